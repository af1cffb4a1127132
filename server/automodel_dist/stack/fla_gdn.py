"""A stand-in for flash-linear-attention's chunked Gated DeltaNet kernel (``fla.ops.gated_delta_rule.
chunk_gated_delta_rule``), so AutoModel's Qwen3-Next and Qwen3.5 linear-attention layers hold on fake CPU tensors what
they hold on a GPU. AutoModel binds fla's kernel where ``nemo-automodel[fla]`` (in its ``moe`` and ``all`` extras)
installed it, else transformers' pure-torch chunk loop, which keeps every chunk's intermediates for backward: many
times fla's memory, and most of a dry run's time. Only the dry run's worker imports this module.

Provided: ``fla.ops.gated_delta_rule`` (its chunked kernel; the recurrent one is inference's) and, for AutoModel's
Qwen3.5 context-parallel layers (``qwen3_5_moe/cp_linear_attn.py``), ``fla.ops.cp.build_cp_context`` and
``fla.modules.convolution.causal_conv1d`` with the chunked kernel's ``cp_context``. Kimi-Linear's KDA pieces
(``fla.ops.kda``, ``fla.ops.kda.gate``, ``fla.modules.ShortConvolution`` and ``FusedRMSNormGated``) are stack/fla_kda.py's,
whose ``install`` puts both under the same fake package.

Memory model (fla ``ChunkGatedDeltaRuleFunction``, chunk size 64, ``use_qk_l2norm_in_kernel``; q, k [B, T, H, K],
v [B, T, H, V] in bf16, g fp32 and beta [B, T, H]; NT = T / 64):
  forward, saved:     q and k l2-normalised (like q, k) with fp32 rstd [B, T, H] each, v, beta, g's chunk-local
                      cumsum (fp32), the WY matrix A [B, T, H, 64] (k's dtype)
  forward, transient: A in fp32 before solve_tril, w (like k), u and v_new (like v), the chunk states
                      h [B, NT, H, K, V] (k's dtype)
  backward:           w, u, h, v_new recomputed; dv (twice), dh [B, NT, H, K, V], dq, dk, dw, fp32 dg, then the WY
                      backward's dk, dv, dbeta, fp32 dg, dg's reverse cumsum, l2norm's dq, dk
(fla/ops/gated_delta_rule/chunk.py, fla/ops/common/chunk_o.py, chunk_delta_h.py, wy_fast.py)

Under context parallelism (fla/ops/cp/chunk_delta_h.py, contiguous layout, one sequence split over the CP ranks as
AutoModel's unpacked CP path builds it; HV heads, W CP ranks):
  forward:            the rank's affine summary hm [HV, K, V + K] fp32 and its all-gather [W, HV, K, V + K] while the
                      incoming state is merged; that state [1, HV, K, V] fp32 is kept for backward
  backward:           dhm [HV, K, V + K] fp32 and its all-gather [W, ...] while the state gradient [1, HV, K, V] fp32
                      is merged; that gradient lives to the end of the backward
A packed batch (many documents in the CP context's boundaries) is refused: its per-document states are not stood in.
Causal conv1d under CP (fla/modules/causal_conv1d/cp.py and ops.py, chunk 64): the previous rank's last W - 1 tokens
as an initial state [1, D, W] kept for backward with x (fla builds it on every rank but the first: a few KiB);
forward y like x; backward the pre-activation output recomputed (like x), dx like x, and per-chunk fp32 weight and
bias gradients [B * T / 64, D, W] summed to the weight's.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from .stand_in import install_modules

CHUNK = 64
on_cp_context: Any = (
    None  # called at each build_cp_context (the dry run's shim counts the layers that ran fla's CP path)
)
on_call: Any = None  # called at each chunk_gated_delta_rule call (the dry run's shim counts the layers that ran it)


def _states(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, t, h, dk = k.shape
    return k.new_empty((b, -(-t // CHUNK), h, dk, v.shape[-1]))


def _rows(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(x.shape[:3], dtype=dtype, device=x.device)


def _cp_state(k: torch.Tensor, v: torch.Tensor, world: int) -> tuple[torch.Tensor, ...]:
    """The rank's affine summary, its all-gather over the CP group and the state merged from it (fp32; fla sizes
    them by v's heads, HV)."""
    heads, dk, dv = v.shape[2], k.shape[3], v.shape[-1]
    summary = torch.empty((heads, dk, dv + dk), dtype=torch.float32, device=k.device)
    gathered = torch.empty((world, heads, dk, dv + dk), dtype=torch.float32, device=k.device)
    state = torch.empty((1, heads, dk, dv), dtype=torch.float32, device=k.device)
    return summary, gathered, state


