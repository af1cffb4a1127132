"""A smoke run on AutoModel's own stack vs one on the tiny home-made stack, same layout, measured in the same run.

Layout: Llama-3.1-8B's recipe with FSDP2 + TP 2 + SP on 4 gloo CPU ranks, 3 steps, fp32. The AutoModel stack builds
the recipe's architecture at tiny dims through AutoModel's setup, parallelizer, loss, clip and optimizer (and its
single-process reference on rank 0); the tiny stack trains this tool's tiny Llama through its re-implementation.
The series are interleaved so the machine's load hits both alike. Goal (issue 33): AutoModel stack <= 3x the tiny.

Run: python bench/bench_smoke_stack.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from automodel_dist import run_smoke_test

RECIPE = """model:
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
distributed:
  strategy: fsdp2
  tp_size: 2
  sequence_parallel: true
"""
GOAL = 3.0


def once(stack: str) -> tuple[float, object]:
    t = time.perf_counter()
    report = run_smoke_test(RECIPE, world_size=4, stack=stack, precision="fp32")
    wall = time.perf_counter() - t
    assert report.passed and report.stack == stack, (report.reason, report.stack)
    return wall, report.timing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    walls: dict[str, list[float]] = {"tiny": [], "automodel": []}
    timings: dict[str, object] = {}
    for _ in range(args.repeat):
        for stack in ("tiny", "automodel"):
            wall, timing = once(stack)
            walls[stack].append(wall)
            timings[stack] = timing
    tiny, am = statistics.median(walls["tiny"]), statistics.median(walls["automodel"])
    print(f"layout: fsdp2 + tp 2 + SP on 4 gloo ranks, 3 steps, fp32; medians of {args.repeat} interleaved runs")
    print(f"{'stack':>10} {'wall s':>7}  phases (last run)")
    for stack, wall in (("tiny", tiny), ("automodel", am)):
        t = timings[stack]
        split = ", ".join(
            f"{k} {getattr(t, k + '_s'):.1f}s"
            for k in ("launch", "init", "steps", "check", "teardown")
            if getattr(t, k + "_s") is not None
        )
        print(f"{stack:>10} {wall:>7.1f}  {split}")
    ratio = am / tiny
    print(
        f"ratio AutoModel stack / tiny stack: {ratio:.2f}x (goal <= {GOAL:.0f}x: {'met' if ratio <= GOAL else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
