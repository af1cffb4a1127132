"""The smoke run's spec: what the planner hands every rank, as one typed object serialised to JSON (no torch)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..dims import ParallelDims


@dataclass(frozen=True)
class PipelineSpec:
    """How the ranks run their pipeline stages (torch's schedule class)."""

    schedule: str
    stages_per_rank: int
    v_style: bool
    n_microbatches: int
    microbatch_size: int


@dataclass(frozen=True)
class SmokeSpec:
    """One smoke run. ``dims`` is AutoModel's reading of the layout under test (the meshes come from
    ``dims.layout``); ``mp_policy`` is the precision this run uses (the block's, or the one ``--precision`` asked
    for); the rest describes the tiny model, its data and the run itself."""

    world_size: int
    spec_id: str  # each rank echoes it: results of another spec in the same directory are stale
    dims: ParallelDims
    model: str
    model_config: dict[str, Any]
    seq_len: int
    global_batch: int
    steps: int
    lr: float
    seed: int
    backend: str
    pg_timeout_s: float
    precision: str
    mp_policy: dict[str, Any] | None = None
    ddp: dict[str, Any] = field(default_factory=dict)
    pipeline: PipelineSpec | None = None
    fault: dict[str, Any] | None = None
    run_dir: str | None = None  # where the ranks write their results (default: the spec's folder)
    progress_file: str | None = None
    report_base: dict[str, Any] | None = None  # exported runs: what the judge reports besides the results
    stack: str = "tiny"  # "automodel": the recipe's architecture through AutoModel's own code (stack_worker.py)
    automodel: dict[str, Any] | None = None  # what AutoModel builds and trains (stack="automodel")

    def to_json(self) -> str:
        data = asdict(self)
        data["dims"] = self.dims.to_json()
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SmokeSpec:
        """Raises ``ValueError`` (``KeyError``/``TypeError`` included) for what the planner does not write."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a smoke spec is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown smoke spec keys {unknown}")
        pipe = data.get("pipeline")
        return cls(
            **{
                **data,
                "dims": ParallelDims.from_json(data["dims"]),
                "pipeline": PipelineSpec(**pipe) if pipe is not None else None,
            }
        )

    @classmethod
    def read(cls, path: str | Path) -> SmokeSpec:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


__all__ = ["SmokeSpec", "PipelineSpec"]
