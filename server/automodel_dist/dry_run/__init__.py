"""dry_run: NeMo AutoModel 0.7.0's own training step at full model size and world size, on fake tensors.

Planning (:mod:`.plan`) and the report (:mod:`.report`) import no torch; each measured rank runs in its own process
(:mod:`.worker`), the only place torch and AutoModel are imported. Names load on first use, so importing
``automodel_dist.dry_run.report`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "dry_run": "run",
    "DryRunUnavailable": "run",
    "missing_packages": "run",
    "DryRunUsageError": "plan",
    "plan_dry_run": "plan",
    "DryRunReport": "report",
    "RankResult": "report",
    "MemorySplit": "report",
    "CategoryDiff": "report",
}


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_NAMES)
