"""The model catalog: computed parameter counts within 2% of the published totals; config.json parsing."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist.catalog.models import (
    CATALOG_DIR,
    ModelConfigError,
    ModelSpec,
    catalog,
    from_hf_config,
    lookup,
    period_of,
)
from automodel_dist.catalog.sources import resolve_model

REQUIRED_FAMILIES = [
    "Llama-3.2-1B",
    "Llama-3.1-405B",
    "Qwen2.5-",
    "Qwen3-8B",
    "Qwen3-30B-A3B",
    "Mixtral",
    "DeepSeek-V3",
    "gpt-oss",
    "gemma",
]


@pytest.mark.parametrize("spec", [s for s in catalog() if s.published_params], ids=lambda s: s.name)
def test_param_count_within_2_percent_of_published(spec):
    assert abs(spec.param_count() - spec.published_params) / spec.published_params < 0.02


def test_an_entry_without_a_published_total_says_where_its_config_came_from():
    """Entries added for AutoModel's CI recipes whose model card total was not at hand: their config.json fields come
    from public copies (named in ``provenance``); their counts are held to the transformers class built from the same
    file (test_the_config_json_of_every_entry_builds_the_same_model_in_transformers), exactly."""
    import json

    from automodel_dist.catalog.models import CATALOG_DIR

    entries = json.loads((CATALOG_DIR / "catalog.json").read_text(encoding="utf-8"))["models"]
    unpublished = [e for e in entries if e["published_params"] is None]
    assert unpublished and all(len(e.get("provenance", "")) > 40 for e in unpublished)


def test_the_parsers_transformers_defaults_are_transformers():
    """TIED_BY_DEFAULT is the set of causal-LM model types whose transformers config ties the embeddings when
    config.json does not say; recomputed from the installed transformers."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from automodel_dist.catalog.models import TIED_BY_DEFAULT, UNGATED_MLP

    tied = set()
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            config = AutoConfig.for_model(model_type)
            tie = getattr(config, "tie_word_embeddings", None)
            if tie is None and hasattr(config, "get_text_config"):
                tie = config.get_text_config().tie_word_embeddings
        except Exception:  # a config class that cannot build without arguments, or states no default: not read
            continue
        if tie:
            tied.add(model_type)
    assert tied == TIED_BY_DEFAULT
    from automodel_dist.catalog.models import TEXT_CONFIG_DEFAULTS

    for model_type, defaults in TEXT_CONFIG_DEFAULTS.items():
        config = AutoConfig.for_model(model_type)
        assert {k: getattr(config, k) for k in defaults} == defaults, model_type
    assert set(UNGATED_MLP) <= set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    from transformers import FalconH1Config

    from automodel_dist.catalog.models import FALCON_H1_DEFAULTS

    assert {k: getattr(FalconH1Config, k) for k in FALCON_H1_DEFAULTS} == FALCON_H1_DEFAULTS


def test_catalog_covers_the_required_families():
    names = " ".join(s.name for s in catalog())
    for fam in REQUIRED_FAMILIES:
        assert fam in names, fam


def test_lookup_is_case_insensitive_and_knows_aliases():
    assert lookup("META-LLAMA/llama-3.1-70b").name == "meta-llama/Llama-3.1-70B"
    assert lookup("meta-llama/Llama-3.3-70B-Instruct").name == "meta-llama/Llama-3.1-70B"
    assert lookup("Qwen/Qwen3-30B-A3B-Thinking-2507").num_experts == 128
    assert lookup("nope/nope") is None


def test_moe_active_params():
    assert 3.0e9 < lookup("Qwen/Qwen3-30B-A3B").active_param_count() < 3.6e9
    assert 36e9 < lookup("deepseek-ai/DeepSeek-V3").active_param_count() < 38e9


def test_hf_config_round_trip(tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    assert spec.param_count() == lookup("meta-llama/Llama-3.1-8B").param_count()
    assert resolve_model(tmp_path).num_layers == 32  # a directory holding config.json
    moe = from_hf_config(
        {
            "model_type": "qwen3_moe",
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "intermediate_size": 6144,
            "vocab_size": 151936,
        }
    )
    assert abs(moe.param_count() - lookup("Qwen/Qwen3-30B-A3B").param_count()) < 1e6
    vlm = from_hf_config({"model_type": "x", "text_config": cfg})
    assert vlm.num_attention_heads == 32


def test_ernie_moe_reads_its_own_expert_keys_and_refuses_what_it_cannot_count():
    """ERNIE-4.5 names its experts moe_num_experts / moe_k / moe_num_shared_experts and routes the layers from
    moe_layer_start_index on: a dense prefix, as transformers' and AutoModel's classes build it (the catalog entry is
    held to transformers' class by test_the_config_json_of_every_entry_builds_the_same_model_in_transformers). An
    interleaved pattern, a range that stops short of the last layer, use_bias or a null end index is refused rather
    than miscounted."""
    spec = lookup("baidu/ERNIE-4.5-21B-A3B-PT")
    assert (spec.num_experts, spec.experts_per_token, spec.first_dense_layers) == (64, 6, 1)
    assert spec.shared_expert_intermediate_size == 2 * 1536 and spec.num_moe_layers == 27 and spec.tie_word_embeddings
    cfg = dict(spec.hf_config)
    for change in (
        {"moe_layer_interval": 2},
        {"moe_layer_end_index": 20},
        {"use_bias": True},
        {"moe_layer_end_index": None},
    ):
        with pytest.raises(ModelConfigError, match="ERNIE-4.5"):
            from_hf_config({**cfg, **change})
    assert from_hf_config({**cfg, "moe_layer_end_index": -1, "moe_layer_start_index": 3}).first_dense_layers == 3


@pytest.mark.parametrize(
    "bad",
    ["unknown/model", {"hidden_size": 8}, {"hidden_size": "x", "num_attention_heads": 2, "num_hidden_layers": 1}, 42],
)
def test_bad_models_raise_model_config_error(bad):
    with pytest.raises(ModelConfigError):
        resolve_model(bad)


def test_every_catalog_model_has_a_tabled_automodel_implementation():
    from automodel_dist.catalog.implementations import implementation

    for spec in catalog():
        assert implementation(spec.architecture) is not None, spec.name


def test_hf_config_architecture_is_read():
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_experts": 8,
    }
    assert from_hf_config(cfg).architecture == "Qwen3MoeForCausalLM"
    vlm = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {k: v for k, v in cfg.items() if k != "architectures"},
    }
    assert from_hf_config(vlm).architecture == "Gemma3ForConditionalGeneration"
    assert from_hf_config({**cfg, "architectures": ["not an identifier"]}).architecture is None


