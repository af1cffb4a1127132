"""Load a config (YAML text, file or mapping) with line numbers and AutoModel's value semantics.

The text is composed into PyYAML's node tree (its C loader, with marks), from which this module
builds the Python values itself so that it can (a) remember the line of every key, (b) report duplicate keys instead of silently
keeping the last, (c) bound alias expansion and nesting, and (d) apply AutoModel's own YAML
value semantics (``none`` -> None, ``"2"`` -> 2, ...). Nothing read is ever imported or run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..report import Finding
from .files import MAX_BYTES, _err, check_path
from .values import clip, import_path_problem, translate_value

MAX_NODES = 200_000  # values built, counting alias re-use: stops "billion laughs"
MAX_DEPTH = 64

PathKey = tuple[Any, ...]

try:  # libyaml is ~10x faster and bounds flow nesting itself
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Loader = yaml.SafeLoader


_ENV_BRACED = re.compile(r"\$\{([^}]+)\}")
_ENV_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


class Unresolved(str):
    """A string whose value comes from an environment variable at launch time (not checked here)."""

    variable: str


@dataclass
class Document:
    """A loaded config: its data, the line of every key, and the findings loading produced."""

    data: Any
    lines: dict[PathKey, int | None] = field(default_factory=dict)  # None: a value set by an override
    findings: list[Finding] = field(default_factory=list)
    source: str | None = None
    from_yaml: bool = False

    def line(self, path: PathKey) -> int | None:
        """Line of ``path``, else of its nearest ancestor that has one."""
        if not self.from_yaml:
            return None
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return None


class _TooBig(Exception):
    pass


_SAFE_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}"
    for t in (
        "null",
        "bool",
        "int",
        "float",
        "str",
        "binary",
        "timestamp",
        "seq",
        "map",
        "merge",
        "omap",
        "pairs",
        "set",
        "value",
    )
)


def _dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


class _Builder:
    """Turns a composed node tree into Python values, recording lines and problems."""

    def __init__(self, doc: Document):
        self.doc = doc
        self.constructor = yaml.constructor.SafeConstructor()
        self.count = 0

    def build(self, node: yaml.Node, path: PathKey, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooBig("alias")
        if depth > MAX_DEPTH:
            raise _TooBig("depth")
        if node.tag not in _SAFE_TAGS:
            self.doc.findings.append(
                _err(
                    "yaml-unsafe-tag",
                    f"YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')!r} is not a plain "
                    "YAML type; AutoModel's yaml.safe_load fails ('could not determine a constructor for the "
                    "tag') and nothing here constructs or runs it",
                    line=node.start_mark.line + 1,
                    path=_dotted(path),
                    fix="remove the tag and write the plain value",
                )
            )
            return None
        if isinstance(node, yaml.ScalarNode):
            try:
                return self.constructor.construct_object(node)
            except (ValueError, OverflowError, yaml.YAMLError) as exc:
                self.doc.findings.append(
                    _err(
                        "yaml-syntax",
                        f"value {clip(node.value)!r} cannot be read: {exc}; AutoModel's YAML loader fails on it too",
                        line=node.start_mark.line + 1,
                        path=_dotted(path),
                        fix="write a plain number or string",
                    )
                )
                return None
        if isinstance(node, yaml.SequenceNode):
            out = []
            for i, child in enumerate(node.value):
                self.doc.lines.setdefault(path + (i,), child.start_mark.line + 1)
                out.append(self.build(child, path + (i,), depth + 1))
            return out
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        raise _TooBig("node")  # pragma: no cover - PyYAML has no other node kinds

    def _merged_pairs(self, node: yaml.MappingNode, depth: int) -> list[tuple[yaml.Node, yaml.Node]]:
        """Pairs contributed by ``<<`` merge keys (explicit keys override them, earlier merges win)."""
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for src in sources:
                if isinstance(src, yaml.MappingNode):
                    merged = (
                        merged
                        + [p for p in self._merged_pairs(src, depth + 1)]
                        + [p for p in src.value if p[0].tag != "tag:yaml.org,2002:merge"]
                    )
        return merged

    def _mapping(self, node: yaml.MappingNode, path: PathKey, depth: int) -> dict:
        out: dict[Any, Any] = {}
        merged = self._merged_pairs(node, depth)
        for key_node, value_node in merged:
            key = self.build(key_node, path, depth + 1)
            if _hashable(key) and key not in out:
                out[key] = self.build(value_node, path + (key,), depth + 1)
                self.doc.lines.setdefault(path + (key,), key_node.start_mark.line + 1)
        explicit_seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line + 1
            key = self.build(key_node, path, depth + 1)
            if not _hashable(key):
                self.doc.findings.append(
                    _err(
                        "yaml-bad-key",
                        f"a mapping key must be a scalar, got {type(key).__name__}",
                        line=line,
                        path=_dotted(path),
                        fix="use a plain string key",
                    )
                )
                continue
            if key in explicit_seen:
                self.doc.findings.append(
                    _err(
                        "yaml-duplicate-key",
                        f"key {key!r} appears twice (lines {explicit_seen[key]} and {line}); YAML loaders "
                        f"(PyYAML, AutoModel) silently keep the last value and drop the first",
                        line=line,
                        path=_dotted(path + (key,)),
                        fix=f"keep one {key!r} entry",
                        severity="warning",  # raised to error inside the distributed: block
                    )
                )
            explicit_seen[key] = line
            sub = path + (key,)
            self.doc.lines[sub] = line
            out[key] = self.build(value_node, sub, depth + 1)
        return out


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _resolve_env(value: str, path: PathKey, doc: Document) -> str:
    """AutoModel's ``${VAR}``/``${VAR,default}``/``$VAR`` interpolation, without reading the environment.

    The value at launch depends on the cluster's environment, so a default is used when given and
    otherwise the value is marked :class:`Unresolved` (the rules then skip it).
    """
    missing: list[str] = []

    def braced(match: re.Match[str]) -> str:
        expr = match.group(1).strip().removeprefix("oc.env:").strip()
        if "," in expr:
            name, default = (s.strip() for s in expr.split(",", 1))
            doc.findings.append(
                _err(
                    "env-var",
                    f"value comes from ${{{name}}} at launch; checked with its default {default!r}",
                    line=doc.line(path),
                    path=_dotted(path),
                    severity="info",
                )
            )
            return default
        missing.append(expr)
        return match.group(0)

    out = _ENV_BRACED.sub(braced, value)
    if not missing:
        for m in _ENV_DOLLAR.finditer(out):
            missing.append(m.group(1))
    if missing:
        doc.findings.append(
            _err(
                "env-var",
                f"value comes from environment variable(s) {', '.join(missing)} at launch and was "
                "not checked (AutoModel fails at load if they are unset)",
                line=doc.line(path),
                path=_dotted(path),
                severity="warning",
                fix="give a default, e.g. ${VAR,2}, to have it checked",
            )
        )
        unresolved = Unresolved(value)
        unresolved.variable = missing[0]
        return unresolved
    return out


def apply_value_semantics(value: Any, doc: Document, path: PathKey = ()) -> Any:
    """AutoModel's ``ConfigNode`` view of a loaded value (strings translated, targets kept as names)."""
    if isinstance(value, dict):  # numbers, bools and nulls pass as they are
        out = {}
        for k, v in value.items():
            if isinstance(v, str):
                v = _string(v, doc, path, k)
            elif isinstance(v, (dict, list)):
                v = apply_value_semantics(v, doc, path + (k,))
            out[k] = v
        return out
    if isinstance(value, list):
        return [
            _string(v, doc, path, i)
            if isinstance(v, str)
            else apply_value_semantics(v, doc, path + (i,))
            if isinstance(v, (dict, list))
            else v
            for i, v in enumerate(value)
        ]
    if isinstance(value, str):  # a bare string config
        return _string(value, doc, path, None)
    return value


