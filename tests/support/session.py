"""This test session's own processes and files: a tag every process it starts inherits, its own temporary
directory, and the helpers that look for what it left behind. Imported by conftest.py before any test runs."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

# Every process this test session starts inherits this tag, orphans included, so "nothing left behind" checks look
# at this session's processes only (another run of the tool on the same machine is not a survivor).
TEST_TAG = f"automodel-dist-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["AUTOMODEL_DIST_TEST_TAG"] = TEST_TAG
# ... and its own temporary directory (inherited by every process it starts), so "no run directory left behind"
# checks see this session's runs only, not those of a parallel worker or another run on the machine.
SESSION_TMP = Path(tempfile.gettempdir()) / TEST_TAG
SESSION_TMP.mkdir(parents=True, exist_ok=True)
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def own_processes(*needles: str, tag: str | None = None) -> list[str]:
    """``"pid cmdline"`` of this session's live processes (not this one) whose command line holds any needle; with
    ``tag``, only those started under that tag (:func:`own_tag`)."""
    exact = f"AUTOMODEL_DIST_TEST_TAG={tag}".encode() if tag else None
    prefix = f"AUTOMODEL_DIST_TEST_TAG={TEST_TAG}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            if not any(v == exact if exact else v.startswith(prefix) for v in env):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = next((ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if "zombie" not in state and any(n in cmd for n in needles):
            out.append(f"{entry.name} {cmd}")
    return out


def still_running(*needles: str, tag: str | None = None, timeout_s: float = 15) -> list[str]:
    """:func:`own_processes` once they are gone or the time is up (a killed process takes a moment to exit)."""
    deadline = time.monotonic() + timeout_s
    while (left := own_processes(*needles, tag=tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@contextlib.contextmanager
def own_tag() -> Iterator[str]:
    """A tag of the calling test's own, inherited by every process it starts meanwhile (this session's tag with a
    suffix), so that ``own_processes(..., tag=...)`` sees that test's processes only, not those a test running on
    another worker of this session started."""
    tag = f"{TEST_TAG}-{uuid.uuid4().hex[:8]}"
    os.environ["AUTOMODEL_DIST_TEST_TAG"] = tag
    try:
        yield tag
    finally:
        os.environ["AUTOMODEL_DIST_TEST_TAG"] = TEST_TAG


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """Until a server process listens on 127.0.0.1:port; fails if it exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            out = proc.stdout.read() if proc.stdout and proc.poll() is not None else ""
            assert proc.poll() is None and time.monotonic() < deadline, f"server on port {port} did not start\n{out}"
            time.sleep(0.2)
