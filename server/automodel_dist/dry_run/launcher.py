"""The process that starts the dry run's ranks, through a fork server (multiprocessing's ``forkserver``) that imports
AutoModel's stack once (``stack/preload.py``, as the smoke runner's fork server does) where each rank would otherwise
import it itself: 3-4 s of every rank's CPU time. Each rank is forked into a session of its own, so that its memory
can be read and the whole rank stopped by process group, as a separately started process would be.

Run as ``python -m automodel_dist.dry_run.launcher`` by dry_run/run.py, with the ranks' environment (one CPU thread,
offline, Dynamo off) set before anything imports torch and with pipes of its own: a fork server started by the host
process itself would inherit the host's environment and output (the MCP server's protocol stream), and there is
only one per process.

Protocol, one JSON array per line. Parent to launcher, on stdin: ``[tag, spec, result, stdout, stderr]`` (paths: the
rank's spec, where it writes its result, and where its stdout and stderr go). Launcher to parent, on stdout:
``["pid", tag, pid]`` per rank started and ``["exit", pid, code]`` per rank ended (``code`` negative: killed by that
signal). End of stdin: no more ranks; the launcher exits once its ranks have.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import sys
from typing import Any

PRELOAD = ("automodel_dist.stack.preload", "automodel_dist.dry_run.worker")
"""What the fork server imports before it forks a rank (a module that fails to import there is left to the rank,
which reports the failure as its result)."""


def _say(*message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _rank(spec: str, result: str, stdout: str, stderr: str) -> None:
    """A forked rank: its own session and output files, then the worker (multiprocessing makes the worker's return
    the process's exit code, and prints an exception to the stderr file)."""
    os.setsid()
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    from . import worker

    sys.exit(worker.serve(spec, result))


def main() -> int:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()  # its imports start now, while the parent plans and writes specs
    ranks: dict[int, Any] = {}  # sentinel -> process
    pending = b""
    reading = True
    while reading or ranks:
        for ready in multiprocessing.connection.wait([0, *ranks] if reading else list(ranks)):
            if ready in ranks:
                process = ranks.pop(ready)
                process.join()
                _say("exit", process.pid, process.exitcode)
                continue
            chunk = os.read(0, 1 << 16)
            reading = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                tag, spec, result, stdout, stderr = json.loads(line)
                process = context.Process(target=_rank, args=(spec, result, stdout, stderr))
                process.start()  # the first waits for the fork server's imports
                ranks[process.sentinel] = process
                _say("pid", tag, process.pid)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
