"""Stand-ins for the flash-linear-attention pieces AutoModel's Kimi-Linear KDA layer binds (kimi_linear/model.py:
``fla.modules.ShortConvolution``, ``fla.modules.FusedRMSNormGated``, ``fla.ops.kda.chunk_kda`` and
``fla.ops.kda.gate.fused_kda_gate``), so its layers build and hold on fake CPU tensors what fla's Triton kernels hold
on a GPU. The modules keep fla's parameters (a depthwise ``nn.Conv1d`` without bias; the gated norm's weight); the
functions keep fla's shapes, dtypes and saved tensors, not its values. Read from fla 0.6.0 (AutoModel's ``fla`` extra
asks for flash-linear-attention >= 0.4.2); ``install`` puts them beside stack/fla_gdn.py's Gated DeltaNet stand-in,
under the same fake ``fla`` package. Only the dry run's worker imports this module.

Memory model (q, k [B, T, H, K], v [B, T, H, V] bf16; g fp32 [B, T, H, K], beta fp32 [B, T, H]; chunk 64, NT = T / 64):
  chunk_kda (fla/ops/kda/chunk.py ChunkKDAFunction, chunk_fwd.py, chunk_bwd.py; AutoModel passes the gate already
  computed, ``use_qk_l2norm_in_kernel``, recompute on):
    saved:      q and k l2-normalised with fp32 rstd [B, T, H] each, v, g's chunk-local cumsum (fp32, like g), g and
                beta (AutoModel's tensors), Aqk and Akk [B, T, H, 64] in k's dtype; under CP the merged initial
                state [1, H, K, V] fp32
    transient:  Akk's fp32 diagonal blocks [B, T, H, 16], w, u, qg, kg (like k, v, q, k), the chunk states h
                [B, NT, H, K, V] and v_new (like v); under CP the rank's summary and its all-gather (fla_gdn's)
    backward:   w, u, qg, kg, h and v_new recomputed, living (with dh and both dA) to the end of fla's chunk_kda_bwd;
                fp32 dAqk and dv; dh [B, NT, H, K, V]; the fused pass's fp32 dq, dk, dg, dbeta and dAkk and dv; the
                intra-chunk pass's fp32 dq, dk, dg and per-32-key-block dbeta; dg's reverse cumsum; l2norm's dq, dk
  fused_kda_gate (fla/ops/kda/gate.py): output fp32 like its input g [B, T, H, K]; keeps g; backward dg like g and
    per-32-token fp32 partial gradients of A_log [NT32, H] and dt_bias [NT32, H * K]
  ShortConvolution (fla/modules/causal_conv1d/ops.py CausalConv1dFunction): keeps x; y like x; backward the
    pre-activation output recomputed, dx and per-chunk fp32 weight gradients [B * NT, D, W] (under CP, fla_gdn's
    context-parallel conv)
  FusedRMSNormGated (fla/modules/norm/fused_norm_gate.py, RMS, sigmoid gate): keeps x, the gate and fp32 rstd a row;
    y like x; backward dx and dg
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from . import fla_gdn
from .fla_gdn import CHUNK, CausalConv1d, CPContext, _cp_state, _rows, _states, causal_conv1d

GATE_CHUNK = 32  # kda_gate_bwd's BT
on_call: Any = None  # called at each chunk_kda call (the dry run's shim counts the KDA layers that ran)


class ShortConvolution(nn.Conv1d):
    """fla's depthwise causal conv module: its parameters (``nn.Conv1d`` of ``hidden_size`` groups, no bias by
    default) and its training-step call."""

    def __init__(
        self,
        hidden_size: int,
        kernel_size: int,
        bias: bool = False,
        activation: str | None = "silu",
        backend: str | None = "triton",
        device: Any = None,
        dtype: torch.dtype | None = None,
        **_: Any,
    ) -> None:
        super().__init__(
            hidden_size,
            hidden_size,
            kernel_size,
            padding=kernel_size - 1,
            groups=hidden_size,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        self.hidden_size, self.activation, self.backend = hidden_size, activation, backend

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        cp_context: CPContext | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, None]:
        if residual is not None or mask is not None or cache is not None or output_final_state:
            raise NotImplementedError("the dry run's ShortConvolution stand-in has a training step's call only")
        weight = self.weight.squeeze(1)  # fla: rearrange(weight, "d 1 w -> d w")
        if cp_context is not None:
            return causal_conv1d(x, weight, self.bias, activation=self.activation, cp_context=cp_context)
        if self.bias is not None:
            raise NotImplementedError("the dry run's ShortConvolution stand-in has no bias outside CP")
        return CausalConv1d.apply(x, weight, None, False), None


class _GatedRMSNorm(torch.autograd.Function):
    """Shapes and memory of fla's gated RMS norm (``LayerNormGatedFunction``, RMS, no residual)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rstd = torch.empty(x.numel() // x.shape[-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, g, weight, rstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, g, weight, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(g), torch.empty_like(weight)


