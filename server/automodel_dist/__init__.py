"""automodel-dist: check, lay out, size and smoke-test NeMo AutoModel 0.7.0 ``distributed:`` configs.

The engine is pure Python; torch is imported only by ``run_smoke_test`` (and only when called).
"""

from __future__ import annotations

__version__ = "0.1.0"
AUTOMODEL_VERSION = "0.7.0"

_LAZY = {
    "ConfigError": ("automodel_dist.report", "ConfigError"),
    "Finding": ("automodel_dist.report", "Finding"),
    "MeshReport": ("automodel_dist.report", "MeshReport"),
    "ValidationReport": ("automodel_dist.report", "ValidationReport"),
    "validate_config": ("automodel_dist.api", "validate_config"),
    "build_mesh": ("automodel_dist.api", "build_mesh"),
    "run_smoke_test": ("automodel_dist.smoke", "run_smoke_test"),
    "suggest_strategy": ("automodel_dist.suggest", "suggest_strategy"),
    "estimate_memory": ("automodel_dist.estimate", "estimate_memory"),
}


def __getattr__(name: str) -> object:
    """Import the engine and its report models on first use (``import automodel_dist`` loads no pydantic)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'automodel_dist' has no attribute {name!r}")


__all__ = [
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
