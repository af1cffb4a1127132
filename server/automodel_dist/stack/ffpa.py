"""Stand-ins for the FFPA CuTeDSL attention kernels (the ``ffpa-attn`` package, CUDA only) that AutoModel's Gemma-4
context-parallel ring runs its full-attention layers' chunks through where a recipe sets
``text_config.cp_full_attn_backend: ffpa`` (``gemma4_moe/cp_attention.py``), so that the ring runs on fake CPU tensors
as on a GPU: AutoModel's own wrappers (``components/attention/ffpa_attention.py``: their ``contiguous()`` copies, the
ring's gathers, merges and scatters) run as written; only the kernels are replaced, by outputs of the shapes and
dtypes those wrappers document. Only the dry run's worker imports this module.

Memory model (AutoModel 0.7.0's ``ffpa_attention.py`` docstrings; B batch, H heads, S a chunk's tokens, T packed tokens):
  dense forward  ``ffpa_attn.cute._ffpa_attn_forward_cute``: out [B, Hq, S, Dv] in q's dtype, fp32 lse [B, Hq, S]
  dense backward ``ffpa_attn.cute._ffpa_attn_backward_cute``: dq, dk, dv like q, k, v (GQA: k's heads)
  varlen forward ``torch.ops.ffpa_attn._varlen_fwd_cute``: out [T, Hq, Dv] in q's dtype, fp32 lse [Hq, T]
  varlen backward ``torch.ops.ffpa_attn._varlen_bwd_cute``: dq, dk, dv like q, k, v
The kernels' own workspaces (a flash backward's fp32 accumulators) are not measured.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

on_call: Any = None  # called at each stood-in kernel call (the dry run's shim counts them)
LIBRARY = "ffpa_attn"
_ops: list[Any] = []  # torch.library's registrations, kept alive for the process


def _count() -> None:
    if on_call is not None:
        on_call()


def _dense_out(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, s, _ = q.shape
    out = torch.empty((b, h, s, v.shape[-1]), dtype=q.dtype, device=q.device)
    return out, torch.empty((b, h, s), dtype=torch.float32, device=q.device)


def _ffpa_attn_forward_cute(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, return_lse: bool = False
) -> Any:
    out, lse = torch.ops.ffpa_attn._fwd_cute(q, k, v, scale, causal)
    return (out, lse) if return_lse else out


def _ffpa_attn_backward_cute(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.ffpa_attn._bwd_cute(grad_out, q, k, v, out, lse, scale, causal)


def _register() -> None:
    """The four kernels as torch operators of the ``ffpa_attn`` namespace (where AutoModel looks them up), each
    answering with fresh outputs of its documented shapes, under FakeTensorMode too."""
    lib = torch.library.Library(LIBRARY, "DEF")  # noqa: TOR901 - a namespace of stand-ins, defined once
    _ops.append(lib)
    lib.define("_fwd_cute(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> (Tensor, Tensor)")
    lib.define(
        "_bwd_cute(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float scale, bool causal) "
        "-> (Tensor, Tensor, Tensor)"
    )
    lib.define(
        "_varlen_fwd_cute(Tensor q, Tensor k, Tensor v, Tensor cu_q, Tensor cu_k, int max_q, int max_k, float scale, "
        "bool causal, int window_left, int window_right, float softcap, bool pack_gqa) -> (Tensor, Tensor)"
    )
    lib.define(
        "_varlen_bwd_cute(Tensor q, Tensor k, Tensor v, Tensor out, Tensor grad_out, Tensor lse, Tensor cu_q, "
        "Tensor cu_k, int max_q, int max_k, float scale, bool causal, int window_left, int window_right, "
        "float softcap, Tensor? extra) -> (Tensor, Tensor, Tensor)"
    )

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> Any:
        _count()
        return _dense_out(q, v)

    def bwd(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> Any:
        _count()
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> Any:
        _count()
        t, h, _ = q.shape
        out = torch.empty((t, h, v.shape[-1]), dtype=q.dtype, device=q.device)
        return out, torch.empty((h, t), dtype=torch.float32, device=q.device)

    def varlen_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> Any:
        _count()
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    kernels = {"_fwd_cute": fwd, "_bwd_cute": bwd, "_varlen_fwd_cute": varlen_fwd, "_varlen_bwd_cute": varlen_bwd}
    for name, fn in kernels.items():
        lib.impl(name, fn, "CompositeExplicitAutograd")  # (AutoModel's ring calls them inside its own Function)
        torch.library.register_fake(f"{LIBRARY}::{name}", fn, lib=lib)


def _modules() -> tuple[types.ModuleType, types.ModuleType]:
    package = types.ModuleType("ffpa_attn")
    package.__path__ = []  # a package, so that ``import ffpa_attn.cute`` finds its submodule in sys.modules
    cute = types.ModuleType("ffpa_attn.cute")
    cute._ffpa_attn_forward_cute = _ffpa_attn_forward_cute  # type: ignore[attr-defined]
    cute._ffpa_attn_backward_cute = _ffpa_attn_backward_cute  # type: ignore[attr-defined]
    package.cute = cute  # type: ignore[attr-defined]
    return package, cute


def _forget_readiness() -> None:
    """AutoModel caches whether FFPA's kernels import (``_FFPA_LOW_LEVEL_READY``): asked again after a change."""
    from nemo_automodel.components.attention import ffpa_attention

    ffpa_attention._FFPA_LOW_LEVEL_READY = None


def install() -> None:
    """The ``ffpa_attn`` package (its ``cute`` module and operators) as stand-ins, for the rest of the process (the
    dry run's rank: fake tensors, which the real kernels could not run even where the package is installed)."""
    if not _ops:
        _register()
    sys.modules["ffpa_attn"], sys.modules["ffpa_attn.cute"] = _modules()
    _forget_readiness()


@contextlib.contextmanager
def stood_in() -> Iterator[None]:
    """The stand-ins importable for a block, whatever was there before restored after it (tests; the operators stay
    registered, unreachable by AutoModel's readiness check, which imports the package first)."""
    saved = {name: sys.modules.get(name) for name in ("ffpa_attn", "ffpa_attn.cute")}
    install()
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        _forget_readiness()


__all__ = ["install", "stood_in"]
