"""automodel-dist: check, lay out, size and smoke-test NeMo AutoModel 0.7.0 ``distributed:`` configs.

The engine is pure Python; torch is imported only by ``run_smoke_test`` (and only when called).
"""

from __future__ import annotations

from ._lazy import lazy_attrs

__version__ = "0.1.0"
AUTOMODEL_VERSION = "0.7.0"

_LAZY = {
    "ConfigError": "automodel_dist.report",
    "Finding": "automodel_dist.report",
    "MeshReport": "automodel_dist.report",
    "ValidationReport": "automodel_dist.report",
    "Request": "automodel_dist.request",
    "validate_config": "automodel_dist.api",
    "build_mesh": "automodel_dist.api",
    "run_smoke_test": "automodel_dist.smoke",
    "suggest_strategy": "automodel_dist.suggest",
    "estimate_memory": "automodel_dist.estimate",
}
# the engine and its report models load on first use (``import automodel_dist`` loads no pydantic)
__getattr__ = lazy_attrs(__name__, _LAZY)


__all__ = [
    "Request",
    "validate_config",
    "build_mesh",
    "ConfigError",
    "Finding",
    "MeshReport",
    "ValidationReport",
    "run_smoke_test",
    "suggest_strategy",
    "estimate_memory",
    "__version__",
]
