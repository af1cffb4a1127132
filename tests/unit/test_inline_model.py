"""A recipe that writes its model out in ``model.config`` (a transformers config class's ``_target_`` and its fields,
as from_config recipes do) is sized from those fields: the model type read from the class's module path, never
imported."""

from __future__ import annotations

import pytest

from automodel_dist import estimate_memory, validate_config

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


def _recipe(config: dict) -> dict:
    return {
        "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config", "config": config},
        "distributed": {"strategy": "fsdp2", "ep_size": 2},
        "step_scheduler": {"global_batch_size": 8, "local_batch_size": 1},
    }


def test_the_model_written_out_in_the_recipe_is_sized_as_transformers_builds_it():
    recipe = _recipe({"_target_": TARGET, **FIELDS})
    report = validate_config(recipe, world_size=8)
    found = [f for f in report.findings if f.rule == "model-from-recipe"]
    assert found and found[0].path == "model.config" and "qwen3_moe" in found[0].message
    est = estimate_memory(recipe, world_size=8, seq_len=256)
    assert est.model == "qwen3_moe (model.config)"
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**FIELDS))
    from automodel_dist.catalog.models import from_hf_config

    spec = from_hf_config({**FIELDS, "model_type": "qwen3_moe"})
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()


@pytest.mark.parametrize(
    "target",
    [
        "transformers.Qwen3MoeConfig",
        "my_package.configs.Qwen3MoeConfig",
        "transformers.models.qwen3_moe.Qwen3MoeConfig",
    ],
)
def test_a_config_class_whose_model_type_cannot_be_read_off_its_path_names_no_model(target):
    report = validate_config(_recipe({"_target_": target, **FIELDS}), world_size=8)
    assert not any(f.rule == "model-from-recipe" for f in report.findings)
    # ... unless the fields say it themselves
    report = validate_config(_recipe({"_target_": target, "model_type": "qwen3_moe", **FIELDS}), world_size=8)
    assert any(f.rule == "model-from-recipe" for f in report.findings)
