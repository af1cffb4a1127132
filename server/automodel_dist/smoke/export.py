"""Smoke runs launched elsewhere: export a run's spec for a cluster's own torchrun/srun, then judge its results.

``export_smoke_test`` plans the run as ``run_smoke_test`` does and writes ``DIR/spec.json`` (the worker's
spec plus what the judge needs); the ranks, launched by any torchrun (one node or many, NCCL on GPUs), write
``DIR/rank<R>.json`` next to it; ``judge_smoke_test(DIR)`` applies the same checks as a local run.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, Field
from typing_extensions import Unpack

from ..api import ConfigInput
from ..report import Finding
from .launch import Plan, SmokeUsageError, collect_results, read_results, reproduce_commands
from .report import RankReport, SmokeReport
from .request import SmokeOptions, SmokeRequest
from .run import plan_smoke_test
from .spec import SmokeSpec

SPEC_FILE = "spec.json"


class SmokeExport(BaseModel):
    """Where an exported smoke run's spec lies and how to launch and judge it."""

    directory: str
    spec_file: str
    world_size: int
    command: str = Field(description="One node: run in the directory.")
    multinode_command: str = Field(description="torchrun on every node (the directory on a shared filesystem).")
    srun_command: str
    judge_command: str = Field(description="Judges the ranks' results once the launch has finished.")
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def export_smoke_test(
    config: ConfigInput | SmokeRequest | None, directory: str | Path, **options: Unpack[SmokeOptions]
) -> SmokeExport | SmokeReport:
    """Plan ``config``'s layout on ``world_size`` ranks (the request and its keywords as in ``run_smoke_test``;
    ``world_size`` is required) and write
    ``directory/spec.json`` for a launch elsewhere (nothing else there is touched; earlier results are ignored by the
    judge, each spec having its own id). Returns the commands, or the report of why the layout cannot run. This
    machine's GPUs and CPU limit do not matter."""
    request = SmokeRequest.called("export_smoke_test", config, options)
    world_size = request.world_size
    if world_size is None:  # run_smoke_test would pick a size for this machine; a cluster's must be given
        raise SmokeUsageError("world_size must be a positive integer: the ranks the launch will start")
    plan = plan_smoke_test(request, local=False)
    if isinstance(plan, SmokeReport):
        return plan
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise SmokeUsageError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)  # results already there belong to another spec_id: the judge ignores them
    base = SmokeReport(passed=False, status="not_run", **plan.report_base).model_dump(
        mode="json", include=set(plan.report_base)
    )
    replace(plan.spec, report_base=base).write(out / SPEC_FILE)
    single, multi, srun = reproduce_commands(world_size, SPEC_FILE)
    return SmokeExport(
        directory=str(out),
        spec_file=str(out / SPEC_FILE),
        world_size=world_size,
        command=single,
        multinode_command=multi,
        srun_command=srun,
        judge_command=f"automodel-dist smoke --judge {shlex.quote(str(out))}",
        findings=plan.findings,
        notes=list(plan.report_base.get("notes") or []),
    )


def judge_smoke_test(directory: str | Path) -> SmokeReport:
    """Judge the results the ranks of an exported run left in ``directory`` (parity with one process, the
    meshes, every rank finished), as a local run is judged."""
    d = Path(directory)
    try:
        spec = SmokeSpec.read(d / SPEC_FILE)
        world, base = spec.world_size, dict(spec.report_base or {})
        if not base:
            raise ValueError("it has no report_base")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SmokeUsageError(f"{d / SPEC_FILE} is not a smoke spec written by export_smoke_test ({exc})") from None
    plan = Plan(spec=spec, world_size=world, report_base=base)
    results = read_results(d, world, spec.spec_id)
    missing = [r for r in range(world) if r not in results]
    failed = [r for r, res in results.items() if "error" in res or "terminated" in res]
    if missing and not failed:
        reason = (
            f"rank(s) {missing} left no result in {d}: every rank writes rank<R>.json next to {SPEC_FILE} (on "
            "several nodes the directory must be on a shared filesystem); results of another spec are "
            "ignored"
        )
        ranks = [RankReport(rank=r, ok=False, state="not_started") for r in missing]
        return SmokeReport(passed=False, status="failed", reason=reason, failed_ranks=missing, ranks=ranks, **base)
    try:
        t0 = min(float(res.get("t_start", 0.0)) for res in results.values())
        end = max(float(res.get("t_end") or res.get("t_error") or t0) for res in results.values())
        report = collect_results(plan, d, 0, total=end - t0, t0=t0, timed_out=False, interrupted=None, timeout_s=0.0)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # hand-edited or truncated files
        raise SmokeUsageError(
            f"the results in {d} are not what the smoke worker writes ({type(exc).__name__}: {exc})"
        ) from None
    for rk in report.ranks:
        if rk.rank in missing:
            rk.state = "not_started"
    report.launcher = "external"
    report.timing.launch_s = report.timing.teardown_s = None  # the launch happened elsewhere, untimed
    return report


__all__ = ["export_smoke_test", "judge_smoke_test", "SmokeExport"]
