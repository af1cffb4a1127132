"""A stand-in for Liger Kernel, which AutoModel applies to a Hugging Face class by default (``use_liger_kernel``,
installed in its container; it turns it off itself under TP or CP), so the dry run holds what Liger's kernels hold on
a GPU. Only the dry run's worker imports this module.

What Liger changes in memory, per decoder layer of the classes covered here (Liger's instance patch of them):
- RMSNorm (``LigerRMSNorm``): keeps its input and one fp32 reciprocal RMS per row for backward, where the Hugging Face
  norm keeps an fp32 copy of its input and the normalised tensor.
- SwiGLU MLP (``LigerSwiGLUMLP``): ``down_proj(silu(gate_proj(x)) * up_proj(x))`` through ``LigerSiLUMulFunction``,
  which keeps gate and up and recomputes silu in backward (the Hugging Face MLP also keeps silu(gate)).
Rotary embeddings (in place in Liger, no saved tensors in either) and the fused linear cross entropy (only when the
model itself is given labels, which AutoModel's training step never does) change nothing the tracker sees.
"""

from __future__ import annotations

import types
from typing import Any

import torch

# model_type -> the RMSNorm modules of a decoder layer Liger's instance patch replaces (its SwiGLU MLP too: every
# one of these types has gate/up/down projections)
COVERED = {
    "llama": ("input_layernorm", "post_attention_layernorm"),
    "mistral": ("input_layernorm", "post_attention_layernorm"),
    "qwen2": ("input_layernorm", "post_attention_layernorm"),
    "qwen3": ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"),
}


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
        norms = COVERED.get(model_type or "")
        if norms is None:
            self.skipped.append(str(model_type))  # Liger itself covers more; measured without its kernels
            return
        backbone = getattr(model, "model", model)
        for layer in getattr(backbone, "layers", []):
            for name in norms:
                mod = _module(layer, name)
                if mod is not None:
                    mod.forward = types.MethodType(_norm_forward, mod)
            mlp = getattr(layer, "mlp", None)
            if mlp is not None and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
                mlp.forward = types.MethodType(_mlp_forward, mlp)
        final = getattr(backbone, "norm", None)
        if final is not None:
            final.forward = types.MethodType(_norm_forward, final)
        self.applied.append(str(model_type))


__all__ = ["Stub", "COVERED"]
