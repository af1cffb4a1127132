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

from ..config.files import allowed_roots, check_path, is_dir
from ..config.values import clip
from .models import MAX_CONFIG_BYTES, ModelConfigError, ModelSpec, close_matches, from_hf_config, lookup, names_a_file

# Hub repo ids as huggingface_hub accepts them (ASCII, no "--" or ".." anywhere), and revisions (a branch, tag or
# commit); anything else is never looked up
REPO_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$", re.ASCII)
REVISION = re.compile(r"^(?!.*\.\.)[\w.\-/]{1,128}$", re.ASCII)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model and where its dims came from."""

    spec: ModelSpec
    source: str  # argument | config.json | hf-cache | catalog | downloaded | recipe
    where: str | None = None  # the file read, or the catalog's reference
    note: str | None = None  # what the reader should know about this source (a revision that was not found)

    def describe(self) -> str:
        said = {
            "argument": "the spec passed",
            "config.json": f"the config.json at {self.where}",
            "hf-cache": f"the Hugging Face cache ({self.where})",
            "catalog": "the built-in catalog",
            "downloaded": f"config.json downloaded from the Hub ({self.where})",
            "mapping": "the config dict passed",
            "recipe": f"the recipe's {self.where}",
        }.get(self.source, self.source)
        return f"{said} ({self.note})" if self.note else said


def hub_cache_dir() -> Path:
    """The cache huggingface_hub reads, from the environment at the time of the call (it reads it at import)."""

    def path(var: str) -> Path:
        return Path(os.path.expandvars(os.environ[var])).expanduser()

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second: the older name huggingface_hub still reads
        if os.environ.get(var):
            return path(var)
    if os.environ.get("HF_HOME"):
        return path("HF_HOME") / "hub"
    return (
        (path("XDG_CACHE_HOME") if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache") / "huggingface" / "hub"
    )


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def read_config(path: Path, *, name: str | None = None) -> ModelSpec:
    """A spec from a config.json file: a regular file under the allowed roots (the MCP server's), size-capped, read
    as JSON only."""
    problem = check_path(path, max_bytes=MAX_CONFIG_BYTES, allowed_roots=allowed_roots())
    if problem is not None:
        raise ModelConfigError(f"model config: {clip(problem.message, 300)}")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # the file may have grown since it was checked
        if len(raw) > MAX_CONFIG_BYTES:
            raise ModelConfigError(f"{clip(str(path), 160)} is over the {MAX_CONFIG_BYTES:,}-byte limit")
        data = json.loads(raw.decode("utf-8"))
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

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache), revision=revision)
    except (OSError, ValueError) as exc:  # a damaged cache folder, a name the Hub's validator refuses
        raise ModelConfigError(f"cannot read the Hugging Face cache entry of {repo_id}: {clip(str(exc), 200)}") from exc
    return Path(found) if isinstance(found, str) else None


def download(repo_id: str, revision: str | None) -> Path:
    """config.json alone from the Hub (``fetch``); ModelConfigError when offline, unreachable or missing."""
    if offline():
        raise ModelConfigError(f"HF_HUB_OFFLINE is set: config.json of {repo_id} cannot be downloaded")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=str(hub_cache_dir())))
    except Exception as exc:  # noqa: BLE001 - HTTP, proxy, timeout and protocol errors all mean "not downloaded"
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
        missed = f"revision {revision} is not in the Hugging Face cache" if revision not in (None, "main") else None
        return ModelSource(spec, "catalog", spec.source, missed)
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
