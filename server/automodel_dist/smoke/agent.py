"""The launcher process: torch's elastic agent (``torch.distributed.launcher.api.elastic_launch``).

``python -m automodel_dist.smoke.agent --spec spec.json`` imports torch once and forks the ranks
(start_method ``fork``), so they do not each pay the torch import; rendezvous, per-rank logs,
failure propagation and worker teardown are torch's own (the same machinery as ``torchrun``). It
dies with its parent (PR_SET_PDEATHSIG), and so do the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

from ._exec import set_pdeathsig


def _preimport() -> None:
    """Import what every rank needs before forking, so no rank pays for it."""
    import importlib

    for name in ("torch.distributed.device_mesh", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
                 "torch.distributed.fsdp", "torch.distributed.pipelining", "torch.distributed._functional_collectives",
                 "torch.distributed.tensor.experimental", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
                 "torch.nn.parallel", "torch.utils.checkpoint", "automodel_dist.smoke.parallelize",
                 "automodel_dist.smoke.tiny_models"):
        try:
            importlib.import_module(name)
        except ImportError:  # older torch: the rank imports what exists when it needs it
            pass


def main(argv: list[str] | None = None) -> int:
    set_pdeathsig()
    ap = argparse.ArgumentParser(description="automodel-dist smoke launcher (elastic agent)")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    args = ap.parse_args(argv)
    spec_path = Path(args.spec)
    run_dir = spec_path.parent

    import torch  # noqa: F401  - imported once here; forked ranks inherit it
    if args.start_method == "fork" and args.nproc > (os.cpu_count() or 1):
        _preimport()  # more ranks than cores: importing once beats importing in parallel
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .worker import entry

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=args.nproc,
        run_id=f"automodel-dist-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port per run
        max_restarts=0,
        monitor_interval=0.05,
        start_method=args.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs"), redirects=Std.ALL),
    )
    try:
        elastic_launch(config, entry)(str(spec_path))
    except ChildFailedError as exc:
        (run_dir / "agent_failure.json").write_text(json.dumps({"failures": {
            str(rank): {"message": f.message if isinstance(f.message, str) else json.dumps(f.message),
                        "exitcode": f.exitcode}
            for rank, f in exc.failures.items()}}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
