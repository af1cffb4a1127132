"""What the dry run and the smoke run hand AutoModel as model.backend (stack/recipe.py, torch-free): a sparse-attention
backend whose kernels the dry run stands in stays as the recipe wrote it on that class, and nowhere else; every other
flash-like attention runs as the TE stand-in (dry run) or torch's SDPA (smoke run)."""

from __future__ import annotations

import pytest

from automodel_dist.stack.recipe import backend_for
from automodel_dist.workload import read_workload


def _backend(attn: str, architecture: str, *, values: bool = False) -> tuple[str | None, list[str]]:
    w = read_workload({"model": {"backend": {"attn": attn}}})
    out: list[str] = []
    backend = backend_for(w, moe=True, custom=True, out=out, values=values, architecture=architecture)
    return backend.get("attn"), out


@pytest.mark.parametrize(
    ("attn", "architecture", "values", "expected", "named"),
    [
        ("cudnn", "GlmMoeDsaForCausalLM", False, "cudnn", "stack/glm_cudnn_dsa.py"),
        ("tilelang", "GlmMoeDsaForCausalLM", False, "tilelang", "stack/glm_dsa.py"),
        ("tilelang", "DeepseekV4ForCausalLM", False, "tilelang", "stack/dsv4_tilelang.py"),
        # the smoke run computes attention on the CPU: torch's SDPA, whatever the class
        ("cudnn", "GlmMoeDsaForCausalLM", True, "sdpa", "runs as sdpa"),
        # cuDNN's fused attention on the other classes keeps what a flash kernel keeps: the TE stand-in
        ("cudnn", "Qwen3MoeForCausalLM", False, "te", "stack/te_attention.py"),
        ("cudnn", "DeepseekV4ForCausalLM", False, "te", "stack/te_attention.py"),
    ],
)
def test_a_stood_in_sparse_attention_backend_stays_only_on_its_class(attn, architecture, values, expected, named):
    got, said = _backend(attn, architecture, values=values)
    assert got == expected
    assert any(named in line for line in said), said
