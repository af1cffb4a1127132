"""Where a model's dims come from, in this order, never downloading unless asked:

1. an explicit ``config.json`` path or a model folder holding one;
2. the local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``), through
   ``huggingface_hub.try_to_load_from_cache`` at the revision asked for (``main`` by default): the machine a job
   is launched from usually has the model's ``config.json`` already;
3. the built-in catalog (published dims);
4. with ``fetch`` (CLI ``--fetch-config``, MCP ``fetch_config``), ``config.json`` alone from the Hub through
   ``huggingface_hub.hf_hub_download`` (never weights; ``HF_HUB_OFFLINE=1`` forbids it).

A config is read as JSON (never through remote code), capped in size, and a file that is not a model config is a
clear error, never a traceback. Pure: huggingface_hub is imported only for a cache lookup or a download.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.files import is_dir
from ..config.values import clip
from .models import MAX_CONFIG_BYTES, ModelConfigError, ModelSpec, close_matches, from_hf_config, lookup, names_a_file

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$")
REVISION = re.compile(r"^[\w.\-/]{1,128}$")


@dataclass(frozen=True)
class ModelSource:
    """A resolved model and where its dims came from."""

    spec: ModelSpec
    source: str  # argument | config.json | hf-cache | catalog | downloaded
    where: str | None = None  # the file read, or the catalog's reference

    def describe(self) -> str:
        return {
            "argument": "the spec passed",
            "config.json": f"the config.json at {self.where}",
            "hf-cache": f"the Hugging Face cache ({self.where})",
            "catalog": "the built-in catalog",
            "downloaded": f"config.json downloaded from the Hub ({self.where})",
            "mapping": "the config dict passed",
        }.get(self.source, self.source)


def hub_cache_dir() -> Path:
    """The cache huggingface_hub reads, from the environment at the time of the call (it reads it at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def read_config(path: Path, *, name: str | None = None) -> ModelSpec:
    """A spec from a config.json file (size-capped, JSON only)."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ModelConfigError(
                f"{clip(str(path), 160)} is {size:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte limit"
            )
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelConfigError(f"cannot read model config {clip(str(path), 160)}: {clip(str(exc), 300)}") from exc
    return from_hf_config(data, name=name or str(path))


def from_cache(repo_id: str, revision: str | None) -> Path | None:
    """The cached config.json of ``repo_id`` at ``revision``, or None (not cached, or cached as missing)."""
    if not REPO_ID.match(repo_id) or (revision is not None and not REVISION.match(revision)):
        return None
    cache = hub_cache_dir()
    if not is_dir(cache / f"models--{repo_id.replace('/', '--')}"):
        return None  # nothing for this repo: no need to import huggingface_hub
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache), revision=revision)
    return Path(found) if isinstance(found, str) else None


def download(repo_id: str, revision: str | None) -> Path:
    """config.json alone from the Hub (``fetch``); ModelConfigError when offline, unreachable or missing."""
    if offline():
        raise ModelConfigError(f"HF_HUB_OFFLINE is set: config.json of {repo_id} cannot be downloaded")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=str(hub_cache_dir())))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelConfigError(f"could not download config.json of {repo_id}: {clip(str(exc), 300)}") from exc


def resolve(model: Any, *, revision: str | None = None, fetch: bool = False) -> ModelSource:
    """The spec of ``model`` (a spec, a config dict, a config.json path or folder, or a Hugging Face repo id) and
    where it came from; raises :class:`ModelConfigError` saying what was looked at."""
    if isinstance(model, ModelSpec):
        return ModelSource(model, "argument")
    if isinstance(model, dict):
        return ModelSource(from_hf_config(model), "mapping")
    if names_a_file(model):
        path = Path(model)
        if is_dir(path):  # False, not OSError, for a name no folder can have
            path = path / "config.json"
        return ModelSource(read_config(path), "config.json", str(path))
    if not isinstance(model, str):
        raise ModelConfigError(f"model must be a name, a config.json path or a dict, not {type(model).__name__}")
    name = model.strip()
    cached = from_cache(name, revision)
    if cached is not None:
        spec = read_config(cached, name=name)
        return ModelSource(spec, "hf-cache", str(cached))
    spec = lookup(name)
    if spec is not None:
        return ModelSource(spec, "catalog", spec.source)
    if fetch and REPO_ID.match(name):
        path = download(name, revision)
        return ModelSource(read_config(path, name=name), "downloaded", f"{name}@{revision or 'main'}")
    hint = close_matches(name)
    more = f"; did you mean {', '.join(hint)}?" if hint else ""
    how = "" if fetch else "; --fetch-config (MCP fetch_config) downloads its config.json alone"
    raise ModelConfigError(
        f"unknown model {clip(repr(name), 120)}: not a config.json path, not in the Hugging Face cache "
        f"({hub_cache_dir()}), not in the catalog{more}{how}"
    )


def resolve_model(model: Any, *, revision: str | None = None, fetch: bool = False) -> ModelSpec:
    """A :class:`ModelSpec` from a spec, a config dict, a config.json path or folder, a cached Hugging Face repo or a
    catalog name (:func:`resolve`)."""
    return resolve(model, revision=revision, fetch=fetch).spec


__all__ = [
    "ModelSource",
    "resolve_model",
    "download",
    "from_cache",
    "hub_cache_dir",
    "offline",
    "read_config",
    "resolve",
]
