"""Shared test setup: make tests/oracle.py importable and keep hypothesis deterministic in CI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import golden
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
os.environ["HF_HUB_CACHE"] = str(golden.NO_HF_CACHE)  # no test reads this machine's cache (see golden.py)
EXAMPLES = Path(os.environ.get("AUTOMODEL_DIST_EXAMPLES", ROOT / "tests" / "examples"))

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
