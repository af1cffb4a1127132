"""A Hugging Face ``config.json`` for a model spec: what the dry run and the smoke run hand AutoModel's model builder.

Every spec the engine resolves was read from a config.json (the catalog's trimmed files, the local Hugging Face cache,
a path, a download of config.json alone) and keeps it (``ModelSpec.hf_config``): that dict is returned unchanged.
``tests/unit/test_catalog.py`` builds the transformers class of every catalog entry from its file on the meta device and
compares its parameter count with the spec's. Pure: no transformers import.
"""

from __future__ import annotations

from typing import Any

from .models import ModelSpec


class NoConfigError(ValueError):
    """A spec that was not read from a config.json (built by hand): there is nothing to build the model from."""


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """The ``config.json`` dict ``spec`` was read from; raises :class:`NoConfigError` for a spec built by hand."""
    if spec.hf_config is None:
        raise NoConfigError(f"{spec.name}: this model's config.json is not known here; pass its config.json")
    return dict(spec.hf_config)


__all__ = ["hf_config", "NoConfigError"]
