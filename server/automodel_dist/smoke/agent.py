"""The launcher process: torch's elastic agent (``torch.distributed.launcher.api.elastic_launch``).

``python -m automodel_dist.smoke.agent --spec spec.json`` runs the ranks through a fork server
(start_method ``forkserver``) that imports torch once, while the agent imports its own, so the ranks
do not each pay the torch import; rendezvous, per-rank logs, failure propagation and worker teardown
are torch's own (the same machinery as ``torchrun``). It dies with its parent (PR_SET_PDEATHSIG), and
so do the ranks.

Why not plain ``fork`` from the agent: the agent has threads (the rendezvous store's server, its
keep-alive timer) when it forks, and a rank forked while one of them held a libc lock inherits the
lock held forever. Seen here about once in 100 four-rank runs: the store's server thread was
resolving a peer's address as the last rank was forked, and that rank hung in ``getaddrinfo``
(``__resolv_context_get``) inside ``init_process_group`` until the process-group timeout. The fork
server is a fresh single-threaded process, so nothing is held when it forks.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from ..child_process import set_pdeathsig

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "torch.distributed._functional_collectives",
    "torch.distributed.tensor.experimental",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
    "torch.nn.parallel",
    "torch.utils.checkpoint",
    "automodel_dist.smoke.parallelize",
    "automodel_dist.smoke.tiny_models",
    "automodel_dist.smoke.worker",
)
"""What every rank needs, imported by the fork server before it forks them (a name an older torch
lacks is skipped; the rank imports what exists when it needs it)."""


STACK_PRELOAD = ("automodel_dist.smoke.stack_worker", "automodel_dist.stack.preload")
"""Added for a run on AutoModel's stack: AutoModel and transformers, imported once instead of once per rank."""


def start_fork_server(stack: str | None = None) -> None:
    """Start the fork server now, so that its imports (:data:`PRELOAD`) run while the agent imports."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(list(PRELOAD) + (list(STACK_PRELOAD) if stack == "automodel" else []))
    multiprocessing.forkserver.ensure_running()


def main(argv: list[str] | None = None) -> int:
    set_pdeathsig()
    ap = argparse.ArgumentParser(description="automodel-dist smoke launcher (elastic agent)")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--start-method", default="forkserver", choices=["forkserver", "spawn"])
    args = ap.parse_args(argv)
    spec_path = Path(args.spec)
    run_dir = spec_path.parent

    if args.start_method == "forkserver":
        try:
            stack = json.loads(spec_path.read_text(encoding="utf-8")).get("stack")
        except (OSError, ValueError, AttributeError):
            stack = None  # the worker reports an unreadable spec itself
        start_fork_server(stack)
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
        (run_dir / "agent_failure.json").write_text(
            json.dumps(
                {
                    "failures": {
                        str(rank): {
                            "message": f.message if isinstance(f.message, str) else json.dumps(f.message),
                            "exitcode": f.exitcode,
                        }
                        for rank, f in exc.failures.items()
                    }
                }
            )
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
