"""The job a tool is asked about: one frozen object that each surface (a CLI command, an MCP tool, a Python call)
builds once and every layer below reads, instead of a dozen keyword arguments redeclared at every hop.

A request has four parts: the job (the config and the launch command's overrides, the torch release it runs on), the
cluster (world size or nodes x GPUs per node, the GPU and its links), where the model's dimensions come from, and the
workload sizes (sequence length and batch sizes). Feature options that only one tool reads (an estimate's headroom, a
dry run's measured ranks) stay that tool's keywords.

Values are kept as given, not coerced or checked here: the engine turns a bad value into a finding or a usage error
that names it, as it did when the values arrived as keywords.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Union

from typing_extensions import Unpack

if TYPE_CHECKING:  # the MCP server imports this module at start-up: the catalog loads on first use
    from .catalog.models import ModelSpec

ConfigInput = Union[str, Path, Mapping[str, Any]]
ModelInput = Union[str, Path, Mapping[str, Any], "ModelSpec", None]
Overrides = Union[Sequence[str], None]  # AutoModel's command-line overrides, "dotted.key=value"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """What is launched: the recipe or ``distributed:`` block (YAML text, a path or a mapping), the launch command's
    ``"dotted.key=value"`` overrides, and the torch release the job will run on (for the checks that depend on it)."""

    config: ConfigInput | None = None
    overrides: Overrides = None
    torch_version: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cluster:
    """Where it runs: ``world_size``, or ``nodes`` x ``gpus_per_node``, or neither (the recipe's ``ci:`` block); the
    GPU by name (None: the tool's default, H100-80GB) with optional overrides of its memory and link speeds."""

    world_size: Any = None
    nodes: Any = None
    gpus_per_node: Any = None
    gpu: str | None = None
    memory_gib: float | None = None
    intra_gbps: float | None = None
    inter_gbps: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelLookup:
    """Which model's dimensions the model-aware checks use: a name, a config.json path or mapping, or a resolved
    :class:`ModelSpec` (None: the recipe's ``model.pretrained_model_name_or_path``); ``fetch_config`` allows a
    download of config.json alone when the model is neither local nor in the catalog."""

    model: ModelInput = None
    fetch_config: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """The sizes that set activation memory and step time (None: the recipe's, else each tool's stated default)."""

    seq_len: Any = None
    micro_batch_size: Any = None
    global_batch_size: Any = None


class RequestFields(TypedDict, total=False):
    """The flat keywords a Python caller may give instead of building a :class:`Request` (each names one field of
    one part; :func:`Request.of` routes it)."""

    overrides: Overrides
    torch_version: str | None
    world_size: int | None
    nodes: int | None
    gpus_per_node: int | None
    gpu: str | None
    memory_gib: float | None
    intra_gbps: float | None
    inter_gbps: float | None
    model: ModelInput
    fetch_config: bool
    seq_len: int | None
    micro_batch_size: int | None
    global_batch_size: int | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One tool call's job, cluster, model source and workload (see the module's docstring)."""

    job: Job = Job()
    cluster: Cluster = Cluster()
    lookup: ModelLookup = ModelLookup()
    workload: Workload = Workload()

    @property
    def config(self) -> ConfigInput | None:
        return self.job.config

    @classmethod
    def of(cls, config: ConfigInput | Request | None = None, /, **fields: Unpack[RequestFields]) -> Request:
        """A request from a config and flat keywords; a request given as ``config`` is returned with the keywords
        replaced. Raises ``TypeError`` for a keyword that is no field of any part."""
        base = config if isinstance(config, Request) else cls(job=Job(config=config))
        return base.replace(**fields)

    def replace(self, **fields: Unpack[RequestFields]) -> Request:
        """A copy with the named fields (flat names, as in :class:`RequestFields`) replaced."""
        if not fields:
            return self
        unknown = set(fields) - set(_PART_OF)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {sorted(unknown)}")
        parts: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            parts.setdefault(_PART_OF[name], {})[name] = value
        return dataclasses.replace(
            self, **{part: dataclasses.replace(getattr(self, part), **values) for part, values in parts.items()}
        )

    def with_config(self, config: ConfigInput | None) -> Request:
        """A copy for another config (the rest of the job kept)."""
        return dataclasses.replace(self, job=dataclasses.replace(self.job, config=config))

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name (the inverse of :func:`of`, without the config)."""
        return {name: getattr(getattr(self, part), name) for name, part in _PART_OF.items()}


_PART_OF: dict[str, str] = {
    f.name: part.name
    for part in dataclasses.fields(Request)
    for f in dataclasses.fields(part.default)  # type: ignore[arg-type]
    if f.name != "config"
}

__all__ = ["Request", "RequestFields", "Job", "Cluster", "ModelLookup", "Workload", "ConfigInput", "ModelInput"]
