"""A recipe that writes its model out in ``model.config`` (a transformers config class's ``_target_`` and its fields,
as from_config recipes do) is sized from those fields: the model type read from the class's module path, never
imported."""

from __future__ import annotations

import pytest

from automodel_dist import estimate_memory, validate_config
from automodel_dist.api import NO_MODEL, _recipe_inline_config
from automodel_dist.catalog.models import from_hf_config

FIELDS = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}
TARGET = "transformers.models.qwen3_moe.configuration_qwen3_moe.Qwen3MoeConfig"


def _recipe(config: object) -> dict:
    return {
        "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config", "config": config},
        "distributed": {"strategy": "fsdp2", "ep_size": 2},
        "step_scheduler": {"global_batch_size": 8, "local_batch_size": 1},
    }


def test_the_model_written_out_in_the_recipe_is_sized_as_transformers_builds_it():
    recipe = _recipe({"_target_": TARGET, "_recursive_": False, **FIELDS})
    report = validate_config(recipe, world_size=8)
    found = [f for f in report.findings if f.rule == "model-from-recipe"]
    assert found and found[0].path == "model.config" and "qwen3_moe" in found[0].message
    est = estimate_memory(recipe, world_size=8, seq_len=256)
    assert est.model == "qwen3_moe (model.config)" and "model.config" in est.model_source
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**FIELDS))
    # the recipe's own resolution: its parameters are the transformers class's (no LoRA: all trainable)
    assert est.trainable_params == sum(p.numel() for p in model.parameters())
    # Hydra's own keys are instructions to it, not fields
    assert _recipe_inline_config(recipe) == {**FIELDS, "model_type": "qwen3_moe"}


@pytest.mark.parametrize(
    "target",
    [
        "transformers.Qwen3MoeConfig",
        "my_package.configs.Qwen3MoeConfig",
        "transformers.models.qwen3_moe.Qwen3MoeConfig",
        # another class of the module: the path would say gemma3 where the class is gemma3_text's
        "transformers.models.gemma3.configuration_gemma3.Gemma3TextConfig",
    ],
)
def test_a_config_class_whose_model_type_cannot_be_read_off_its_path_says_what_to_add(target):
    report = validate_config(_recipe({"_target_": target, **FIELDS}), world_size=8)
    assert not any(f.rule == "model-from-recipe" for f in report.findings)
    why = _recipe_inline_config(_recipe({"_target_": target, **FIELDS}))
    assert isinstance(why, str) and "add model_type" in why and report.model_checks_skipped == why
    # ... unless the fields say it themselves
    report = validate_config(_recipe({"_target_": target, "model_type": "qwen3_moe", **FIELDS}), world_size=8)
    assert any(f.rule == "model-from-recipe" for f in report.findings)


@pytest.mark.parametrize(
    "config",
    [None, "Qwen/Qwen3-30B-A3B", {"hidden_size": 2048}, {"_target_": 3, **FIELDS}],
)
def test_no_written_out_model_is_no_model(config):
    assert _recipe_inline_config(_recipe(config)) is None
    assert validate_config(_recipe(config), world_size=8).model_checks_skipped == NO_MODEL


@pytest.mark.parametrize("model_type", [None, 3, "", "  "])
def test_a_model_type_that_is_not_a_name_is_refused(model_type):
    why = _recipe_inline_config(
        _recipe({"_target_": "transformers.Qwen3MoeConfig", "model_type": model_type, **FIELDS})
    )
    assert isinstance(why, str) and "does not name its model type" in why


def test_a_written_out_model_missing_its_sizes_is_skipped_with_the_parsers_reason():
    recipe = _recipe({"_target_": TARGET, "vocab_size": 1000})
    report = validate_config(recipe, world_size=8)
    assert not any(f.rule == "model-from-recipe" for f in report.findings)
    assert report.model_checks_skipped.startswith("model.config: ") and "hidden_size" in report.model_checks_skipped
    with pytest.raises(Exception, match="hidden_size"):
        from_hf_config(_recipe_inline_config(recipe))
