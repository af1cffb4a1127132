"""What suggest_strategy returns: ranked candidates, rejected alternatives (no engine imports)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..estimate.report import MemoryBreakdown
from ..report import Finding


class Candidate(BaseModel):
    rank: int
    verdict: Literal["fits", "tight"] = Field(
        default="fits",
        description="fits: within the budget even with the estimate's memory error; tight: the budget is inside "
        "that error (check with the dry run). Candidates are ordered fits first, then by step time.",
    )
    yaml: str = Field(description="A ready distributed: block (and step_scheduler batch sizes).")
    distributed: dict[str, Any]
    memory_gib: MemoryBreakdown
    comm_bytes_per_step: dict[str, float]
    step_time_s: float
    mfu: float
    tokens_per_second: float
    rationale: list[str]
    findings: list[Finding] = Field(default_factory=list, description="Warnings validate_config gave.")
    measured: bool = Field(
        default=False,
        description="True when the dry run (AutoModel's own step on fake tensors) measured this layout: the CLI and "
        "MCP surfaces verify the top candidates when AutoModel is installed.",
    )
    measured_peak_gib: float | None = Field(
        default=None, description="The dry run's allocated peak on the worst measured rank (no overhead), GiB."
    )
    measured_fits: bool | None = Field(
        default=None, description="The dry run's peak with overhead within the headroom (null: it could not decide)."
    )
    measured_verdict: Literal["fits", "tight", "does not fit"] | None = Field(
        default=None,
        description="The dry run's verdict: fits within the headroom, tight over it but within the GPU, does not fit "
        "over the GPU (null: it could not decide).",
    )
    measured_note: str | None = Field(default=None, description="Why the dry run did not measure it, when it did not.")


class Rejected(BaseModel):
    distributed: dict[str, Any]
    reason: str


class CurrentLayout(BaseModel):
    """The recipe's own layout, estimated on the same cluster and sizes as the candidates."""

    distributed: dict[str, Any]
    valid: bool
    errors: list[str] = Field(default_factory=list, description="Why validate_config rejects it on this cluster.")
    memory_gib: float | None = Field(default=None, description="Peak per GPU (worst pipeline rank).")
    fits: bool | None = Field(default=None, description="As estimate_memory's: null when tight (or not judged).")
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
