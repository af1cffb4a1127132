"""The plain block-mapping subset of YAML, read directly (no node tree) for speed.

Most configs are nested ``key: value`` mappings of plain words, numbers, quoted strings and short
lists such as ``[0.9, 0.999]``. For those, building PyYAML's node tree costs more than every check
together, so :func:`read_simple` reads them line by line. It accepts only text whose meaning is
beyond doubt and returns ``None`` for anything else (block sequences, anchors, tags, multi-line or
escaped scalars, flow mappings other than ``{}``, flow sequences of anything but plain words,
document markers, tabs, non-ASCII, duplicate keys, odd indentation, keys that are not strings,
timestamps, ...), which the full loader then reads and reports on. Tags are resolved and scalars
built by the same functions the full loader uses (:mod:`.scalars`), so an accepted text yields
exactly PyYAML's values and key lines; the tests compare the two on generated texts.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .scalars import STR, scalar_tag, scalar_value

_WORD = r"[A-Za-z0-9_./~][A-Za-z0-9_./~+*-]*|[-+][0-9.][A-Za-z0-9_./+*-]*"  # a plain word (1e-5, org/Model-1B, a/*.txt)
_LINE = re.compile(
    r"(?P<indent> *)"
    r"(?:#.*"  # a comment line
    r"|(?P<key>[A-Za-z_][A-Za-z0-9_\-]*):"
    r"(?: +(?:"
    rf"(?P<plain>{_WORD})"  # a plain word or a signed number
    r'|"(?P<double>[^"\\]*)"'  # a double-quoted string without escapes
    r"|'(?P<single>[^']*)'"  # a single-quoted string
    r"|(?P<map>\{\})"  # an empty flow mapping
    rf"|(?P<seq>\[ *(?P<items>(?:{_WORD})(?: *, *(?:{_WORD}))*)? *\])"  # a flow sequence of words ([0.9, 0.999], [])
    r"))?"
    r"(?: +#.*)?)? *"
)
MAX_DEPTH = 32  # deeper nesting goes to the full loader (which bounds it and reports)
MAX_LINE = 200  # longer lines are read but not memoized

_OPEN, _VALUE, _EMPTY_MAP, _SEQ = range(4)
_SKIP = (0, None, _OPEN, None)  # a blank or comment line
Line = tuple[int, Any, int, Any]  # (indent, key or None, kind, value)


class _Decline(Exception):
    pass


def _parse(line: str) -> Line | None:
    """One line as (indent, key, kind, value); None when the full loader must read the text."""
    m = _LINE.fullmatch(line)
    if m is None:
        return None
    key = m.group("key")
    if key is None:
        return _SKIP
    if scalar_tag(key) != STR:
        return None  # keys such as on, yes, null are not strings in YAML 1.1
    indent = len(m.group("indent"))
    plain, double, single, items = m.group("plain", "double", "single", "items")
    try:
        if plain is not None:
            return indent, key, _VALUE, _scalar(plain)
        if double is not None or single is not None:
            return indent, key, _VALUE, double if double is not None else single
        if m.group("map") is not None:
            return indent, key, _EMPTY_MAP, None
        if m.group("seq") is not None:  # kept as a tuple (the parse is memoized), listed per document
            return indent, key, _SEQ, tuple(_scalar(w.strip()) for w in items.split(",")) if items else ()
    except ValueError:
        return None
    return indent, key, _OPEN, None


def _scalar(word: str) -> Any:
    """PyYAML's value of an unquoted word (``ValueError`` for the types left to the full loader)."""
    return scalar_value(scalar_tag(word), word)


_parse_memo = functools.lru_cache(maxsize=4096)(_parse)  # lines such as "  tp_size: 2" recur; values are immutable


def read_simple(text: str) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]] | None:
    """``(data, line of every key)`` for a plain block mapping, else ``None`` (the full loader reads it)."""
    if not (text.isascii() and text.replace("\n", "").isprintable()):
        return None  # tabs, carriage returns, control characters, non-ASCII: the full loader decides
    try:
        return _read(text)
    except _Decline:
        return None


def _read(text: str) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]] | None:
    root: dict[str, Any] = {}
    lines: dict[tuple[Any, ...], int] = {}
    stack: list[tuple[int, dict[str, Any], tuple[str, ...]]] = []  # (indent, mapping, path) of open mappings
    pending: tuple[dict[str, Any], str, tuple[str, ...]] | None = None  # a `key:` whose value is not yet known
    for number, line in enumerate(text.split("\n"), 1):
        parsed = _parse_memo(line) if len(line) <= MAX_LINE else _parse(line)
        if parsed is None:
            raise _Decline
        indent, key, kind, value = parsed
        if key is None:  # blank or comment
            continue
        if not stack:
            if indent:
                raise _Decline  # an indented root mapping: legal, but left to the full loader
            stack.append((0, root, ()))
        elif pending is not None:
            parent, pkey, ppath = pending
            pending = None
            if indent > stack[-1][0]:  # the first line of the mapping that is `key:`'s value
                child: dict[str, Any] = {}
                parent[pkey] = child
                stack.append((indent, child, ppath))
                if len(stack) > MAX_DEPTH:
                    raise _Decline
            # else `key:` was followed by a line at or left of its indent: its value stays null
        if indent < stack[-1][0]:
            while stack[-1][0] > indent:
                stack.pop()
            if stack[-1][0] != indent:
                raise _Decline  # a dedent to no open level: a YAML error
        elif indent > stack[-1][0]:
            raise _Decline  # more indented after a complete `key: value`: a continuation or an error
        _, mapping, path = stack[-1]
        if key in mapping:
            raise _Decline  # the full loader reports duplicate keys
        sub = path + (key,)
        lines[sub] = number
        if kind == _VALUE:
            mapping[key] = value
        elif kind == _EMPTY_MAP:
            mapping[key] = {}
        elif kind == _SEQ:
            mapping[key] = list(value)
            for i in range(len(value)):  # items have lines too (all on the key's line)
                lines[sub + (i,)] = number
        else:
            mapping[key] = None
            pending = (mapping, key, sub)
    if not stack:
        return None  # no key at all: empty or comments only
    return root, lines
