"""Beyond the distributed block, against AutoModel 0.7.0 itself: the checkpoint section as its recipes build it,
and the losses it silently replaces (its own functions, on models built on the meta device)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import pathlib
import tempfile
import warnings

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automodel_dist import validate_config
from automodel_dist.config import kinds, schema
from automodel_dist.rules.checkpoint import CHECKED_BY_AUTOMODEL
from automodel_dist.rules.fallbacks import KEEPS_OWN_PIPELINE_FORWARD, NO_LOGITS_TO_KEEP, masked_ce_instead
from support import oracle

pytestmark = pytest.mark.skipif(not oracle.AVAILABLE, reason="AutoModel oracle not installed")

MODEL = {"pretrained_model_name_or_path": "org/model"}
LLM = "TrainFinetuneRecipeForNextTokenPrediction"
ROOT = pathlib.Path(importlib.util.find_spec("nemo_automodel").origin).parent  # the package, not imported

# Values per checkpoint key: the defaults, values AutoModel accepts in other spellings and values it rejects.
CHECKPOINT_VALUES = {
    "consolidation_timeout_minutes": [30, 90, 2.5, 0, -1, "30", "soon", None, True],
    "allow_legacy_pickle_restore": [True, False, "yes", 1],
    "max_recent_checkpoints": [None, 1, 3, 0, -2, True, 2.0, "3"],
    "model_save_format": ["safetensors", "torch_save", "pt", "Safetensors"],
    "save_consolidated": [True, False, "final", " Final ", "every", "true", "false", "bogus", 1, None],
    "checkpoint_dir": ["checkpoints/", "msc://bucket/run"],
    "enabled": [True, False, "yes please"],
    "is_async": [False, True],
    "staging_dir": [None, "/local/stage"],
    "save_every": [5],
    "keep_last": [2],
}


def _automodel_checkpoint(section: dict, peft: bool) -> str | None:
    data = {"recipe": LLM, "model": MODEL, "checkpoint": section}
    if peft:
        data["peft"] = {"dim": 8}
    return oracle.checkpoint_config(data)[1]


def _our_errors(section: dict, peft: bool) -> list[str]:
    recipe = {"recipe": LLM, "model": MODEL, "distributed": {}, "checkpoint": section}
    if peft:
        recipe["peft"] = {"dim": 8}
    report = validate_config(yaml.safe_dump(recipe, sort_keys=False), world_size=8)
    return [f.message for f in report.errors if f.rule == "checkpoint-invalid"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in CHECKPOINT_VALUES.items()}),
    peft=st.booleans(),
)
def test_checkpoint_sections_are_refused_exactly_when_automodel_refuses_them(section: dict, peft: bool) -> None:
    """Every checkpoint: AutoModel's RecipeConfig.checkpoint raises for, and only those, is an error here; the
    exception AutoModel raises first is among the ones named (all are reported, not only the first)."""
    theirs = _automodel_checkpoint(section, peft)
    ours = _our_errors(section, peft)
    assert bool(ours) == (theirs is not None), (section, peft, theirs, ours)
    if theirs is not None:
        kind = theirs.split(":", 1)[0]
        assert any(kind in message for message in ours), (theirs, ours)


def test_checkpoint_errors_name_automodel_texts() -> None:
    for section, text in [
        ({"save_consolidated": "bogus"}, "Unsupported save_consolidated value"),
        ({"model_save_format": "pt"}, "Unsupported model save format"),
        ({"consolidation_timeout_minutes": 0}, "must be greater than 0"),
        ({"allow_legacy_pickle_restore": "yes"}, "must be a boolean"),
        ({"max_recent_checkpoints": 0}, "must be unset or a positive integer"),
    ]:
        theirs = _automodel_checkpoint(section, False)
        assert theirs is not None and text in theirs, theirs
        (ours,) = _our_errors(section, False)
        assert "AutoModel raises" in ours, ours


def test_only_the_keys_automodel_checks_are_errors() -> None:
    source = inspect.getsource(importlib.import_module("nemo_automodel.components.checkpoint.config"))
    post_init = source[source.index("def __post_init__") : source.index("def build(")]
    for key in CHECKED_BY_AUTOMODEL:
        assert f"self.{key}" in post_init, key
    checked_there = {
        name for name in schema.fields(schema.CheckpointOptions) if f"self.{name} " in post_init.split("is_peft")[0]
    }
    assert checked_there <= CHECKED_BY_AUTOMODEL | {"model_cache_dir"}, checked_there


def test_the_recipe_overwrites_the_model_derived_keys() -> None:
    data = {
        "recipe": LLM,
        "model": {**MODEL, "cache_dir": "/models"},
        "checkpoint": {"model_repo_id": "mine/other", "model_cache_dir": "/elsewhere", "is_peft": True},
    }
    config, error, _ = oracle.checkpoint_config(data)
    assert error is None
    assert (config.model_repo_id, config.model_cache_dir, config.is_peft) == ("org/model", "/models", False)
    report = validate_config(yaml.safe_dump({**data, "distributed": {}}), world_size=8)
    assert {f.path for f in report.findings if f.rule == "checkpoint-overwritten"} == {
        f"checkpoint.{k}" for k in schema.CHECKPOINT_FROM_MODEL
    }
    assert set(schema.CHECKPOINT_FROM_MODEL) | {"restore_from"} == {
        "model_repo_id",
        "model_cache_dir",
        "is_peft",
    } | set(schema.CHECKPOINT_READ_APART)
    assert 'kwargs.pop("restore_from", None)' in inspect.getsource(
        importlib.import_module("nemo_automodel.recipes._typed_config").RecipeConfig
    )


@pytest.mark.parametrize(
    "section,peft",
    [
        ({"model_save_format": "torch_save"}, False),
        ({"model_save_format": "torch_save", "save_consolidated": "every"}, False),
        ({"model_save_format": "torch_save", "save_consolidated": False}, False),
        ({"model_save_format": "torch_save"}, True),
        ({"model_save_format": "safetensors"}, False),
    ],
)
def test_torch_save_consolidation_warning_matches_automodel(section: dict, peft: bool) -> None:
    data = {"recipe": LLM, "model": MODEL, "checkpoint": section, **({"peft": {"dim": 8}} if peft else {})}
    config, error, logged = oracle.checkpoint_config(data)
    assert error is None
    ignored = any("is ignored when checkpoint.model_save_format=torch_save" in m for m in logged)
    report = validate_config(yaml.safe_dump({**data, "distributed": {}}), world_size=8)
    ours = [f.message for f in report.findings if f.rule == "checkpoint-torch-save-consolidation"]
    if peft:  # AutoModel's PEFT fallback: safetensors, final
        assert (config.model_save_format.value, config.save_consolidated.value) == ("safetensors", "final")
        assert ours and "falls back to safetensors" in ours[0]
    else:
        assert ignored == bool(ours), (logged, ours)


def test_async_save_on_an_older_torch_is_disabled_by_automodel(monkeypatch) -> None:
    module = importlib.import_module("nemo_automodel.components.checkpoint.config")
    monkeypatch.setattr(module, "_is_geq_torch_2_9", lambda: False)
    config, error, logged = oracle.checkpoint_config({"recipe": LLM, "model": MODEL, "checkpoint": {"is_async": True}})
    assert error is None and config.is_async is False
    assert any("Async mode is only supported for torch >= 2.9.0" in m for m in logged)
    text = yaml.safe_dump({"recipe": LLM, "model": MODEL, "distributed": {}, "checkpoint": {"is_async": True}})
    old = validate_config(text, world_size=8, torch_version="2.8.0")
    new = validate_config(text, world_size=8, torch_version="2.9.0")
    assert [f.rule for f in old.findings if f.rule == "checkpoint-async-torch"] == ["checkpoint-async-torch"]
    assert not [f for f in new.findings if f.rule == "checkpoint-async-torch"]


def test_consolidation_defaults_are_automodels() -> None:
    from nemo_automodel.components.checkpoint import checkpointing

    from automodel_dist.rules import checkpoint

    assert checkpointing._DEFAULT_HF_CONSOLIDATED_SHARD_SIZE_BYTES == checkpoint.SHARD_BYTES
    init = inspect.signature(
        importlib.import_module("nemo_automodel.components.distributed.init_utils").initialize_distributed
    )
    assert init.parameters["timeout_minutes"].default == checkpoint.TRAIN_FT_TIMEOUT_MIN
    source = inspect.getsource(checkpointing)
    assert "consolidate_on_all_ranks" in source and "single_rank_consolidation" in source
    # the output files are dealt out to the ranks round-robin: a model with fewer files than ranks idles the rest
    backport = importlib.import_module("nemo_automodel.components.checkpoint._backports.consolidate_hf_safetensors")
    assert "% world_size" in inspect.getsource(backport.consolidate_safetensors_files_on_every_rank)


def _registry_classes() -> dict[str, type | str]:
    """Every architecture AutoModel 0.7.0 registers: its class, or its module's source where the module needs a
    package not installed here."""
    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING

    out: dict[str, type | str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            for arch, entry in MODEL_ARCH_MAPPING.items():
                module, name = entry[0], entry[1]
                try:
                    out[arch] = getattr(importlib.import_module(module), name)
                except ImportError:
                    out[arch] = (ROOT.parent / (module.replace(".", "/") + ".py")).read_text()
        finally:
            logging.disable(logging.NOTSET)
    return out


def test_the_pipeline_forward_table_is_automodels() -> None:
    keeps = set()
    for arch, cls in _registry_classes().items():
        if isinstance(cls, str):
            assert "_pp_keep_self_forward" not in cls, f"{arch}: cannot import it here to read its flags"
        elif getattr(cls, "_pp_keep_self_forward", False) and not getattr(
            cls, "_pp_return_hidden_states_supported", False
        ):
            keeps.add(arch)
    assert keeps == KEEPS_OWN_PIPELINE_FORWARD


def test_the_logits_to_keep_table_is_automodels() -> None:
    from nemo_automodel.components.utils.model_utils import _supports_logits_to_keep

    lacking = set()
    for arch, cls in _registry_classes().items():
        if isinstance(cls, str):  # the class's own source decides
            if "logits_to_keep" not in cls:
                lacking.add(arch)
            continue
        probe = cls.__new__(cls)  # the check reads the class's forward only
        if not _supports_logits_to_keep(probe):
            lacking.add(arch)
    assert lacking == NO_LOGITS_TO_KEEP


def test_the_vlm_recipe_asks_the_pipeline_object() -> None:
    from nemo_automodel.components.distributed.pipelining.autopipeline import AutoPipeline
    from nemo_automodel.components.utils.model_utils import _supports_logits_to_keep

    assert not _supports_logits_to_keep(AutoPipeline.__new__(AutoPipeline))
    source = (ROOT / "recipes/vlm/finetune.py").read_text()
    assert "if not _supports_logits_to_keep(model) and not isinstance(self.loss_fn, MaskedCrossEntropy)" in source


MOE_TINY = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
PIPELINE_MODELS = [
    ("LlamaForCausalLM", "llama", {}, False),
    ("LlamaForCausalLM", "llama", {}, True),
    ("Qwen3ForCausalLM", "qwen3", {}, False),
    ("Qwen3MoeForCausalLM", "qwen3_moe", MOE_TINY, False),
    ("Qwen3MoeForCausalLM", "qwen3_moe", MOE_TINY, True),
    # its own forward declares hidden-state outputs (_pp_return_hidden_states_supported), patched or not
    ("MiMoV2FlashForCausalLM", "mimo_v2_flash", MOE_TINY, False),
]


@pytest.mark.parametrize("arch,model_type,config,force_hf", PIPELINE_MODELS)
@pytest.mark.parametrize("patch", [True, False])
@pytest.mark.parametrize("loss", ["FusedLinearCrossEntropy", "ChunkedCrossEntropy", "MaskedCrossEntropy"])
def test_the_loss_trained_under_pipeline_parallelism_matches_automodel(arch, model_type, config, force_hf, patch, loss):
    theirs = oracle.pipeline_loss(arch, model_type, config, loss, force_hf=force_hf, patch_causal_lm_model=patch)
    modules = {
        "FusedLinearCrossEntropy": "linear_ce",
        "ChunkedCrossEntropy": "chunked_ce",
        "MaskedCrossEntropy": "masked_ce",
    }
    recipe = {
        "recipe": LLM,
        "model": {"force_hf": True} if force_hf else {},
        "loss_fn": {"_target_": f"nemo_automodel.components.loss.{modules[loss]}.{loss}"},
        "distributed": {"pp_size": 2, "pipeline": {"patch_causal_lm_model": patch}},
    }
    model = {"architectures": [arch], "model_type": model_type, "num_hidden_layers": 4, "hidden_size": 64}
    model |= {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "intermediate_size": 128, **config}
    report = validate_config(yaml.safe_dump(recipe), world_size=4, model=model)
    found = {f.rule: f for f in report.findings if f.rule == "pp-linear-ce-fallback"}
    # the estimate trains what AutoModel trains (the condition both read: rules/fallbacks.py masked_ce_instead)
    instead = masked_ce_instead(loss, LLM, arch, force_hf, 2, {"patch_causal_lm_model": patch})
    assert (instead is not None) is (theirs == "MaskedCrossEntropy" != loss), (theirs, instead)
    if theirs == loss:
        assert not found, (theirs, found)
    elif theirs == "MaskedCrossEntropy":
        assert found and found["pp-linear-ce-fallback"].severity == "warning", theirs
    else:
        assert theirs.startswith("ValueError") and found["pp-linear-ce-fallback"].severity == "error", theirs


def test_recipe_kind_tables_are_automodels() -> None:
    from nemo_automodel.cli.utils import _discover_recipe_classes

    assert set(_discover_recipe_classes()) == kinds.RECIPE_CLASSES
    root = ROOT / "recipes"
    spec_optional = 'if self.cfg.get("distributed", None) is not None'
    seen = set()
    for path in root.glob("llm/train_*.py"):
        text = path.read_text()
        for name in kinds.SPECULATIVE_RECIPES:
            if f"class {name}(" not in text:
                continue
            seen.add(name)
            base = text.split(f"class {name}(")[1].split(")")[0]
            # a subclass of another speculative recipe inherits its setup (ViSpec stage 1 refuses the section)
            assert base in kinds.SPECULATIVE_RECIPES or spec_optional in text, (name, path)
    assert seen == kinds.SPECULATIVE_RECIPES
    diffusion = (root / "diffusion/train.py").read_text()
    assert "Cannot specify both 'fsdp' and 'ddp' configurations" in diffusion
    assert 'self.cfg.get("distributed"' not in diffusion and "cfg.distributed" not in diffusion


# freeze_config values: what AutoModel accepts, what it rejects, and the option earlier versions ignored
_SELECTORS = st.sampled_from(
    [
        [{"path": "model.language_model.embed_tokens"}],
        [{"glob": "*.visual.*"}, {"path": "lm_head"}],
        [],
        [{"path": "a", "glob": "b"}],
        [{}],
        [{"name": "a"}],
        [{"path": ""}],
        [{"glob": 3}],
        ["model.visual"],
        {"path": "model.visual"},
        "model.visual",
    ]
)
_FLAGS = st.sampled_from([True, False, None, "true", 1, 0, "no"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.fixed_dictionaries(
        {},
        optional={
            "freeze_vision_tower": _FLAGS,
            "freeze_audio_tower": _FLAGS,
            "freeze_language_model": _FLAGS,
            "freeze_video_embedder": _FLAGS,
            "freeze_modules": _SELECTORS,
            "unfreeze_modules": _SELECTORS,
            "freeze_embeddings": st.booleans(),
            "freeze_vision": st.booleans(),
        },
    ),
    recipe=st.sampled_from([LLM, "FinetuneRecipeForVLM", "TrainBiEncoderRecipe"]),
)
def test_freeze_configs_are_refused_exactly_when_automodel_refuses_them(section: dict, recipe: str) -> None:
    """Every freeze_config AutoModel raises for, and only those, is an error here (the YAML read by its own loader,
    which turns 'true' into true, then its parse_freeze_config, which the model build calls, ModuleSelector's checks
    included), and every problem is named at once."""
    from nemo_automodel.components.utils.model_utils import parse_freeze_config

    text = yaml.safe_dump({"recipe": recipe, "model": MODEL, "distributed": {}, "freeze_config": section})
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "recipe.yaml"
        path.write_text(text)
        loaded = oracle.load_with_overrides(str(path), []).get("freeze_config").to_dict()
    try:
        parse_freeze_config(loaded)
        theirs = None
    except (TypeError, ValueError) as exc:
        theirs = str(exc)
    ours = [f for f in validate_config(text, world_size=8).errors if f.rule == "freeze-config-invalid"]
    assert bool(ours) == (theirs is not None), (section, theirs, [f.message for f in ours])
    for f in ours:
        assert f.fix and f.line is not None and f.path.startswith("freeze_config"), f


def test_freeze_config_is_checked_only_where_the_recipe_reads_it() -> None:
    """The recipes whose build parses freeze_config (FREEZE_CONFIG_RECIPES) are those whose source passes it on;
    a VLM distillation's teacher_freeze_config is parsed the same way."""
    for name in ("train_ft.py", "train_seq_cls.py"):
        assert "freeze_config" in (ROOT / "recipes" / "llm" / name).read_text()
    assert "freeze_config" in (ROOT / "recipes" / "vlm" / "finetune.py").read_text()
    assert 'self.cfg.get("teacher_freeze_config"' in (ROOT / "recipes" / "vlm" / "kd.py").read_text()
    bad = {"freeze_embeddings": True}
    for recipe, checked in [
        ("KnowledgeDistillationRecipeForVLM", True),
        ("FinetuneRecipeForVLM", True),
        ("TrainEagle3Recipe", False),
    ]:
        data = {"recipe": recipe, "model": MODEL, "distributed": {}, "freeze_config": bad}
        if recipe.startswith("Knowledge"):
            data |= {"teacher_model": MODEL, "teacher_freeze_config": bad}
        found = [
            f.path
            for f in validate_config(yaml.safe_dump(data), world_size=8).errors
            if f.rule == "freeze-config-invalid"
        ]
        expected = ["freeze_config.freeze_embeddings"] if checked else []
        if recipe.startswith("Knowledge"):
            expected.append("teacher_freeze_config.freeze_embeddings")
        assert found == expected, (recipe, found)


