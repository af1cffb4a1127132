"""A stand-in for flash-linear-attention's chunked Gated DeltaNet kernel (``fla.ops.gated_delta_rule.
chunk_gated_delta_rule``), so AutoModel's Qwen3-Next and Qwen3.5 linear-attention layers hold on fake CPU tensors what
they hold on a GPU. AutoModel binds fla's kernel where ``nemo-automodel[fla]`` (in its ``moe`` and ``all`` extras)
installed it, else transformers' pure-torch chunk loop, which keeps every chunk's intermediates for backward: many
times fla's memory, and most of a dry run's time. Only the dry run's worker imports this module.

Only ``fla.ops.gated_delta_rule`` is provided (its chunked kernel; the recurrent one is inference's); ``fla.modules``,
``fla.ops.cp`` and ``fla.ops.kda`` stay absent, so a path that needs them (Kimi-Linear's KDA, fla's context-parallel
GDN) still reports fla unavailable.

Memory model (fla ``ChunkGatedDeltaRuleFunction``, chunk size 64, ``use_qk_l2norm_in_kernel``; q, k [B, T, H, K],
v [B, T, H, V] in bf16, g fp32 and beta [B, T, H]; NT = T / 64):
  forward, saved:     q and k l2-normalised (like q, k) with fp32 rstd [B, T, H] each, v, beta, g's chunk-local
                      cumsum (fp32), the WY matrix A [B, T, H, 64] (k's dtype)
  forward, transient: A in fp32 before solve_tril, w (like k), u and v_new (like v), the chunk states
                      h [B, NT, H, K, V] (k's dtype)
  backward:           w, u, h, v_new recomputed; dv (twice), dh [B, NT, H, K, V], dq, dk, dw, fp32 dg, then the WY
                      backward's dk, dv, dbeta, fp32 dg, dg's reverse cumsum, l2norm's dq, dk
(fla/ops/gated_delta_rule/chunk.py, fla/ops/common/chunk_o.py, chunk_delta_h.py, wy_fast.py)
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import torch

from .stand_in import stand_in_module

CHUNK = 64


def _states(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, t, h, dk = k.shape
    return k.new_empty((b, -(-t // CHUNK), h, dk, v.shape[-1]))


def _rows(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(x.shape[:3], dtype=dtype, device=x.device)


class _ChunkGatedDeltaRule(torch.autograd.Function):
    """Shapes and memory of fla's chunked Gated DeltaNet; the values are not the recurrence's."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, l2norm: bool
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
        h, v_new = _states(k, v), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
        o = torch.empty_like(v)  # chunk_fwd_o
        del w, u, h, v_new
        ctx.save_for_backward(q, k, v, g, beta, a, *((q_rstd, k_rstd) if l2norm else ()))
        ctx.l2norm = l2norm
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, g, beta, a, *_ = ctx.saved_tensors
        w, u = torch.empty_like(k), torch.empty_like(v)
        h, v_new = _states(k, v), torch.empty_like(u)
        dv = torch.empty_like(do)  # chunk_bwd_dv_local
        dh, dv = _states(k, v), torch.empty_like(dv)  # chunk_gated_delta_rule_bwd_dhu
        dq, dk, dw, dg = torch.empty_like(q), torch.empty_like(k), torch.empty_like(w), _rows(q)  # chunk_bwd_dqkwg
        dk2, dv, db, dg2 = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), _rows(q)  # wy bwd
        dg = torch.empty_like(dg)  # the reverse chunk-local cumsum
        del w, u, h, v_new, dh, dw, dk2, dg2
        if ctx.l2norm:
            dq, dk = torch.empty_like(dq), torch.empty_like(dk)  # l2norm_bwd
        return dq, dk, dv, dg, db, None


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
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's signature (``cu_seqlens`` packs the batch into one row, as fla's varlen path does: same bytes)."""
    if initial_state is not None:
        raise NotImplementedError("the dry run's fla stand-in runs training steps only (no initial recurrent state)")
    o = _ChunkGatedDeltaRule.apply(q, k, v, g, beta, bool(use_qk_l2norm_in_kernel))
    final = None
    if output_final_state:
        final = torch.empty((q.shape[0], q.shape[2], q.shape[3], v.shape[-1]), dtype=torch.float32, device=q.device)
    return o, final


def fused_recurrent_gated_delta_rule(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the dry run's fla stand-in has no recurrent (decoding) kernel")


NAMES = ("fla", "fla.ops", "fla.ops.gated_delta_rule")


def install() -> dict[str, types.ModuleType]:
    """Put the stand-in where ``safe_import_from("fla.ops.gated_delta_rule", ...)`` finds it; nothing where the real
    fla is installed."""
    if "fla" in sys.modules or importlib.util.find_spec("fla") is not None:
        return {}
    fla = stand_in_module("fla", __version__="0.4.2", _stand_in=True)
    ops = stand_in_module("fla.ops")
    gdr = stand_in_module(
        "fla.ops.gated_delta_rule",
        chunk_gated_delta_rule=chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule,
    )
    fla.ops, ops.gated_delta_rule = ops, gdr  # type: ignore[attr-defined]
    mods = dict(zip(NAMES, (fla, ops, gdr)))
    sys.modules.update(mods)
    return mods


__all__ = ["chunk_gated_delta_rule", "install"]
