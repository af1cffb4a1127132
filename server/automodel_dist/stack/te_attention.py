"""A stand-in for Transformer Engine's attention, so AutoModel's own model classes run with ``backend.attn: te``
(the only attention they accept under context parallelism) on fake CPU tensors, holding what TE would hold. Only the
dry run's worker imports this module.

Only ``transformer_engine.pytorch.attention.DotProductAttention`` (and ``transformer_engine_torch.
thd_get_partitioned_indices`` for the packed THD CP path) is provided; TE Linear / RMSNorm / GroupedLinear /
rope / optimizers are deliberately absent, so every ``safe_import``/``safe_import_from`` of them still
reports "unavailable" (the plan runs those backends as torch's, and says so).

Install with :func:`install` AFTER ``import_automodel()`` (so the module-level ``HAS_TE = safe_import_te()``
flags in lora.py, module_matcher.py, stateful_wrappers.py, moe_utils.py stay False), and pre-import the few
AutoModel modules that evaluate ``safe_import_te()`` at import time and are not imported yet (:data:`PREIMPORT`).

Memory model (TE 2.x ``AttnFuncWithCPAndKVP2P``, f16/bf16, cp_comm_type="p2p"):
  forward, saved:   q, kv_peer (= p2p_comm_buffers[-1]: one k+v-sized buffer), out, softmax_lse fp32 [b,h,s]
                    (same bytes as flash without CP: q, k, v, out, lse)
  forward, transient: all cp_size k+v buffers (the list keeps them to the end of forward),
                    cp_size partial outputs out_per_step (bf16) + cp_size lse_per_step (fp32)
  backward, transient: dq_buffer (like q), 2 x [2, *kv] (kv + dkv, send/recv double buffer),
                    per-step dq/dk/dv of the flash kernel
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from .stand_in import install_modules

PREIMPORT = (
    "nemo_automodel.components._peft.lora",
    "nemo_automodel.components._peft.module_matcher",
    "nemo_automodel.components.checkpoint.stateful_wrappers",
    "nemo_automodel.components.moe.megatron.moe_utils",
    "nemo_automodel.components.distributed.blockdiag_cp.kernels",
)


def _cp_size(group: Any) -> int:
    if group is None:
        return 1
    if isinstance(group, list):  # a2a+p2p: [a2a_group, p2p_group]
        return group[0].size() * group[1].size()
    return group.size()


class _RingFlashAttention(torch.autograd.Function):
    """Shapes and memory of TE's (CP-)flash attention; the values are not attention's."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str, cp: int) -> torch.Tensor:
        if fmt == "bshd":
            b, s, h = q.shape[0], q.shape[1], q.shape[2]
            lse_shape: tuple[int, ...] = (b, h, s)
            half: tuple[int, ...] = (b, s // 2, h, v.shape[-1])
        elif fmt == "sbhd":
            s, b, h = q.shape[0], q.shape[1], q.shape[2]
            lse_shape, half = (b, h, s), (s // 2, b, h, v.shape[-1])
        else:  # thd: [t, h, d]; packed lse [h, t] (flash >= 2.6) / [t, h, 1] (cuDNN >= 9.6): same bytes
            h, t = q.shape[1], q.shape[0]
            lse_shape, half = (h, t), (t // 2, h, v.shape[-1])
        out4 = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        if cp > 1:
            # p2p_comm_buffers: all cp k+v buffers live until forward returns; the last (a peer's) is saved
            kv_numel = k.numel() + v.numel()
            buffers = [q.new_empty((kv_numel,)) for _ in range(cp)]
            # out_per_step: the diagonal/lower steps cover the whole local q, the upper steps its second half
            partial = [out4.new_empty(out4.shape)] + [out4.new_empty(half) for _ in range(cp - 1)]
            lse_steps = [torch.empty(lse_shape, dtype=torch.float32, device=q.device) for _ in range(cp)]
            saved_kv: tuple[torch.Tensor, ...] = (buffers[-1],)
            del partial, lse_steps
            buffers = buffers[-1:]
        else:
            saved_kv = (k, v)
        ctx.save_for_backward(q, *saved_kv, out4, lse)
        ctx.k_meta, ctx.v_meta, ctx.cp = (k.shape, k.dtype), (v.shape, v.dtype), cp
        return out4.view(*out4.shape[:-2], -1)  # TE returns [b, s, h*dv] / [s, b, h*dv] / [t, h*dv]

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, *_ = ctx.saved_tensors
        (k_shape, k_dtype), (v_shape, v_dtype), cp = ctx.k_meta, ctx.v_meta, ctx.cp
        if cp > 1:
            kv_numel = torch.Size(k_shape).numel() + torch.Size(v_shape).numel()
            dq_buffer = torch.empty_like(q)
            comm = [q.new_empty((2, kv_numel)), q.new_empty((2, kv_numel))]  # [kv, dkv] send / recv
            del dq_buffer, comm
        dq = torch.empty_like(q)
        dk = q.new_empty(k_shape, dtype=k_dtype)
        dv = q.new_empty(v_shape, dtype=v_dtype)
        return dq, dk, dv, None, None


class DotProductAttention(torch.nn.Module):
    """TE's ``DotProductAttention`` constructor, attributes and call signature (no parameters, like TE's)."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Any = None,
        tp_group: Any = None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: list[int] | None = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        self.tp_size = tp_size if tp_group is None else tp_group.size()
        self.num_gqa_groups_per_partition = self.num_gqa_groups // self.tp_size
        k_ch, v_ch = kv_channels if isinstance(kv_channels, tuple) else (kv_channels, kv_channels)
        self.hidden_size_per_attention_head_k = k_ch
        self.hidden_size_per_attention_head_v = v_ch
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.softmax_scale = softmax_scale
        self.attention_dropout = attention_dropout
        self.tp_group = tp_group
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (
            cp_group,
            cp_global_ranks,
            cp_stream,
            cp_comm_type,
        )
        self.softmax_type = kwargs.get("softmax_type", "vanilla")
        if self.softmax_type != "vanilla":  # attention sinks (GPT-OSS): one learned logit per head, TE's parameter
            self.softmax_offset = torch.nn.Parameter(torch.empty(num_attention_heads // max(self.tp_size, 1)))

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        self.tp_group = tp_group

    def set_context_parallel_group(
        self, cp_group: Any, cp_global_ranks: list[int], cp_stream: Any, cp_comm_type: str = "p2p"
    ) -> None:
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (
            cp_group,
            cp_global_ranks,
            cp_stream,
            cp_comm_type,
        )

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: Any = None,
        max_seqlen_kv: Any = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        fmt = qkv_format or self.qkv_format
        cp = _cp_size(self.cp_group)
        mask_type = attn_mask_type or self.attn_mask_type
        if cp > 1 and attention_mask is not None:  # TE: "Padding mask not supported with context parallelism!"
            raise AssertionError("Padding mask not supported with context parallelism!")
        if cp > 1 and fmt == "bshd" and query_layer.shape[1] % 2:
            raise AssertionError("Sequence length per GPU needs to be divisible by 2!")
        if cp > 1 and "causal" not in mask_type and self.cp_comm_type == "p2p":
            pass  # TE runs non-causal p2p too (all tiles); same memory model
        return _RingFlashAttention.apply(query_layer, key_layer, value_layer, fmt, cp)


def thd_get_partitioned_indices(cu_seqlens_padded: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int):
    """TE's load-balanced THD split: per sequence, chunks r and 2*cp-1-r of 2*cp (needs real cu_seqlens)."""
    idx = []
    bounds = cu_seqlens_padded.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            idx.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    out = torch.cat(idx) if idx else torch.empty(0, dtype=torch.long)
    return out.to(device=cu_seqlens_padded.device, dtype=torch.int64)


def install() -> dict[str, types.ModuleType]:
    import importlib

    if "transformer_engine" in sys.modules and not getattr(sys.modules["transformer_engine"], "_stand_in", False):
        return {}  # the real Transformer Engine is imported: nothing to stand in for
    for name in PREIMPORT:  # their import-time safe_import_te() must still see no TE
        importlib.import_module(name)
    return install_modules(
        {
            "transformer_engine": {"__version__": "2.16.0", "_stand_in": True},
            "transformer_engine.pytorch": {"DotProductAttention": DotProductAttention},
            "transformer_engine.pytorch.attention": {"DotProductAttention": DotProductAttention},
            "transformer_engine_torch": {"thd_get_partitioned_indices": thd_get_partitioned_indices},
        }
    )
