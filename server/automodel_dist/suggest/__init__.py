"""suggest: ranked layouts for a model on a cluster, by step time within the fit class.

:mod:`.search` enumerates and sizes the layouts (with the estimate), :mod:`.report` holds the report models (light: the
MCP server's typed tools import them without the search). Names load on first use.
"""

from __future__ import annotations

from .._lazy import lazy_attrs

_NAMES = {
    "suggest_strategy": ".search",
    "search_strategies": ".search",
    "_options": ".search",
    "SuggestReport": ".report",
    "Candidate": ".report",
    "CurrentLayout": ".report",
    "Rejected": ".report",
}

__getattr__ = lazy_attrs(__name__, _NAMES)

__all__ = sorted(n for n in _NAMES if not n.startswith("_"))
