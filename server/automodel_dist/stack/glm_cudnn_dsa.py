"""Stand-ins for the CUDA kernels behind GLM-5.2's ``backend.attn: cudnn`` sparse attention (DSA): cuDNN Frontend's
``cudnn.DSA`` wrappers (the indexer's scores and top-k, the sparse attention's backward) and FlashMLA's
``flash_mla_sparse_fwd``. AutoModel's own adapters run as written around them (``glm_moe_dsa/kernels/cudnn_dsa.py``:
the packed metadata, the top-k's row chunks, the global indices and their compaction;
``common/cudnn_sparse_attention.py``: the autograd Function, what it saves for backward, its padded indices); only
the kernels are replaced, by what each returns and allocates. Only the dry run's worker imports this module.

Memory model (T query tokens of the packed THD batch, S the longest key segment, H heads; nvidia-cudnn-frontend
>= 1.27, which AutoModel's ``cuda`` extra requires):
  indexer_forward_wrapper:   fp32 scores [T, S] (the kernel scores every query over its key segment)
  indexer_top_k_wrapper:     int32 indices [T, top_k] (and values when asked), its radix scratch allocated per call:
                             T x 2 x S int32 for fp32 scores (``IndexerTopK.scratch_workspace_bytes``, two buffers
                             for fp32 input; AutoModel chunks its rows by the same factor, which the shim checks)
  flash_mla_sparse_fwd:      out [T, H, d_v] in q's dtype, fp32 max logits and log-sum-exp [T, H]
  sparse_attention_backward: dq like q, dkv like kv, fp32 d_sink [H]; the SM90 kernel's fp32 scratch (``dpsum`` and
                             the log2 LSE, [T rounded to 64, H] each, and the dKV accumulator [keys rounded to 64,
                             head dim rounded to 32]) for the call (``flash_attn_bwd_sm90_workspace_size``)
Assumed: the GPU is an H100 (SM90), the GPU the corpus ran on, which sets FlashMLA's query-head padding (64 on SM90;
AutoModel pads a rank's heads up to it), and it has both packages installed (FlashMLA is in none of AutoModel's
extras; without either AutoModel raises rather than fall back). Not measured: the kernels' own buffers beyond those
above (cuDNN's compile caches, FlashMLA's on-chip tiles).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import torch

from . import kernel_bindings
from .known_values import when_known

KERNELS = "nemo_automodel.components.models.glm_moe_dsa.kernels.cudnn_dsa"
SHARED = "nemo_automodel.components.models.common.cudnn_sparse_attention"
MODEL = "nemo_automodel.components.models.glm_moe_dsa.model"
SM = (9, 0)  # H100
TOPK_BUFFERS_FP32 = 2  # IndexerTopK's int32 radix buffers a score for fp32 input (buffer_numbers)
on_call: Callable[[], None] | None = None  # called at each stood-in kernel call (the dry run's shim counts them)


def _count() -> None:
    if on_call is not None:
        on_call()


def _round_up(value: int, multiple: int) -> int:
    return (int(value) + multiple - 1) // multiple * multiple


class CudnnDsa:
    """``cudnn.DSA``'s wrappers, as AutoModel calls them (each returns a dict of named outputs, as cuDNN's
    ``TupleDict``)."""

    @staticmethod
    def indexer_forward_wrapper(
        q: torch.Tensor,
        k: torch.Tensor,
        w: torch.Tensor,
        ratio: int = 4,
        *args: Any,
        max_seqlen_k: int | None = None,
        **kwargs: Any,
    ) -> dict[str, torch.Tensor]:
        _count()
        if max_seqlen_k is None:  # (AutoModel's GLM adapter always passes THD segments)
            raise NotImplementedError("the cuDNN indexer stand-in takes THD segments (max_seqlen_k) only")
        return {"scores": torch.empty((q.shape[0], max_seqlen_k), device=q.device, dtype=torch.float32)}

    @staticmethod
    def indexer_top_k_wrapper(
        input_values: torch.Tensor,
        seq_lens: torch.Tensor,
        top_k: int,
        next_n: int = 1,
        return_val: bool = True,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, torch.Tensor | None]:
        _count()
        rows, columns = input_values.shape
        if input_values.dtype != torch.float32:  # (AutoModel hands it fp32 scores; other dtypes take other counts)
            raise NotImplementedError(f"the cuDNN top-k stand-in takes fp32 scores, not {input_values.dtype}")
        scratch = rows * TOPK_BUFFERS_FP32 * columns * 4
        workspace = torch.empty(scratch, device=input_values.device, dtype=torch.uint8)
        indices = torch.empty((rows, top_k), device=input_values.device, dtype=torch.int32)
        values = input_values.new_empty((rows, top_k)) if return_val else None
        del workspace  # freed when the call returns
        return {"indices": indices, "values": values}

    @staticmethod
    def sparse_attention_backward_wrapper(
        q: torch.Tensor,
        kv: torch.Tensor,
        out: torch.Tensor,
        dout: torch.Tensor,
        lse: torch.Tensor,
        attn_sink: torch.Tensor,
        topk_idxs: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, torch.Tensor]:
        _count()
        rows, heads, dim = q.shape
        stats = _round_up(rows, 64) * heads
        scratch = [torch.empty(stats, device=q.device, dtype=torch.float32) for _ in range(2)]
        scratch.append(
            torch.empty(_round_up(kv.shape[0], 64) * _round_up(dim, 32), device=q.device, dtype=torch.float32)
        )
        grads = {"dq": torch.empty_like(q), "dkv": torch.empty_like(kv), "d_sink": torch.empty_like(attn_sink)}
        del scratch
        return grads


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _count()
    rows, heads = q.shape[0], q.shape[1]
    stats = (rows, heads)
    return (
        q.new_empty((rows, heads, d_v)),
        torch.empty(stats, device=q.device, dtype=torch.float32),
        torch.empty(stats, device=q.device, dtype=torch.float32),
    )


SHARDER = "nemo_automodel.components.distributed.context_parallel.sharder"
GLM_CP = "nemo_automodel.components.models.glm_moe_dsa.cp"
THD = "nemo_automodel.components.distributed.thd_utils"
# AutoModel's own, taken before any binding
_ORIGINALS = {
    "prepare": importlib.import_module(KERNELS).prepare_cudnn_dsa_packed_metadata,
    "local_indices": importlib.import_module(SHARDER).contiguous_local_indices,
    "padding_mask": importlib.import_module(THD)._thd_padding_mask,
}
# On the THD batch's known values (stack/known_values.py): the packed metadata, which reads the layout on the host
# (once a stage, as on a GPU) and derives shapes from it; the query coordinates it is handed (a rank's global token
# positions, from sizes alone: at CP 1 all of them); the padding mask AutoModel builds from the pack's lengths
prepare_packed_metadata = when_known(_ORIGINALS["prepare"], required="cuDNN DSA's packed metadata")
known_local_indices = when_known(_ORIGINALS["local_indices"], from_sizes=True)
known_padding_mask = when_known(_ORIGINALS["padding_mask"])


def _on_gpu(operation: str, *tensors: torch.Tensor) -> tuple[int, int]:
    return SM  # the fake CPU tensors stand for the GPU's


def _bindings() -> list[kernel_bindings.Binding]:
    """(module, name, stand-in) for every binding: the kernels where AutoModel's adapters look them up, the flags
    that say both packages imported, and the device check (CUDA tensors on SM90 or later)."""
    extra = []
    for module in (KERNELS, SHARED):
        extra += [
            (module, "_HAS_CUDNN_DSA", True),
            (module, "_HAS_FLASH_MLA", True),
            (module, "_CUDNN_DSA", CudnnDsa),
            (module, "_require_cuda_tensors", _on_gpu),
        ]
    extra.append((SHARED, "_FLASH_MLA_SPARSE_FWD", flash_mla_sparse_fwd))
    # where the model prepares it once a stage, and where the indexer would without it
    extra += [(module, "prepare_cudnn_dsa_packed_metadata", prepare_packed_metadata) for module in (MODEL, KERNELS)]
    # the query coordinates it reads: GLM's packed CP sharder's (imported by name) and the sharder module's (the
    # model's prepare_model_inputs_for_cp imports it from there at each call)
    extra += [(module, "contiguous_local_indices", known_local_indices) for module in (SHARDER, GLM_CP)]
    extra.append((THD, "_thd_padding_mask", known_padding_mask))
    return kernel_bindings.bindings({}, extra)


def install() -> None:
    """Bind the stand-ins for the rest of the process (the dry run's rank)."""
    kernel_bindings.install(_bindings())


def stood_in() -> contextlib.AbstractContextManager[None]:
    """The stand-ins bound for a block, the originals restored after it (tests)."""
    return kernel_bindings.stood_in(_bindings())


__all__ = ["CudnnDsa", "flash_mla_sparse_fwd", "install", "stood_in"]
