"""torch's RMSNorm as a GPU runs it, on fake tensors (the dry run's step; stack/shims.py RMS_NORM).

On a CUDA tensor ``F.rms_norm`` (``nn.RMSNorm``, AutoModel's ``rms_norm: torch`` backend, DeepSeek-V4's per-head
query norm) dispatches to ``aten._fused_rms_norm``: one kernel whose autograd node (``FusedRmsNormBackward0``) keeps
the input, the weight and the fp32 reciprocal RMS a row, and whose backward (``_fused_rms_norm_backward``) writes the
input's and the weight's gradients. On a CPU tensor the same call decomposes into eager ops that keep an fp32 copy of
a bf16 input and, with a weight, the fp32 normalised input: up to 8 bytes an element where the GPU keeps the input's
own (shared with whatever else holds it) and 4 bytes a row. This stand-in allocates what the kernel allocates and keeps
what its node keeps; the values are not computed (fake tensors carry none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _stats_shape(x: torch.Tensor, normalized: int) -> list[int]:
    # the reduced dims kept as size 1, as the kernel's rstd output (layer_norm's convention)
    return [*x.shape[: x.dim() - normalized], *([1] * normalized)]


class _FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, normalized: int) -> torch.Tensor:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32  # the kernel's accumulation type
        if not x.is_contiguous():
            # the kernel reads a contiguous copy of a strided input (DeepSeek-V4's transposed query) while it runs
            _copy = torch.empty_like(x, memory_format=torch.contiguous_format)
            del _copy
        rstd = x.new_empty(_stats_shape(x, normalized), dtype=acc)
        ctx.normalized = normalized
        ctx.save_for_backward(x, weight, rstd)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, _rstd = ctx.saved_tensors
        grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(weight) if weight is not None and ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None


def fused_rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None) -> torch.Tensor:
    """``F.rms_norm``'s output with ``_fused_rms_norm``'s memory (fake tensors only; the caller checks)."""
    return _FusedRMSNorm.apply(x, weight, len(tuple(normalized_shape)))


__all__ = ["fused_rms_norm"]
