"""The pydantic schema mirrors AutoModel 0.7.0's dataclasses: same fields, same defaults."""

from __future__ import annotations

import dataclasses

import pytest

from automodel_dist.config import schema
from automodel_dist.config.values import SCHEDULES, dtype_name
from support import oracle
from support.builders import torch_version

pytestmark = pytest.mark.skipif(not oracle.AVAILABLE, reason="AutoModel oracle not installed")

# activation_checkpointing is a field of the strategy dataclasses but AutoModel pops it from the
# YAML block before building them (it becomes a top-level setting), so it is not an option here.
POPPED = {"activation_checkpointing"}


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _plain(value):
    import torch

    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value):  # fields a newer torch added are compared in their own test
        later = schema.TORCH_LATER_FIELDS.get(type(value).__name__, {})
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in later}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "param_dtype"):  # MixedPrecisionPolicy
        return {
            k: _plain(getattr(value, k)) for k in ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
        }
    return value


def _pairs():
    from nemo_automodel.components.checkpoint.config import CheckpointingConfig
    from nemo_automodel.components.distributed import config as amc
    from nemo_automodel.components.distributed.cp_vision_frame_shard import CpVisionFrameShardingConfig
    from nemo_automodel.components.distributed.pipelining.config import PipelineConfig

    return [
        (schema.FSDP2Options, amc.FSDP2Config),
        (schema.MegatronFSDPOptions, amc.MegatronFSDPConfig),
        (schema.DDPOptions, amc.DDPConfig),
        (schema.PipelineConfig, PipelineConfig),
        (schema.MoEConfig, amc.MoEParallelizerConfig),
        (schema.Multimodal, amc.MultimodalDistributedConfig),
        (schema.MultimodalVision, amc.MultimodalVisionConfig),
        (schema.FrameSharding, CpVisionFrameShardingConfig),
        (schema.CheckpointOptions, CheckpointingConfig),
    ]


@pytest.mark.parametrize("index", range(9))
def test_fields_and_defaults_match_automodel(index):
    ours, theirs = _pairs()[index]
    their_fields = {f.name: f for f in dataclasses.fields(theirs)} if dataclasses.is_dataclass(theirs) else {}
    expected = set(their_fields) - POPPED
    assert set(ours.model_fields) == expected
    for name, f in their_fields.items():
        if name in POPPED:
            continue
        mine = schema.field_default(ours, name)
        assert _plain(mine) == _plain(_default(f)), name


def test_mixed_precision_yaml_defaults_match_automodel():
    # A YAML mp_policy mapping gets torch's defaults with cast_forward_inputs defaulted to False.
    from nemo_automodel.recipes._dist_utils import parse_distributed_section

    parsed = parse_distributed_section({"mp_policy": {}})
    assert _plain(parsed["strategy_config"].mp_policy) == schema.MixedPrecisionPolicy().model_dump()


def _torch_at_least(version: str) -> bool:
    return torch_version() >= tuple(int(x) for x in version.split("."))


def test_torch_later_fields_are_what_the_installed_torch_adds():
    import inspect

    from torch.distributed.fsdp import MixedPrecisionPolicy

    theirs = set(inspect.signature(MixedPrecisionPolicy).parameters)
    ours = set(schema.MixedPrecisionPolicy.model_fields)
    later = schema.TORCH_LATER_FIELDS["MixedPrecisionPolicy"]
    assert ours <= theirs
    assert theirs - ours == {k for k, since in later.items() if _torch_at_least(since)}


def test_torch_later_field_verdict():
    # Rejected on torch < 2.15 (the reference, 2.13, included); accepted by AutoModel on a newer torch, where our
    # error says so (the tool does not know the cluster's torch).
    from automodel_dist import validate_config

    block = {"mp_policy": {"param_dtype": "bf16", "param_dtype_override_fn": None}}
    o = oracle.run(block, 8, [0])
    assert o.ok == _torch_at_least("2.15")
    if not o.ok:
        assert "unexpected keyword argument 'param_dtype_override_fn'" in (o.error or "")
    (f,) = validate_config({"distributed": block}, world_size=8).errors
    assert (f.rule, f.path) == ("mp-policy-invalid", "distributed.mp_policy.param_dtype_override_fn")
    assert "only from torch 2.15" in f.message


def test_dtype_names_match_automodel():
    import torch
    from nemo_automodel.shared.utils import dtype_from_str

    for spelling in [
        "bf16",
        "BF16",
        "bfloat16",
        "torch.bfloat16",
        "float",
        "float32",
        "half",
        "fp16",
        "fp8",
        "float64",
        "double",
        "int",
        "long",
        "bool",
        "torch.float16",
        "Float32",
        "nonsense",
    ]:
        try:
            theirs = str(dtype_from_str(spelling)).removeprefix("torch.")
        except KeyError:
            theirs = None
        assert dtype_name(spelling) == theirs, spelling
    assert torch.bfloat16 is not None


def test_schedule_names_match_torch():
    from torch.distributed.pipelining.schedules import get_schedule_class

    for lower, name in SCHEDULES.items():
        assert get_schedule_class(lower).__name__ in (f"Schedule{name}", name)


def _recipe_classes() -> dict[str, tuple[str, list[str]]]:
    """AutoModel 0.7.0's recipe classes: name -> (source text, base names), read with ast (nothing imported)."""
    import ast
    import importlib.util
    from pathlib import Path

    root = Path(importlib.util.find_spec("nemo_automodel").origin).parent / "recipes"
    out = {}
    for py in root.rglob("*.py"):
        text = py.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and "Recipe" in node.name:
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                out[node.name] = (ast.get_source_segment(text, node) or "", bases)
    return out


def _with_subclasses(roots: set[str], classes: dict[str, tuple[str, list[str]]]) -> set[str]:
    found = set(roots)
    while True:
        more = {n for n, (_, bases) in classes.items() if set(bases) & found} - found
        if not more:
            return found
        found |= more


def test_recipe_tables_match_automodel_source():
    from nemo_automodel.cli.utils import _discover_recipe_classes

    from automodel_dist.rules import recipe

    assert set(_discover_recipe_classes()) == recipe.RECIPE_CLASSES
    classes = _recipe_classes()
    assert "Pipeline parallelism is not supported" in classes["FinetuneRecipeForMultimodal"][0]
    assert "Encoder does not support pipeline parallelism" in classes["TrainBiEncoderRecipe"][0]
    assert _with_subclasses({"FinetuneRecipeForMultimodal", "TrainBiEncoderRecipe"}, classes) == recipe.NO_PP_RECIPES
    ft = classes["TrainFinetuneRecipeForNextTokenPrediction"][0]
    assert "domain_mixture does not currently support pipeline parallelism" in ft
    assert "embedding_row_repair is not currently supported with pipeline parallelism" in ft
    assert _with_subclasses({"TrainFinetuneRecipeForNextTokenPrediction"}, classes) == recipe.TRAIN_FT_RECIPES
