"""DeepSeek-V4's hyper-connection Sinkhorn as the dry run stands it in (stack/dsv4_tilelang.py): with backend.attn
tilelang, AutoModel's layers ask for the Sinkhorn backend ``auto``, which on a GPU with TileKernels installed (its
cuda extra pins tile-kernels 1.0.0) runs AutoModel's own ``_Dsv4TileKernelsSinkhorn`` Function around TileKernels'
kernels. The stand-ins let that Function run as written on CPU tensors: it saves only its input, where the torch
reference the CPU would otherwise run keeps every iteration."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import dsv4_tilelang  # noqa: E402

OPTIMIZED = "nemo_automodel.components.models.deepseek_v4.optimized_kernels"


def _saved(fn, x):
    """What autograd keeps from ``fn(x)``: each saved tensor once (by storage), and the output."""
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.setdefault(id(t.untyped_storage()), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    return list(kept.values()), out


def _normalize(backend: str):
    import importlib

    optimized = importlib.import_module(OPTIMIZED)
    return lambda x: optimized.dsv4_sinkhorn_normalize(x, backend=backend, repeat=20, eps=1e-6)


def test_the_tilelang_sinkhorn_runs_automodels_function_keeping_only_its_input():
    """backend auto under the stand-ins: AutoModel's Function (its node in the graph), the two kernels called once
    each, the input the one tensor kept (fp32 [n, m, m]), the output and the input's gradient shaped like it."""
    calls = []
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    before = dsv4_tilelang.on_sinkhorn_call
    with dsv4_tilelang.stood_in():
        dsv4_tilelang.on_sinkhorn_call = lambda: calls.append(1)
        try:
            saved, out = _saved(_normalize("auto"), x)
            assert type(out.grad_fn).__name__ == "_Dsv4TileKernelsSinkhornBackward"
            assert out.shape == x.shape and out.dtype == torch.float32
            assert len(calls) == 1
            out.sum().backward()
            assert len(calls) == 2
        finally:
            dsv4_tilelang.on_sinkhorn_call = before
    assert x.grad is not None and x.grad.shape == x.shape
    assert len(saved) == 1 and saved[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert saved[0].shape == (16, 4, 4)


def test_the_torch_reference_the_cpu_runs_otherwise_keeps_every_iteration():
    """Without the stand-ins (no TileKernels here) the same call takes the torch reference: its 20 iterations keep
    their ratios and sums (about 50 times the input's bytes), through about 120 operators forward and 320 backward:
    what the dry run ran on CPU before."""
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    saved, out = _saved(_normalize("auto"), x)
    assert type(out.grad_fn).__name__ == "DivBackward0"
    kept = sum(t.numel() * t.element_size() for t in saved)
    assert kept >= 45 * x.numel() * x.element_size()


def test_the_stand_ins_are_bound_only_for_the_block():
    import importlib

    optimized = importlib.import_module(OPTIMIZED)
    before = optimized.is_dsv4_kernel_available("sinkhorn")
    with dsv4_tilelang.stood_in():
        assert optimized.is_dsv4_kernel_available("sinkhorn")
        assert optimized._tile_kernels_sinkhorn_fwd is dsv4_tilelang.sinkhorn_fwd
    assert optimized.is_dsv4_kernel_available("sinkhorn") == before
