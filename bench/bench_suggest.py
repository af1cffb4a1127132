"""suggest_strategy speed: a full search for Llama-3.1-405B on 512 nodes x 8 H100 (4,096 GPUs). Goal: <= 0.5 s.
(The estimate's accuracy is bench/bench_calibration.py's: against AutoModel's published runs and its dry run.)

Run: python bench/bench_suggest.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from automodel_dist import suggest_strategy


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        rep = suggest_strategy(
            "meta-llama/Llama-3.1-405B",
            nodes=512,
            gpus_per_node=8,
            gpu="H100-80GB",
            seq_len=8192,
            global_batch_size=2048,
        )
        times.append(time.perf_counter() - t)
    print(
        f"suggest_strategy 405B on 4,096 H100: median {statistics.median(times):.3f} s over 5 runs "
        f"({rep.searched} layouts evaluated, {rep.fitting} fit) - goal <= 0.5 s"
    )
    print(
        f"  best: {rep.candidates[0].distributed} ({rep.candidates[0].memory_gib.total:.1f} GiB, "
        f"~{rep.candidates[0].step_time_s:.1f} s/step)"
    )


if __name__ == "__main__":
    main()
