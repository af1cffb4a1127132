"""estimate: per-GPU memory, communication, step time and MFU of one given layout.

:mod:`.api` holds ``estimate_memory`` and what the search shares with it, :mod:`.report` the report models (light:
the MCP server's typed tools import them without the engine), :mod:`.memory`, :mod:`.comm`, :mod:`.training` and
:mod:`.peft` the model. Names load on first use.
"""

from __future__ import annotations

from .._lazy import lazy_attrs

_NAMES = {
    "estimate_memory": ".api",
    "model_of": ".api",
    "teacher_of": ".api",
    "make_cluster": ".api",
    "cluster_of": ".api",
    "resolved_model": ".api",
    "fit_limits": ".api",
    "verdict_for": ".api",
    "MEMORY_ERROR": ".api",
    "ASSUMPTIONS": ".api",
    "Estimate": ".report",
    "MemoryBreakdown": ".report",
}

__getattr__ = lazy_attrs(__name__, _NAMES)

__all__ = sorted(_NAMES)
