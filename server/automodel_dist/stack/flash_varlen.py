"""Stand-ins for flash-attn's two kernels (``flash_attn.flash_attn_func`` and ``flash_attn_varlen_func``, CUDA only)
that AutoModel's block-diagonal context parallelism runs a packed batch's softmax attention through
(``components/distributed/blockdiag_cp/kernels.py``: ``_flash_varlen_with_long_prefix_guard``, reached where a
packed VLM batch under CP selects its contiguous block-diagonal sharder: Qwen3.5's classes). AutoModel's code around
them runs as written: the all-gather of the stacked K/V, the packed ``contiguous()`` copies of this rank's queries
and of the keys and values its documents reach, the output buffer it scatters into. Only the kernels are replaced.
Only the dry run's worker imports this module.

Memory model (flash-attn 2's autograd Functions and its C++ backward, flash_api.cpp ``mha_varlen_bwd`` / ``mha_bwd``;
T query tokens of a call over ``n`` sequences, Tk key tokens, Hq query heads, Hkv key heads, D head dim):
  forward keeps q, k, v as handed (the packed copies), the output like q and an fp32 log-sum-exp ([Hq, T] varlen,
  [B, Hq, S] fixed-length); backward makes dq, dk, dv like q, k, v and, while it runs, an fp32 dq accumulator
  ([T + 128 n, Hq, D rounded up to 32, or 256 past 192] varlen; [B, S rounded up to 128, Hq, D rounded] fixed-length),
  an fp32 softmax_d of the log-sum-exp's rows, and with fewer key than query heads (GQA) dk and dv at the query's head
  count ([Tk, Hq, D] each, in q's dtype), summed into the grouped dk and dv before it returns.
A varlen call's documents are one call here: what it keeps does not depend on where the documents split (the
accumulator's 128 rows a document do, and are counted). The stand-ins allocate exactly those tensors, never a T x Tk
score matrix; the kernels' shared-memory and register state is not memory the allocator sees.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

from ..catalog.kernels import flash_attn_dq_accum_rows, flash_attn_head_dim_rounded
from .stand_in import stand_in_module

on_call: Any = None  # called at each stood-in kernel call that returned (the dry run's shim counts them)
MODULE = "flash_attn"


def _count() -> None:
    if on_call is not None:
        on_call()


@functools.cache
def _function() -> Any:
    """flash-attn's forward and backward as one autograd Function on ``[rows, heads, dim]`` tensors (varlen: all
    the call's tokens as rows; fixed-length: a sequence's); built on first use (torch is imported by the rank)."""
    import torch

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, batch: int, varlen: bool) -> Any:
            rows = q.shape[0] // batch  # (fixed-length: each sequence's queries)
            out = torch.empty_like(q)
            lse_shape = (q.shape[1], q.shape[0]) if varlen else (batch, q.shape[1], rows)
            lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.batch, ctx.varlen = batch, varlen
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v, _, _ = ctx.saved_tensors
            heads, d = q.shape[1], q.shape[2]
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            accum_rows = flash_attn_dq_accum_rows(q.shape[0], ctx.batch, varlen=ctx.varlen)
            workspace = [
                torch.empty((accum_rows, heads, flash_attn_head_dim_rounded(d)), dtype=torch.float32, device=q.device),
                torch.empty((heads, accum_rows), dtype=torch.float32, device=q.device),  # softmax_d
            ]
            if k.shape[1] != heads:  # GQA: dk and dv at the query's heads, summed into the grouped ones
                workspace += [torch.empty((k.shape[0], heads, d), dtype=q.dtype, device=q.device) for _ in "kv"]
            del workspace
            return (*grads, None, None)

    return FlashAttention


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **kwargs: Any,
) -> Any:
    """flash-attn's varlen call on packed ``[total, heads, dim]`` tensors: the output ``[total_q, Hq, D]``."""
    out = _function().apply(q, k, v, max(1, len(cu_seqlens_q) - 1), True)
    _count()
    return out


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **kwargs: Any,
) -> Any:
    """flash-attn's fixed-length call on ``[batch, seq, heads, dim]`` tensors: the output like q."""
    b = q.shape[0]
    out = _function().apply(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), b, False)
    _count()
    return out.unflatten(0, (b, q.shape[1]))


def install() -> None:
    """The ``flash_attn`` package (its two kernels) as stand-ins, and AutoModel's block-diagonal CP told it imports
    (its probe ran when the module was imported), for the rest of the process (the dry run's rank)."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels

    sys.modules[MODULE] = stand_in_module(
        MODULE, flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func
    )
    kernels.HAS_FLASH_VARLEN = True


@contextlib.contextmanager
def stood_in() -> Iterator[None]:
    """The stand-ins in place for a block, whatever was there before restored after it (tests)."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels

    saved, had = sys.modules.get(MODULE), kernels.HAS_FLASH_VARLEN
    install()
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(MODULE, None)
        else:
            sys.modules[MODULE] = saved
        kernels.HAS_FLASH_VARLEN = had


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "install", "stood_in"]
