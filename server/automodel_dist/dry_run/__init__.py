"""dry_run: NeMo AutoModel 0.7.0's own training step at full model size and world size, on fake tensors.

Planning (:mod:`.plan`) and the report (:mod:`.report`) import no torch; each measured rank runs in its own process
(:mod:`.worker`, forked from the fork server :mod:`.launcher` starts), the only place torch and AutoModel are
imported. Names load on first use, so importing ``automodel_dist.dry_run.report`` stays light.
"""

from __future__ import annotations

from .._lazy import lazy_attrs

_NAMES = {
    "dry_run": ".run",
    "DryRunUnavailable": ".run",
    "missing_packages": ".run",
    "DryRunUsageError": ".plan",
    "plan_dry_run": ".plan",
    "DryRunReport": ".report",
    "RankResult": ".report",
    "MemorySplit": ".report",
    "CategoryDiff": ".report",
}


__getattr__ = lazy_attrs(__name__, _NAMES)


__all__ = sorted(_NAMES)
