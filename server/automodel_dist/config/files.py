"""Which files may be read as a config or model config.json (no YAML here: the MCP server imports it at start)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..report import Finding

MAX_BYTES = 1 << 20  # 1 MiB: far above any real recipe (the largest AutoModel example is ~12 KiB)
MAX_OVERRIDES = 256  # command-line overrides per call
MAX_OVERRIDE_CHARS = 4096  # characters per override
# The MCP server's --allowed-root folders: every file read on a client's behalf (a config, a model's config.json,
# one a recipe names) must lie under one of them.
ALLOWED_ROOTS_ENV = "AUTOMODEL_DIST_ALLOWED_ROOTS"


def allowed_roots() -> list[Path] | None:
    """The folders files may be read from (None: anywhere), from ``AUTOMODEL_DIST_ALLOWED_ROOTS``."""
    raw = os.environ.get(ALLOWED_ROOTS_ENV)
    return [Path(p) for p in raw.split(os.pathsep) if p] if raw else None


def _err(
    rule: str,
    message: str,
    *,
    line: int | None = None,
    path: str = "<root>",
    fix: str | None = None,
    severity: str = "error",
) -> Finding:
    return Finding(rule=rule, severity=severity, path=path, line=line, message=message, fix=fix)


def is_file(path: str | os.PathLike[str]) -> bool:
    """``Path.is_file`` that says False, not OSError/ValueError, for a name no file can have (too long, NUL)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: str | os.PathLike[str]) -> bool:
    """``Path.is_dir``, False for a name no directory can have (too long, NUL)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def check_path(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, allowed_roots: list[Path] | None = None
) -> Finding | None:
    """Why ``path`` may not be read as a config: not a regular file, too large, outside the allowed roots."""
    p = Path(path)
    if "\x00" in str(p):
        return _err("file-unreadable", "the path contains a NUL byte")
    try:
        st = p.stat()
    except OSError as exc:
        return _err("file-unreadable", f"cannot read {p}: {exc.strerror or exc}")
    if not stat.S_ISREG(st.st_mode):
        return _err("file-unreadable", f"{p} is not a regular file")
    if allowed_roots is not None:
        real = p.resolve()
        if not any(real.is_relative_to(r.resolve()) for r in allowed_roots):
            return _err(
                "file-not-allowed", f"{p} is outside the allowed roots ({', '.join(str(r) for r in allowed_roots)})"
            )
    if st.st_size > max_bytes:
        return _err("yaml-too-large", f"{p} is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit")
    return None
