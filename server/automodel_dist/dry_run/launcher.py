"""The process that starts the dry run's ranks, through a fork server (multiprocessing's ``forkserver``) that imports
AutoModel's stack once (``stack/preload.py``, as the smoke runner's fork server does) where each rank would otherwise
import it itself: 3-4 s of every rank's CPU time. Each rank is forked into a session of its own, so that its memory
can be read and the whole rank stopped by process group, as a separately started process would be; it dies with the
fork server (the parent-death signal), which exits with this process.

Run as ``python -m automodel_dist.dry_run.launcher`` by dry_run/run.py, with the ranks' environment (one CPU thread,
offline, Dynamo off) set before anything imports torch and with pipes of its own: a fork server started by the host
process itself would inherit the host's environment and output (the MCP server's protocol stream), and there is
only one per process.

Protocol, one JSON array per line, on descriptors the fork server and the ranks never see (their stdin is
``/dev/null``, their stdout this process's stderr). Parent to launcher, on stdin: ``[tag, spec, result, stdout,
stderr]`` (paths: the rank's spec, where it writes its result, and where its stdout and stderr go). Launcher to parent,
on stdout: ``["pid", tag, pid]`` per rank started, once the rank leads its own process group (or has already ended),
and ``["exit", tag, code]`` per rank ended (``code`` negative: killed by that signal). End of stdin: no more ranks;
the launcher exits once its ranks have.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import sys
import time
from typing import Any

from ..child_process import set_pdeathsig

PRELOAD = ("automodel_dist.stack.preload", "automodel_dist.dry_run.worker")
"""What the fork server imports before it forks a rank (a module that fails to import there is left to the rank,
which reports the failure as its result)."""


def _rank(spec: str, result: str, stdout: str, stderr: str) -> None:
    """A forked rank: its own session and output files, then the worker (multiprocessing makes the worker's return
    the process's exit code, and prints an exception to the stderr file)."""
    os.setsid()
    set_pdeathsig()
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    from . import worker

    sys.exit(worker.serve(spec, result))


def _own_session(process: Any) -> None:
    """Until the started rank leads its own process group (a stop by group reaches all of it) or has ended."""
    while process.is_alive():
        try:
            if os.getpgid(process.pid) == process.pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.002)


def main() -> int:
    # the protocol's own descriptors (os.dup's are not inheritable); what the fork server or a rank prints goes to
    # stderr, and they read nothing
    inbox, outbox = os.dup(0), os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def say(*message: Any) -> None:
        outbox.write(json.dumps(message) + "\n")
        outbox.flush()

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()  # its imports start now, while the parent plans and writes specs
    ranks: dict[int, tuple[str, Any]] = {}  # sentinel -> (tag, process)
    pending = b""
    reading = True
    while reading or ranks:
        for ready in multiprocessing.connection.wait([inbox, *ranks] if reading else list(ranks)):
            if ready in ranks:
                tag, process = ranks.pop(ready)
                process.join()
                say("exit", tag, process.exitcode)
                continue
            chunk = os.read(inbox, 1 << 16)
            reading = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                tag, spec, result, stdout, stderr = json.loads(line)
                process = context.Process(target=_rank, args=(spec, result, stdout, stderr))
                process.start()  # the first waits for the fork server's imports
                _own_session(process)
                ranks[process.sentinel] = (tag, process)
                say("pid", tag, process.pid)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
