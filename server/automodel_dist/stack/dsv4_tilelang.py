"""Stand-ins for the TileLang kernels AutoModel vendors for DeepSeek-V4's sparse attention and indexer (from Miles,
``nemo_automodel/components/models/deepseek_v4/kernels``) and for TileKernels' Sinkhorn, so that ``backend.attn:
tilelang`` runs on fake CPU tensors as it runs on a GPU. Only the kernel builders are replaced, by builders of kernels
that return (or fill) what the real ones do, with what lets AutoModel's dispatch take them (its ``_all_cuda`` check and
TileKernels' availability flags): AutoModel's autograd Functions (``DeepSeekV4SparseAttention`` and its head-chunked
form, ``_Dsv4TileKernelsSinkhorn``), its interfaces' padded indices, valid masks, fp32 accumulators and per-chunk
copies, and the indexer's padded logits run as written. Only the dry run's worker imports this module.

Memory model (AutoModel 0.7.0's vendored interfaces; B sequences of S queries, h heads of a chunk, D = head_dim, K
keys, k selected keys a query):
  sparse MQA forward:  a chunk's out [B, S, h, D] in q's dtype and fp32 base-two lse [B, S, h] (the kernel's
                       out_idx), after the interface's int32 indices and valid mask padded to 64 slots; the chunked
                       Function saves q, kv, the sinks, the indices, out and lse
  sparse MQA backward: fp32 delta [B, S, h] (preprocess), dq [B, S, h, D] (the kernel's out_idx), the interface's
                       fp32 dkv accumulator [B, K, D] (zeroed) and sink gradient, indices and mask padded to 32 slots
  indexer forward:     fp32 logits [S_pad, K_pad] per sequence, which the kernels fill in place (no autograd)
  Sinkhorn:            the hyper-connections' [m, m] mixing ratios a token. backend.attn tilelang sets the Sinkhorn
                       backend to auto, which takes TileKernels' kernels where the package is installed (AutoModel's
                       cuda extra pins tile-kernels 1.0.0) and the tensors are on a GPU. Its Function
                       (optimized_kernels._Dsv4TileKernelsSinkhorn) saves only its fp32 input and fills an output it
                       allocated; the kernels keep every iteration on chip (the backward recomputes them in shared
                       memory) and allocate nothing. On a CPU the same call runs the torch reference: about 120
                       operators forward and 320 backward a call (20 iterations), each iteration's ratios and
                       sums kept for autograd (about 50 times the input's bytes).
(kernels/tilelang_sparse_mla_fwd.py sparse_mqa_fwd_interface, tilelang_sparse_mla_bwd.py sparse_mqa_bwd_interface,
tilelang_indexer_fwd.py indexer_fwd_interface, sparse_attention.py DeepSeekV4SparseAttentionHeadChunked;
tile_kernels 1.0.0 mhc/sinkhorn_kernel.py _mhc_sinkhorn_fwd / _mhc_sinkhorn_bwd)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from . import kernel_bindings

KERNELS = "nemo_automodel.components.models.deepseek_v4.kernels"
OPTIMIZED = "nemo_automodel.components.models.deepseek_v4.optimized_kernels"
on_call: Any = None  # called at each stood-in kernel call (the dry run's shim counts them)
on_sinkhorn_call: Any = None  # called at each stood-in Sinkhorn kernel call (counted apart)


def _count() -> None:
    if on_call is not None:
        on_call()


def _count_sinkhorn() -> None:
    if on_sinkhorn_call is not None:
        on_sinkhorn_call()


def sparse_mqa_fwd(heads: int, dim: int, topk: int, *_: Any, **__: Any) -> Callable[..., Any]:
    """The forward kernel: (q, kv, sinks, indices, valid mask) -> (out in q's dtype, fp32 lse [B, S, h])."""

    def kernel(q: torch.Tensor, kv: torch.Tensor, *_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _count()
        return torch.empty_like(q), torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)

    return kernel


def preprocess(batch: int, seq: int, heads: int, dim: int, *_: Any, **__: Any) -> Callable[..., Any]:
    """The backward's preprocess kernel: (out, dout) -> fp32 delta [B, S, h]."""

    def kernel(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
        return torch.empty((batch, seq, heads), device=o.device, dtype=torch.float32)

    return kernel


def bwd(*_: Any, **__: Any) -> Callable[..., Any]:
    """The backward kernel: dq returned (its out_idx), dkv and the sinks' gradient accumulated in place."""

    def kernel(q: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
        _count()
        return torch.empty_like(q)

    return kernel


def postprocess(*_: Any, **__: Any) -> Callable[..., Any]:
    """The fp32 dkv accumulator cast to bf16."""

    def kernel(dkv: torch.Tensor) -> torch.Tensor:
        return torch.empty(dkv.shape, device=dkv.device, dtype=torch.bfloat16)

    return kernel


def tl_indexer_fwd_impl(*_: Any, **__: Any) -> Callable[..., Any]:
    """The indexer kernel: fills the interface's fp32 logits in place."""

    def kernel(*_: torch.Tensor) -> None:
        _count()

    return kernel


def clean_logits_(*_: Any, **__: Any) -> Callable[..., Any]:
    """Masks the logits outside each query's causal window, in place."""

    def kernel(*_: torch.Tensor) -> None:
        return None

    return kernel


def sinkhorn_fwd(hidden_size: int, token_block_size: int, repeat: int, eps: float) -> Callable[..., Any]:
    """TileKernels' Sinkhorn forward: (x [n, m, m] fp32, out [n, m, m] fp32) -> None, ``out`` filled in place."""

    def kernel(x: torch.Tensor, out: torch.Tensor) -> None:
        _count_sinkhorn()

    return kernel


def sinkhorn_bwd(hidden_size: int, token_block_size: int, repeat: int, eps: float) -> Callable[..., Any]:
    """TileKernels' Sinkhorn backward: (grad_output, x, grad_input), all [n, m, m] fp32 -> None, ``grad_input``
    filled in place (the forward's iterations recomputed on chip)."""

    def kernel(grad_output: torch.Tensor, x: torch.Tensor, grad_input: torch.Tensor) -> None:
        _count_sinkhorn()

    return kernel


# TileKernels' availability flags in optimized_kernels: set, they make is_dsv4_kernel_available("sinkhorn") true as
# the package's imports would
SINKHORN_FLAGS = ("_HAS_TILE_KERNELS_SINKHORN", "_HAS_TILE_KERNELS_SINKHORN_FWD", "_HAS_TILE_KERNELS_SINKHORN_BWD")

STAND_INS = {
    f"{KERNELS}.tilelang_sparse_mla_fwd": {"sparse_mqa_fwd": sparse_mqa_fwd},
    f"{KERNELS}.tilelang_sparse_mla_bwd": {"preprocess": preprocess, "bwd": bwd, "postprocess": postprocess},
    f"{KERNELS}.tilelang_indexer_fwd": {"tl_indexer_fwd_impl": tl_indexer_fwd_impl, "clean_logits_": clean_logits_},
    OPTIMIZED: {"_tile_kernels_sinkhorn_fwd": sinkhorn_fwd, "_tile_kernels_sinkhorn_bwd": sinkhorn_bwd},
}


def _on_gpu(*tensors: torch.Tensor) -> bool:
    return True  # the fake CPU tensors stand for the GPU's


def _bindings() -> list[kernel_bindings.Binding]:
    """(module, name, stand-in) for every binding: the kernels where AutoModel's vendored code calls them, and
    what lets its dispatcher take the TileLang path (the tensors on a GPU, TileKernels' Sinkhorn installed)."""
    flags = [(OPTIMIZED, flag, True) for flag in SINKHORN_FLAGS]
    return kernel_bindings.bindings(STAND_INS, [(OPTIMIZED, "_all_cuda", _on_gpu), *flags])


def install() -> None:
    """Bind the stand-ins for the rest of the process (the dry run's rank)."""
    kernel_bindings.install(_bindings())


def stood_in() -> contextlib.AbstractContextManager[None]:
    """The stand-ins bound for a block, the originals restored after it (tests)."""
    return kernel_bindings.stood_in(_bindings())


__all__ = [
    "bwd",
    "clean_logits_",
    "install",
    "postprocess",
    "preprocess",
    "sinkhorn_bwd",
    "sinkhorn_fwd",
    "sparse_mqa_fwd",
    "stood_in",
    "tl_indexer_fwd_impl",
]
