"""Shared test setup: make tests/oracle.py importable and keep hypothesis deterministic in CI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import golden
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
SKILL_DIR = ROOT / "skills" / "nemo-automodel-distributed-training"  # what `npx skills add` installs
sys.path.insert(0, str(Path(__file__).parent))
os.environ["HF_HUB_CACHE"] = str(golden.NO_HF_CACHE)  # no test reads this machine's cache (see golden.py)
EXAMPLES = Path(os.environ.get("AUTOMODEL_DIST_EXAMPLES", ROOT / "tests" / "examples"))

# Every process this test session starts inherits this tag, orphans included, so "nothing left behind" checks look
# at this session's processes only (another run of the tool on the same machine is not a survivor).
TEST_TAG = f"automodel-dist-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["AUTOMODEL_DIST_TEST_TAG"] = TEST_TAG


def own_processes(*needles: str) -> list[str]:
    """``"pid cmdline"`` of this session's live processes (not this one) whose command line holds any needle."""
    tag = f"AUTOMODEL_DIST_TEST_TAG={TEST_TAG}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if tag not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = next((ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if "zombie" not in state and any(n in cmd for n in needles):
            out.append(f"{entry.name} {cmd}")
    return out


settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def dims(strategy: str = "fsdp2", *, dp: int = 1, **kw: Any) -> Any:
    """A :class:`ParallelDims` with ``dp`` data-parallel ranks (the world is dp*tp*cp*pp)."""
    from automodel_dist.dims import ParallelDims

    world = dp * kw.get("tp", 1) * kw.get("cp", 1) * kw.get("pp", 1)
    return ParallelDims(strategy, world_size=world, **kw)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch."""
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


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