NANO_CONFIG = {  # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json (the fields that shape parameters)
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 2688,
    "intermediate_size": 1856,
    "num_hidden_layers": 52,
    "num_attention_heads": 32,
    "head_dim": 128,
    "num_key_value_heads": 2,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "num_experts_per_tok": 6,
    "tie_word_embeddings": False,
    "mlp_hidden_act": "relu2",
}


def test_nemotron_h_config_json_matches_the_catalog_and_layer_types():
    spec = from_hf_config(NANO_CONFIG)
    nano = lookup("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-bf16")
    assert spec.param_count() == nano.param_count() and spec.layer_types == nano.layer_types
    assert (spec.count("mamba"), spec.count("moe"), spec.count("attention")) == (23, 23, 6)
    assert spec.num_moe_layers == 23 and spec.is_moe and spec.architecture == "NemotronHForCausalLM"
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    legacy = {k: v for k, v in NANO_CONFIG.items() if k != "hybrid_override_pattern"}
    legacy["layers_block_type"] = [names[c] for c in NANO_CONFIG["hybrid_override_pattern"]]
    assert from_hf_config(legacy).layer_types == spec.layer_types
    current = {
        **legacy,
        "layers_block_type": [
            {"mamba": "linear_attention", "attention": "full_attention"}.get(t, t) for t in legacy["layers_block_type"]
        ],
    }
    assert from_hf_config(current).layer_types == spec.layer_types
    dense = from_hf_config({**NANO_CONFIG, "hybrid_override_pattern": "M-M*" * 13})
    assert not dense.is_moe and dense.count("mlp") == 13  # n_routed_experts without MoE layers: a dense model


@pytest.mark.parametrize("name", ["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/Nemotron-H-8B-Base-8K"])
def test_nemotron_h_param_count_equals_the_hugging_face_model(name):
    """Exact: the Hugging Face NemotronH class built on the meta device from the catalog's values."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = lookup(name)
    codes = {"mamba": "M", "moe": "E", "attention": "*", "mlp": "-"}
    config = transformers.NemotronHConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        hybrid_override_pattern="".join(codes[t] for t in spec.layer_types),
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hd,
        mamba_num_heads=spec.mamba_num_heads,
        mamba_head_dim=spec.mamba_head_dim,
        n_groups=spec.mamba_n_groups,
        ssm_state_size=spec.ssm_state_size,
        conv_kernel=spec.conv_kernel,
        n_routed_experts=spec.num_experts or 8,
        moe_intermediate_size=spec.moe_intermediate_size or 8,
        moe_shared_expert_intermediate_size=spec.shared_expert_intermediate_size or 8,
        num_experts_per_tok=spec.experts_per_token or 2,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    with torch.device("meta"):
        model = transformers.NemotronHForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()


_HF_MOE = {  # catalog name -> (transformers class, model_type) for the exact counts below
    "zai-org/GLM-4.5": ("Glm4MoeForCausalLM", "glm4_moe"),
    "zai-org/GLM-4.5-Air": ("Glm4MoeForCausalLM", "glm4_moe"),
    "moonshotai/Kimi-K2-Instruct": ("DeepseekV3ForCausalLM", "deepseek_v3"),
    "deepseek-ai/DeepSeek-V3": ("DeepseekV3ForCausalLM", "deepseek_v3"),
    "Qwen/Qwen3-30B-A3B": ("Qwen3MoeForCausalLM", "qwen3_moe"),
}


def _hf_config(spec, model_type: str) -> dict:
    """The config.json keys of ``spec`` as its Hugging Face config names them."""
    cfg = {
        "model_type": model_type,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "head_dim": spec.hd,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "architectures": [spec.architecture],
    }
    if not spec.is_moe:
        return cfg
    cfg.update(moe_intermediate_size=spec.moe_intermediate_size, num_experts_per_tok=spec.experts_per_token)
    if model_type == "qwen3_moe":
        return {**cfg, "num_experts": spec.num_experts, "norm_topk_prob": True}
    cfg.update(
        n_routed_experts=spec.num_experts,
        first_k_dense_replace=spec.first_dense_layers,
        n_shared_experts=spec.shared_expert_intermediate_size // spec.moe_intermediate_size,
    )
    if model_type == "glm4_moe":
        return {**cfg, "attention_bias": spec.qkv_bias, "use_qk_norm": spec.qk_norm, "partial_rotary_factor": 0.5}
    return {
        **cfg,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "n_group": 1,
        "topk_group": 1,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
    }


_HF_DENSE = {
    "meta-llama/Llama-3.1-8B": ("LlamaForCausalLM", "llama"),
    "Qwen/Qwen3-8B": ("Qwen3ForCausalLM", "qwen3"),
    "mistralai/Mistral-7B-v0.3": ("MistralForCausalLM", "mistral"),
    "mistralai/Mistral-Nemo-Base-2407": ("MistralForCausalLM", "mistral"),
    "mistralai/Mistral-Small-24B-Base-2501": ("MistralForCausalLM", "mistral"),
}


@pytest.mark.parametrize("name", sorted(_HF_DENSE) + sorted(_HF_MOE))
def test_param_count_equals_the_hugging_face_model(name):
    """Exact: the transformers class built on the meta device from the catalog's values, and the same values
    read back from that config.json give the same spec (dense families and MoE entries, whose counts are not
    just published totals)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = lookup(name)
    cls, model_type = {**_HF_DENSE, **_HF_MOE}[name]
    cfg = _hf_config(spec, model_type)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    with torch.device("meta"):
        model = getattr(transformers, cls)(config)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()
    parsed = from_hf_config(cfg, name=spec.name)
    assert parsed.param_count() == spec.param_count() and parsed.architecture == spec.architecture


