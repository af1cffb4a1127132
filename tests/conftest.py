"""Shared test setup: this session's process tag and temporary directory (support/session.py), no Hugging Face cache
of this machine, test groups for pytest-xdist, and deterministic hypothesis in CI. ``tests/`` is on the path
(pyproject's ``pythonpath``), so every test imports its helpers from :mod:`support`."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

from support import golden
from support.session import SESSION_TMP

os.environ["HF_HUB_CACHE"] = str(golden.NO_HF_CACHE)  # no test reads this machine's cache (see support/golden.py)

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


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """This session's temporary directory goes with it (pytest's tmp_path folders included)."""
    import shutil

    shutil.rmtree(SESSION_TMP, ignore_errors=True)
