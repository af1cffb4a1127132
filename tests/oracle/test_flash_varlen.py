"""flash-attn's kernels as the dry run stands them in (stack/flash_varlen.py), under AutoModel's own block-diagonal CP
attention (blockdiag_cp/kernels.py ``_cp_blockdiag_varlen``, which packs a rank's queries and the keys and values its
documents reach, calls flash-attn and scatters the output back): on fake tensors, what the stood-in kernels keep for
backward is what flash-attn's Functions keep (q, k, v, the output, an fp32 log-sum-exp a row), never a score matrix."""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import flash_varlen  # noqa: E402

HQ, HKV, D = 8, 2, 64  # grouped keys, as Qwen3.5's full-attention layers


def _saved_by_attention(
    doc_ids: list[int], rank: int, world: int
) -> tuple[list[tuple[tuple[int, ...], Any]], Any, dict[str, Any]]:
    """AutoModel's varlen CP attention of ``rank``'s share of a pack on fake tensors: the (shape, dtype) of every
    tensor autograd saves, and the output."""
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
    # the document map a known value, its segmentation computed on it, as the dry run's step has them
    ids = mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)
    with mode, known_values(), known_document_segments(mode):
        meta = kernels.precompute_blockdiag_varlen_meta(ids, rank * local, local, ids.device)
        q = torch.empty(1, HQ, local, D, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(1, HKV, seq, D, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(1, HKV, seq, D, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = kernels._cp_blockdiag_varlen(q, k, v, ids, rank * local, backend="flash", meta=meta)
    return saved, out, meta


def _floating(saved: list[tuple[tuple[int, ...], Any]]) -> list[tuple[tuple[int, ...], Any]]:
    return [s for s in saved if s[1].is_floating_point]


def test_one_document_rank_keeps_what_flash_attn_keeps():
    """Rank 0 of 2, one document filling the pack: one flash call on its 64 queries against the 64 keys before them."""
    before = sys.modules.get("flash_attn")
    with flash_varlen.stood_in():
        saved, out, meta = _saved_by_attention([1] * 128, rank=0, world=2)
    assert sys.modules.get("flash_attn") is before  # what was there before, after the block
    assert out.shape == (1, HQ, 64, D) and meta["n_real"] == 64
    n = 64
    assert sorted(_floating(saved)) == sorted(
        [
            ((1, HQ, n, D), torch.bfloat16),  # q (the packed copy, as a batch of one)
            ((1, HKV, n, D), torch.bfloat16),  # k, grouped
            ((1, HKV, n, D), torch.bfloat16),  # v, grouped
            ((1, HQ, n, D), torch.bfloat16),  # the output
            ((1, HQ, n), torch.float32),  # the log-sum-exp a row
        ]
    )


def test_a_straddling_document_runs_the_guards_two_calls():
    """Rank 1 of 2, a document straddling the ranks and a second one: AutoModel's long-prefix guard runs the fixed
    call for the straddling document (its 16 local queries against its 80 keys) and the varlen call for the rest."""
    with flash_varlen.stood_in():
        saved, out, meta = _saved_by_attention([1] * 80 + [2] * 48, rank=1, world=2)
    assert out.shape == (1, HQ, 64, D)
    assert (meta["first_q"], meta["first_k"]) == (16, 80)
    shapes = _floating(saved)
    assert ((1, HQ, 16), torch.float32) in shapes and ((1, HKV, 80, D), torch.bfloat16) in shapes  # the fixed call
    assert ((1, HQ, 48), torch.float32) in shapes and ((1, HKV, 48, D), torch.bfloat16) in shapes  # the varlen call
    # nothing a query by key: no score matrix kept
    assert all(s[0][-1] in (D, 16, 48) for s in shapes)


def test_without_the_stand_in_automodel_reports_no_varlen_kernel():
    """Here flash-attn is not installed: AutoModel's varlen path reports itself unavailable (its caller falls back to
    the dense mask), which is why the dry run stands it in."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels

    if "flash_attn" in sys.modules or kernels.HAS_FLASH_VARLEN:
        pytest.skip("flash-attn is installed here")
    q = torch.zeros(1, HQ, 4, D, dtype=torch.bfloat16)
    k = torch.zeros(1, HKV, 8, D, dtype=torch.bfloat16)
    assert kernels._cp_blockdiag_varlen(q, k, k, torch.ones(1, 8, dtype=torch.long), 4, backend="flash") is None
