"""Command-line overrides the way AutoModel 0.7.0 applies them (``--distributed.tp_size 4``).

A job is launched as ``automodel recipe.yaml --nproc-per-node 8 --distributed.tp_size=4`` (or
``python recipe_script.py -c recipe.yaml --distributed.tp_size 4``): the launcher's argparse takes
the config and ``--nproc-per-node``, and ``_arg_parser.parse_cli_argv`` turns every other
``--dotted.key=value`` / ``--dotted.key value`` / ``--flag`` (= ``True``) into an override that
``ConfigNode.set_by_dotted`` applies after the YAML is loaded: the value is read with
``translate_value`` (Python literals, ``none``/``true``) and then stored like a loaded value
(``_wrap``); intermediate keys that are missing or not mappings become empty mappings.

Pure: nothing read is imported or run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..report import Finding
from .files import MAX_OVERRIDE_CHARS, MAX_OVERRIDES, _err
from .load import Document, PathKey, apply_value_semantics, clip
from .values import translate_value


@dataclass
class LaunchArgs:
    """What AutoModel's launcher reads from the arguments after ``automodel``."""

    config: str | None = None  # the recipe: the first bare argument, or -c/--config PATH
    nproc_per_node: int | None = None
    overrides: list[str] = field(default_factory=list)  # "dotted.key=value", in order


class _LauncherParser(argparse.ArgumentParser):
    """The ``automodel`` launcher's parser (``nemo_automodel/cli/app.py``), raising instead of exiting."""

    def __init__(self) -> None:
        super().__init__(prog="automodel", add_help=False)
        self.add_argument("config")
        self.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None)

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def parse_launch_args(argv: Sequence[str]) -> LaunchArgs:
    """AutoModel's reading of a launch command line (without the program name).

    Two entry points: the launcher, ``automodel CONFIG [--nproc-per-node N] [overrides]`` (its argparse
    takes the config and ``--nproc-per-node``, unknown arguments go on), and a recipe script,
    ``python script.py -c CONFIG [overrides]`` (read so when the first argument is ``-c``/``--config``). Then
    ``_arg_parser.parse_cli_argv``: ``--key.sub=value``, ``--key.sub value`` and ``--flag`` (= ``True``)
    become overrides, in order; other bare words are skipped, as AutoModel skips them. Raises
    ``ValueError`` where AutoModel stops (a bad ``--nproc-per-node``, ``--config`` without a path).
    """
    out = LaunchArgs()
    rest = list(argv)
    if not rest or rest[0] not in ("-c", "--config"):
        ns, rest = _LauncherParser().parse_known_args(rest)
        out.config, out.nproc_per_node = ns.config, ns.nproc_per_node
        if out.nproc_per_node is not None and out.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {out.nproc_per_node}")
    i = 0
    while i < len(rest):  # _arg_parser.parse_cli_argv
        tok = rest[i]
        if tok in ("--config", "-c"):
            if i + 1 >= len(rest):
                raise ValueError("Expected a path after --config")
            out.config = rest[i + 1]
            i += 2
            continue
        if tok.startswith("--"):
            key = tok.lstrip("-")
            if "=" in key:
                out.overrides.append(key)
                i += 1
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                out.overrides.append(f"{key}={rest[i + 1]}")
                i += 2
            else:
                out.overrides.append(f"{key}=True")
                i += 1
            continue
        i += 1
    return out


def apply_overrides(doc: Document, overrides: Sequence[str], *, bare: bool) -> None:
    """Apply ``dotted.key=value`` overrides to ``doc.data`` in place, as ``set_by_dotted`` would.

    ``bare``: the document is a bare ``distributed:`` block, so keys must start with ``distributed.``
    (the path the same override has in the recipe). Each override adds an info finding (at the line of
    the value it replaces); a malformed one an error. The lines of replaced values are dropped, so
    findings about an overridden value carry no line.
    """
    if not isinstance(doc.data, dict):
        return
    if isinstance(overrides, str) or len(overrides) > MAX_OVERRIDES:
        doc.findings.append(
            _err(
                "override-invalid",
                f"overrides must be a list of at most {MAX_OVERRIDES} 'dotted.key=value' strings",
                fix="pass e.g. ['distributed.tp_size=4']",
            )
        )
        return
    data = doc.data = dict(doc.data)  # never modify the caller's mapping
    for item in overrides:
        problem = _malformed(item)
        if problem:
            doc.findings.append(
                _err(
                    "override-invalid",
                    f"override {clip(repr(item))} {problem}",
                    path="<overrides>",
                    fix="write dotted.key=value, e.g. distributed.tp_size=4",
                )
            )
            continue
        dotted, raw = item.split("=", 1)
        parts = dotted.split(".")
        if bare:
            if parts[0] != "distributed" or len(parts) < 2:
                doc.findings.append(
                    _err(
                        "override-invalid",
                        f"override {clip(repr(item))} is outside the distributed: block, and the "
                        "config is a bare block",
                        path="<overrides>",
                        fix="validate the whole recipe, or override distributed.* keys only",
                    )
                )
                continue
            parts = parts[1:]
        _set(doc, data, parts, raw, dotted)


def _malformed(item: Any) -> str | None:
    if not isinstance(item, str):
        return f"is a {type(item).__name__}, not a 'dotted.key=value' string"
    if len(item) > MAX_OVERRIDE_CHARS:
        return f"is over {MAX_OVERRIDE_CHARS:,} characters"
    if "=" not in item:
        return "has no '=' (AutoModel fails splitting it: 'not enough values to unpack')"
    return None


def _set(doc: Document, data: dict[str, Any], parts: list[str], raw: str, dotted: str) -> None:
    node = data
    path: PathKey = ()
    for p in parts[:-1]:  # walk, copying each mapping on the way (the caller's data stays as it was)
        path += (p,)
        child = node.get(p)
        if isinstance(child, dict):
            child = dict(child)
        else:
            _drop_lines(doc, path)
            child = {}
        node[p] = child
        node = child
    key = parts[-1]
    path += (key,)
    old_line = doc.lines.get(path) if key in node else None
    had, old = key in node, node.get(key)
    _drop_lines(doc, path)  # first: findings about the new value (env, _target_) must not point at the old line
    node[key] = apply_value_semantics({key: translate_value(raw)}, doc, path[:-1])[key]
    was = f"the config has {clip(repr(old))}" if had else "not in the config"
    doc.findings.append(
        Finding(
            rule="override-applied",
            severity="info",
            path=".".join(path),
            line=old_line,
            message=f"{dotted} = {clip(repr(node[key]))} from the command line ({was})",
        )
    )


def _drop_lines(doc: Document, path: PathKey) -> None:
    """Forget the lines of ``path`` and everything under it: the value there no longer comes from the file
    (``None`` also keeps ``Document.line`` from falling back to the parent's line)."""
    n = len(path)
    for k in [k for k in doc.lines if k[:n] == path]:
        del doc.lines[k]
    doc.lines[path] = None
