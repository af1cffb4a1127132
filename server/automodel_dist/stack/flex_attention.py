"""A stand-in for ``torch.compile(flex_attention)`` as Gemma-4's context-parallel ring calls it (AutoModel's
gemma4_moe/cp_attention.py, once per ring chunk, forward and in its backward's recompute).

Dynamo refuses fake tensors, and torch's eager flex_attention refuses a backward on CPU tensors and, run eagerly,
would materialise the chunk's whole score matrix, which the compiled Triton kernel never does. What the compiled
kernel allocates and keeps is read from torch's own lowering (torch/_inductor/kernel/flex/flex_attention.py) and its
autograd function (torch/_higher_order_ops/flex_attention.py, FlexAttentionAutogradOp):

- forward: the output ``[B, Hq, S, Dv]`` in the query's dtype, the log-sum-exp ``[B, Hq, S]`` in fp32 (always fp32)
  and the max scores beside it (fp32, returned only on request);
- kept for backward: query, key, value, output, log-sum-exp and max scores (the block mask's few int32 tables and
  the mask's captured index tensors are not counted);
- backward: ``delta`` (fp32 ``[B, Hq, S]``, the row sums of output x its gradient less the log-sum-exp's gradient),
  then the query's gradient and the key's and value's at the key's own head count (GQA sums in the kernel).

Both outputs take gradients, as AutoModel's online-softmax merge of the ring chunks differentiates through the
log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

on_call: Callable[[], None] = lambda: None  # noqa: E731 - replaced by the shim's counter


class _CompiledFlexAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, heads, seq = query.shape[:3]
        out = query.new_empty((batch, heads, seq, value.shape[-1]))
        lse = query.new_empty((batch, heads, seq), dtype=torch.float32)
        max_scores = torch.empty_like(lse)  # the kernel's second fp32 row output (returned only on request)
        ctx.save_for_backward(query, key, value, out, lse, max_scores)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        query, key, value, _out, lse, _max_scores = ctx.saved_tensors
        delta = torch.empty_like(lse)
        grads = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        del delta
        return grads


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    kernel_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``torch.compile(flex_attention)``'s call and its outputs' shapes, dtypes and kept tensors (not its values)."""
    if query.dim() != 4 or key.shape[:2] != value.shape[:2] or key.shape[2] != value.shape[2]:
        raise ValueError(
            f"flex_attention stand-in: q {tuple(query.shape)}, k {tuple(key.shape)}, v {tuple(value.shape)}"
        )
    if query.shape[1] != key.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        raise ValueError(f"flex_attention stand-in: {query.shape[1]} query heads over {key.shape[1]} KV heads")
    on_call()
    out, lse = _CompiledFlexAttention.apply(query, key, value)
    return (out, lse) if return_lse else out


__all__ = ["flex_attention"]
