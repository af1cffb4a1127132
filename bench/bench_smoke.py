"""Smoke-run wall time vs a bare torchrun job that does one all_reduce, measured in the same run.

For N = 2 and 4 (gloo, CPU): the baseline is ``torchrun --standalone --nproc-per-node N`` on a script
that inits the process group, all-reduces one tensor and exits. Goal: a full smoke run (meshes,
model, parallelism, 3 steps, reference, parity check) within 1.3x of that. Also prints the phase
split of the smoke run and the same for the literal torchrun launcher.

Run: python bench/bench_smoke.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automodel_dist import run_smoke_test

BARE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def bare_torchrun(n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "bare.py"
        script.write_text(BARE)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), str(script)],
            check=True,
            capture_output=True,
            env=env,
        )
        return time.perf_counter() - t


def smoke(n: int, launcher: str):
    t = time.perf_counter()
    report = run_smoke_test(world_size=n, tp=2, precision="fp32", launcher=launcher)
    wall = time.perf_counter() - t
    assert report.passed, report.reason
    return wall, report.timing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("layout: fsdp2 + tp 2, tiny-llama, 3 steps, fp32, gloo on CPU; medians of", args.repeat, "runs")
    print(f"{'N':>3} {'bare torchrun':>14} {'smoke (elastic)':>16} {'ratio':>6} {'smoke (torchrun)':>17} {'ratio':>6}")
    for n in (2, 4):
        bare = statistics.median(bare_torchrun(n) for _ in range(args.repeat))
        runs = [smoke(n, "elastic") for _ in range(args.repeat)]
        el = statistics.median(w for w, _ in runs)
        tr = statistics.median(smoke(n, "torchrun")[0] for _ in range(args.repeat))
        print(f"{n:>3} {bare:>13.1f}s {el:>15.1f}s {el / bare:>5.2f}x {tr:>16.1f}s {tr / bare:>5.2f}x")
        timing = sorted(runs, key=lambda r: r[0])[len(runs) // 2][1]
        split = ", ".join(
            f"{k} {getattr(timing, k + '_s'):.2f}s"
            for k in ("launch", "import", "init", "steps", "check", "teardown")
            if getattr(timing, k + "_s")
        )
        print(f"    elastic phase split (N={n}): {split}")
    print("goal: smoke (elastic, the default) <= 1.3x bare torchrun")


if __name__ == "__main__":
    main()