class FusedRMSNormGated(nn.Module):
    """fla's gated RMS norm module: one weight of ``hidden_size`` (no bias)."""

    def __init__(
        self,
        hidden_size: int,
        elementwise_affine: bool = True,
        eps: float = 1e-5,
        activation: str = "swish",
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not elementwise_affine:
            raise NotImplementedError("the dry run's FusedRMSNormGated stand-in has an affine weight")
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, g: torch.Tensor, residual: torch.Tensor | None = None, **_: Any) -> Any:
        if residual is not None:
            raise NotImplementedError("the dry run's FusedRMSNormGated stand-in has no residual path")
        return _GatedRMSNorm.apply(x, g, self.weight)


class _KDAGate(torch.autograd.Function):
    """Shapes and memory of fla's ``KDAGateFunction``."""

    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(g, a_log, *(() if dt_bias is None else (dt_bias,)))
        return torch.empty_like(g, dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, dyg: torch.Tensor) -> tuple[Any, ...]:
        g, a_log, *rest = ctx.saved_tensors
        heads, dim = g.shape[-2:]
        nt = -(-(g.numel() // (heads * dim)) // GATE_CHUNK)
        dg = torch.empty_like(g)
        da = g.new_empty((nt, heads), dtype=torch.float32).sum(0).view_as(a_log).to(a_log.dtype)
        dbias = None
        if rest:
            dbias = g.new_empty((nt, heads * dim), dtype=torch.float32).sum(0).to(rest[0].dtype)
        return dg, da, dbias


def fused_kda_gate(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,  # noqa: N803 - fla's name
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """fla's signature (0.6.0: no ``g_bias``, so AutoModel hands g as [B, T, H, K])."""
    if A_log is None or lower_bound is not None or output_dtype != torch.float32:
        raise NotImplementedError("the dry run's KDA gate stand-in has AutoModel's call only (A_log, fp32 output)")
    return _KDAGate.apply(g, A_log, dt_bias)


class _ChunkKDA(torch.autograd.Function):
    """Shapes and memory of fla's chunked KDA; the values are not the recurrence's."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        l2norm: bool,
        cp: int | None,
    ) -> torch.Tensor:
        if l2norm:
            q, q_rstd = torch.empty_like(q), _rows(q)
            k, k_rstd = torch.empty_like(k), _rows(k)
        g_cumsum = torch.empty_like(g, dtype=torch.float32)  # chunk_local_cumsum
        a_qk = torch.empty((*k.shape[:3], CHUNK), dtype=k.dtype, device=k.device)  # chunk_kda_fwd_intra
        a_kk = torch.empty((*k.shape[:3], CHUNK), dtype=k.dtype, device=k.device)
        a_kkd = torch.empty((*k.shape[:3], 16), dtype=torch.float32, device=k.device)
        w, u, qg, kg = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q), torch.empty_like(k)
        del a_kkd
        h0 = None
        if cp is not None:  # chunk_gated_delta_rule_fwd_h_pre_process: the state handed on along the CP ranks
            hm, gathered, h0 = _cp_state(k, v, cp)
            del hm, gathered
        h, v_new = _states(k, v), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
        o = torch.empty_like(v)  # chunk_gla_fwd_o_gk
        del w, u, qg, kg, h, v_new  # (recompute on: dropped before the forward returns)
        kept = (q, k, v, g_cumsum, g, beta, a_qk, a_kk)
        ctx.save_for_backward(*kept, *((q_rstd, k_rstd) if l2norm else ()), *(() if h0 is None else (h0,)))
        ctx.l2norm, ctx.cp = l2norm, cp
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, g_cumsum, g, beta, a_qk, a_kk, *_ = ctx.saved_tensors
        fp32 = torch.float32
        # chunk_kda_bwd (chunk_bwd.py): its locals live to its return
        w, u, qg, kg = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q), torch.empty_like(k)  # recompute
        h, v_new = _states(k, v), torch.empty_like(v)
        da_qk, dv = torch.empty_like(a_qk, dtype=fp32), torch.empty_like(do)  # chunk_kda_bwd_dAv
        dht = None
        if ctx.cp is not None:  # chunk_gated_delta_rule_bwd_dhu_pre_process: the state gradient from the next ranks
            dhm, gathered, dht = _cp_state(k, v, ctx.cp)
            del dhm, gathered
        dh, dv = _states(k, v), torch.empty_like(dv)  # chunk_gated_delta_rule_bwd_dhu
        # chunk_kda_bwd_wy_dqkg_fused: fp32 dq, dk, dg, dbeta and dAkk
        dq, dk, dv, db, dg, da_kk = (
            torch.empty_like(q, dtype=fp32),
            torch.empty_like(k, dtype=fp32),
            torch.empty_like(v),
            torch.empty_like(beta, dtype=fp32),
            torch.empty_like(g_cumsum, dtype=fp32),
            torch.empty_like(a_kk, dtype=fp32),
        )
        # chunk_kda_bwd_intra: new fp32 dq, dk, dg and per-key-block dbeta [NK, B, T, H] summed into dbeta
        nk = -(-k.shape[-1] // 32)
        dq, dk, dg, db = (
            torch.empty_like(dq),
            torch.empty_like(dk),
            torch.empty_like(dg),
            beta.new_empty((nk, *beta.shape), dtype=fp32).sum(0),
        )
        dg = torch.empty_like(dg)  # the reverse chunk-local cumsum
        del w, u, qg, kg, h, v_new, dh, da_qk, da_kk, dht  # (chunk_kda_bwd returns)
        if ctx.l2norm:
            dq, dk = torch.empty_like(q), torch.empty_like(k)  # l2norm_bwd, like the normalised q and k
        return dq.to(q.dtype), dk.to(k.dtype), dv, dg.to(g.dtype), db.to(beta.dtype), None, None


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_context: CPContext | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's signature (``cu_seqlens`` packs the batch into one row, as fla's varlen path does: same bytes). Only
    AutoModel's call is stood in: any other option fla takes (``disable_recompute``, ``chunk_size`` 32, the in-kernel
    gate or beta sigmoid, ``safe_gate``) changes what the kernel keeps, and is refused."""
    other = {k for k, v in kwargs.items() if v is not None and v is not False and k != "cu_seqlens_cpu"}
    if kwargs.get("chunk_size") == CHUNK:
        other.discard("chunk_size")
    if initial_state is not None or use_gate_in_kernel or other:
        raise NotImplementedError(
            f"the dry run's KDA stand-in runs AutoModel's training call only (not {sorted(other) or 'initial_state'})"
        )
    if on_call is not None:
        on_call()
    cp = None if cp_context is None else cp_context.world
    o = _ChunkKDA.apply(q, k, v, g, beta, bool(use_qk_l2norm_in_kernel), cp)
    final = None
    if output_final_state:
        final = torch.empty((q.shape[0], v.shape[2], q.shape[3], v.shape[-1]), dtype=torch.float32, device=q.device)
    return o, final


def fused_recurrent_kda(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the dry run's fla stand-in has no recurrent KDA kernel (forward only in fla)")


def install() -> dict[str, types.ModuleType]:
    """The fake ``fla`` package with both stand-ins: the Gated DeltaNet kernels (stack/fla_gdn.py) and these;
    nothing where the real fla is installed."""
    return fla_gdn.install(
        {
            "fla.ops.kda": {"chunk_kda": chunk_kda, "fused_recurrent_kda": fused_recurrent_kda},
            "fla.ops.kda.gate": {"fused_kda_gate": fused_kda_gate},
            "fla.modules": {"ShortConvolution": ShortConvolution, "FusedRMSNormGated": FusedRMSNormGated},
        }
    )


__all__ = ["FusedRMSNormGated", "ShortConvolution", "chunk_kda", "fused_kda_gate", "install"]
