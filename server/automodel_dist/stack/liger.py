"""A stand-in for Liger Kernel, which AutoModel applies to a Hugging Face class by default (``use_liger_kernel``,
installed in its container; it turns it off itself under TP or CP), so the dry run holds what Liger's kernels hold on
a GPU. Only the dry run's worker imports this module.

What Liger changes in memory, per decoder layer of the model types ``catalog/kernels.LIGER_LAYERS`` lists (the modules
Liger's instance patch replaces; the estimate reads the same table):
- RMSNorm (``LigerRMSNorm``): keeps its input and one fp32 reciprocal RMS per row for backward, where the Hugging Face
  norm keeps an fp32 copy of its input and the normalised tensor.
- SwiGLU / GeGLU MLP (``LigerSwiGLUMLP``, ``LigerPhi3SwiGLUMLP``, ``LigerGEGLUMLP``): ``down_proj(act(gate) * up)``
  through one function that keeps gate and up and recomputes the activation in backward (the Hugging Face MLP also
  keeps act(gate)); the GELU variant keeps the same tensors as the SiLU one, so one stand-in serves both.
Rotary embeddings (in place in Liger, no saved tensors in either) and the fused linear cross entropy (only when the
model itself is given labels, which AutoModel's training step never does) change nothing the tracker sees.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ..catalog.kernels import LIGER_LAYERS


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rstd = torch.empty_like(x[..., 0], dtype=torch.float32)
        ctx.save_for_backward(x, weight, rstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x, weight, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight)


class _SiLUMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> Any:
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b)  # Liger writes them into a's and b's storage


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight)


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_SiLUMul.apply(self.gate_proj(x), self.up_proj(x)))


def _fused_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # LigerPhi3SwiGLUMLP
    return self.down_proj(_SiLUMul.apply(gate, up))


_MLP = {
    "split": (_mlp_forward, ("gate_proj", "up_proj", "down_proj")),
    "fused": (_fused_mlp_forward, ("gate_up_proj", "down_proj")),
}


def _module(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part, None)
        if root is None:
            return None
    return root


class Stub:
    """What ``kernel_patches.liger_kernel_trf`` is: Liger's ``transformers`` module, as far as AutoModel calls it."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.skipped: list[str] = []

    def _apply_liger_kernel_to_instance(self, model: Any, **kwargs: Any) -> None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        row = LIGER_LAYERS.get(model_type or "")
        if row is None:
            self.skipped.append(str(model_type))  # Liger itself covers more; measured without its kernels
            return
        forward, names = _MLP[row.mlp] if row.mlp else (None, ())
        backbone = getattr(model, "model", model)
        for layer in getattr(backbone, "layers", []):
            for name in row.norms:
                mod = _module(layer, name)
                if mod is not None:
                    mod.forward = types.MethodType(_norm_forward, mod)
            mlp = getattr(layer, row.mlp_module, None)
            if forward is not None and mlp is not None and all(hasattr(mlp, n) for n in names):
                mlp.forward = types.MethodType(forward, mlp)
        final = getattr(backbone, row.final_norm, None)
        if final is not None:
            final.forward = types.MethodType(_norm_forward, final)
        self.applied.append(str(model_type))


__all__ = ["Stub"]
