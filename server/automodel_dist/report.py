"""Pydantic report models shared by every surface (API, CLI ``--json``, MCP structured content)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class Finding(BaseModel):
    """One problem (or note) about a config, pointing at its YAML line."""

    rule: str = Field(description="Stable rule id, e.g. 'tp-heads'.")
    severity: Severity
    path: str = Field(description="Dotted YAML path, e.g. 'distributed.tp_size'.")
    line: int | None = Field(default=None, description="1-based YAML line, when the config came from YAML.")
    message: str
    fix: str | None = None


class Resolved(BaseModel):
    """What AutoModel would resolve the block to (None where it cannot be resolved)."""

    strategy: str | None = Field(default=None, description="Canonical strategy: fsdp2, megatron_fsdp or ddp.")
    dp: int | None = None
    dp_replicate: int | None = None
    dp_shard: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    ep_shard: int | None = None
    activation_checkpointing: bool | str | None = None
    sequence_parallel: bool | None = None
    pp_schedule: str | None = Field(default=None, description="torch schedule class name when pp > 1.")
    pp_microbatch_size: int | None = None
    mesh_ranks: int | None = Field(default=None, description="Ranks inside the device mesh (dp*cp*tp*pp).")


NOT_CHECKED = (
    "per-GPU memory and step time: `automodel-dist estimate` (estimate_memory), or `dryrun` (dry_run, AutoModel's own step)",
)


class ValidationReport(BaseModel):
    """Result of ``validate_config``: every finding at once."""

    valid: bool
    world_size: int | None = None
    world_size_source: str | None = Field(default=None, description="Where world_size came from.")
    gpus_per_node: int | None = Field(
        default=None, description="GPUs per node the node checks used (argument or the recipe's ci: block), when known."
    )
    source: str | None = Field(default=None, description="File name, when validated from a file.")
    model: str | None = Field(default=None, description="Model used for model-aware checks.")
    model_source: str | None = Field(default=None, description="Where the model's dims came from.")
    model_checks_skipped: str | None = Field(
        default=None,
        description="Why the model-aware checks (heads vs tp, experts vs ep, stages, the class's capabilities) did "
        "not run; null when they ran.",
    )
    findings: list[Finding] = Field(default_factory=list)
    resolved: Resolved = Field(default_factory=Resolved)
    not_checked: list[str] = Field(
        default_factory=lambda: list(NOT_CHECKED),
        description="What a valid report does not say (and the tool that checks it).",
    )

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]


class ConfigError(ValueError):
    """Raised by ``build_mesh`` (and others) when a config is invalid; carries the full report."""

    def __init__(self, report: ValidationReport):
        self.report = report
        errors = report.errors
        first = errors[0].message if errors else "invalid config"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{first}{more}")


class MeshDims(BaseModel):
    dim_names: list[str]
    shape: list[int]


class AxisInfo(BaseModel):
    """One mesh axis (a device_mesh dim, a flattened dim or a moe_mesh dim)."""

    name: str
    mesh: Literal["device_mesh", "flattened", "moe_mesh"]
    size: int
    groups: int = Field(description="Number of groups on this axis across the mesh.")
    sources: list[str] = Field(default_factory=list, description="device_mesh dims a flattened axis is made of.")
    crosses_nodes: int | None = Field(
        default=None, description="How many of the groups span more than one node (when gpus_per_node is known)."
    )
    example_crossing: list[int] | None = Field(
        default=None, description="One group that spans nodes (listed for groups of at most 4,096 ranks)."
    )


class GroupSpec(BaseModel):
    """A group too large to list: its members are ``first + sum(i_k * stride_k)`` over ``i_k < count_k``,
    in row-major order with the outermost dim first (the order AutoModel's flattened groups use)."""

    size: int
    first: int
    dims: list[tuple[int, int]] = Field(description="(count, stride) per mesh dim, outermost first.")


class MeshReport(BaseModel):
    """Result of ``build_mesh``: AutoModel's meshes and per-rank groups, built without GPUs."""

    world_size: int
    strategy: str
    mesh_ranks: int = Field(description="Ranks inside the device mesh; ranks beyond are outside it.")
    gpus_per_node: int | None = None
    device_mesh: MeshDims | None
    moe_mesh: MeshDims | None
    flattened: dict[str, list[str]] = Field(
        default_factory=dict, description="Flattened axes registered on the device mesh, and their sources."
    )
    fsdp_mesh: list[str] | None = Field(
        default=None, description="The data-parallel mesh dims FSDP2 shards over (get_fsdp_dp_mesh)."
    )
    axes: list[AxisInfo] = Field(default_factory=list)
    rank_groups: dict[str, dict[str, list[int]] | None] = Field(
        default_factory=dict,
        description="Per requested rank: its group on every axis (groups of at most 4,096 "
        "ranks; larger ones are in large_groups). null: the rank is outside the mesh; {}: DDP, no mesh.",
    )
    large_groups: dict[str, dict[str, GroupSpec]] = Field(
        default_factory=dict,
        description="Per requested rank: its groups of more than 4,096 ranks, exactly, "
        "as first rank and (count, stride) dims.",
    )
    findings: list[Finding] = Field(default_factory=list)
    picture: str | None = None


class Explanation(BaseModel):
    """One rule that matches the pasted error text."""

    rule: str
    title: str
    family: str
    severity: str
    matched: str = Field(description="The part of the text that matched.")
    cause: str
    fix: str
    line: int | None = Field(default=None, description="Line of the text (1-based) where it first matched.")
    ranks: list[int] = Field(
        default_factory=list,
        description="Ranks whose lines matched ([rankN]: / [Rank N] prefixes of torchrun and NCCL logs).",
    )
    consequence: bool = Field(
        default=False,
        description="Usually a consequence of another rank's failure (a "
        "timeout, a vanished peer): look at the matches before it first.",
    )


class ExplainReport(BaseModel):
    matches: list[Explanation] = Field(default_factory=list)
    hint: str | None = None
