"""Dry-run cost: wall time and peak host memory of AutoModel's own step on fake tensors at full size, against the
analytic estimate of the same layout, measured in the same run.

Cases: Llama-3.2-1B on 8 ranks (FSDP2, seq 4096) and Llama-3.1-70B on 64 ranks (FSDP2, activation checkpointing,
seq 8192). Goal on a 2-core machine (issue 34's): <= 60 s and <= 2 GiB host RSS each. The ratio column is the dry
run's wall time over the estimate's (the estimate is the instant figure, the dry run AutoModel's own code).

Run: python bench/bench_dry_run.py
"""

from __future__ import annotations

import argparse
import time

from automodel_dist import estimate_memory
from automodel_dist.dry_run import dry_run

CASES = [
    ("Llama-3.2-1B, 8 ranks, FSDP2, seq 4096", "meta-llama/Llama-3.2-1B", "distributed: {}\n", 8, 4096),
    (
        "Llama-3.1-70B, 64 ranks, FSDP2 + AC, seq 8192",
        "meta-llama/Llama-3.1-70B",
        "distributed:\n  activation_checkpointing: true\n",
        64,
        8192,
    ),
]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"{'case':<46} {'dry run s':>10} {'RSS MiB':>8} {'estimate s':>11} {'ratio':>9} {'peak GiB':>9}  goal")
    for label, model, text, world, seq in CASES:
        t0 = time.perf_counter()
        est = estimate_memory(text, model=model, world_size=world, seq_len=seq, micro_batch_size=1)
        t_est = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = dry_run(text, model=model, world_size=world, seq_len=seq, micro_batch_size=1)
        t_dry = time.perf_counter() - t0
        [rank] = report.ranks
        rss = rank.host_peak_rss_mib or 0.0
        ok = t_dry <= 60 and rss <= 2048 and report.status == "measured"
        print(
            f"{label:<46} {t_dry:>10.1f} {rss:>8.0f} {t_est:>11.4f} {t_dry / t_est:>8.0f}x "
            f"{rank.peak_allocated_gib or 0:>9.2f}  {'met' if ok else 'NOT met'} (estimate {est.memory_gib.tracked_peak:.2f})"
        )


if __name__ == "__main__":
    main()
