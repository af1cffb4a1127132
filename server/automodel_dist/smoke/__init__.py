"""run_smoke_test: really launch a layout on N processes and prove parity with one process.

The parent never imports torch; ranks are started by torch's elastic launcher or torchrun.
Names load on first use, so importing ``automodel_dist.smoke.report`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "run_smoke_test": "run",
    "DEFAULT_CONFIG": "run",
    "export_smoke_test": "export",
    "judge_smoke_test": "export",
    "SmokeExport": "export",
    "Plan": "launch",
    "SmokeUsageError": "launch",
    "kill_all_active": "launch",
    "parse_fault": "launch",
    "SmokeReport": "report",
    "RankReport": "report",
    "Timing": "report",
    "Tolerance": "report",
    "TOLERANCES": "report",
}


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_NAMES)
