"""Shared test setup: make tests/oracle.py importable and keep hypothesis deterministic in CI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
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
# ... and its own temporary directory (inherited by every process it starts), so "no run directory left behind"
# checks see this session's runs only, not those of a parallel worker or another run on the machine.
SESSION_TMP = Path(tempfile.gettempdir()) / TEST_TAG
SESSION_TMP.mkdir(parents=True, exist_ok=True)
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = None  # gettempdir() reads TMPDIR again


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


# pytest-xdist (-n auto, --dist loadgroup): the tests that launch processes run one after another on one worker per
# group, so two smoke runs never compete for the CPU or see each other's run directories; the rest spread over the
# workers. A group holds whole files.
XDIST_GROUPS = {
    "smoke": {"test_smoke.py", "test_smoke_automodel.py", "test_docs.py", "test_mcp.py", "test_mcp_serve.py"},
    "dry_run": {
        "test_dry_run.py",
        "test_dry_run_depth.py",
        "test_calibration.py",
        "test_corpus_sweep.py",
        "test_suggest_verified.py",
        "test_overrides.py",
    },
    "node": {"test_skill_install.py"},
}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    import pytest

    for item in items:
        for group, files in XDIST_GROUPS.items():
            if item.path.name in files:
                item.add_marker(pytest.mark.xdist_group(group))


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


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """This session's temporary directory goes with it (pytest's tmp_path folders included)."""
    import shutil

    shutil.rmtree(SESSION_TMP, ignore_errors=True)
