"""Binding stand-ins for the CUDA kernels AutoModel vendors into its modules (GLM-5.2's DSA, DeepSeek-V4's sparse
attention and indexer): where its code looks them up, for the rest of the dry run's process or for a block (tests).
Only the dry run's worker and the tests import the modules that use this."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

Binding = tuple[Any, str, Any]  # (module, attribute, stand-in)


def bindings(stand_ins: Mapping[str, Mapping[str, Any]], extra: Iterable[tuple[str, str, Any]] = ()) -> list[Binding]:
    """``stand_ins`` (module path -> {attribute: stand-in}) and ``extra`` (module path, attribute, value) as
    (module, attribute, stand-in), the modules imported."""
    out = [(importlib.import_module(m), name, fn) for m, names in stand_ins.items() for name, fn in names.items()]
    return out + [(importlib.import_module(m), name, value) for m, name, value in extra]


def install(bound: list[Binding]) -> None:
    """Bind them for the rest of the process (the dry run's rank: fake tensors, which the real kernels could not run
    even where their package is installed)."""
    for module, name, value in bound:
        setattr(module, name, value)


@contextlib.contextmanager
def stood_in(bound: list[Binding]) -> Iterator[None]:
    """Bind them for a block, the originals restored after it (tests)."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in bound]
    install(bound)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
