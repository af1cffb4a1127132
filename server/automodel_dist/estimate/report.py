"""The estimate's report models (per-GPU memory and the whole estimate), apart from the arithmetic so that the MCP
server can declare its tools' output without importing the estimator."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..report import Finding, Resolved


class MemoryBreakdown(BaseModel):
    """Per-GPU memory in GiB for the worst rank."""

    params: float = Field(description="Sharded parameters (storage dtype).")
    grads: float = Field(
        description="Sharded gradients held at the peak (zero_grad frees them after each step; they are re-created "
        "as each unit's gradients are reduce-scattered)."
    )
    optimizer: float = Field(description="Optimizer states.")
    activations: float = Field(description="Saved activations of in-flight microbatches, logits and loss.")
    buffers: float = Field(description="Unsharded FSDP parameters/gradients, loss temporaries, PP p2p buffers.")
    overhead: float = Field(description="CUDA context and allocator fragmentation margin.")
    total: float
    model_states: float = Field(description="params + every sharded gradient + optimizer (as at the optimizer step).")
    tracked_peak: float = Field(description="What torch's memory tracker sees: total minus overhead.")
    worst_pp_rank: int = 0
    peak_phase: str = Field(
        default="",
        description="start-of-backward, head-forward (the lm_head's own FSDP unit gathered beside its all-gather "
        "buffer and its logits), next-microbatch-forward and gathered-late-backward (AutoModel's MoE FSDP "
        "optimizations keep every unit gathered between microbatches, and gathered again by a microbatch's "
        "backward), in-backward (a block's gradients and the next block's gather), "
        "end-of-stage-backward (a single-stage pipeline rank with every block gathered), late-backward (the first "
        "block's backward: every other block's gradients made, a tied head's held to the end), end-of-backward or "
        "optimizer-step.",
    )
    teacher: float = Field(
        default=0.0,
        description="Knowledge distillation: the teacher's weights on this GPU (sharded like the student's, in the "
        "compute dtype, no gradients or optimizer states; its root unit and output embedding stay gathered after "
        "its gradient-free forward) and its probabilities kept for the KD loss; included in total, not in params.",
    )
    deferred_grads: float = Field(
        default=0.0,
        description=(
            "Part of buffers: the unsharded fp32 gradients FSDP2 holds across the backward passes of a step when "
            "defer_fsdp_grad_sync is true (AutoModel's default) and a step has several (gradient accumulation) or runs "
            "under PP; defer_fsdp_grad_sync: false reduce-scatters after every backward instead."
        ),
    )


class Estimate(BaseModel):
    """Memory and communication of one layout, per GPU."""

    model: str
    model_source: str | None = Field(default=None, description="Where the model's dims came from.")
    world_size: int
    layout: Resolved
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    intra_gbps: float | None = Field(default=None, description="GB/s per GPU, one direction, assumed inside a node.")
    inter_gbps: float | None = Field(default=None, description="GB/s per GPU, one direction, assumed between nodes.")
    precision: str
    seq_len: int
    micro_batch_size: int
    global_batch_size: int | None = None
    memory_gib: MemoryBreakdown
    fits: bool | None = Field(
        default=None,
        description="True when the verdict is fits, False when it is does not fit; null when tight or not judged.",
    )
    verdict: Literal["fits", "tight", "does not fit"] | None = Field(
        default=None,
        description="fits: total x (1 + memory_error) <= GPU memory x (1 - headroom); does not fit: total x "
        "(1 - memory_error) exceeds it; tight: the budget is inside the estimate's error band (run the dry run); "
        "null: not judged (an assumed sequence length or image, or an unknown teacher).",
    )
    memory_error: float = Field(
        default=0.0, description="The estimate's measured error on the peak (a fraction), which the verdict allows."
    )
    headroom: float = 0.0
    comm_bytes_per_step: dict[str, float] = Field(default_factory=dict)
    comm_time_s: dict[str, float] = Field(default_factory=dict)
    crosses_nodes: dict[str, bool] = Field(default_factory=dict)
    step_time_s: float | None = None
    mfu: float | None = None
    tokens_per_step: int | None = None
    grad_accumulation_steps: int | None = None
    bubble_fraction: float = 0.0
    max_seq_len: int | None = Field(
        default=None,
        description=(
            "Longest seq_len (a multiple of 128 and of what CP/SP split it by) that fits with headroom at this micro "
            "batch; null if none does."
        ),
    )
    max_micro_batch_size: int | None = Field(
        default=None, description=("Largest micro batch that fits with headroom at this seq_len; null if none does.")
    )
    seq_len_known: bool = Field(
        default=True,
        description="False when neither the call nor the recipe fixes the sequence length (dynamic padding): the "
        "memory is then at an assumed length, with no fit verdict (fits is null).",
    )
    micro_batch_at_lengths: dict[int, int | None] = Field(
        default_factory=dict,
        description="With the length unknown: the largest micro batch that fits at 2,048, 4,096 and 8,192 tokens.",
    )
    shortest_seq_len: int | None = Field(
        default=None,
        description=(
            "When no seq_len fits (max_seq_len null): the shortest one searched (128, or what CP/SP split by)."
        ),
    )
    shortest: MemoryBreakdown | None = Field(
        default=None, description=("The memory at shortest_seq_len: what does not shrink with the sequence.")
    )
    assumed: list[str] = Field(
        default_factory=list,
        description=(
            "Sizes neither passed nor in the recipe: seq_len 4096, micro batch 1, a VLM step's image (media.IMAGE_PX)."
        ),
    )
    workload: list[str] = Field(
        default_factory=list,
        description="What was read from the recipe (PEFT, optimizer, loss, dtype) and what each costs, one sentence "
        "each.",
    )
    trainable_params: float | None = Field(default=None, description="Parameters that train (all, or the adapters).")
    findings: list[Finding] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list, description="What the estimate assumes, stated.")


__all__ = ["Estimate", "MemoryBreakdown"]
