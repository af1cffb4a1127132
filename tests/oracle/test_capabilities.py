"""The capability table against AutoModel 0.7.0 itself: the committed ``capabilities.json`` is what
``tools/gen_capabilities.py`` generates from the installed AutoModel, and for every architecture of its registry (and
every Hugging Face class it builds otherwise) the engine's verdict on tp/pp/ep/cp equals what AutoModel's
``validate_for_mesh`` decides for the class."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest

from automodel_dist import validate_config
from automodel_dist.catalog.implementations import implementations, registered, table_versions
from automodel_dist.catalog.models import ModelSpec
from support.paths import ROOT

pytest.importorskip("nemo_automodel")
pytest.importorskip("einops")

GEN = ROOT / "tools" / "gen_capabilities.py"
SETTINGS = {"tp": {"tp_size": 2}, "pp": {"pp_size": 2, "pipeline": {}}, "ep": {"ep_size": 2}, "cp": {"cp_size": 2}}
GATE_RULES = {"model-capability", "model-cp-backend"}


@cache
def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("gen_capabilities", GEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not module._quiet(): it disables logging for the tests that follow
    import torch

    torch.cuda.current_device = lambda: 0  # some classes build torch.device(f"cuda:{...}") at import
    return module


def test_the_committed_table_is_what_the_generator_makes_from_automodel() -> None:
    done = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    from importlib.metadata import version

    assert table_versions() == {"nemo_automodel": version("nemo_automodel"), "transformers": version("transformers")}


def test_the_table_has_every_architecture_of_automodels_registry() -> None:
    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING

    assert len(MODEL_ARCH_MAPPING) == 71  # the issue said 68; AutoModel 0.7.0's registry maps 71 names
    assert {a for a in implementations() if registered(a)} == set(MODEL_ARCH_MAPPING)
    for arch, entry in MODEL_ARCH_MAPPING.items():
        assert implementations()[arch].module == entry[0]


def _cls(arch: str) -> type:
    import importlib

    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING

    if arch in MODEL_ARCH_MAPPING:
        module, name = MODEL_ARCH_MAPPING[arch][0], MODEL_ARCH_MAPPING[arch][1]
        return getattr(importlib.import_module(module), name)
    import transformers

    return getattr(transformers, arch)


def _automodel_refuses(arch: str, what: str, *, hybrid: bool, attn: str) -> bool:
    """Whether AutoModel's validate_for_mesh raises for ``what`` at size 2 on its class for ``arch``."""
    from nemo_automodel._transformers.capabilities import validate_for_mesh

    gen = _gen()
    cls = _cls(arch)
    shell = gen._shell(cls, gen._configs(arch)["hybrid" if hybrid else "plain"], attn)
    sizes = {"tp_size": 1, "pp_size": 1, "cp_size": 1, "ep_size": 1} | {f"{what}_size": 2}
    try:
        validate_for_mesh(shell, SimpleNamespace(**sizes))
    except ValueError:
        return True
    return False


def _spec(arch: str, *, hybrid: bool) -> ModelSpec:
    """A small MoE model of ``arch`` (so ep is a question of the class), hybrid (Gated DeltaNet layers) or not."""
    return ModelSpec(
        name=f"tiny-{arch}",
        hidden_size=256,
        num_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=512,
        vocab_size=1024,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=128,
        layer_attention=("linear", "linear", "linear", "full") * 2 if hybrid else (),
        linear_key_heads=8 if hybrid else 0,
        linear_value_heads=8 if hybrid else 0,
        linear_key_dim=32 if hybrid else 0,
        linear_value_dim=32 if hybrid else 0,
        architecture=arch,
    )


def _we_refuse(arch: str, what: str, *, hybrid: bool, attn: str | None) -> bool:
    recipe = {"model": {"backend": {"attn": attn}} if attn else {}, "distributed": dict(SETTINGS[what])}
    report = validate_config(recipe, world_size=8, model=_spec(arch, hybrid=hybrid))
    return any(
        f.rule in GATE_RULES and "passes its capability check" not in f.message and f"{what}_size" in f.message
        for f in report.errors
    )


CASES = [
    pytest.param(arch, what, hybrid, attn, id=f"{arch}-{what}{'-hybrid' if hybrid else ''}-{attn}")
    for arch in sorted(implementations())
    for what in SETTINGS
    for hybrid in ((False, True) if what == "cp" else (False,))
    for attn in (("te", "sdpa") if what == "cp" and implementations()[arch].custom else ("te",))
    # DeepSeek-V4's CP gate reads model_type == deepseek_v4 from a real config: test_deepseek_v4_... below
    if not (arch.startswith("DeepseekV4") and what == "cp")
]


@pytest.mark.parametrize("arch,what,hybrid,attn", CASES)
def test_verdicts_match_validate_for_mesh(arch: str, what: str, hybrid: bool, attn: str) -> None:
    """tp/pp/ep/cp 2 on every tabled class: AutoModel's own gate decides, the engine must say the same."""
    assert _we_refuse(arch, what, hybrid=hybrid, attn=attn) == _automodel_refuses(
        arch, what, hybrid=hybrid, attn=attn
    ), (arch, what, hybrid, attn)


@pytest.mark.parametrize("arch", ["DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM"])
def test_deepseek_v4_context_parallelism_needs_tilelang(arch: str) -> None:
    """The classes whose CP gate reads the config's model_type: checked on their own config."""
    from nemo_automodel._transformers.capabilities import validate_for_mesh

    gen = _gen()
    cls = _cls(arch)
    refused = {}
    for attn in ("te", "sdpa", "tilelang"):
        shell = gen._shell(cls, SimpleNamespace(model_type="deepseek_v4", architectures=[arch]), attn)
        try:
            validate_for_mesh(shell, SimpleNamespace(tp_size=1, pp_size=1, cp_size=2, ep_size=1))
            theirs = False
        except ValueError:
            theirs = True
        assert _we_refuse(arch, "cp", hybrid=False, attn=attn) == theirs, attn
        refused[attn] = theirs
    # model.backend.attn unset: BackendConfig's default is te with TE on CUDA, sdpa otherwise; an error when both fail
    assert _we_refuse(arch, "cp", hybrid=False, attn=None) == (refused["te"] and refused["sdpa"])
