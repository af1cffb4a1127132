"""The AutoModel facts the pure estimate copies (it imports no AutoModel) held to AutoModel 0.7.0's own code: the
expert-bias chunk threshold, the classes that weight their experts' outputs after the down projection, the token
dispatchers the dry run stands in for and Liger's default."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest

from automodel_dist.catalog.kernels import LOCAL_DISPATCHERS
from automodel_dist.estimate.memory import _ROUTER_AFTER_DOWN, EXPERT_BIAS_CHUNK_ROWS

pytest.importorskip("nemo_automodel")


def test_the_expert_bias_chunk_threshold_is_automodels():
    from nemo_automodel.components.moe import experts

    assert experts._BIAS_CHUNK_THRESHOLD == EXPERT_BIAS_CHUNK_ROWS


def test_the_classes_weighting_after_the_down_projection_say_so_in_their_moe_config():
    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING

    for arch in _ROUTER_AFTER_DOWN:
        module, _ = MODEL_ARCH_MAPPING[arch]
        package = Path(inspect.getfile(importlib.import_module(module))).parent  # a VLM wrapper's text model too
        source = "".join(f.read_text(encoding="utf-8") for f in sorted(package.glob("*.py")))
        assert re.search(r"apply_router_weight_after_down\s*=\s*True", source), arch


def test_the_dispatchers_the_dry_run_keeps_local_are_backend_choices():
    from nemo_automodel.components.models.common.utils import BackendConfig

    choices = set(typing.get_args(typing.get_type_hints(BackendConfig)["dispatcher"]))
    assert LOCAL_DISPATCHERS < choices and "torch" in choices
