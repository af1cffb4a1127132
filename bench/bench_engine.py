"""Engine speed, each goal as a ratio or bound measured in one run.

1. validate_config in process over every config under tests/ (the example recipes and AutoModel's calibration
   recipes): every call timed, p50 / p99 / max. Goal: p99 <= 5 ms.
2. One cold ``automodel-dist validate DIR`` over all of those files against a cold
   ``python -c "import automodel_dist.api"``, interleaved. Goal: <= 1.5x of (that import + 1 ms per file).
3. build_mesh (layout + one rank's groups) at 16,384 and 131,072 ranks against torch's ``init_device_mesh`` on a
   fake process group of that size. Goal: <= 200 ms at 16,384.

Run: python bench/bench_engine.py [--repeat N]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

from automodel_dist import build_mesh, validate_config  # noqa: E402
from automodel_dist.api import build_layout  # noqa: E402

FILES = sorted((ROOT / "tests").rglob("*.yaml"))


def _percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def in_process(repeat: int) -> list[float]:
    texts = [p.read_text() for p in FILES]
    for t in texts:  # warm imports and pydantic's validators
        validate_config(t)
    gc.freeze()
    times = []
    for _ in range(repeat):
        for t in texts:
            t0 = time.perf_counter()
            validate_config(t)
            times.append((time.perf_counter() - t0) * 1000)
    return times


def _run_ms(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False)
    return (time.perf_counter() - t0) * 1000


def cold_directory(repeat: int) -> tuple[float, float]:
    """Median ms of a cold ``automodel-dist validate DIR`` and of a cold import of the API, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(FILES):
            shutil.copy(p, Path(tmp) / f"{i:02d}_{p.name}")
        cli = [str(BIN / "automodel-dist"), "validate", tmp]
        imp = [sys.executable, "-c", "import automodel_dist.api"]
        _run_ms(cli), _run_ms(imp)  # page cache
        ours, base = [], []
        for _ in range(repeat):
            ours.append(_run_ms(cli))
            base.append(_run_ms(imp))
    return statistics.median(ours), statistics.median(base)


def torch_mesh(world: int, shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for n in names:
            dist.get_process_group_ranks(mesh[n].get_group())
    finally:
        dist.destroy_process_group()


def _median_ms(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()

    times = in_process(args.repeat)
    p99 = _percentile(times, 0.99)
    print(f"== validate_config in process: {len(FILES)} configs under tests/ x {args.repeat} = {len(times)} calls")
    print(
        f"p50 {_percentile(times, 0.5):.2f} ms, p99 {p99:.2f} ms, max {max(times):.2f} ms; "
        f"goal p99 <= 5 ms: {'met' if p99 <= 5 else 'NOT met'}"
    )

    ours, base = cold_directory(max(3, args.repeat // 4))
    bound = base + len(FILES)
    print(f"\n== cold `automodel-dist validate DIR` over the same {len(FILES)} files")
    print(
        f"{ours:.0f} ms vs cold `import automodel_dist.api` {base:.0f} ms + {len(FILES)} ms = {bound:.0f} ms: "
        f"ratio {ours / bound:.2f}x; goal <= 1.5x: {'met' if ours <= 1.5 * bound else 'NOT met'}"
    )

    print("\n== build_mesh (layout + one rank's groups) vs torch init_device_mesh on a fake process group")
    print(f"{'world':>8} {'ours ms':>9} {'torch ms':>9} {'ratio':>7}")
    block = "distributed:\n  tp_size: 8\n  cp_size: 2\n  pp_size: 8\n  pipeline: {}\n  dp_replicate_size: 4\n"
    at_16k = None
    for world in (16384, 131072):
        ours_ms = _median_ms(lambda w=world: build_mesh(block, world_size=w, ranks=[w - 1]), 5)
        lay, _ = build_layout(block, world_size=world)
        shape, names = tuple(lay.device_mesh()[1]), tuple(lay.device_mesh()[0])
        theirs = _median_ms(lambda w=world, sh=shape, n=names: torch_mesh(w, sh, n), 2)
        print(f"{world:>8} {ours_ms:>9.2f} {theirs:>9.1f} {theirs / ours_ms:>6.0f}x")
        at_16k = at_16k or ours_ms
    print(f"goal <= 200 ms at 16,384 ranks: {'met' if at_16k <= 200 else 'NOT met'}")


if __name__ == "__main__":
    main()
