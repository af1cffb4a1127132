"""The module objects a stand-in puts in ``sys.modules`` in place of a CUDA-only package (Transformer Engine's
attention, flash-linear-attention's Gated DeltaNet kernel, mamba_ssm's Mamba-2 kernel), so AutoModel's ``safe_import``
and ``import a.b.c`` find them. Only the dry run's worker imports the stand-ins."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any


def stand_in_module(name: str, **attrs: Any) -> types.ModuleType:
    """A package module ``name`` holding ``attrs``."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)  # find_spec() must not raise
    mod.__path__ = []  # a package, so "import a.b.c" resolves submodules from sys.modules
    mod.__dict__.update(attrs)
    return mod


def install_modules(tree: dict[str, dict[str, Any]]) -> dict[str, types.ModuleType]:
    """Stand-in modules for ``tree`` (``name -> attrs``), each an attribute of its parent in the tree, put in
    ``sys.modules``; returned by name."""
    mods = {name: stand_in_module(name, **attrs) for name, attrs in tree.items()}
    for name, mod in mods.items():
        parent, _, leaf = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], leaf, mod)
    sys.modules.update(mods)
    return mods
