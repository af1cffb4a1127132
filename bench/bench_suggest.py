"""suggest_strategy speed, and estimate_memory against torch's memory tracker.

1. Full search for Llama-3.1-405B on 512 nodes x 8 H100 (4,096 GPUs). Goal: <= 0.5 s.
2. A table of estimated vs measured (FSDPMemTracker on fake tensors) per-rank model states and
   peak, over the test matrix plus full-size runs (``--quick`` skips the full-size ones).

Run: python bench/bench_suggest.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import memtrack  # noqa: E402

from automodel_dist import suggest_strategy  # noqa: E402
from automodel_dist.catalog.models import lookup  # noqa: E402

GIB = float(1 << 30)
L8, L70 = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"
ROWS = [
    ("Llama-3.1-8B, 8 ranks, FSDP2", L8, dict(world_size=8)),
    ("Llama-3.2-1B (tied), 8 ranks", "meta-llama/Llama-3.2-1B", dict(world_size=8)),
    ("8B x4 layers, seq 4096", L8, dict(world_size=8, num_layers=4, seq_len=4096)),
    ("8B x4, full AC", L8, dict(world_size=8, num_layers=4, activation_checkpointing=True)),
    ("8B x4, selective AC", L8, dict(world_size=8, num_layers=4, activation_checkpointing="selective")),
    ("8B x4, TP2 + FSDP2", L8, dict(world_size=8, num_layers=4, tp=2)),
    ("8B x4, TP2 + SP + FSDP2", L8, dict(world_size=8, num_layers=4, tp=2, sequence_parallel=True)),
    ("8B x4, CP2 + FSDP2", L8, dict(world_size=8, num_layers=4, cp=2)),
    ("8B x4, HSDP 2x4", L8, dict(world_size=8, num_layers=4, dp_replicate=2)),
    ("8B x4, bf16 weights", L8, dict(world_size=8, num_layers=4, storage_dtype="bfloat16")),
    ("Mixtral-8x7B x4, EP8, 16 ranks", "mistralai/Mixtral-8x7B-v0.1", dict(world_size=16, ep=8, num_layers=4)),
    ("Qwen3-30B-A3B x4, EP8, 16 ranks", "Qwen/Qwen3-30B-A3B", dict(world_size=16, ep=8, num_layers=4)),
    ("Mixtral-8x7B x4, no EP, 8 ranks", "mistralai/Mixtral-8x7B-v0.1", dict(world_size=8, num_layers=4)),
    ("Qwen3-30B-A3B x4, no EP, 8 ranks", "Qwen/Qwen3-30B-A3B", dict(world_size=8, num_layers=4)),
    (
        "70B x8, TP8+SP+AC, 64 ranks",
        L70,
        dict(world_size=64, tp=8, sequence_parallel=True, activation_checkpointing=True, seq_len=4096, num_layers=8),
    ),
]
FULL = [
    (
        "Llama-3.1-70B, TP8+SP+AC, 64 ranks",
        L70,
        dict(world_size=64, tp=8, sequence_parallel=True, activation_checkpointing=True, seq_len=4096),
    ),
    ("Llama-3.1-8B, HSDP 2x8 + sel. AC", L8, dict(world_size=16, dp_replicate=2, activation_checkpointing="selective")),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the full-size tracker runs (minutes)")
    args = ap.parse_args()
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
    print()
    print(f"{'configuration':<36} {'states est/meas GiB':>20} {'err':>6} {'peak est/meas GiB':>19} {'err':>6} {'s':>5}")
    rows = ROWS + ([] if args.quick else FULL)
    worst_states = worst_peak = 0.0
    for name, model, kw in rows:
        spec = lookup(model)
        t = time.perf_counter()
        meas = memtrack.measure(spec, **kw)
        est = memtrack.estimate_fsdp2(spec, **kw)
        es, ms = est.model_states, meas.model_states / GIB
        ep, mp = est.tracked_peak, meas.peak / GIB
        worst_states, worst_peak = max(worst_states, abs(es / ms - 1)), max(worst_peak, abs(ep / mp - 1))
        print(
            f"{name:<36} {es:>9.2f} / {ms:<8.2f} {100 * (es / ms - 1):>+5.1f}% {ep:>8.2f} / {mp:<8.2f} "
            f"{100 * (ep / mp - 1):>+5.1f}% {time.perf_counter() - t:>5.0f}"
        )
    print(f"worst error: model states {100 * worst_states:.1f}% (goal 5%), peak {100 * worst_peak:.1f}% (goal 15%)")


if __name__ == "__main__":
    main()