@pytest.mark.parametrize(
    "bad",
    [
        {"hybrid_override_pattern": "MX*"},  # unknown layer code
        {"hybrid_override_pattern": "M*"},  # 2 layers for num_hidden_layers=3
        {"hybrid_override_pattern": None},  # neither a pattern nor layers_block_type
        {"hybrid_override_pattern": "MEM", "n_routed_experts": 0},  # MoE layers without experts
        {"hybrid_override_pattern": "M*-", "mamba_num_heads": 0},
    ],
)
def test_bad_nemotron_h_configs_raise_model_config_error(bad):
    cfg = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3, **bad}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ModelConfigError):
        from_hf_config(cfg)


_FALCON_H1 = {
    "model_type": "falcon_h1",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "mamba_d_ssm": 512,
    "mamba_n_heads": 8,
    "mamba_d_state": 16,
}


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"mamba_proj_bias": True}, "mamba_proj_bias"),
        ({"projectors_bias": True, "mlp_bias": True}, "projectors_bias, mlp_bias"),
        ({"mamba_conv_bias": False}, "mamba_conv_bias false"),
        ({"mamba_n_heads": 7}, "must divide the Mamba width 512"),
        ({"mamba_d_head": 32}, "is not the Mamba width 512"),
        ({"mamba_rms_norm": True}, "mamba_norm_before_gate true"),
        ({"lm_head_multiplier": "x"}, "lm_head_multiplier must be a number"),
    ],
)
def test_a_falcon_h1_config_the_spec_cannot_hold_is_refused(extra, why):
    with pytest.raises(ModelConfigError, match=why):
        from_hf_config({**_FALCON_H1, **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mamba_rms_norm": True, "mamba_norm_before_gate": False, "mamba_n_groups": 2},
        {"mamba_d_ssm": None, "mamba_expand": 1},
        {"mamba_d_head": 64},
    ],
)
def test_falcon_h1_layers_are_the_parameters_transformers_builds(extra):
    """Attention, a Mamba-2 mixer (its gated norm where mamba_rms_norm says so; its width mamba_expand x hidden where
    mamba_d_ssm is null) and the gated MLP per layer: transformers' FalconH1ForCausalLM on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {**_FALCON_H1, **extra}
    spec = from_hf_config(cfg)
    assert spec.parallel_mamba and spec.architecture == "FalconH1ForCausalLM" and not spec.is_hybrid
    with torch.device("meta"):
        model = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**cfg))
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()


@pytest.mark.parametrize("spec", catalog(), ids=lambda s: s.name)
def test_the_config_json_of_every_entry_builds_the_same_model_in_transformers(spec):
    """Each entry's trimmed config.json (catalog/configs/) names its values under its architecture's Hugging Face
    field names: the transformers class built from it on the meta device (four layers, or every layer of a hybrid
    pattern) has exactly the parameters of the spec read from the same file, cut to the same depth."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.dry_run.depth import truncated_config

    # four layers, or two past a dense prefix so the MoE layers are compared too (Ling-1T's first four are dense), or a
    # whole period of layer kinds (transformers' Gemma-4 config makes a cut's last layer full attention)
    period = period_of(spec.layer_attention) if spec.layer_attention else None
    depth = min(spec.num_layers, max(4, spec.first_dense_layers + 2, period or 0))
    if spec.kv_shared_layers:  # Gemma-4's E-series: its KV-shared (and double-wide) layers are its last ones
        depth = spec.num_layers
    cfg = hf_config(spec) if spec.layer_types else truncated_config(hf_config(spec), depth)
    small = from_hf_config(cfg, name=spec.name)
    assert small.architecture == spec.architecture and small.hd == spec.hd
    model_type = cfg.pop("model_type")
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        # a model type only AutoModel knows (it registers it with transformers on import, so transformers' own names
        # decide): Ling's bailing_moe, built from AutoModel's own config and class
        _assert_automodel_class_matches(model_type, cfg, small)
        return
    # transformers' own config class, named by its static table: AutoModel re-registers some model types on import
    # (MiMo-V2-Flash's) with its own config class, which transformers' model classes cannot read
    config = getattr(transformers, transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES[model_type])(**cfg)
    if model_type in OWN_CLASS_TOO:
        _assert_automodel_class_matches(model_type, dict(cfg), small)
    if model_type in EXACT_TOWERS:
        # the whole multimodal model, its towers and projector included: the parser counts them exactly
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(config)
        # transformers' classes leave the MTP layers out (AutoModel's build them: the test below); transformers'
        # Gemma-4 router keeps a per-expert scale that AutoModel's class folds into the experts' down projections
        # when it loads the checkpoint (gemma4_moe/state_dict_adapter.py): the spec follows AutoModel
        folded = sum(p.numel() for n, p in model.named_parameters() if n.endswith("router.per_expert_scale"))
        assert sum(p.numel() for p in model.parameters()) - folded == small.param_count() - small.mtp_params()
        return
    if model_type not in transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        # a multimodal class transformers' own table maps to no causal LM (Mistral3; AutoModel registers one on
        # import, so the static table decides): its language model is built alone
        config = config.get_text_config()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    # another multimodal config builds its text model as a causal LM: the spec's approximate towers are left out
    towers = small.vision_params + small.audio_params
    # ERNIE-4.5's routers keep their score-correction bias as an untrained parameter in transformers' class, a buffer
    # in AutoModel's (as every other class here keeps it), and MiMo-V2-Flash's sliding layers their attention sinks
    # (AutoModel's class: a frozen fp32 buffer, the checkpoint's sink kept as it is); the spec follows AutoModel
    untrained = ("moe_statics.e_score_correction_bias",) + (
        ("self_attn.sinks",) if model_type == "mimo_v2_flash" else ()
    )
    buffers = sum(p.numel() for n, p in model.named_parameters() if n.endswith(untrained))
    assert sum(p.numel() for p in model.parameters()) - buffers == small.param_count() - towers - small.mtp_params()


