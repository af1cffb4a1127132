"""Fuzz run: >= 10,000 generated inputs through validate_config / build_mesh / estimate_memory, plus
suggest_strategy and explain_error, with counts of outcomes and rules and per-call timings.

Goal: no exception escapes (any escape stops the run with the failing input), and each call stays
under 100 ms (reported as p50 / p99 / max and the count over 100 ms, never asserted).

Run: python bench/bench_fuzz.py [--examples N] [--suggest N] [--seed S]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from automodel_dist.explain import explain_error  # noqa: E402
from support.fuzzing import Tally, check_input, check_suggest, inputs, suggest_args  # noqa: E402


def run(examples: int, suggests: int, rng_seed: int) -> Tally:
    tally = Tally()
    opts = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=False)

    @seed(rng_seed)
    @settings(max_examples=examples, **opts)
    @given(inputs())
    def configs(case):
        check_input(*case, tally=tally)

    @seed(rng_seed)
    @settings(max_examples=suggests, **opts)
    @given(suggest_args())
    def suggest(args):
        check_suggest(args, tally=tally)

    @seed(rng_seed)
    @settings(max_examples=max(examples // 10, 1), **opts)
    @given(st.text(max_size=2000))
    def explain(text):
        t = time.perf_counter()
        explain_error(text)
        tally.time("explain_error", (time.perf_counter() - t) * 1e3)

    configs()
    suggest()
    explain()
    return tally


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--suggest", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    t = time.perf_counter()
    tally = run(args.examples, args.suggest, args.seed)
    wall = time.perf_counter() - t
    total = sum(tally.calls.values())
    print(f"{total:,} calls in {wall:.0f} s, seed {args.seed}; no exception escaped, no rule crashed")
    print(f"\n{'call':<18} {'count':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>100 ms':>8}")
    for what, xs in sorted(tally.times_ms.items()):
        xs = sorted(xs)
        p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
        print(
            f"{what:<18} {len(xs):>7,} {statistics.median(xs):8.2f} {p99:8.2f} {xs[-1]:8.1f} "
            f"{sum(x > 100 for x in xs):>8}"
        )
    import automodel_dist

    print("\nslowest input per call, and the same input re-timed (best of 3: an outlier that does not repeat is")
    print("a pause of this machine, not the input):")
    for what, (ms, desc) in sorted(tally.slowest.items()):
        fn = getattr(automodel_dist, what, None)
        again = float("nan")
        if fn is not None:
            a, kw = tally.slowest_inputs[what]
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                try:
                    fn(*a, **kw)
                except ValueError:
                    pass
                runs.append((time.perf_counter() - t0) * 1e3)
            again = min(runs)
        print(f"  {what:<18} {ms:7.1f} ms, re-timed {again:6.1f} ms  {desc[:120]}")
    print("\noutcomes:")
    for k, v in sorted(tally.outcomes.items()):
        print(f"  {k:<40} {v:>7,}")
    print("\nmost frequent error rules:")
    for k, v in tally.rules.most_common(25):
        print(f"  {k:<40} {v:>7,}")


if __name__ == "__main__":
    main()
