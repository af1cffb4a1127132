"""FFPA's CuTeDSL kernels as the dry run stands them in (stack/ffpa.py): AutoModel's own wrappers
(components/attention/ffpa_attention.py) run around the stand-ins, which take the arguments those wrappers pass and
return the shapes and dtypes their docstrings give for the kernels' outputs."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import ffpa  # noqa: E402


def test_automodels_wrappers_run_around_the_stand_ins_with_the_kernels_shapes():
    """Dense (SDPA layout, GQA: 8 query heads over 4 key heads, head_dim 512 as Gemma-4's global layers): out like q
    with v's width, fp32 lse [B, Hq, S], gradients like q, k, v. Varlen (packed THD): out [T, Hq, Dv], fp32 lse
    [Hq, T]."""
    import importlib.util

    from nemo_automodel.components.attention import ffpa_attention as f

    before = sys.modules.get("ffpa_attn")
    with ffpa.stood_in():
        assert f._ffpa_low_level_ready() and f._ffpa_varlen_ready()
        q = torch.randn(2, 8, 64, 512, dtype=torch.bfloat16)
        k = torch.randn(2, 4, 64, 512, dtype=torch.bfloat16)
        out, lse = f._ffpa_dense_fwd(q, k, k, scale=0.05, causal=True)
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 64) and lse.dtype == torch.float32
        grads = f._ffpa_dense_bwd(out, q, k, k, out, lse, scale=0.05, causal=True)
        assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]

        qp, kp = torch.randn(96, 8, 512, dtype=torch.bfloat16), torch.randn(96, 4, 512, dtype=torch.bfloat16)
        cu = torch.tensor([0, 40, 96], dtype=torch.int32)
        out, lse = f._ffpa_varlen_fwd(qp, kp, kp, cu, cu, 56, 56, scale=0.05, causal=True)
        assert out.shape == qp.shape and out.dtype == torch.bfloat16
        assert lse.shape == (8, 96) and lse.dtype == torch.float32
        grads = f._ffpa_varlen_bwd(out, qp, kp, kp, out, lse, cu, cu, 56, 56, scale=0.05, causal=True)
        assert [g.shape for g in grads] == [qp.shape, kp.shape, kp.shape]
    assert sys.modules.get("ffpa_attn") is before  # what was there before, after the block
    if before is None and importlib.util.find_spec("ffpa_attn") is None:  # (here: no real package)
        assert not f._ffpa_low_level_ready() and "ffpa_attn" not in sys.modules


def test_the_stand_ins_work_on_fake_tensors():
    from nemo_automodel.components.attention import ffpa_attention as f
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with ffpa.stood_in(), FakeTensorMode():
        q = torch.empty(1, 8, 2048, 512, dtype=torch.bfloat16)
        out, lse = f._ffpa_dense_fwd(q, q, q, scale=0.05, causal=True)
        assert isinstance(out, FakeTensor) and out.shape == q.shape and lse.dtype == torch.float32