@pytest.mark.parametrize("spec", [s for s in catalog() if s.mtp_layers], ids=lambda s: s.name)
def test_the_mtp_layers_are_the_ones_automodels_class_builds(spec):
    """The multi-token-prediction layers AutoModel's own class builds from the config (its ``mtp.`` parameters,
    on the meta device at two layers) are the spec's ``mtp_params``."""
    import importlib

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    registry = pytest.importorskip("nemo_automodel._transformers.registry")
    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.dry_run.depth import truncated_config

    cfg = truncated_config(hf_config(spec), 2)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    module, name = registry.MODEL_ARCH_MAPPING[cfg["architectures"][0]][:2]
    with torch.device("meta"):
        model = getattr(importlib.import_module(module), name)(config)
    mtp = sum(p.numel() for k, p in model.named_parameters() if k.startswith("mtp."))
    assert mtp == from_hf_config(cfg | {"model_type": config.model_type}, name=spec.name).mtp_params() > 0


def _transformers_moe_lms() -> list[ModelSpec]:
    """The catalog's MoE models transformers has a causal LM class of its own for (the others AutoModel builds)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal
    except ImportError:  # (no class to build: nothing to hold)
        return []
    from automodel_dist.catalog.hf_config import hf_config

    moe = [s for s in catalog() if s.is_moe and not s.layer_types and not s.per_layer_input]
    return [s for s in moe if hf_config(s).get("model_type") in causal]


@pytest.mark.parametrize("spec", _transformers_moe_lms(), ids=lambda s: s.name)
def test_transformers_moe_classes_hold_their_routed_experts_as_parameters_not_linear_modules(spec):
    """What bitsandbytes quantizes is Linear modules (transformers' replace_with_bnb_linear): every MoE class of
    transformers built here holds its routed experts as 3D parameters, which QLoRA leaves in the compute dtype
    (estimate/memory.py, where AutoModel builds transformers' class)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.dry_run.depth import truncated_config

    cfg = truncated_config(hf_config(spec), spec.first_dense_layers + 2)
    model_type = cfg.pop("model_type")
    config = getattr(transformers, transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES[model_type])(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    routed = [n for n, _ in model.named_modules() if n.endswith(".experts")]
    assert routed
    for name in routed:
        module = model.get_submodule(name)
        assert not any(isinstance(m, torch.nn.Linear) for m in module.modules()), name
        assert any(p.dim() == 3 for p in module.parameters()), name


@pytest.mark.parametrize("repeated", [True, False])
def test_a_recipes_repeated_mtp_layer_is_what_automodels_nemotron_v3_class_builds_and_runs(repeated):
    """A recipe's ``num_nextn_predict_layers: 2`` with ``mtp_use_repeated_layer`` (Nemotron-3 Ultra's): AutoModel's
    class, on the meta device from the spec's config and that argument, builds one physical depth (the spec's
    ``mtp_params``) and runs it at two (``mtp_depths``); without the flag it builds two."""
    import importlib

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    registry = pytest.importorskip("nemo_automodel._transformers.registry")
    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.models import with_mtp_depth
    from automodel_dist.dry_run.depth import truncated_config

    spec = with_mtp_depth(lookup("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"), 2, repeated=repeated)
    assert spec is not None and (spec.mtp_layers, spec.mtp_depths()) == ((1, 2) if repeated else (2, 2))
    cfg = truncated_config(hf_config(spec), 2)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    module, name = registry.MODEL_ARCH_MAPPING[cfg["architectures"][0]][:2]
    with torch.device("meta"):
        model = getattr(importlib.import_module(module), name)(config, mtp_use_repeated_layer=repeated)
    assert model.mtp_config.num_layers == spec.mtp_depths()
    mtp = sum(p.numel() for k, p in model.named_parameters() if k.startswith("mtp."))
    assert mtp == spec.mtp_params() > 0


# the multimodal model types whose towers the parser counts exactly (catalog.models._qwen_or_siglip_tower)
EXACT_TOWERS = {
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma3",
    "gemma4",
    "mistral3",
    "cohere_compass",
    "muse_glimmer",
}


# model types whose AutoModel class keeps as buffers what transformers' class has as parameters: the spec follows
# AutoModel's, which is checked too (MiMo-V2-Flash's attention sinks); Muse-Glimmer's native class, which AutoModel
# builds in place of transformers' (its own module names, the same parameters)
OWN_CLASS_TOO = ("mimo_v2_flash", "muse_glimmer")


def _assert_automodel_class_matches(model_type, cfg, small):
    import torch

    registry = pytest.importorskip("nemo_automodel._transformers.registry")
    config = registry.resolve_custom_config_cls(model_type)(**cfg)
    module, name = registry.MODEL_ARCH_MAPPING[cfg["architectures"][0]]
    with _fla_stand_ins(module) if small.linear_mixer == "kda" else contextlib.nullcontext():
        with torch.device("meta"):
            model = getattr(importlib.import_module(module), name)(config)
    assert sum(p.numel() for p in model.parameters()) == small.param_count()


@contextlib.contextmanager
def _fla_stand_ins(module: str):
    """AutoModel's ``module`` re-imported with the dry run's fla stand-ins bound (Kimi-Linear's KDA layers require fla,
    which needs CUDA; the stand-in modules keep fla's parameters), and re-imported without them afterwards."""
    from automodel_dist.stack import fla_kda

    installed = fla_kda.install()
    if not getattr(sys.modules.get("fla"), "_stand_in", False):
        pytest.skip("a real fla is installed: its modules need CUDA")
    importlib.reload(importlib.import_module(module))
    try:
        yield
    finally:
        for name in installed:
            sys.modules.pop(name, None)
        importlib.reload(importlib.import_module(module))


def test_ling_flash_sizes_give_its_published_safetensors_total():
    """Ling-flash-2.0's entry holds size fields from Megatron-Bridge, not its config.json: the parameters they give
    are exactly its checkpoint's safetensors total (the Hub API's model.json, a public copy), once each MoE layer's
    router score-correction bias is added: a tensor in the checkpoint, a buffer (no parameter) in AutoModel's class."""
    m = lookup("inclusionAI/Ling-flash-2.0")
    assert m.param_count() + m.num_moe_layers * m.num_experts == 102_889_705_216


def test_every_config_file_is_a_catalog_entry_and_reads_as_the_hugging_face_cache_would():
    """catalog.json lists each trimmed config.json once, and the entry is what the cache's parser makes of the file."""
    import json

    from automodel_dist.catalog.models import CATALOG_DIR

    index = json.loads((CATALOG_DIR / "catalog.json").read_text(encoding="utf-8"))["models"]
    listed = [e["config"] for e in index]
    assert sorted(listed) == sorted(f"configs/{p.name}" for p in (CATALOG_DIR / "configs").glob("*.json"))
    assert len(set(listed)) == len(listed) == len(catalog())
    for entry, spec in zip(index, catalog()):
        cfg = json.loads((CATALOG_DIR / entry["config"]).read_text(encoding="utf-8"))
        assert from_hf_config(cfg, name=entry["name"]) == dataclasses.replace(
            spec, published_params=None, source=None, aliases=()
        )


def test_a_multimodal_configs_language_model_is_read_with_the_whole_models_settings():
    """Qwen3.5's text_config: its Gated DeltaNet layers stay linear when a shallow build keeps only linear layers, and a
    tie_word_embeddings said once for the whole model applies to the language model."""
    from automodel_dist.dry_run.depth import truncated_config

    cfg = lookup("Qwen/Qwen3.5-35B-A3B").hf_config
    assert from_hf_config(truncated_config(cfg, 3)).layer_attention == ("linear",) * 3
    assert from_hf_config(truncated_config(cfg, 4)).layer_attention == ("linear",) * 3 + ("full",)
    text = {k: v for k, v in cfg["text_config"].items() if k != "tie_word_embeddings"}
    for tie in (True, False):
        assert from_hf_config({**cfg, "text_config": text, "tie_word_embeddings": tie}).tie_word_embeddings is tie


@pytest.mark.parametrize("model_type", ["cohere", "cohere2"])
def test_a_parallel_block_has_one_norm_a_layer(model_type):
    """Cohere's and Cohere2's decoder layers run attention and the MLP on one norm's output (PARALLEL_BLOCK), a
    LayerNorm without bias: the parser counts what transformers builds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {
        "model_type": model_type,
        "architectures": ["Cohere2ForCausalLM" if model_type == "cohere2" else "CohereForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    spec = from_hf_config(dict(cfg))
    assert spec.norms_per_layer == 1 and spec.tie_word_embeddings
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()


MIMO_LIKE = {
    "model_type": "mimo_v2_flash",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "swa_num_key_value_heads": 2,
    "head_dim": 24,
    "v_head_dim": 16,
    "num_hidden_layers": 3,
    "hybrid_layer_pattern": [0, 1, 1],
    "moe_layer_freq": [0, 1, 1],
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def test_a_mimo_style_config_reads_its_layer_pattern_kv_heads_and_value_width():
    """MiMo-V2-Flash's spelling: hybrid_layer_pattern (0 full, 1 sliding), the sliding layers' own KV heads, values and
    outputs at v_head_dim, a dense prefix from moe_layer_freq."""
    spec = from_hf_config(MIMO_LIKE)
    assert spec.layer_attention == ("full", "sliding", "sliding")
    assert (spec.num_key_value_heads, spec.full_kv_heads, spec.first_dense_layers) == (2, 1, 1)
    h, q = 64, 4 * 24
    sliding = h * q + h * 2 * 24 + h * 2 * 16 + 4 * 16 * h
    full = h * q + h * 1 * 24 + h * 1 * 16 + 4 * 16 * h
    assert spec.attention_params("sliding") == sliding and spec.attention_params("full") == full


@pytest.mark.parametrize(
    "bad",
    [
        {"hybrid_layer_pattern": [0, 1]},  # not one per layer
        {"hybrid_layer_pattern": [0, 2, 1]},
        {"moe_layer_freq": [0, 1, 0]},  # a dense layer after an MoE one
        {"moe_layer_freq": [True, 1, 1]},
        {"swa_num_attention_heads": 8},  # the spec varies only the KV heads by kind
        {"swa_head_dim": 32},
        {"swa_v_head_dim": 8},
    ],
)
def test_a_mimo_style_config_the_spec_cannot_hold_is_refused(bad):
    with pytest.raises(ModelConfigError):
        from_hf_config({**MIMO_LIKE, **bad})


@pytest.mark.parametrize(
    "extra,why",
    [
        ({"num_kv_shared_layers": 60}, "leaves no layer"),
        ({"hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 0}, "without vocab_size_per_layer_input"),
    ],
)
def test_a_gemma4_e_series_config_that_cannot_be_built_is_refused(extra, why):
    """KV sharing needs a layer before the shared ones to compute what they share, and per-layer inputs need their
    table: a config without them is refused, not sized."""
    import json

    from automodel_dist.catalog.models import CATALOG_DIR

    cfg = json.loads((CATALOG_DIR / "configs" / "google--gemma-4-31B-it.json").read_text())
    from_hf_config(cfg)
    cfg["text_config"] = {**cfg["text_config"], **extra}
    with pytest.raises(ModelConfigError, match=why):
        from_hf_config(cfg)


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(2, 9),
    shared=st.integers(0, 8),
    ple=st.sampled_from([0, 8, 16]),
    wide=st.booleans(),
    kv=st.sampled_from([1, 2]),
    k_eq_v=st.booleans(),
)
def test_gemma4_e_series_layers_are_the_parameters_transformers_builds(layers, shared, ple, wide, kv, k_eq_v):
    """Per-layer inputs, KV-shared layers (no k/v projections or key norm) and their double-wide MLP, at any mix with
    sliding and full layers: the spec's count is that of transformers' Gemma4ForCausalLM on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    shared = min(shared, layers - 2)  # a sliding and a full layer before the shared ones, to share from
    kinds = ["sliding_attention", "full_attention"] * layers
    text = {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": kv,
        "num_global_key_value_heads": 1 if k_eq_v else None,
        "attention_k_eq_v": k_eq_v,
        "head_dim": 16,
        "global_head_dim": 32,
        "vocab_size": 1000,
        "vocab_size_per_layer_input": 500,
        "hidden_size_per_layer_input": ple,
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": wide,
        "layer_types": kinds[:layers],
        "tie_word_embeddings": True,
    }
    config = transformers.Gemma4TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.Gemma4ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == from_hf_config(text).param_count()


def test_a_nemotron_h_config_that_lists_its_layers_reads_as_its_pattern():
    """Nemotron-3 Ultra's config.json lists layers_block_type and mtp_layers_block_type and no num_hidden_layers (as
    transformers' NemotronHConfig accepts): read as the equivalent pattern strings the catalog's copy holds."""
    spec = lookup("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16")
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    cfg = {k: v for k, v in spec.hf_config.items() if k not in ("num_hidden_layers", "hybrid_override_pattern")}
    cfg = {k: v for k, v in cfg.items() if k != "mtp_hybrid_override_pattern"}
    cfg["layers_block_type"] = [names[c] for c in spec.hf_config["hybrid_override_pattern"]]
    cfg["mtp_layers_block_type"] = [names[c] for c in spec.hf_config["mtp_hybrid_override_pattern"]]
    listed = from_hf_config(cfg, name=spec.name)
    assert listed.num_layers == 108 and listed.mtp_layer_types == ("attention", "moe")
    assert listed.param_count() == spec.param_count() == 560_524_578_816


@pytest.mark.parametrize(
    ("name", "published_active"),
    [
        ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", 12e9),
        ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", 55e9),
        ("nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16", 3e9),
    ],
)
def test_an_mtp_depths_idle_experts_are_not_active(name, published_active):
    """The MTP depths' routed experts idle as the backbone's do (k of them a token): the active count is the model
    card's 'A' figure with the embeddings, the head and the MTP depth's attention and shared parts around it, not
    every MTP expert."""
    m = lookup(name)
    assert m.mtp_moe_layers == 1
    assert published_active < m.active_param_count() < 1.2 * published_active + 2 * m.embedding_params()


@pytest.mark.parametrize(
    ("text_type", "quant", "expected"),
    [
        ("ministral3", None, "Mistral3FP8VLMForConditionalGeneration"),
        ("ministral3", {"quant_method": "fp8"}, "Mistral3FP8VLMForConditionalGeneration"),
        ("ministral3", {"quant_method": "bitsandbytes"}, "Mistral3ForConditionalGeneration"),
        ("mistral4", None, "Mistral3ForConditionalGeneration"),
    ],
)
def test_a_mistral3_config_names_the_class_automodel_resolves_for_it(text_type, quant, expected):
    """AutoModel hands a Mistral3ForConditionalGeneration whose text model is ministral3 (unquantized or FP8) to its
    Mistral3FP8VLMForConditionalGeneration, and the rest to the registry's Mistral4 class of that name
    (tests/oracle/test_kernel_facts.py asks AutoModel's own supports_config); the projector, which
    freeze_vision_tower leaves trainable, is transformers' multi_modal_projector."""
    cfg = json.loads((CATALOG_DIR / "configs" / "mistralai--Ministral-3-3B-Instruct-2512.json").read_text())
    cfg["text_config"]["model_type"] = text_type
    if quant is not None:
        cfg["quantization_config"] = quant
    spec = from_hf_config(cfg)
    assert spec.architecture == expected
    h, text = cfg["vision_config"]["hidden_size"], cfg["text_config"]["hidden_size"]
    assert spec.projector_params == h + 4 * h * h + h * text + text * text


def test_mistral_medium_3_5_is_valid_at_its_recipes_tp_8():
    """Its class (AutoModel's Mistral3 FP8 VLM class, which has a TP plan) takes the corpus recipe's TP 8; the
    registry's Mistral4 class of the same architecture name would refuse it."""
    from automodel_dist import validate_config

    report = validate_config(
        "distributed:\n  tp_size: 8\n  pp_size: 8\n  pipeline: {}\n",
        world_size=64,
        model="mistralai/Mistral-Medium-3.5-128B",
    )
    assert not [f for f in report.findings if f.rule == "model-capability"], report.findings


def test_glm_5_2s_shared_indexers_are_not_counted():
    """GLM-5.2's IndexShare: 57 of its 78 layers reuse an earlier layer's indexer selection and hold no indexer of
    their own (AutoModel's glm_moe_dsa class builds none there): GLM-5.1's parameters less 57 indexers, exactly the
    policy parameter count a public training script expects for GLM-5.2."""
    glm51, glm52 = lookup("zai-org/GLM-5.1"), lookup("zai-org/GLM-5.2")
    assert len(glm52.index_shared_layers) == 57 and glm52.index_shared_layers[:3] == (3, 4, 5)
    assert glm52.param_count() == 743_377_000_704
    assert glm51.param_count() - glm52.param_count() == 57 * glm51.indexer_params()


def test_an_index_share_schedule_is_read_as_automodels_config_reads_it():
    from automodel_dist.dry_run.depth import truncated_config

    cfg = dict(lookup("zai-org/GLM-5.2").hf_config)
    cut = truncated_config(cfg, 8)
    assert cut["indexer_types"] == cfg["indexer_types"][:8] and cut["mlp_layer_types"] == ["dense"] * 3 + ["sparse"] * 5
    # under PP the shallow builds make the dense prefix MoE: AutoModel's GLM config reads mlp_layer_types, and without
    # them makes three dense layers whatever first_k_dense_replace says
    assert truncated_config(cfg, 8, moe_prefix_as_moe=True)["mlp_layer_types"] == ["sparse"] * 8
    glm5 = dict(lookup("zai-org/GLM-5").hf_config)
    assert truncated_config(glm5, 6, moe_prefix_as_moe=True)["mlp_layer_types"] == ["sparse"] * 6
    no_list = {k: v for k, v in cfg.items() if k != "indexer_types"}
    # without the list: every index_topk_freq-th layer after the first has its own (AutoModel's default schedule)
    assert from_hf_config({**no_list, "index_topk_freq": 4}).index_shared_layers == tuple(
        i for i in range(78) if max(i - 1, 0) % 4
    )
    assert from_hf_config({**no_list, "index_topk_freq": 1}).index_shared_layers == ()
    # a list with an entry past the layers (an MTP layer's): AutoModel reads the entry of each layer it builds
    longer = from_hf_config({**cfg, "indexer_types": [*cfg["indexer_types"], "shared"]})
    assert longer.index_shared_layers == lookup("zai-org/GLM-5.2").index_shared_layers


@pytest.mark.parametrize("kinds", [["full"] * 77, ["shared"] + ["full"] * 77, ["full"] * 77 + ["partial"], "FS" * 39])
def test_an_index_share_schedule_the_spec_cannot_hold_is_refused(kinds):
    cfg = dict(lookup("zai-org/GLM-5.2").hf_config)
    with pytest.raises(ModelConfigError, match="indexer_types"):
        from_hf_config({**cfg, "indexer_types": kinds})


def test_glm_5_2s_shallow_builds_repeat_its_index_share_period():
    """The dry run's shallow builds extrapolate per period of layer kinds: GLM-5.2's shared-index layers are a kind of
    their own (no indexer), so its period after the dense prefix is four layers, not one."""
    from automodel_dist.dry_run.depth import layer_kinds

    kinds = layer_kinds(lookup("zai-org/GLM-5.2"))
    assert period_of(kinds[3:]) == 4 and period_of(layer_kinds(lookup("zai-org/GLM-5.1"))[3:]) == 1


KIMI_LINEAR = "moonshotai/Kimi-Linear-48B-A3B-Instruct"


def test_kimi_linear_reads_its_kda_and_mla_layers_from_linear_attn_config():
    """Kimi-Linear's linear_attn_config lists its KDA layers 1-based (AutoModel's is_kda_layer(i): i + 1 listed):
    20 KDA layers and MLA on every fourth and the last; one dense layer, then 256 experts of 1,024, 8 a token."""
    m = lookup(KIMI_LINEAR)
    assert m.linear_mixer == "kda" and m.architecture == "KimiLinear48BForCausalLM"
    full = [i for i, kind in enumerate(m.layer_attention) if kind == "full"]
    assert full == [3, 7, 11, 15, 19, 23, 26] and m.layer_attention.count("linear") == 20
    assert (m.linear_value_heads, m.linear_value_dim, m.linear_conv_kernel) == (32, 128, 4)
    assert (m.num_experts, m.experts_per_token, m.first_dense_layers) == (256, 8, 1)
    assert m.kv_lora_rank == 512 and m.q_lora_rank is None


def test_kimi_linear_param_count_equals_automodels_class():
    """AutoModel's KimiLinear48BForCausalLM built from the catalog's file at full depth (meta device, fla's modules as
    the dry run's stand-ins, which keep fla's parameters): every parameter, and each layer kind's attention, as the
    parser counts."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("nemo_automodel")
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.models.kimi_linear.config import KimiLinear48BConfig

    module = "nemo_automodel.components.models.kimi_linear.model"
    cfg = json.loads((CATALOG_DIR / "configs" / "moonshotai--Kimi-Linear-48B-A3B-Instruct.json").read_text())
    config = KimiLinear48BConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    backend = BackendConfig(attn="sdpa", linear="torch", rms_norm="torch", experts="torch", dispatcher="torch")
    with _fla_stand_ins(module), torch.device("meta"):
        model = importlib.import_module(module).KimiLinear48BForCausalLM(config, backend=backend)
    m = lookup(KIMI_LINEAR)
    assert sum(p.numel() for p in model.parameters()) == m.param_count() == 49_122_675_072
    layers = model.model.layers
    assert sum(p.numel() for p in layers["0"].self_attn.parameters()) == m.attention_params("linear")
    assert sum(p.numel() for p in layers["3"].self_attn.parameters()) == m.attention_params()


DSV4_FLASH, DSV4_PRO = "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"


def test_deepseek_v4_reads_its_layer_kinds_from_compress_ratios():
    """compress_ratios gives each layer's KV compression, then the MTP layer's: Flash's first two layers are the
    sliding window alone, then ratio 4 (overlapping windows and an indexer) and 128 alternate; Pro starts at 128.
    Every layer is MoE, the first three routed by token id, hc_mult hyper-connection streams."""
    m = lookup(DSV4_FLASH)
    assert m.architecture == "DeepseekV4ForCausalLM" and m.num_layers == 43
    assert m.layer_attention[:5] == ("sliding", "sliding", "csa", "hca", "csa") and m.layer_attention[-1] == "csa"
    assert (m.layer_attention.count("csa"), m.layer_attention.count("hca")) == (21, 20)
    assert (m.hc_mult, m.hca_ratio, m.o_groups, m.o_lora_rank, m.hash_layers) == (4, 128, 8, 1024, 3)
    assert (m.mtp_layers, m.mtp_attention, m.num_experts, m.experts_per_token, m.first_dense_layers) == (
        1,
        "sliding",
        256,
        6,
        0,
    )
    pro = lookup(DSV4_PRO)
    assert pro.layer_attention[:3] == ("hca", "hca", "csa") and pro.num_layers == 61
    assert (pro.layer_attention.count("csa"), pro.layer_attention.count("hca")) == (30, 31)


def test_a_deepseek_v4_config_with_two_heavy_compression_ratios_is_refused():
    """One compression ratio besides 0 and 4 is sized (its position table's rows): a config mixing two is refused
    rather than sized as one."""
    cfg = json.loads((CATALOG_DIR / "configs" / "deepseek-ai--DeepSeek-V4-Flash.json").read_text())
    cfg["compress_ratios"] = [0, 4, 128, 64] * 11
    with pytest.raises(ModelConfigError, match="mixes compression ratios"):
        from_hf_config(cfg)
    # a list shorter than the layers (AutoModel's attention raises IndexError), a vision tower: refused, not guessed
    with pytest.raises(ModelConfigError, match="2 ratios for 43 layers"):
        from_hf_config({**cfg, "compress_ratios": [0, 4]})
    with pytest.raises(ModelConfigError, match="vision_n_layers"):
        from_hf_config({**cfg, "compress_ratios": [], "vision_n_layers": 2})
    assert set(from_hf_config({**cfg, "compress_ratios": []}).layer_attention) == {"sliding"}  # (AutoModel: all 0)


@pytest.mark.parametrize("name", [DSV4_FLASH, DSV4_PRO])
@pytest.mark.parametrize("mtp", [0, 1])
def test_deepseek_v4_param_count_equals_automodels_class(name, mtp):
    """AutoModel's DeepseekV4ForCausalLM built from the catalog's file at full depth (meta device, bf16 as its
    from_config builds it), with and without its MTP layer: every parameter, the fp32 ones (lm_head,
    hyper-connections, compressors, sinks) and each layer kind's attention, as the parser counts."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("nemo_automodel")
    from nemo_automodel.components.models.deepseek_v4.config import DeepseekV4Config
    from nemo_automodel.components.models.deepseek_v4.model import DeepseekV4ForCausalLM

    spec = lookup(name)
    cfg = {k: v for k, v in spec.hf_config.items() if k != "quantization_config"} | {"num_nextn_predict_layers": mtp}
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = DeepseekV4ForCausalLM(DeepseekV4Config(**cfg))
    finally:
        torch.set_default_dtype(before)
    m = from_hf_config(cfg)
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == m.param_count()
    assert sum(p.numel() for p in params if p.dtype == torch.float32) == m.fp32_param_count()
    layers = model.model.layers
    for kind in ("sliding", "csa", "hca"):
        if kind in m.layer_attention:
            i = m.layer_attention.index(kind)
            assert sum(p.numel() for p in layers[str(i)].self_attn.parameters()) == m.attention_params(kind)
            assert sum(p.numel() for p in layers[str(i)].parameters()) == m.layer_params(i)
    if name == DSV4_FLASH and not mtp:
        assert m.param_count() == 284_332_230_231 and m.fp32_param_count() == 868_923_351


def test_deepseek_v4s_shallow_builds_keep_its_first_layers_whole():
    """DeepSeek-V4-Flash's first three layers (two sliding-window ones, the first three routed by token id) break its
    period of two: the shallow builds keep them whole before whole periods, and the cut config keeps each layer's
    compression ratio (and the MTP layer's entry after them)."""
    from automodel_dist.dims import ParallelDims
    from automodel_dist.dry_run.depth import plan_depth, truncated_config

    m = lookup(DSV4_FLASH)
    d = plan_depth(m, ParallelDims(), 0)
    assert d is not None and (d.prefix, d.period, d.suffix, d.layers) == (3, 2, 0, (7, 9))
    cut = truncated_config(m.hf_config, 7)
    assert cut["compress_ratios"] == [0, 0, 4, 128, 4, 128, 4, 0]
    assert from_hf_config(cut).layer_attention == m.layer_attention[:7]
