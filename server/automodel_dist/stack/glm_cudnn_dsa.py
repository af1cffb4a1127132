"""Stand-ins for the CUDA kernels behind GLM-5.2's ``backend.attn: cudnn`` sparse attention (DSA): cuDNN Frontend's
``cudnn.DSA`` wrappers (the indexer's scores and top-k, the sparse attention's backward) and FlashMLA's
``flash_mla_sparse_fwd``. AutoModel's own adapters run as written around them (``glm_moe_dsa/kernels/cudnn_dsa.py``:
the packed metadata, the top-k's row chunks, the global indices and their compaction;
``common/cudnn_sparse_attention.py``: the autograd Function, what it saves for backward, its padded indices); only
the kernels are replaced, by what each returns and allocates. Only the dry run's worker imports this module.

Memory model (T query tokens of the packed THD batch, S the longest key segment, H heads; nvidia-cudnn-frontend
>= 1.27, AutoModel's ``cuda`` extra):
  indexer_forward_wrapper:   fp32 scores [T, S] (the kernel scores every query over its key segment)
  indexer_top_k_wrapper:     int32 indices [T, top_k] (and values when asked), its radix scratch allocated per call:
                             T x 2 x S int32 for fp32 scores (``IndexerTopK.scratch_workspace_bytes``; AutoModel
                             chunks its rows by the same factor, ``_TOPK_SCRATCH_INT32_FACTOR``)
  flash_mla_sparse_fwd:      out [T, H, d_v] in q's dtype, fp32 max logits and log-sum-exp [T, H]
  sparse_attention_backward: dq like q, dkv like kv, fp32 d_sink [H]; the SM90 kernel's fp32 scratch (``dpsum`` and
                             the log2 LSE, [T rounded to 64, H] each, and the dKV accumulator [keys rounded to 64,
                             head dim rounded to 32]) for the call (``flash_attn_bwd_sm90_workspace_size``)
The device is taken to be an H100 (SM90), the GPU the corpus ran on: AutoModel pads the query heads for FlashMLA by
the SM's alignment (64 on SM90; GLM-5.2's 64 heads need none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from . import kernel_bindings

KERNELS = "nemo_automodel.components.models.glm_moe_dsa.kernels.cudnn_dsa"
SHARED = "nemo_automodel.components.models.common.cudnn_sparse_attention"
MODEL = "nemo_automodel.components.models.glm_moe_dsa.model"
SM = (9, 0)  # H100
on_call: Any = None  # called at each stood-in kernel call (the dry run's shim counts them)


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
        columns = max_seqlen_k if max_seqlen_k is not None else k.shape[0]
        return {"scores": torch.empty((q.shape[0], columns), device=q.device, dtype=torch.float32)}

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
        factor = importlib.import_module(KERNELS)._TOPK_SCRATCH_INT32_FACTOR
        workspace = torch.empty(rows * factor * columns * 4, device=input_values.device, dtype=torch.uint8)
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


class UnknownValues(RuntimeError):
    """A packed-layout tensor the cuDNN metadata reads whose values the dry run does not know."""


def _on_known_values(original: Callable[..., Any], what: str, *, required: bool) -> Callable[..., Any]:
    """``original`` (AutoModel's) run as written on real CPU tensors where every fake tensor it is handed is a
    constant (the dry run's THD batch: its lengths are constants that propagate through AutoModel's sharder), its
    tensors lifted back into the fake mode as constants; so host reads of the packed layout (``.tolist()``, value-
    dependent shapes) work as on a GPU and what it builds stays known downstream. With an unknown input it runs on
    the fake tensors as before, or, where ``required``, raises :class:`UnknownValues`. Its tensors are index maps a
    few int32s a token: not measured either way."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    def run(*args: Any, **kwargs: Any) -> Any:
        fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        fakes = [a for a in (*args, *kwargs.values()) if isinstance(a, FakeTensor)]
        unknown = [a for a in fakes if a.constant is None]
        if fake_mode is None and not fakes:
            return original(*args, **kwargs)
        if unknown:
            if required:
                raise UnknownValues(
                    f"{what} reads the packed layout's values on the host, and {len(unknown)} of its inputs are not "
                    "known to the dry run (a THD batch whose lengths are not the dry run's own constants)"
                )
            return original(*args, **kwargs)
        fake_mode = fake_mode or fakes[0].fake_mode

        def real(value: Any) -> Any:
            if isinstance(value, FakeTensor):
                return value.constant
            return None if isinstance(value, torch.device) else value  # (the host's)

        with unset_fake_temporarily():
            out = original(*(real(a) for a in args), **{k: real(v) for k, v in kwargs.items()})

        def fake(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, value, make_constant=True)
            return value

        if dataclasses.is_dataclass(out):
            return dataclasses.replace(out, **{f.name: fake(getattr(out, f.name)) for f in dataclasses.fields(out)})
        return fake(out)

    run.__wrapped__ = original  # type: ignore[attr-defined]
    return run


# AutoModel's own, taken before any binding
_ORIGINALS = {
    "prepare": importlib.import_module(KERNELS).prepare_cudnn_dsa_packed_metadata,
    "local_indices": importlib.import_module(SHARDER).contiguous_local_indices,
    "padding_mask": importlib.import_module(THD)._thd_padding_mask,
}
# the packed metadata (which reads the layout on the host, once a stage as on a GPU, and derives shapes from it), the
# query coordinates it is handed (a rank's global token positions: at CP 1 all of them) and the padding mask
prepare_packed_metadata = _on_known_values(_ORIGINALS["prepare"], "cuDNN DSA's packed metadata", required=True)
known_local_indices = _on_known_values(_ORIGINALS["local_indices"], "contiguous_local_indices", required=False)
known_padding_mask = _on_known_values(_ORIGINALS["padding_mask"], "_thd_padding_mask", required=False)


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
