"""A stand-in for cut_cross_entropy's fused linear cross entropy (``cut_cross_entropy.linear_cross_entropy`` with
``impl="cce"``, as AutoModel's FusedLinearCrossEntropy calls it: ``filter_eps=None``, ``accum_e_fp32=True``,
``accum_c_fp32`` left off), so a dry run on fake tensors holds what its kernels hold on a GPU. cut_cross_entropy's
kernels need CUDA (Triton); the dry run computes the loss through AutoModel's ChunkedCrossEntropy (the same
inputs, the head's weight prepared as FusedLinearCrossEntropy prepares it), whose backward keeps the head's gradient
in fp32 with a bf16 gradient per chunk and a bf16 copy at the end, where the kernel writes it once in the weight's
dtype. This Function replaces ChunkedCrossEntropy's autograd Function on fake tensors only (on real tensors, the
smoke run's and the GPU check's, ChunkedCrossEntropy computes the loss).

Memory model (cut_cross_entropy's cce.py / cce_backward.py): forward keeps the hidden states, the head's weight and the
targets with the fp32 log-sum-exp per token (the logits live blockwise in SRAM); backward allocates the hidden states'
gradient in fp32 (accum_e_fp32) and the head's in its dtype, and returns the hidden states' cast to their dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor


class _CutCrossEntropy(torch.autograd.Function):
    """``_ChunkedLinearCE``'s signature, cut_cross_entropy's memory (module docstring); values are not the loss's."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        chunk_len: int,
        ignore_index: int,
        logits_dtype: torch.dtype | None,
        compute_loss: Any,
    ) -> torch.Tensor:
        lse = torch.empty(labels.shape, dtype=torch.float32, device=hidden.device)
        ctx.save_for_backward(hidden, weight, labels, lse)
        return torch.empty(labels.shape, dtype=torch.float32, device=hidden.device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, _, _ = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_hidden = grad_hidden.to(hidden.dtype) if grad_hidden is not None else None
        return grad_hidden, grad_weight, None, None, None, None, None


class _Dispatch:
    """In ChunkedCrossEntropy's module in place of its autograd Function while the loss runs: the stand-in on fake
    tensors, the Function itself on real ones."""

    def __init__(self, chunked: Any, on_call: Any = None) -> None:
        self.chunked, self.on_call = chunked, on_call

    def apply(self, hidden: torch.Tensor, *args: Any) -> torch.Tensor:
        if not isinstance(hidden, FakeTensor):
            return self.chunked.apply(hidden, *args)
        if self.on_call is not None:
            self.on_call()
        return _CutCrossEntropy.apply(hidden, *args)


def stand_in(chunked_function: Any, on_call: Any = None) -> _Dispatch:
    """What to put in ChunkedCrossEntropy's module in place of ``chunked_function`` while the loss runs."""
    return _Dispatch(chunked_function, on_call)


__all__ = ["stand_in"]
