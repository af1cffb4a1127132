"""Package attributes imported on first use, so importing a package (or one light submodule) loads nothing else."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attrs(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each of ``names`` (attribute -> module, relative to the package
    when it starts with a dot) is imported from its module on first use."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_attrs"]