@pytest.mark.parametrize(
    "section",
    [
        None,
        {},
        {"freeze_vision_tower": True},
        {"freeze_vision_tower": False},
        {"freeze_modules": [{"path": "language_model"}]},
        {"unfreeze_modules": [{"glob": "lm_*"}], "freeze_vision_tower": True},
        {"freeze_audio_tower": True},
        {"freeze_audio_tower": False, "freeze_vision_tower": False},
    ],
)
def test_the_towers_the_estimate_trains_are_the_ones_automodel_leaves_trainable(section: dict | None) -> None:
    """Workload.train_towers / train_audio (what the estimate trains) against AutoModel's own freezing
    (model_utils.apply_parameter_freezing, which infrastructure._apply_trainability_policy runs for a section and
    skips without one) on a model with a vision tower, an audio tower and a language model."""
    import torch.nn as nn
    from nemo_automodel.components.utils.model_utils import apply_parameter_freezing

    policy = (ROOT / "_transformers" / "infrastructure.py").read_text()  # not imported: it needs torchao
    assert "    if freeze_config is not None:\n        apply_parameter_freezing(model, freeze_config" in policy

    from automodel_dist.workload import read_workload

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = nn.Linear(2, 2)
            self.audio_tower = nn.Linear(2, 2)
            self.language_model = nn.Linear(2, 2)
            self.lm_head = nn.Linear(2, 2)

    model = Tiny()
    if section is not None:
        apply_parameter_freezing(model, section, strict=True)
    recipe = {"recipe": "FinetuneRecipeForVLM", "model": MODEL} | (
        {} if section is None else {"freeze_config": section}
    )
    w = read_workload(recipe)
    assert w.train_towers == model.visual.weight.requires_grad, section
    assert w.train_audio == model.audio_tower.weight.requires_grad, section
