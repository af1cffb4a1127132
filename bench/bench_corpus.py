#!/usr/bin/env python3
"""The dry run over AutoModel's CI recipes (../shared/corpus), against the estimate, in one run: per recipe the dry
run's wall time and host memory, the estimate's time for the same recipe (the baseline), their ratio, and the
estimate's error on the peak. Goals (issue 34): every recipe <= 60 s and <= 2 GiB host on a 2-core machine.

    python bench/bench_corpus.py              # the fixed sample the default tests use
    python bench/bench_corpus.py --all        # every recipe whose model the catalog sizes
    python bench/bench_corpus.py --match deepseek
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("corpus_sweep", ROOT / "tools" / "corpus_sweep.py")
assert _spec is not None and _spec.loader is not None
sweep = importlib.util.module_from_spec(_spec)
sys.modules["corpus_sweep"] = sweep  # its dataclasses look their module up while the class is made
_spec.loader.exec_module(sweep)

WALL_GOAL_S, HOST_GOAL_MIB = 60.0, 2048.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every sized recipe (about 13 min on 2 cores)")
    ap.add_argument("--match", help="only recipes whose path contains this")
    ap.add_argument("--json", metavar="FILE", help="also save the rows (tools/corpus_sweep.py --table-from FILE)")
    args = ap.parse_args(argv)
    paths = sweep.recipes() if args.all or args.match else [sweep.CORPUS / s for s in sweep.SAMPLE]
    if args.match:
        paths = [p for p in paths if args.match in str(p)]
    sized = [r for r in sweep.sweep(paths, dry=False) if r.estimate_gib is not None]
    print(f"{'recipe':70} {'world':>5} {'est ms':>7} {'dry s':>6} {'ratio':>8} {'host MiB':>8} {'error':>6}")
    over, rows = [], sweep.sweep([sweep.CORPUS / r.recipe for r in sized])
    if args.json:
        sweep.save_rows(rows, Path(args.json))
    for row in rows:
        est_ms = (row.estimate_s or 0.0) * 1e3
        ratio = (row.dry_s or 0.0) / row.estimate_s if row.estimate_s else float("nan")
        err = "-" if row.error is None else f"{row.error:+.0%}"
        print(
            f"{row.recipe:70} {row.world_size or 0:>5} {est_ms:>7.1f} {row.dry_s or 0:>6.1f} {ratio:>8.0f} "
            f"{row.dry_rss_mib or 0:>8.0f} {err:>6}"
        )
        if (row.dry_s or 0) > WALL_GOAL_S or (row.dry_rss_mib or 0) > HOST_GOAL_MIB:
            over.append(row.recipe)
    timed = [r for r in rows if r.dry_s is not None]
    if timed:
        slowest = max(timed, key=lambda r: r.dry_s or 0.0)
        print(
            f"{len(timed)} dry runs: {sum(r.dry_s or 0.0 for r in timed):.0f} s in all, slowest {slowest.dry_s:.1f} s "
            f"({slowest.recipe}), host at most {max(r.dry_rss_mib or 0.0 for r in timed):.0f} MiB; the estimates "
            f"{sum(r.estimate_s or 0.0 for r in timed) * 1e3:.0f} ms in all"
        )
    print(f"over the goals ({WALL_GOAL_S:.0f} s, {HOST_GOAL_MIB:.0f} MiB): {over or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
