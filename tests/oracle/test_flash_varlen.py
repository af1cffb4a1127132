"""flash-attn's kernels as the dry run stands them in (stack/flash_varlen.py), under AutoModel's own block-diagonal CP
attention (blockdiag_cp/kernels.py ``_cp_blockdiag_varlen``, which packs a rank's queries and the keys and values its
documents reach, calls flash-attn and scatters the output back). On fake tensors: what the stood-in kernels keep for
backward is what flash-attn's Functions keep (q, k, v, the output, an fp32 log-sum-exp a row), never a score matrix,
and their backward allocates what flash-attn 2's C++ backward allocates (flash_api.cpp ``mha_varlen_bwd``: the
gradients, an fp32 dq accumulator of 128 spare rows a sequence, an fp32 softmax_d, and under GQA dk and dv at the
query's head count)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import flash_varlen  # noqa: E402

HQ, HKV, D = 8, 2, 64  # grouped keys, as Qwen3.5's full-attention layers
BF16, FP32 = torch.bfloat16, torch.float32


def _attention(doc_ids: list[int], rank: int, world: int) -> tuple[list[tuple[tuple[int, ...], Any]], Any, dict]:
    """AutoModel's varlen CP attention of ``rank``'s share of a pack on fake tensors, the document map a known value
    and its segmentation computed on it as the dry run's step has them: the (shape, dtype) of every tensor autograd
    saves, the output, and the segmentation."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels
    from torch._subclasses.fake_tensor import FakeTensorMode

    from automodel_dist.stack.media import known_document_segments, known_values

    real = torch.tensor([doc_ids])
    seq = real.shape[1]
    local = seq // world
    saved: list[tuple[tuple[int, ...], Any]] = []

    def pack(t: Any) -> Any:
        saved.append((tuple(t.shape), t.dtype))
        return t

    mode = FakeTensorMode()
    ids = mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)
    with mode, known_values(), known_document_segments(mode):
        meta = kernels.precompute_blockdiag_varlen_meta(ids, rank * local, local, ids.device)
        q = torch.empty(1, HQ, local, D, dtype=BF16, requires_grad=True)
        k = torch.empty(1, HKV, seq, D, dtype=BF16, requires_grad=True)
        v = torch.empty(1, HKV, seq, D, dtype=BF16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = kernels._cp_blockdiag_varlen(q, k, v, ids, rank * local, backend="flash", meta=meta)
    return saved, out, meta


def _kept(q: int, k: int, lse: tuple[int, ...]) -> list[tuple[tuple[int, ...], Any]]:
    """What one flash-attn call keeps for backward: q, grouped k and v, the output, the fp32 log-sum-exp."""
    return [((q, HQ, D), BF16), ((k, HKV, D), BF16), ((k, HKV, D), BF16), ((q, HQ, D), BF16), (lse, FP32)]


def _floating(saved: list[tuple[tuple[int, ...], Any]]) -> list[tuple[tuple[int, ...], Any]]:
    return sorted(s for s in saved if s[1].is_floating_point)


def test_one_document_rank_keeps_what_flash_attn_keeps():
    """Rank 0 of 2, one document filling the pack: one varlen call on its 64 queries against the 64 keys before them;
    AutoModel's path ran (its engaged flag set, no fallback warned)."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels

    before = sys.modules.get("flash_attn")
    kernels._CP_FLASH_ENGAGED = kernels._CP_FLASH_WARNED = False
    with flash_varlen.stood_in():
        saved, out, meta = _attention([1] * 128, rank=0, world=2)
    assert sys.modules.get("flash_attn") is before  # what was there before, after the block
    assert kernels._CP_FLASH_ENGAGED and not kernels._CP_FLASH_WARNED
    assert out.shape == (1, HQ, 64, D) and meta["n_real"] == 64
    assert _floating(saved) == sorted(_kept(64, 64, (HQ, 64)))


def test_a_straddling_document_runs_the_guards_two_calls():
    """Rank 1 of 2, a document straddling the ranks and a second one: AutoModel's long-prefix guard runs the fixed
    call for the straddling document (its 16 local queries against its 80 keys) and the varlen call for the other
    (48 and 48); nothing else is kept, no query-by-key tensor."""
    with flash_varlen.stood_in():
        saved, out, meta = _attention([1] * 80 + [2] * 48, rank=1, world=2)
    assert out.shape == (1, HQ, 64, D)
    assert (meta["first_q"], meta["first_k"]) == (16, 80)
    assert _floating(saved) == sorted(_kept(16, 80, (1, HQ, 16)) + _kept(48, 48, (HQ, 48)))


@pytest.mark.parametrize("kv_heads", [HKV, HQ])
def test_backward_allocates_what_flash_attn_2s_backward_allocates(kv_heads):
    """One varlen call of two sequences (64 queries, 96 keys), its backward under torch's memory tracker: the
    gradients, the fp32 dq accumulator ([64 + 2 x 128, Hq, 64]) and softmax_d, and under GQA dk and dv expanded to
    the query's heads, all at once; with as many key as query heads, no expanded copies."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        q = torch.empty(64, HQ, D, dtype=BF16, requires_grad=True)
        k = torch.empty(96, kv_heads, D, dtype=BF16, requires_grad=True)
        v = torch.empty(96, kv_heads, D, dtype=BF16, requires_grad=True)
        cu = torch.tensor([0, 32, 64], dtype=torch.int32)
        tracker = MemTracker()
        with tracker:
            out = flash_varlen.flash_attn_varlen_func(q, k, v, cu, cu, 32, 48, causal=True)
            grad_out = torch.empty_like(out)
            out.backward(grad_out)
        temp = next(iter(tracker.get_tracker_snapshot("peak").values()))["Temp"]
    grads = (64 * HQ + 2 * 96 * kv_heads) * D * 2
    rows = 64 + 2 * 128
    workspace = rows * HQ * D * 4 + HQ * rows * 4 + (2 * 96 * HQ * D * 2 if kv_heads != HQ else 0)
    assert temp == grads + workspace


def test_the_estimates_last_cp_rank_term_is_what_automodels_attention_allocates():
    """The estimate's block-diagonal CP attention term (estimate/memory.py blockdiag_flash_backward_bytes) against
    AutoModel's varlen attention on the last of 4 CP ranks, one document filling 256 tokens, under torch's memory
    tracker: what its backward allocates at its peak (the gradients and flash-attn's buffers) with the key and value
    copies past the rank's share that its forward kept, less the two query-sized tensors the estimate counts with the
    layer (the query's gradient and the incoming one), within 5% (the term leaves out flash-attn's softmax_d and the
    backward's smaller slice gradients: 3.6% at this size, less at a real pack's)."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from automodel_dist.estimate.memory import blockdiag_flash_backward_bytes
    from automodel_dist.stack.media import known_document_segments, known_values

    world, seq = 4, 256
    local, rank = seq // world, world - 1
    mode = FakeTensorMode()
    ids = mode.fake_tensor_converter.from_real_tensor(mode, torch.ones(1, seq, dtype=torch.long), make_constant=True)
    with flash_varlen.stood_in(), mode, known_values(), known_document_segments(mode):
        meta = kernels.precompute_blockdiag_varlen_meta(ids, rank * local, local, ids.device)
        q = torch.empty(1, HQ, local, D, dtype=BF16, requires_grad=True)
        k = torch.empty(1, HKV, seq, D, dtype=BF16, requires_grad=True)
        v = torch.empty(1, HKV, seq, D, dtype=BF16, requires_grad=True)
        tracker = MemTracker()
        with tracker:
            out = kernels._cp_blockdiag_varlen(q, k, v, ids, rank * local, backend="flash", meta=meta)
            out.backward(torch.empty_like(out))
        temp = next(iter(tracker.get_tracker_snapshot("peak").values()))["Temp"]
    query_sized = 2 * local * HQ * D * 2
    kept_past_share = 2 * (seq - local) * HKV * D * 2
    measured = temp - query_sized + kept_past_share
    ours = blockdiag_flash_backward_bytes(seq, local, 1, HQ, HKV, D, 2)
    assert 0.95 < ours / measured <= 1.0
