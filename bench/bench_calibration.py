"""The estimate against what AutoModel really produced, printed as ratios in one run:

1. every published H100 run (tests/calibration/README.md) at its measured sizes: the fit verdict and the estimated
   over the measured step time (goal: fits, within STEP_TIME_ERROR);
2. AutoModel's own step on fake tensors (the dry run) on a matrix of layouts: the estimate over the dry run per memory
   category (goal: each within 15% of the dry run's peak, the total within 15%);
3. AutoModel's own step on a real GPU (tests/calibration/gpu/, docs/gpu-check.md): the dry run and the estimate over
   the GPU's max_memory_allocated for every recorded build (goal: the dry run within 1%, the estimate within 15%).
``--quick`` skips parts 2 and 3.

Run: python bench/bench_calibration.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from automodel_dist.estimate.comm import STEP_TIME_ERROR  # noqa: E402
from support.calibration import DRY, DRY_SLOW, LLM, MISSES, estimate_row, published_rows  # noqa: E402

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries", "total")


def published() -> None:
    print(f"{'published run':<48} {'GPUs':>5} {'GiB est':>8} {'fits':>5} {'s est':>7} {'s meas':>7} {'ratio':>6}")
    worst = 0.0
    for row in published_rows():
        est = estimate_row(row)
        ratio = est.step_time_s / row["s/step"]
        if row["recipe"] not in MISSES:
            worst = max(worst, abs(ratio - 1))
        mark = "  (known miss)" if row["recipe"] in MISSES else ""
        print(
            f"{row['recipe']:<48} {row['GPUs']:>5} {est.memory_gib.total:>8.1f} {str(est.fits):>5} "
            f"{est.step_time_s:>7.2f} {row['s/step']:>7.2f} {ratio:>6.2f}{mark}"
        )
    print(f"worst step-time error outside the known misses: {worst:.0%} (goal {STEP_TIME_ERROR:.0%})")
    for name, why in MISSES.items():
        print(f"  known miss {name}: {why}")


def against_dry_run() -> None:
    from automodel_dist.dry_run import dry_run

    print()
    print(f"{'dry-run case (8 layers, 4,096 tokens)':<34}" + "".join(f"{c[:6]:>16}" for c in CATEGORIES) + f"{'s':>6}")
    worst_share = worst_total = 0.0
    for param in DRY + DRY_SLOW:
        model, block = param.values
        t = time.perf_counter()
        report = dry_run(LLM + block, world_size=8, model=model, num_layers=8, seq_len=4096)
        diffs = {d.category: d for d in report.estimate_vs_dry_run}
        if not diffs:
            print(f"{param.id:<34} {report.status}")
            continue
        peak = max(r.peak.total for r in report.ranks if r.peak is not None)
        cells = ""
        for cat in CATEGORIES:
            d = diffs[cat]
            cells += f"{d.estimate_gib:>7.2f}/{d.dry_run_gib:<7.2f} "
            if cat != "total":
                worst_share = max(worst_share, abs(d.estimate_gib - d.dry_run_gib) / peak)
        worst_total = max(worst_total, abs(diffs["total"].estimate_gib / diffs["total"].dry_run_gib - 1))
        print(f"{param.id:<34}{cells}{time.perf_counter() - t:>5.0f}")
    print(
        f"worst category error {worst_share:.1%} of the dry run's peak (goal 15%), worst total {worst_total:.1%} "
        "(goal 15%); cells are estimate/dry-run GiB"
    )


def against_gpu() -> None:
    import importlib.util
    import json

    from automodel_dist.dry_run import on_gpu

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gpu_check", root / "tools" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    gpu = root / "tests" / "calibration" / "gpu"
    print()
    print(f"{'GPU-measured build':<44} {'GPU GiB':>8} {'dry run':>8} {'ratio':>6} {'estimate':>9} {'ratio':>6}")
    worst_dry = worst_est = 0.0
    for record in sorted(gpu.glob("h200_*.json")):
        for row in json.loads(record.read_text(encoding="utf-8"))["cases"]:
            case = json.loads((gpu / "cases" / f"{row['name']}.json").read_text(encoding="utf-8"))
            recipe = gpu_check.recipe_path(case)
            for i, build in enumerate(row["builds"]):
                if build["status"] != "measured" or not recipe.exists():
                    continue
                got = on_gpu.against_gpu(
                    recipe,
                    case["fields"],
                    build,
                    rank=row.get("rank", 0),
                    full_depth=build.get("build") == "full",
                    previous=row["builds"][i - 1] if i else None,
                )
                if "gpu_gib" not in got:
                    print(f"{row['name']:<44} dry run {got['dry_run_status']}")
                    continue
                worst_dry = max(worst_dry, abs(got["dry_run_vs_gpu"]))
                worst_est = max(worst_est, abs(got["estimate_vs_gpu"]))
                name = f"{row['name']} ({build['layers']} layers)"
                print(
                    f"{name:<44} {got['gpu_gib']:>8.3f} {got['dry_run_gib']:>8.3f} {1 + got['dry_run_vs_gpu']:>6.3f} "
                    f"{got['estimate_gib']:>9.3f} {1 + got['estimate_vs_gpu']:>6.3f}"
                )
    print(f"worst dry-run error {worst_dry:.1%} (goal 1%), worst estimate error {worst_est:.1%} (goal 15%)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the published runs (no dry runs)")
    args = ap.parse_args()
    published()
    if not args.quick:
        against_dry_run()
        against_gpu()


if __name__ == "__main__":
    main()
