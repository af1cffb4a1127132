"""The dry run's report models (pydantic, like the other reports; no torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..report import Explanation, Finding, Resolved

RankStatus = Literal["measured", "failed", "not_measured", "timeout", "host_memory_cap", "cancelled"]


class MemorySplit(BaseModel):
    """Bytes on one rank, in GiB, split the way the estimate splits them."""

    params: float = Field(description="Local parameter shards (FSDP's sharded parameters, buffers).")
    grads: float = Field(description="Local gradient shards.")
    optimizer: float = Field(description="Optimizer states.")
    activations: float = Field(description="Tensors autograd saved for backward, and the inputs.")
    temporaries: float = Field(
        description="Gathered parameters and gradients, all-gather / reduce-scatter buffers, other temporaries."
    )
    total: float


class RankResult(BaseModel):
    """One measured rank: AutoModel's own step on fake tensors, under torch's memory tracker."""

    rank: int
    status: RankStatus
    pp_stages: list[int] = Field(default_factory=list, description="Pipeline stages this rank holds (PP only).")
    peak_allocated_gib: float | None = Field(default=None, description="Peak allocated bytes, no allocator model.")
    peak: MemorySplit | None = None
    peak_phase: str | None = Field(default=None, description="Phase of the step where the peak falls.")
    tracker: str | None = Field(
        default=None,
        description="torch's tracker: FSDPMemTracker for one FSDP root (gathered parameters are "
        "temporaries), else MemTracker (gathered parameters count as parameters).",
    )
    tracker_categories_gib: dict[str, float] = Field(
        default_factory=dict, description="torch's own categories at the peak (FSDPMemTracker / MemTracker)."
    )
    phase_peaks_gib: dict[str, float] = Field(default_factory=dict)
    moment_peaks_gib: dict[str, float] = Field(
        default_factory=dict,
        description="The 24 largest moments, in step order. Under PP, each pipeline action's peak within its phase (``phase@F<stage>.<microbatch>#<n>``: "
        "the action itself; ``!``: what it leaves; ``+``: the stretch until the next action), each on its own line "
        "where the rank was built shallow (per phase where its two builds hold different stage counts); without PP, "
        "each phase's.",
    )
    peak_moment: str | None = Field(
        default=None,
        description="The largest moment of the peak's phase (a key of moment_peaks_gib). Its figure is the largest "
        "total held at once; on a rank built whole the peak adds each device's own peak, which can fall apart.",
    )
    largest_modules: list[tuple[str, float]] = Field(
        default_factory=list, description="Modules with the largest memory while they ran (GiB, torch's local peak)."
    )
    forward_retained: list[tuple[str, float]] = Field(
        default_factory=list, description="What each module's forward left allocated (GiB): mostly saved activations."
    )
    after_forward: MemorySplit | None = Field(
        default=None, description="What was allocated when the first microbatch's forward and loss were done."
    )
    local_param_bytes: int | None = None
    local_grad_bytes: int | None = Field(default=None, description="Gradients the backward left on this rank.")
    local_trainable_param_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    phases_s: dict[str, float] = Field(default_factory=dict, description="Wall time per phase.")
    import_shared: bool = Field(
        default=False,
        description="The rank was forked after its stack was imported once for every rank (dry_run/launcher.py); "
        "its import phase is that shared import's time, unless import_earlier.",
    )
    import_earlier: bool = Field(
        default=False,
        description="The stack had been imported before this run began, by a fork server an earlier dry run of the "
        "same process started (kept for the next run a minute, dry_run/run.py IDLE_S): this run did not wait for it "
        "(what of the import a run waited for is in its ranks' import phase).",
    )
    side_by_side: bool = Field(
        default=False,
        description="The two shallow builds ran at once, in two processes (cores the other ranks left idle): the "
        "phase times are both processes' work added up (not the wall time), and the host memory is the larger of "
        "either process's own peak and both processes' proportional shares together.",
    )
    host_peak_rss_mib: float | None = None
    error: str | None = Field(default=None, description="AutoModel's own exception, when it raised.")
    error_phase: str | None = None
    traceback: list[str] = Field(default_factory=list)
    explanations: list[Explanation] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why the rank was not measured, when it was not.")
    shim_hits: dict[str, int] = Field(
        default_factory=dict,
        description="The shims and stand-ins (stack/shims.py) that acted on this rank, with how many times.",
    )
    builds: list[dict[str, float | int | str | None]] = Field(
        default_factory=list,
        description="The shallow builds the figures were extrapolated from (layers, their own peak GiB and phase); "
        "empty when the rank was built at full depth.",
    )


class CategoryDiff(BaseModel):
    category: str
    dry_run_gib: float
    estimate_gib: float
    difference: float = Field(description="(estimate - dry run) / dry run.")


def measured_verdict(with_overhead_gib: float, usable_gib: float, gpu_gib: float) -> str:
    """A measured peak's verdict (see :attr:`DryRunReport.verdict`): the peak is AutoModel's own allocation, so the
    only uncertain part is the overhead added to it, and a peak over the headroom but under the GPU is tight."""
    if with_overhead_gib <= usable_gib:
        return "fits"
    return "tight" if with_overhead_gib <= gpu_gib else "does not fit"


class DryRunReport(BaseModel):
    """Result of ``dry_run``: AutoModel 0.7.0's own code at full size and world size on fake tensors."""

    status: Literal["measured", "failed", "partial"] = Field(
        description="measured: every requested rank ran; failed: AutoModel raised (or a limit stopped it); "
        "partial: some ranks were not measured (the reasons are given)."
    )
    fits: bool | None = Field(
        default=None,
        description="Every measured rank's peak, with the overhead terms, within the usable memory (the GPU's less "
        "the headroom); None: no verdict (an assumed sequence length or image, or a rank not measured).",
    )
    verdict: Literal["fits", "tight", "does not fit"] | None = Field(
        default=None,
        description="fits: within the usable memory; tight: over the headroom but within the GPU's memory (the "
        "overhead terms, allocator fragmentation above all, decide it: a margin, not a measurement); does not fit: "
        "the measured peak with the overhead is over the GPU's memory. None where ``fits`` is None.",
    )
    model: str
    model_source: str
    world_size: int
    gpus_per_node: int | None = None
    layout: Resolved
    seq_len: int
    micro_batch_size: int
    local_batch_size: int
    microbatches: int = Field(description="Microbatches of a step on a rank (pipeline or gradient accumulation).")
    measured_microbatches: int = Field(description="Of those, how many the dry run ran (see notes).")
    num_layers: int = Field(description="Layers built (fewer than the model's only when asked).")
    assumed: list[str] = Field(default_factory=list, description="Sizes neither passed nor in the recipe.")
    ranks: list[RankResult] = Field(default_factory=list)
    params_total: int | None = None
    params_trainable: int | None = None
    gpu: str
    gpu_memory_gib: float
    headroom: float
    overhead: dict[str, float] = Field(
        default_factory=dict,
        description="Added to the allocated peak for the verdict: CUDA context (GiB) and "
        "allocator fragmentation (fraction of the peak).",
    )
    peak_with_overhead_gib: float | None = None
    estimate: dict[str, float] | None = Field(
        default=None, description="The analytic estimate of the same layout (GiB per category), when it has one."
    )
    estimate_vs_dry_run: list[CategoryDiff] = Field(default_factory=list)
    substitutions: list[str] = Field(
        default_factory=list, description="What ran differently from a GPU, and why (kernels, routing, optimizer)."
    )
    not_measured: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict, description="AutoModel, torch and transformers.")
    wall_s: float = 0.0
    findings: list[Finding] = Field(default_factory=list, description="validate_config's errors and warnings.")


__all__ = ["DryRunReport", "RankResult", "MemorySplit", "CategoryDiff"]
