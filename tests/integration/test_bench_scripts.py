"""Every benchmark under bench/ starts: its imports and argument parsing run (``--help``), so a broken script shows in
the default suite rather than when someone runs it for numbers. One interpreter runs them all, each as ``__main__``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.paths import ROOT

SCRIPTS = sorted((ROOT / "bench").glob("bench_*.py"))
RUN_EACH = """
import contextlib, io, json, runpy, sys
out = {}
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(path, run_name="__main__")
        code = "returned without exiting: --help was not parsed"
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:
        code = f"{type(exc).__name__}: {exc}"
    out[path] = [code, buf.getvalue()[:200]]
print(json.dumps(out))
"""


def test_every_benchmark_starts():
    assert len(SCRIPTS) >= 9
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "server"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", RUN_EACH, *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    bad = {path: r for path, r in results.items() if r[0] not in (0, None) or "usage:" not in r[1]}
    assert not bad and len(results) == len(SCRIPTS), bad
