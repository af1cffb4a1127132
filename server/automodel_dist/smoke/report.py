"""The smoke-test report (pure pydantic; the parent process never imports torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..report import Explanation, Finding, Resolved

Status = Literal["passed", "failed", "not_run"]


class Tolerance(BaseModel):
    """Parity bounds: relative loss difference per step and relative max parameter difference."""

    precision: Literal["fp32", "bf16"]
    loss_rel: float
    param_rel: float
    grad_rel: float


# Parameters are compared per tensor as ||p - p_ref|| / ||p_ref|| (the worst tensor counts).
# fp32: parity up to reduction order (measured ~1e-7). bf16 mixed precision (bf16 compute, fp32
# master weights and reduction): the reference computes the same way (a bf16 copy of its fp32
# master weights, as FSDP2 does), so only where the layout splits sums and rounds differs; bf16
# keeps 8 mantissa bits (~4e-3 relative per op) and AdamW moves a weight by up to lr per step
# whatever its gradient's size, so rounding can move some weights differently: bound the loss and
# the parameters at 2e-2 (measured worst cases over the layouts, MoE included: loss 3e-3,
# parameters 1.2e-2). First-step gradients catch what AdamW's scale invariance hides (a sum where a
# mean belongs: >= 50% off with dp >= 2); in bf16 a gradient tensor is up to 5e-2 off by rounding
# alone, so its bound is 1e-1. (Against an fp32 reference a bf16 MoE run is off by rounding alone:
# near-tied router scores pick other experts, 0.35 on a router's gradient in one process.)
TOLERANCES = {
    "fp32": Tolerance(precision="fp32", loss_rel=1e-4, param_rel=1e-4, grad_rel=1e-4),
    "bf16": Tolerance(precision="bf16", loss_rel=2e-2, param_rel=2e-2, grad_rel=1e-1),
}


class RankReport(BaseModel):
    rank: int
    ok: bool
    groups: dict[str, list[int]] = Field(default_factory=dict)
    mesh_matches: bool | None = None
    stages: list[int] = Field(default_factory=list, description="Pipeline stages this rank held.")
    step_times_s: list[float] = Field(default_factory=list)
    peak_rss_mib: float | None = None
    cuda_max_allocated_mib: float | None = None
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optim_bytes: int | None = None
    max_param_rel_diff: float | None = None
    worst_param: str | None = None
    error: str | None = None
    traceback_tail: list[str] = Field(default_factory=list)
    max_grad_rel_diff: float | None = None
    where: dict = Field(default_factory=dict, description="Last phase/step the rank reached (failed/hung ranks).")
    state: Literal["finished", "failed", "hung", "terminated", "not_started"] = "finished"


class Timing(BaseModel):
    launch_s: float | None = Field(default=None, description="torchrun spawn to the worker's first line.")
    import_s: float | None = Field(default=None, description="import torch in the worker.")
    init_s: float | None = Field(default=None, description="Process group, meshes, model, parallelism.")
    steps_s: float | None = Field(default=None, description="The training steps.")
    check_s: float | None = Field(default=None, description="Single-process reference and comparison.")
    teardown_s: float | None = Field(default=None, description="Last rank done to torchrun exit.")
    total_s: float | None = None


class SmokeReport(BaseModel):
    """Result of ``run_smoke_test``: ``passed`` only when every check held on every rank."""

    passed: bool
    status: Status
    reason: str | None = Field(default=None, description="Why it failed or was not run.")
    world_size: int
    layout: Resolved = Field(default_factory=Resolved)
    backend: str | None = None
    device: str | None = None
    model: str
    stack: Literal["automodel", "tiny"] | None = Field(
        default=None,
        description="automodel: the recipe's architecture built, parallelized and trained by AutoModel's own code; "
        "tiny: this tool's home-made model through its re-implementation of AutoModel's parallelize order.",
    )
    model_class: str | None = Field(default=None, description="The class AutoModel built (AutoModel's stack).")
    model_dims: dict = Field(default_factory=dict, description="The tiny model's configuration.")
    substitutions: list[str] = Field(
        default_factory=list, description="CUDA-only kernels and settings that ran as something else, each named."
    )
    rewrites: list[str] = Field(default_factory=list, description="AutoModel's own fallbacks this run took.")
    steps: int
    tolerance: Tolerance | None = None
    losses: list[float] = Field(default_factory=list)
    reference_losses: list[float] = Field(default_factory=list)
    loss_rel_diffs: list[float] = Field(default_factory=list)
    grad_norms: list[float] = Field(default_factory=list, description="AutoModel's grad norm per step (its stack).")
    reference_grad_norms: list[float] = Field(default_factory=list)
    max_param_rel_diff: float | None = Field(default=None, description="Worst tensor ||p - ref|| / ||ref|| at the end.")
    max_grad_rel_diff: float | None = Field(default=None, description="Same for the first step's gradients.")
    diverged_at_step: int | None = Field(default=None, description="First step whose loss is out of tolerance.")
    loss_decreasing: bool | None = None
    mesh_matches: bool | None = None
    failed_ranks: list[int] = Field(default_factory=list)
    hung_ranks: list[int] = Field(default_factory=list)
    error: str | None = None
    traceback_tail: list[str] = Field(default_factory=list)
    ranks: list[RankReport] = Field(default_factory=list)
    timing: Timing = Field(default_factory=Timing)
    launcher: str | None = Field(
        default=None,
        description="elastic (torch elastic agent, ranks from a fork server), "
        "torchrun, or external (an exported run, judged from its results).",
    )
    command: str | None = Field(default=None, description="torchrun command line that reproduces this run.")
    multinode_command: str | None = None
    srun_command: str | None = None
    launcher_log_tail: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="Validation findings of the config.")
    notes: list[str] = Field(default_factory=list)
    explanations: list[Explanation] = Field(
        default_factory=list,
        description=("explain_error's matches for the failing rank's error and traceback: known causes and fixes."),
    )