@dataclass
class CPContext:
    """The fields of fla's ``FLACPContext`` AutoModel's layer and the stand-ins read."""

    group: Any
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor | None = None
    conv1d_kernel_size: int | None = None
    layout: str = "contiguous"

    @property
    def world(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size(self.group)


def build_cp_context(
    cu_seqlens: torch.Tensor,
    group: Any,
    conv1d_kernel_size: int | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    layout: str = "contiguous",
    **_: Any,
) -> CPContext:
    """fla's signature; the stand-in keeps what its kernels size their buffers by (the group). One sequence only:
    AutoModel's unpacked CP path hands [0, S]."""
    if layout != "contiguous":
        raise NotImplementedError(f"the dry run's fla stand-in has the contiguous CP layout only, not {layout!r}")
    if cu_seqlens.shape[0] != 2:
        raise NotImplementedError("the dry run's fla stand-in has one sequence under CP, not a packed batch")
    if on_cp_context is not None:
        on_cp_context()
    return CPContext(group, cu_seqlens, cu_seqlens_cpu, conv1d_kernel_size, layout)


class CausalConv1d(torch.autograd.Function):
    """Shapes and memory of fla's causal conv1d of a training step, context-parallel (``CausalConv1dFunctionCP``:
    ``cp``, the previous rank's tail tokens kept too) or not (``CausalConv1dFunction``); with an activation both
    backwards recompute the pre-activation output first."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cp: bool) -> Any:
        d, w = weight.shape
        state = (torch.empty((1, d, w), dtype=x.dtype, device=x.device),) if cp else ()  # the previous rank's tail
        ctx.save_for_backward(x, weight, *(() if bias is None else (bias,)), *state)
        ctx.has_bias = bias is not None
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, *rest = ctx.saved_tensors
        bias = rest[0] if ctx.has_bias else None
        y = torch.empty_like(x)  # the pre-activation output, recomputed
        dx = torch.empty_like(x)
        chunks = x.shape[0] * -(-x.shape[1] // CHUNK)
        dw = torch.empty((chunks, *weight.shape), dtype=torch.float32, device=x.device).sum(0).to(weight.dtype)
        db = None
        if bias is not None:
            db = torch.empty((chunks, *bias.shape), dtype=torch.float32, device=x.device).sum(0).to(bias.dtype)
        del y
        return dx, dw, db, None


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    cp_context: CPContext | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """fla's signature, for the context-parallel path AutoModel calls (``cp_context`` given, x [B, T, D])."""
    if cp_context is None or weight is None or residual is not None or initial_state is not None or output_final_state:
        raise NotImplementedError(
            "the dry run's fla stand-in has the context-parallel causal conv1d of a training step"
        )
    return CausalConv1d.apply(x, weight, bias, True), None


class _ChunkGatedDeltaRule(torch.autograd.Function):
    """Shapes and memory of fla's chunked Gated DeltaNet; the values are not the recurrence's."""

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
        else:
            q_rstd = k_rstd = None
        g = torch.empty_like(g, dtype=torch.float32)  # chunk_local_cumsum
        a = torch.empty((*k.shape[:3], CHUNK), dtype=torch.float32, device=k.device)  # chunk_scaled_dot_kkt_fwd
        a = torch.empty(a.shape, dtype=k.dtype, device=k.device)  # solve_tril, in k's dtype
        w, u = torch.empty_like(k), torch.empty_like(v)  # recompute_w_u_fwd
        h0 = None
        if cp is not None:  # chunk_gated_delta_rule_fwd_h_pre_process: the state handed on along the CP ranks
            hm, gathered, h0 = _cp_state(k, v, cp)
            del hm, gathered
        h, v_new = _states(k, v), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
        o = torch.empty_like(v)  # chunk_fwd_o
        del w, u, h, v_new
        ctx.save_for_backward(
            q, k, v, g, beta, a, *((q_rstd, k_rstd) if l2norm else ()), *(() if h0 is None else (h0,))
        )
        ctx.l2norm, ctx.cp = l2norm, cp
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, g, beta, a, *_ = ctx.saved_tensors
        w, u = torch.empty_like(k), torch.empty_like(v)
        h, v_new = _states(k, v), torch.empty_like(u)
        dv = torch.empty_like(do)  # chunk_bwd_dv_local
        dht = None  # lives to the end of fla's chunk_gated_delta_rule_bwd
        if ctx.cp is not None:  # chunk_gated_delta_rule_bwd_dhu_pre_process: the state gradient from the next ranks
            dhm, gathered, dht = _cp_state(k, v, ctx.cp)
            del dhm, gathered
        dh, dv = _states(k, v), torch.empty_like(dv)  # chunk_gated_delta_rule_bwd_dhu
        dq, dk, dw, dg = torch.empty_like(q), torch.empty_like(k), torch.empty_like(w), _rows(q)  # chunk_bwd_dqkwg
        dk2, dv, db, dg2 = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), _rows(q)  # wy bwd
        dg = torch.empty_like(dg)  # the reverse chunk-local cumsum
        del w, u, h, v_new, dh, dw, dk2, dg2, dht  # (chunk_gated_delta_rule_bwd returns)
        if ctx.l2norm:
            dq, dk = torch.empty_like(dq), torch.empty_like(dk)  # l2norm_bwd
        return dq, dk, dv, dg, db, None, None


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_context: CPContext | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's signature (``cu_seqlens`` packs the batch into one row, as fla's varlen path does: same bytes)."""
    if initial_state is not None:
        raise NotImplementedError("the dry run's fla stand-in runs training steps only (no initial recurrent state)")
    if on_call is not None:
        on_call()
    cp = None if cp_context is None else cp_context.world
    o = _ChunkGatedDeltaRule.apply(q, k, v, g, beta, bool(use_qk_l2norm_in_kernel), cp)
    final = None
    if output_final_state:
        final = torch.empty((q.shape[0], q.shape[2], q.shape[3], v.shape[-1]), dtype=torch.float32, device=q.device)
    return o, final


def fused_recurrent_gated_delta_rule(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the dry run's fla stand-in has no recurrent (decoding) kernel")


def install(extra: dict[str, dict[str, Any]] | None = None) -> dict[str, types.ModuleType]:
    """Put the stand-in where ``safe_import_from("fla.ops.gated_delta_rule", ...)`` finds it, with ``extra``'s
    modules and attributes (stack/fla_kda.py's) under the same package; nothing where the real fla is installed."""
    if "fla" in sys.modules or importlib.util.find_spec("fla") is not None:
        return {}
    tree: dict[str, dict[str, Any]] = {
        "fla": {"__version__": "0.4.2", "_stand_in": True},
        "fla.ops": {},
        "fla.ops.gated_delta_rule": {
            "chunk_gated_delta_rule": chunk_gated_delta_rule,
            "fused_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
        },
        "fla.ops.cp": {"build_cp_context": build_cp_context, "FLACPContext": CPContext},
        "fla.modules": {},
        "fla.modules.convolution": {"causal_conv1d": causal_conv1d},
    }
    for name, attrs in (extra or {}).items():
        tree[name] = {**tree.get(name, {}), **attrs}
    return install_modules(tree)


__all__ = ["build_cp_context", "causal_conv1d", "chunk_gated_delta_rule", "install"]
