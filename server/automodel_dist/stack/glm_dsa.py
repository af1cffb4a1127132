"""Stand-ins for the TileLang kernels AutoModel vendors for GLM-5.2's sparse attention (DSA,
``nemo_automodel/components/models/glm_moe_dsa/kernels``), so that ``backend.attn: tilelang`` runs on fake CPU tensors
as it runs on a GPU: AutoModel's own autograd Functions (``IndexerFunction``, ``SparseMLA``), their top-k selection
and every allocation their kernel interfaces make run as written; only the TileLang kernels (CUDA) are replaced, by
their outputs. Only the dry run's worker imports this module.

Memory model (AutoModel 0.7.0's vendored interfaces; T tokens of the packed THD batch, H heads):
  indexer forward:     fp32 logits [T, T_kv] (the kernel scores every query over its causal window), top-k over
                       them in row chunks and the selected scores; saved: the indexer's q and k, the head weights,
                       the windows' starts and ends, the top-k indices [T, topk] int32
  indexer backward:    dq like q, fp32 dweights like the weights, fp32 dk like k (zeroed)
  sparse MLA forward:  out [T, H, 512] in q's dtype and fp32 lse [T, H]; saved: q, kv, indices, out, lse
  sparse MLA backward: fp32 delta [T, H], fp32 dkv like kv (zeroed), dq like q, dkv cast back to kv's dtype
(tilelang_indexer_fwd.indexer_fwd_interface, tilelang_indexer_bwd.indexer_bwd_interface,
tilelang_sparse_mla_fwd.sparse_mla_fwd_interface, tilelang_sparse_mla_bwd.sparse_mla_bwd)
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import kernel_bindings

KERNELS = "nemo_automodel.components.models.glm_moe_dsa.kernels"
OPTIMIZED = "nemo_automodel.components.models.glm_moe_dsa.optimized_kernels"
on_call: Any = None  # called at each stood-in kernel call (the dry run's shim counts them)


def _count() -> None:
    if on_call is not None:
        on_call()


def indexer_fwd_interface(
    q: torch.Tensor,
    kv: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    clean_logits: bool = True,
) -> torch.Tensor:
    _count()
    return torch.empty([q.shape[0], kv.shape[0]], device=q.device, dtype=torch.float32)


def indexer_bwd_interface(
    index_q: torch.Tensor,
    weights: torch.Tensor,
    index_k: torch.Tensor,
    topk_indices: torch.Tensor,
    grad_scores: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _count()
    grad_scores = grad_scores.contiguous()
    grad_q = torch.empty_like(index_q)
    grad_w = torch.empty_like(weights, dtype=torch.float32)
    grad_k = torch.zeros_like(index_k, dtype=torch.float32)
    return grad_q, grad_w, grad_k


def sparse_mla_fwd_interface(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    return_p_sum: bool = False,
    d_v: int = 512,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    _count()
    seq, heads = q.shape[0], q.shape[1]
    return q.new_empty((seq, heads, d_v)), torch.empty((seq, heads), device=q.device, dtype=torch.float32)


def sparse_mla_bwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    indices: torch.Tensor,
    lse: torch.Tensor,
    sm_scale: float | None = None,
    is_casual: bool = True,
    return_kernel: bool = False,
    delta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    _count()
    if delta is None:
        delta = torch.empty(q.shape[:2], device=q.device, dtype=torch.float32)
    dkv = torch.zeros_like(kv, dtype=torch.float32)
    dq = torch.empty_like(q)
    return dq, dkv.to(kv.dtype)


STAND_INS = {
    f"{KERNELS}.indexer": {
        "indexer_fwd_interface": indexer_fwd_interface,
        "indexer_bwd_interface": indexer_bwd_interface,
    },
    f"{KERNELS}.sparse_mla": {"sparse_mla_fwd_interface": sparse_mla_fwd_interface, "sparse_mla_bwd": sparse_mla_bwd},
}


def _on_gpu(*tensors: torch.Tensor) -> bool:
    return True  # the fake CPU tensors stand for the GPU's


def _bindings() -> list[kernel_bindings.Binding]:
    """(module, name, stand-in) for every binding: the kernels where AutoModel's vendored code calls them, and
    what lets its dispatcher take the TileLang path (tilelang importable, the tensors on a GPU)."""
    return kernel_bindings.bindings(STAND_INS, ((OPTIMIZED, "HAS_TILELANG", True), (OPTIMIZED, "_all_cuda", _on_gpu)))


def install() -> None:
    """Bind the stand-ins for the rest of the process (the dry run's rank)."""
    kernel_bindings.install(_bindings())


def stood_in() -> contextlib.AbstractContextManager[None]:
    """The stand-ins bound for a block, the originals restored after it (tests)."""
    return kernel_bindings.stood_in(_bindings())


__all__ = [
    "indexer_bwd_interface",
    "indexer_fwd_interface",
    "install",
    "sparse_mla_bwd",
    "sparse_mla_fwd_interface",
    "stood_in",
]
