"""Stand-ins for flash-attn's two kernels (``flash_attn.flash_attn_func`` and ``flash_attn_varlen_func``, CUDA only)
that AutoModel's block-diagonal context parallelism runs a packed batch's softmax attention through
(``components/distributed/blockdiag_cp/kernels.py``: ``_flash_varlen_with_long_prefix_guard``, reached where a
packed VLM batch under CP selects its contiguous block-diagonal sharder: Qwen3.5's classes). AutoModel's code around
them runs as written: the all-gather of the stacked K/V, the packed ``contiguous()`` copies of this rank's queries
and of the keys and values its documents reach, the output buffer it scatters into. Only the kernels are replaced.
Only the dry run's worker imports this module.

Memory model (flash-attn 2's autograd Functions; T query tokens of a call, Hq query heads, Hkv key heads, D head dim):
  forward keeps q, k, v as handed (the packed copies), the output [T, Hq, D] in q's dtype and an fp32 log-sum-exp
  [Hq, T]; backward returns dq, dk, dv like q, k, v (grouped K/V kept grouped).
The stand-in runs torch's own flash-attention operator on the same tensors as a batch of one ([1, H, T, D] views),
whose shape functions give those outputs and whose autograd node keeps those tensors: the bytes a GPU's flash-attn
keeps, never a T x T score matrix. A varlen call's documents are one call here: what it keeps does not depend on
where the documents split. The kernels' own workspaces are not measured.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from .stand_in import stand_in_module

on_call: Any = None  # called at each stood-in kernel call (the dry run's shim counts them)
MODULE = "flash_attn"


def _count() -> None:
    if on_call is not None:
        on_call()


def _flash(q: Any, k: Any, v: Any, dropout_p: float, softmax_scale: float | None, causal: bool) -> Any:
    """torch's flash-attention operator on [T, H, D] tensors, as one sequence: the output [T, Hq, D]."""
    import torch

    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    out = op(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        dropout_p,
        causal,
        scale=softmax_scale,
    )
    return out[0][0].transpose(0, 1)


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
    _count()
    return _flash(q, k, v, dropout_p, softmax_scale, causal)


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
    import torch

    _count()
    outs = [_flash(q[i], k[i], v[i], dropout_p, softmax_scale, causal) for i in range(q.shape[0])]
    return outs[0][None] if len(outs) == 1 else torch.stack(outs)  # (one sequence: a view, as the kernel's output)


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
