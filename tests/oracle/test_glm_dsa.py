"""GLM-5.2's TileLang DSA kernels as the dry run stands them in (stack/glm_dsa.py): AutoModel's own vendored
autograd Functions run around the stand-ins, which take each kernel interface's arguments and return what it returns,
with the dtypes and shapes its kernels write (the vendored interfaces' allocations, read from their source)."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import glm_dsa  # noqa: E402

KERNELS = "nemo_automodel.components.models.glm_moe_dsa.kernels"


def _interfaces():
    import importlib

    return {
        "indexer_fwd_interface": importlib.import_module(f"{KERNELS}.tilelang_indexer_fwd").indexer_fwd_interface,
        "indexer_bwd_interface": importlib.import_module(f"{KERNELS}.tilelang_indexer_bwd").indexer_bwd_interface,
        "sparse_mla_fwd_interface": importlib.import_module(
            f"{KERNELS}.tilelang_sparse_mla_fwd"
        ).sparse_mla_fwd_interface,
        "sparse_mla_bwd": importlib.import_module(f"{KERNELS}.tilelang_sparse_mla_bwd").sparse_mla_bwd,
    }


@pytest.mark.parametrize("name", sorted(_interfaces()))
def test_each_stand_in_takes_the_interfaces_arguments(name):
    real = inspect.signature(_interfaces()[name]).parameters
    ours = inspect.signature(getattr(glm_dsa, name)).parameters
    named = [p for p in ours if ours[p].kind is not inspect.Parameter.VAR_KEYWORD]
    assert named == list(real)[: len(named)]
    assert all(ours[p].default == real[p].default for p in named if real[p].default is not inspect.Parameter.empty)


def test_automodels_functions_run_around_the_stand_ins_with_the_kernels_shapes():
    """The indexer: fp32 logits over every query's window, top-k indices [T, topk] int32, gradients for q, k and the
    head weights; sparse MLA on the absorbed latent (576 wide): its output [T, H, 512] in q's dtype and fp32
    log-sum-exp, gradients like q and kv."""
    from nemo_automodel.components.models.glm_moe_dsa.kernels.indexer import IndexerFunction
    from nemo_automodel.components.models.glm_moe_dsa.kernels.sparse_mla import SparseMLA

    t, heads, dim, topk = 64, 4, 32, 16
    q = torch.randn(t, heads, dim, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(t, dim, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(t, heads, dtype=torch.float32, requires_grad=True)
    starts, ends = torch.zeros(t, dtype=torch.int32), torch.arange(1, t + 1, dtype=torch.int32)
    with glm_dsa.stood_in():
        scores, indices = IndexerFunction.apply(q, k, w, starts, ends, topk, None)
        assert scores.shape == (t, topk) and scores.dtype == torch.float32
        assert indices.shape == (t, topk) and indices.dtype == torch.int32
        scores.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and w.grad.shape == w.shape

        mla_q = torch.randn(t, 8, 576, dtype=torch.bfloat16, requires_grad=True)
        kv = torch.randn(t, 1, 576, dtype=torch.bfloat16, requires_grad=True)
        out, lse = SparseMLA.apply(mla_q, kv, indices.unsqueeze(1), 0.1)
        assert out.shape == (t, 8, 512) and out.dtype == torch.bfloat16
        assert lse.shape == (t, 8) and lse.dtype == torch.float32
        out.float().sum().backward()
        assert mla_q.grad.shape == mla_q.shape and kv.grad.shape == kv.shape and kv.grad.dtype == torch.bfloat16


def test_the_stand_ins_are_unbound_after_the_block():
    import nemo_automodel.components.models.glm_moe_dsa.kernels.indexer as indexer
    import nemo_automodel.components.models.glm_moe_dsa.optimized_kernels as optimized

    before = (indexer.indexer_fwd_interface, optimized.HAS_TILELANG)
    with glm_dsa.stood_in():
        assert indexer.indexer_fwd_interface is glm_dsa.indexer_fwd_interface and optimized.HAS_TILELANG
    assert (indexer.indexer_fwd_interface, optimized.HAS_TILELANG) == before
