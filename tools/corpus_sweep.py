#!/usr/bin/env python3
"""Sweep AutoModel's own CI recipes (../shared/corpus: each RAN in AutoModel's CI at its ci: world size): validate,
estimate and the dry run per recipe, and the estimate's error against the dry run's measured peak.

    python tools/corpus_sweep.py                      # every recipe, the table to docs/corpus-sweep.md
    python tools/corpus_sweep.py --sample             # the fixed sample the default test suite runs
    python tools/corpus_sweep.py --no-dry-run --json rows.json  # validate and estimate only, rows as JSON
    python tools/corpus_sweep.py --fetch-config       # with Hub access: size the recipes whose model the catalog lacks

The table is what tests/oracle/test_corpus_sweep.py asserts (a fixed sample by default, every recipe under the slow marker).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("AUTOMODEL_DIST_CORPUS", ROOT.parent / "shared" / "corpus"))
DOC = ROOT / "docs" / "corpus-sweep.md"
# The default suite's sample: one recipe of each large sized category, each a kind of layout it can afford (seconds
# each); the rest run under the slow marker with the full corpus.
SAMPLE = (
    "llm_benchmark/qwen/qwen2_5_7b_quack.yaml",  # dense FSDP2, 8 GPUs
    "llm_finetune/agent/qwen2_5_3b_synthtraces.yaml",  # FusedLinearCrossEntropy
    "retrieval/bi_encoder/llama3_2_1b.yaml",  # a bi-encoder's contrastive step
    "convergence/tulu3/models/moonlight-16b/moonlight_16b_ep8_te_fusedadam.yaml",  # MoE, EP 8 (slow marker)
    "llm_benchmark/qwen/qwen3_moe_30b_quack_deepep.yaml",  # MoE, EP 8, checkpointing (slow marker)
    "llm_benchmark/qwen/custom_qwen2_5_32b_peft_benchmark_2nodes.yaml",  # LoRA, TP 2, 16 GPUs (slow marker)
    "vlm_finetune/qwen3/qwen3_vl_moe_30b_te_deepep.yaml",  # a VLM step with images, MoE, EP 8 (slow marker)
)
DEFAULT_SAMPLE = SAMPLE[:3]


@dataclass
class Row:
    recipe: str
    category: str
    world_size: int | None = None
    valid: bool | None = None
    errors: list[str] = field(default_factory=list)
    model: str | None = None
    estimate_gib: float | None = None  # tracked peak (allocated bytes, no overhead), as the dry run measures
    estimate_total_gib: float | None = None  # with CUDA context and fragmentation: what the verdict judges
    verdict: str | None = None
    estimate_s: float | None = None
    dry_status: str | None = None
    dry_gib: float | None = None
    dry_split: dict[str, float] = field(default_factory=dict)
    est_split: dict[str, float] = field(default_factory=dict)
    dry_fits: bool | None = None
    dry_s: float | None = None
    dry_rss_mib: float | None = None
    dry_note: str | None = None
    skipped: str | None = None
    overrides: list[str] = field(default_factory=list)
    ci_tier: bool = False

    @property
    def error(self) -> float | None:
        """(estimate - dry run) / dry run on the peak."""
        if self.estimate_gib is None or not self.dry_gib:
            return None
        return (self.estimate_gib - self.dry_gib) / self.dry_gib


def recipes(root: Path = CORPUS) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def category(path: Path, root: Path = CORPUS) -> str:
    return path.relative_to(root).parts[0]


def ci_overrides(path: Path) -> tuple[list[str], list[str]]:
    """What AutoModel's CI changes in a recipe besides its world size: ``ci.local_batch_size`` for every run, and a
    test tier's dotted overrides (``ci.nightly``) for a recipe that only runs in that tier's shape."""
    import yaml

    ci = (yaml.safe_load(path.read_text()) or {}).get("ci") or {}
    base = [f"step_scheduler.local_batch_size={ci['local_batch_size']}"] if "local_batch_size" in ci else []
    tier = ci.get("nightly") if isinstance(ci.get("nightly"), dict) else {}
    # scalar values only: the data sets a tier swaps in do not change the layout
    return base, [f"{k}={v}" for k, v in tier.items() if isinstance(v, (int, float, str, bool))]


STALE_FREEZE_KEY = "freeze_config.freeze_embeddings"
_STALE_DIR: list[Path] = []


def _without_stale_freeze(path: Path) -> Path:
    """A copy of the recipe without freeze_config.freeze_embeddings (in a temporary folder kept for the process)."""
    import tempfile

    import yaml

    if not _STALE_DIR:
        _STALE_DIR.append(Path(tempfile.mkdtemp(prefix="corpus-freeze-")))
    data = yaml.safe_load(path.read_text())
    del data["freeze_config"]["freeze_embeddings"]
    out = _STALE_DIR[0] / path.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def sweep_one(
    path: Path, *, dry: bool = True, root: Path = CORPUS, timeout_s: float = 300.0, fetch: bool = False
) -> Row:
    """One recipe: validate, estimate, dry run. ``fetch``: a model whose config.json is neither in the local Hugging
    Face cache nor the catalog is downloaded (config.json alone), as ``--fetch-config`` does in every tool."""
    from automodel_dist.api import validate_config
    from automodel_dist.estimate import estimate_memory
    from automodel_dist.report import ConfigError

    row = Row(recipe=str(path.relative_to(root)), category=category(path, root))
    overrides, tier = ci_overrides(path)
    report = validate_config(path, overrides=overrides, fetch_config=fetch)
    if not report.valid and tier:
        # a recipe whose ci: block names a test tier ran in that tier's shape (e.g. fewer layers, other degrees)
        overrides = overrides + tier
        report = validate_config(path, overrides=overrides, fetch_config=fetch)
        row.ci_tier = True
    row.overrides = overrides
    row.world_size, row.valid = report.world_size, report.valid
    row.errors = [f"{f.rule}: {f.message}"[:200] for f in report.errors]
    if not report.valid and all(f.path == STALE_FREEZE_KEY for f in report.errors):
        # the one error is freeze_embeddings, which 0.7.0 refuses and earlier AutoModel ignored: sized as AutoModel's
        # own fix for it runs the recipe (the key removed, trainability unchanged)
        path = _without_stale_freeze(path)
        row.overrides = overrides + [f"{STALE_FREEZE_KEY} removed"]
    elif not report.valid:
        return row
    t0 = time.perf_counter()
    try:
        est = estimate_memory(path, overrides=overrides or None, fetch_config=fetch)
    except (ConfigError, ValueError) as exc:
        row.skipped = f"estimate: {exc}"[:200]
        return row
    row.estimate_s = time.perf_counter() - t0
    row.model = est.model
    row.estimate_gib = est.memory_gib.tracked_peak
    row.estimate_total_gib = est.memory_gib.total
    row.verdict = est.verdict
    if not dry:
        return row
    from automodel_dist.dry_run import dry_run
    from automodel_dist.dry_run.plan import DryRunUsageError

    try:
        dr = dry_run(path, overrides=overrides or None, timeout_s=timeout_s, fetch_config=fetch)
    except DryRunUsageError as exc:
        row.dry_status, row.dry_note = "unusable", str(exc)[:200]
        return row
    row.dry_status, row.dry_s, row.dry_fits = dr.status, dr.wall_s, dr.fits
    measured = [r for r in dr.ranks if r.status == "measured" and r.peak is not None]
    row.dry_rss_mib = max((r.host_peak_rss_mib or 0.0 for r in dr.ranks), default=None)
    if measured:
        top = max(measured, key=lambda r: r.peak.total)  # type: ignore[union-attr]
        assert top.peak is not None
        row.dry_gib = top.peak.total
        row.dry_split = {k: round(v, 3) for k, v in top.peak.model_dump().items()}
    if dr.estimate:
        row.est_split = {k: round(v, 3) for k, v in dr.estimate.items()}
        row.estimate_gib = dr.estimate["total"]  # the same layout at the dry run's sizes
    failed = [r for r in dr.ranks if r.status != "measured"]
    if failed:
        row.dry_note = "; ".join(f"rank {r.rank} {r.status}: {(r.error or r.reason or '')[:160]}" for r in failed)
    return row


def sweep(
    paths: Iterable[Path], *, dry: bool = True, root: Path = CORPUS, log: Any = None, fetch: bool = False
) -> list[Row]:
    rows = []
    for path in paths:
        row = sweep_one(path, dry=dry, root=root, fetch=fetch)
        rows.append(row)
        if log is not None:
            err = f"{row.error:+.0%}" if row.error is not None else "-"
            print(
                f"{row.recipe}: world {row.world_size} est {row.estimate_gib} dry {row.dry_gib} ({err}) "
                f"{row.dry_status} {row.dry_s}s {row.dry_rss_mib}MiB {row.dry_note or ''}",
                file=log,
                flush=True,
            )
    return rows


@dataclass(frozen=True)
class Category:
    """One category's agreement: what the table's first part prints and the tests assert."""

    category: str
    recipes: int
    valid: int
    measured: int  # the dry run measured every planned rank
    compared: int  # both an estimate and a dry-run peak
    within: int  # of those, the estimate within MEMORY_ERROR of the dry run
    worst_error: float | None


def categories(rows: list[Row]) -> list[Category]:
    from automodel_dist.estimate import MEMORY_ERROR

    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.category, []).append(r)
    out = []
    for cat, rs in sorted(by.items()):
        errs = [r.error for r in rs if r.error is not None]
        out.append(
            Category(
                category=cat,
                recipes=len(rs),
                valid=sum(bool(r.valid) for r in rs),
                measured=sum(r.dry_status == "measured" for r in rs),
                compared=len(errs),
                within=sum(abs(e) <= MEMORY_ERROR for e in errs),
                worst_error=max(errs, key=abs) if errs else None,
            )
        )
    return out


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[Row], notes: list[str] | None = None) -> str:
    from automodel_dist.estimate import MEMORY_ERROR

    out = [
        "# The corpus sweep: AutoModel's CI recipes, validate, estimate and the dry run",
        "",
        "Generated by `python tools/corpus_sweep.py` (do not edit by hand). Every recipe of `../shared/corpus` ran in "
        "AutoModel's CI at its `ci:` world size on H100-80GB, so each is valid and fits at its own sizes (a recipe whose data "
        "set states no sequence length is measured at an assumed 4,096 tokens and its local batch: no verdict, `-`; "
        "those figures only compare the two). Per recipe: validate's "
        "verdict, the estimate's allocated peak (no CUDA context or fragmentation) and its verdict, the dry run's "
        "measured peak on the worst measured rank (AutoModel's own step on fake tensors), the estimate's error "
        f"against it (the project holds it to {MEMORY_ERROR:.0%}), and the dry run's wall time and host memory on a "
        "2-core machine. `tests/oracle/test_corpus_sweep.py` asserts the agreement per recipe and per category: every "
        "sized recipe the dry run can measure here is measured and within the error (one recipe of each sized "
        "category but convergence in the default suite; every one under `-m slow`).",
        "",
    ]
    out += [
        "| category | recipes | valid | dry run measured | estimate within the error | worst error |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for c in categories(rows):
        out.append(
            f"| {c.category} | {c.recipes} | {c.valid} | {c.measured} | {c.within}/{c.compared} | "
            f"{'-' if c.worst_error is None else f'{c.worst_error:+.0%}'} |"
        )
    out += [
        "",
        "| recipe | world | estimate GiB | verdict | dry run GiB | error | dry run s | host MiB | note |",
        "|---|--:|--:|---|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        note = (r.dry_note or r.skipped or "; ".join(r.errors) or "").replace("|", "/")[:160]
        out.append(
            f"| {r.recipe} | {r.world_size or '-'} | {_gib(r.estimate_gib)} | {r.verdict or '-'} | {_gib(r.dry_gib)} | "
            f"{'-' if r.error is None else f'{r.error:+.0%}'} | {'-' if r.dry_s is None else f'{r.dry_s:.0f}'} | "
            f"{'-' if r.dry_rss_mib is None else f'{r.dry_rss_mib:.0f}'} | {note} |"
        )
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def save_rows(rows: list[Row], path: Path) -> None:
    """The rows as JSON, which ``--table-from`` turns into the table."""
    path.write_text(json.dumps([asdict(r) | {"error": r.error} for r in rows], indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", action="store_true", help="only the fixed sample the default tests run")
    ap.add_argument("--no-dry-run", action="store_true", help="validate and estimate only")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--doc", default=str(DOC), help="the markdown table (default docs/corpus-sweep.md)")
    ap.add_argument("--match", help="only recipes whose path contains this")
    ap.add_argument("--exclude", action="append", default=[], help="skip recipes whose path contains this")
    ap.add_argument("--sized", action="store_true", help="only recipes whose model the catalog sizes")
    ap.add_argument(
        "--fetch-config",
        action="store_true",
        help="download a model's config.json alone from the Hub where neither the HF cache nor the catalog has it "
        "(needs Hub access; HF_HUB_OFFLINE=1 forbids it)",
    )
    ap.add_argument("--table-from", metavar="JSON", help="write the table from a sweep's saved rows (no new run)")
    ap.add_argument("--note", action="append", default=[], help="a note under the table (repeatable)")
    args = ap.parse_args(argv)
    if args.table_from:
        fields = set(Row.__dataclass_fields__)
        saved = json.loads(Path(args.table_from).read_text())
        rows = [Row(**{k: v for k, v in r.items() if k in fields}) for r in saved]
        Path(args.doc).write_text(table(rows, args.note))
        return 0
    paths = [CORPUS / s for s in DEFAULT_SAMPLE] if args.sample else recipes()
    if args.match:
        paths = [p for p in paths if args.match in str(p)]
    paths = [p for p in paths if not any(x in str(p) for x in args.exclude)]
    if args.sized:
        paths = [
            CORPUS / r.recipe for r in sweep(paths, dry=False, fetch=args.fetch_config) if r.estimate_gib is not None
        ]
    rows = sweep(paths, dry=not args.no_dry_run, log=sys.stderr, fetch=args.fetch_config)
    if args.json:
        save_rows(rows, Path(args.json))
    if not (args.sample or args.match or args.exclude or args.sized or args.no_dry_run):
        Path(args.doc).write_text(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