def _string(value: str, doc: Document, parent: PathKey, key: Any) -> Any:
    """A string value under ``key`` of ``parent`` (a list item's key is its index; None: ``parent`` itself)."""
    if isinstance(key, str) and (key == "_target_" or key.endswith("_fn")):
        problem = import_path_problem(value)  # AutoModel imports these at load; we only ever check the name
        if problem:
            path = parent + (key,)
            doc.findings.append(
                _err(
                    "target-path-invalid",
                    f"{_dotted(path)} is {clip(value)!r}: AutoModel's loader resolves "
                    f"{key} values as import paths when it loads the recipe, and {problem}",
                    line=doc.line(path),
                    path=_dotted(path),
                    fix="write a dotted import path (package.module.function) or path/to/file.py:function",
                )
            )
        return value
    if "$" in value:
        resolved = _resolve_env(value, parent if key is None else parent + (key,), doc)
        if isinstance(resolved, Unresolved):
            return resolved
        return translate_value(resolved)
    return translate_value(value)


def load_text(text: str | bytes, *, source: str | None = None, max_bytes: int = MAX_BYTES) -> Document:
    """Load YAML text. Never raises for bad input: problems become findings on the document."""
    doc = Document(data=None, source=source, from_yaml=True)
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
    if size > max_bytes:
        doc.findings.append(
            _err(
                "yaml-too-large",
                f"config is {size:,} bytes, over the {max_bytes:,}-byte limit",
                fix="pass only the recipe (or its distributed: block)",
            )
        )
        return doc
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            doc.findings.append(
                _err(
                    "yaml-not-utf8",
                    f"config text holds a lone surrogate ({text[exc.start]!r} at offset {exc.start}), "
                    "which is not valid Unicode",
                    line=text[: exc.start].count("\n") + 1,
                    fix="send the config as UTF-8 text",
                )
            )
            return doc
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = text[: exc.start].count(b"\n") + 1
            doc.findings.append(
                _err(
                    "yaml-not-utf8",
                    f"config is not valid UTF-8 (byte 0x{text[exc.start]:02x} at offset {exc.start})",
                    line=line,
                    fix="save the file as UTF-8",
                )
            )
            return doc
    try:
        nodes = []
        for i, node in enumerate(yaml.compose_all(text, Loader=_Loader)):
            if i == 1:
                doc.findings.append(
                    _err(
                        "yaml-multiple-documents",
                        "the YAML has more than one document ('---'); AutoModel's yaml.safe_load rejects it "
                        "('expected a single document in the stream'); only the first was checked",
                        line=node.start_mark.line + 1 if node is not None else None,
                        fix="keep one document per recipe file",
                    )
                )
                break
            nodes.append(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        bad_line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        tab = "tab" in str(problem) or "\t" in bad_line[: (mark.column + 1) if mark else None]
        fix = "indent with spaces: YAML forbids tab characters in indentation" if tab else "fix the YAML syntax"
        if "nesting depth" in str(problem):  # libyaml's own bound on flow nesting
            doc.findings.append(
                _err(
                    "yaml-too-deep",
                    f"YAML nesting is deeper than the {MAX_DEPTH}-level limit ({problem})",
                    line=mark.line + 1 if mark else None,
                )
            )
            return doc
        doc.findings.append(
            _err("yaml-syntax", f"YAML syntax error: {problem}", line=mark.line + 1 if mark else None, fix=fix)
        )
        return doc
    except RecursionError:
        doc.findings.append(_err("yaml-too-deep", f"YAML nesting is deeper than the {MAX_DEPTH}-level limit"))
        return doc
    if not nodes or nodes[0] is None:
        doc.findings.append(_err("yaml-empty", "the config is empty", fix="give a distributed: block"))
        return doc
    builder = _Builder(doc)
    try:
        raw = builder.build(nodes[0], (), 0)
    except _TooBig as exc:
        if str(exc) == "depth":
            doc.findings.append(_err("yaml-too-deep", f"YAML nesting is deeper than the {MAX_DEPTH}-level limit"))
        else:
            doc.findings.append(
                _err(
                    "yaml-too-complex",
                    f"YAML expands to more than {MAX_NODES:,} values (alias expansion, "
                    "'billion laughs'); refusing to build it",
                    fix="remove the recursive anchors/aliases",
                )
            )
        doc.data = None
        return doc
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        doc.findings.append(_err("yaml-syntax", f"YAML value error: {exc}"))
        return doc
    if raw is None and not doc.findings:
        doc.findings.append(_err("yaml-empty", "the config is null", fix="give a distributed: block"))
        return doc
    doc.data = apply_value_semantics(raw, doc)
    return doc


def load_path(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, allowed_roots: list[Path] | None = None
) -> Document:
    """Load a YAML file: a regular file under the size cap (and under ``allowed_roots`` if given)."""
    p = Path(path)
    problem = check_path(p, max_bytes=max_bytes, allowed_roots=allowed_roots)
    if problem is not None:
        return Document(data=None, source=str(p), from_yaml=True, findings=[problem])
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        return Document(
            data=None,
            source=str(p),
            from_yaml=True,
            findings=[_err("file-unreadable", f"cannot read {p}: {exc.strerror or exc}")],
        )
    return load_text(data, source=str(p), max_bytes=max_bytes)


def from_mapping(obj: Any, *, source: str | None = None) -> Document:
    """Wrap an already-parsed mapping (AutoModel value semantics still apply to its strings)."""
    doc = Document(data=None, source=source, from_yaml=False)
    try:
        doc.data = apply_value_semantics(obj, doc)
    except RecursionError:
        doc.findings.append(_err("yaml-too-deep", "the mapping is nested too deeply"))
    return doc


def flow(block: dict[str, Any]) -> str:
    """A block as one YAML flow mapping (``{strategy: fsdp2, tp_size: 2}``), pasteable under ``distributed:``."""
    return yaml.safe_dump(block, default_flow_style=True, sort_keys=False, width=1 << 16).strip()
