"""What suggest_strategy returns: ranked candidates, rejected alternatives (no engine imports)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .estimation import MemoryBreakdown
from .report import Finding


class Candidate(BaseModel):
    rank: int
    yaml: str = Field(description="A ready distributed: block (and step_scheduler batch sizes).")
    distributed: dict[str, Any]
    memory_gib: MemoryBreakdown
    comm_bytes_per_step: dict[str, float]
    step_time_s: float
    mfu: float
    tokens_per_second: float
    rationale: list[str]
    findings: list[Finding] = Field(default_factory=list, description="Warnings validate_config gave.")


class Rejected(BaseModel):
    distributed: dict[str, Any]
    reason: str


class CurrentLayout(BaseModel):
    """The recipe's own layout, estimated on the same cluster and sizes as the candidates."""

    distributed: dict[str, Any]
    valid: bool
    errors: list[str] = Field(default_factory=list, description="Why validate_config rejects it on this cluster.")
    memory_gib: float | None = Field(default=None, description="Peak per GPU (worst pipeline rank).")
    fits: bool | None = None
    step_time_s: float | None = None
    best_speedup: float | None = Field(default=None, description="Its step time over the #1 candidate's.")


class SuggestReport(BaseModel):
    model: str
    model_source: str | None = Field(default=None, description="Where the model's dims came from.")
    nodes: int
    gpus_per_node: int
    world_size: int
    gpu: str
    gpu_memory_gib: float
    intra_gbps: float = Field(description="GB/s per GPU, one direction, assumed inside a node.")
    inter_gbps: float = Field(description="GB/s per GPU, one direction, assumed between nodes.")
    seq_len: int
    global_batch_size: int
    micro_batch_size: int
    precision: str
    headroom: float
    strategies: list[str] = Field(
        default_factory=lambda: ["fsdp2", "megatron_fsdp", "ddp"], description="Strategies searched."
    )
    candidates: list[Candidate]
    rejected: list[Rejected] = Field(default_factory=list)
    searched: int = Field(description="Layouts evaluated.")
    fitting: int = Field(description="Layouts that fit in memory.")
    note: str | None = None
    workload: list[str] = Field(
        default_factory=list,
        description="What was read from the recipe's workload (PEFT, optimizer, loss, dtype), one sentence each; "
        "every layout is sized for it.",
    )
    teacher: str | None = Field(
        default=None,
        description="A knowledge-distillation teacher on the student's GPUs, counted in every layout (its sharded "
        "weights, its gathered root and head, its probabilities, its forward's time).",
    )
    from_recipe: dict[str, str] = Field(
        default_factory=dict, description="Arguments taken from the recipe, and the key each came from."
    )
    current: CurrentLayout | None = Field(default=None, description="The recipe's own layout, when a recipe was given.")
    assumed: list[str] = Field(
        default_factory=list,
        description="Sizes neither passed nor in the recipe: built-in "
        "defaults (nodes 1, the GPU's usual node, seq_len 4096, micro batch 1, one micro "
        "batch per GPU).",
    )
