"""The model catalog: computed parameter counts within 2% of the published totals; config.json parsing."""

from __future__ import annotations

import json

import pytest

from automodel_dist.catalog.models import ModelConfigError, catalog, from_hf_config, lookup, resolve_model

REQUIRED_FAMILIES = ["Llama-3.2-1B", "Llama-3.1-405B", "Qwen2.5-", "Qwen3-8B", "Qwen3-30B-A3B", "Mixtral",
                     "DeepSeek-V3", "gpt-oss", "gemma"]


@pytest.mark.parametrize("spec", catalog(), ids=lambda s: s.name)
def test_param_count_within_2_percent_of_published(spec):
    assert spec.published_params
    assert abs(spec.param_count() - spec.published_params) / spec.published_params < 0.02


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
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    assert spec.param_count() == lookup("meta-llama/Llama-3.1-8B").param_count()
    assert resolve_model(tmp_path).num_layers == 32  # a directory holding config.json
    moe = from_hf_config({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                          "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                          "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                          "intermediate_size": 6144, "vocab_size": 151936})
    assert abs(moe.param_count() - lookup("Qwen/Qwen3-30B-A3B").param_count()) < 1e6
    vlm = from_hf_config({"model_type": "x", "text_config": cfg})
    assert vlm.num_attention_heads == 32


@pytest.mark.parametrize("bad", ["unknown/model", {"hidden_size": 8}, {"hidden_size": "x", "num_attention_heads": 2,
                                                                       "num_hidden_layers": 1}, 42])
def test_bad_models_raise_model_config_error(bad):
    with pytest.raises(ModelConfigError):
        resolve_model(bad)


def test_every_catalog_model_has_a_tabled_automodel_implementation():
    from automodel_dist.catalog.implementations import implementation

    for spec in catalog():
        assert implementation(spec.architecture) is not None, spec.name


def test_hf_config_architecture_is_read():
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_experts": 8}
    assert from_hf_config(cfg).architecture == "Qwen3MoeForCausalLM"
    vlm = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {k: v for k, v in cfg.items()
                                                                                if k != "architectures"}}
    assert from_hf_config(vlm).architecture == "Gemma3ForConditionalGeneration"
    assert from_hf_config({**cfg, "architectures": ["not an identifier"]}).architecture is None
