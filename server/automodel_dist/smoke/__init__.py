"""run_smoke_test: really launch a layout on N processes and prove parity with one process.

The parent never imports torch; ranks are started by torch's elastic launcher or torchrun.
Names load on first use, so importing ``automodel_dist.smoke.report`` stays light.
"""

from __future__ import annotations

from .._lazy import lazy_attrs

_NAMES = {
    "run_smoke_test": ".run",
    "DEFAULT_CONFIG": ".request",
    "SmokeRequest": ".request",
    "SmokeOptions": ".request",
    "export_smoke_test": ".export",
    "judge_smoke_test": ".export",
    "SmokeExport": ".export",
    "Plan": ".launch",
    "SmokeUsageError": ".launch",
    "kill_all_active": ".launch",
    "parse_fault": ".launch",
    "SmokeReport": ".report",
    "RankReport": ".report",
    "Timing": ".report",
    "Tolerance": ".report",
    "TOLERANCES": ".report",
}


__getattr__ = lazy_attrs(__name__, _NAMES)


__all__ = sorted(_NAMES)
