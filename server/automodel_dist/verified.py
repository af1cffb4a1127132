"""suggest_strategy's top candidates measured by the dry run (AutoModel's own step on fake tensors), where AutoModel
is installed: the surfaces (CLI, MCP) call this, so the ranked list says which figures were measured, not only
estimated. It sits above both the search and the dry run, which know nothing of each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .config.load import load_path, load_text
from .dry_run import DryRunUnavailable, DryRunUsageError, dry_run, missing_packages
from .request import Request
from .suggest.report import SuggestReport

DEFAULT_VERIFY = 3
# Per measured rank: the quick dry run takes seconds where a repeating model is built shallow; a layout it must build
# whole (many shallow pipeline stages) can take minutes, so a candidate past this is reported as not measured.
VERIFY_TIMEOUT_S = 120.0


def verify_candidates(
    report: SuggestReport,
    request: Request = Request(),
    *,
    top: int = DEFAULT_VERIFY,
    headroom: float = 0.1,
    cancel: threading.Event | None = None,
    progress: Callable[[str, int, int, str], None] | None = None,
    timeout_s: float = VERIFY_TIMEOUT_S,
) -> SuggestReport:
    """Measure the first ``top`` candidates with the dry run (a repeating model built shallow and extrapolated), on the
    report's cluster and sizes; each candidate's block replaces the ``distributed:`` of the recipe the suggestion was
    asked with (``request``: its config and model; the rest of the recipe, e.g. its PEFT and loss, is kept). Without
    AutoModel installed the report is returned as it was."""
    if top <= 0 or missing_packages() or not report.candidates:
        return report
    config, model = request.config, request.lookup.model
    base: dict[str, Any] = {}
    if isinstance(config, dict):
        base = dict(config)
    elif isinstance(config, (str, Path)):
        doc = load_path(config) if isinstance(config, Path) else load_text(config)  # a str is YAML text, as in the API
        base = dict(doc.data) if isinstance(doc.data, dict) else {}
    for i, cand in enumerate(report.candidates[:top]):
        if cancel is not None and cancel.is_set():
            break
        if progress is not None:
            progress("verify", i, top, f"dry run of candidate #{cand.rank}")
        recipe = {**base, **yaml.safe_load(cand.yaml)}
        recipe.pop("ci", None)  # the cluster is the report's
        try:
            dr = dry_run(
                recipe,
                fetch_config=request.lookup.fetch_config,
                world_size=report.world_size,
                gpus_per_node=report.gpus_per_node,
                model=model if model is not None else report.model,
                seq_len=report.seq_len,
                micro_batch_size=report.micro_batch_size,
                global_batch_size=report.global_batch_size,
                gpu=report.gpu,
                headroom=headroom,
                cancel=cancel,
                timeout_s=timeout_s,
            )
        except (DryRunUnavailable, DryRunUsageError) as exc:
            cand.measured_note = str(exc)[:300]
            continue
        peaks = [r.peak_allocated_gib for r in dr.ranks if r.status == "measured" and r.peak_allocated_gib]
        if dr.status == "measured" and peaks:
            cand.measured, cand.measured_peak_gib, cand.measured_fits = True, round(max(peaks), 3), dr.fits
            cand.measured_verdict = dr.verdict
        else:
            why = next((r.error or r.reason for r in dr.ranks if r.status != "measured"), dr.status)
            if any(r.status == "timeout" for r in dr.ranks):
                why = f"over the {timeout_s:.0f} s the quick check allows (run `automodel-dist dryrun` on its YAML)"
            cand.measured_note = f"dry run {dr.status}: {why}"[:300]
    return report


__all__ = ["verify_candidates", "DEFAULT_VERIFY", "VERIFY_TIMEOUT_S"]
