"""A stand-in for what DeepEP, HybridEP and UCCL-EP hold, on AutoModel's torch dispatcher path (the dry run only).

Those dispatchers need CUDA; the dry run runs the recipe's ``dispatcher: deepep|hybridep|uccl_ep`` as ``torch``. On
that path ``GroupedExperts.forward`` (and its LoRA and MXFP4 twins, shims._GATHERING_EXPERTS) all-gathers every token
of the EP group (``_gather_ep_inputs``), computes an fp32 output of the gathered size and all-reduces it, none
of which DeepEP or HybridEP hold: they send each rank the token rows its experts need (``GroupedExpertsDeepEP``). The
stand-in keeps the exchange on the rank: ``_gather_ep_inputs`` returns this rank's own tokens (with the per-rank counts
that make the forward's final narrow select all of them) and the all-reduce passes its input through, while the
experts run AutoModel's own grouped GEMMs on this rank's T*k routed rows (balanced routing delivers as many). The
exchange's communication buffers are not measured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn_f


def local_gather(
    x: torch.Tensor,
    token_mask: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    *,
    ep_group: Any,
    ep_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """``GroupedExperts._gather_ep_inputs`` without the gather: this rank's tokens, fp32 weights as it makes them."""
    lens = [0] * ep_size
    lens[dist.get_rank(ep_group)] = x.size(0)  # the forward narrows from sum(lens[:ep_rank]) = 0
    return x, weights.float(), indices, token_mask, lens


def _passthrough(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def local_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    """An experts forward whose EP all-reduce of the combined output passes it through (nothing was gathered)."""

    @functools.wraps(forward)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        original = dist_nn_f.all_reduce
        dist_nn_f.all_reduce = _passthrough
        try:
            return forward(self, *args, **kwargs)
        finally:
            dist_nn_f.all_reduce = original

    return wrapped


__all__ = ["local_forward", "local_gather"]
