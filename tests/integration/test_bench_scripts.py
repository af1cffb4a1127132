"""Every benchmark under bench/ starts: its imports and argument parsing run (``--help``), so a broken script shows in
the default suite rather than when someone runs it for numbers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.paths import ROOT

SCRIPTS = sorted((ROOT / "bench").glob("bench_*.py"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 9


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_starts(script):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "server"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
