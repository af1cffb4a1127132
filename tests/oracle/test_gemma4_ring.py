"""Gemma-4's context-parallel ring attention (AutoModel's gemma4_moe/cp_attention.py, the path its dense and MoE
classes take under CP) run as AutoModel wrote it on a fake process group and fake tensors, with the dry run's stand-in
for ``torch.compile(flex_attention)`` (stack/flex_attention.py) in place of the compiled kernel: the ring's p2p K/V
rotation, per-chunk masks, online-softmax merge and its backward's recompute all run. The estimate's term for the
ring's backward (estimate/memory.py, ring_chunks_backward_bytes) is held to the peak torch's MemTracker measures
there, for global and sliding layers across CP sizes, local lengths and KV head counts, with q, k and v laid out as
Gemma-4's attention hands them to SDPA."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("nemo_automodel")
pytest.importorskip("torch")

RING = r"""
import json, math, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed._tools.mem_tracker import MemTracker
import nemo_automodel.components.models.gemma4_moe.cp_attention as ring
from automodel_dist.stack import flex_attention

calls = []
flex_attention.on_call = lambda: calls.append(1)
ring._compiled_flex_attention = lambda module: flex_attention.flex_attention
# the ring asks whether any query row is empty (padding): these sequences are full
table = fake_impls.op_implementations_dict
table[torch.ops.aten._local_scalar_dense.default] = table[torch.ops.aten.item.default] = lambda *a: False
out = []
for cp, local, heads, kv_heads, head_dim, window in json.loads(sys.argv[1]):
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=cp, store=FakeStore())
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    module = torch.nn.Module()
    module.sliding_window = window
    ring.attach_gemma4_cp_ring_attention(module)
    with FakeTensorMode(allow_non_fake_inputs=True):
        # as Gemma-4's attention hands them to SDPA (transformers' Gemma4TextAttention and sdpa_attention_forward):
        # q, k and v transposed views of [batch, seq, heads, dim]; past 256 wide SDPA's GQA is off and the keys and
        # values come repeated to every query head (repeat_kv: contiguous)
        q = torch.empty(1, local, heads, head_dim, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        if head_dim > 256:
            k = torch.empty(1, heads, local, head_dim, dtype=torch.bfloat16, requires_grad=True)
            v = torch.empty(1, heads, local, head_dim, dtype=torch.bfloat16, requires_grad=True)
        else:
            k = torch.empty(1, local, kv_heads, head_dim, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
            v = torch.empty(1, local, kv_heads, head_dim, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        module._cp_manual_metadata = {"_packed_seq_ids": torch.ones(1, local, dtype=torch.long)}
        tracker = MemTracker()
        tracker.track_external(q, k, v)
        with tracker:
            o = ring._gemma4_cp_manual_attention(
                module, q, k, v, cp_mesh=mesh, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                enable_gqa=True, kwargs={},
            )
            grads = torch.autograd.grad(o, [q, k, v], torch.empty_like(o))
        peak = sum(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values())
    chunks = cp if window is None else 1 + min(cp - 1, math.ceil(window / local))
    out.append({"peak": peak, "chunks": chunks, "out": list(o.shape), "dtype": str(o.dtype),
                "grads": [list(g.shape) for g in grads], "flex_calls": len(calls)})
    calls.clear()
print(json.dumps(out))
"""

# (cp, local tokens, query heads, KV heads, head dim, sliding window or None): Gemma-4-31B's global layers (32 x 512,
# 4 KV heads) and sliding ones (16 KV heads of 256, window 1,024), and E4B-like narrower shapes
CASES = [
    (2, 2048, 32, 4, 512, None),
    (8, 2048, 32, 4, 512, None),
    (16, 2048, 32, 4, 512, None),
    (8, 4096, 32, 4, 512, None),
    (16, 4096, 8, 2, 512, None),
    (8, 2048, 32, 16, 256, 1024),
    (8, 512, 32, 16, 256, 1024),
    (16, 4096, 8, 2, 256, 512),
]


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    done = subprocess.run([sys.executable, "-c", RING, json.dumps(CASES)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"cp{c[0]}-s{c[1]}-{c[4]}w{c[5]}" for c in CASES])
def test_ring_backward_peak_is_the_estimates_term(measured, case):
    from automodel_dist.estimate.memory import ring_chunks_backward_bytes

    cp, local, heads, kv_heads, head_dim, window = CASES[case]
    got = measured[case]
    # AutoModel's ring ran through the stand-in once per chunk in forward and again in its backward's recompute,
    # and handed back the query's shape and every input's gradient
    assert got["flex_calls"] == 2 * got["chunks"]
    assert got["out"] == [1, heads, local, head_dim] and got["dtype"] == "torch.bfloat16"
    given = heads if head_dim > 256 else kv_heads
    assert got["grads"] == [[1, heads, local, head_dim], [1, given, local, head_dim], [1, given, local, head_dim]]
    est = ring_chunks_backward_bytes(local, heads, kv_heads, head_dim, got["chunks"], 2)
    assert est == pytest.approx(got["peak"], rel=0.06), (est / 2**20, got["peak"] / 2**20)


def test_stand_in_keeps_what_torchs_flex_attention_keeps(monkeypatch):
    """The stand-in's outputs and saved tensors against torch's own flex attention autograd function
    (FlexAttentionAutogradOp, run eagerly on fake tensors: its CPU-backward refusal lifted, as no value is computed)."""
    import torch
    import torch.nn.attention.flex_attention as torch_flex
    from torch._higher_order_ops.flex_attention import saved_values
    from torch._subclasses.fake_tensor import FakeTensorMode

    from automodel_dist.stack.flex_attention import flex_attention

    monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None)

    def described(tensors):
        return [(tuple(t.shape), t.dtype) for t in tensors if isinstance(t, torch.Tensor)]

    with FakeTensorMode():
        q = torch.empty(2, 8, 64, 32, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(2, 2, 96, 32, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(2, 2, 96, 16, dtype=torch.bfloat16, requires_grad=True)
        out, lse = flex_attention(q, k, v, enable_gqa=True, return_lse=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_out, ref_lse = torch_flex.flex_attention(q, k, v, enable_gqa=True, return_lse=True)
        assert described([out, lse]) == described([ref_out, ref_lse])
        # torch saves q, k, v, out, lse and max scores, then the block mask's tables (not counted by the stand-in)
        assert described(out.grad_fn.saved_tensors) == described(saved_values(ref_out.grad_fn))[:6]
        grads = torch.autograd.grad((out.float().sum() + lse.sum()), [q, k, v])
        ref = torch.autograd.grad((ref_out.float().sum() + ref_lse.sum()), [q, k, v])
        assert described(grads) == described(ref)
        with pytest.raises(ValueError, match="query heads"):
            flex_attention(q, torch.empty(2, 3, 96, 32), torch.empty(2, 3, 96, 16), enable_gqa=True)
