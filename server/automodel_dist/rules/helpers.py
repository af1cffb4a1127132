"""Small shared pieces for rules: closest-name hints, type descriptions, pydantic error mapping."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from ..config.load import Unresolved, clip
from ..config.schema import fields
from ..report import Finding, Severity
from .base import Context, finding


def closest(word: str, options: Iterable[str]) -> str | None:
    hits = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return hits[0] if hits else None


def did_you_mean(word: str, options: Iterable[str]) -> str:
    hit = closest(word, options)
    return f"did you mean {hit!r}?" if hit else ""


def fmt_set(values: Iterable[Any]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def yaml_value(value: Any) -> str:
    """A value as it would be written in YAML (true, null, 2, bfloat16, [cp])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Sorted divisors of ``n`` (those <= ``limit`` when given), in bounded time for any ``n``.

    Exact below 2^32; above, a cofactor without prime factors under 2^16 is kept whole (sizes that
    large are errors anyway; the divisors only feed fix hints).
    """
    if not isinstance(n, int) or n < 1:
        return []
    factors: dict[int, int] = {}
    m, p = n, 2
    while p * p <= m and p < 1 << 16:
        while m % p == 0:
            factors[p] = factors.get(p, 0) + 1
            m //= p
        p += 1 if p == 2 else 2
    if m > 1:
        factors[m] = factors.get(m, 0) + 1
    out = [1]
    for prime, k in factors.items():
        out = [d * prime**e for d in out for e in range(k + 1) if limit is None or d * prime**e <= limit]
    return sorted(out)


@cache
def field_adapter(model: type[BaseModel], name: str) -> TypeAdapter:
    info = fields(model)[name]
    from typing import Annotated

    ann = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(ann, config=ConfigDict(strict=True))


def describe(model: type[BaseModel], name: str) -> str:
    """A human description of a field's accepted values ('true or false', 'an integer >= 0')."""
    info = fields(model)[name]
    ann = info.annotation
    text = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
    lows = [getattr(m, "ge", None) for m in info.metadata if getattr(m, "ge", None) is not None]
    if ann is bool:
        return "true or false"
    if ann is int and lows:
        return f"an integer >= {lows[0]}"
    if "Literal" in text:
        return text.replace("Literal", "one of ")
    return text


def value_ok(model: type[BaseModel], name: str, value: Any) -> bool:
    """Whether ``value`` is valid for field ``name`` of ``model`` (strict)."""
    try:
        field_adapter(model, name).validate_python(value)
    except ValidationError:
        return False
    return True


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


@cache
def _nested(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that are pydantic models themselves."""
    return {
        name: info.annotation
        for name, info in fields(model).items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
    }


def pydantic_findings(
    ctx: Context,
    model: type[BaseModel],
    value: dict[str, Any],
    parts: tuple[Any, ...],
    rule_id: str,
    *,
    severity: Severity | None = None,
    skip: frozenset[str] = frozenset(),
    note: str = "",
    section: str | None = None,
) -> Iterator[Finding]:
    """Validate ``value`` against ``model`` strictly, one finding per bad key (with its line). ``parts`` are relative
    to the distributed block, or, with ``section``, to that recipe section (``checkpoint``)."""
    known = fields(model)

    def where(*keys: Any) -> str:
        if section is None:
            return ctx.path(*parts, *keys)
        return ".".join([section, *map(str, parts), *map(str, keys)])

    def at(key: Any, message: str, fix: str) -> Finding:
        if section is None:
            return finding(ctx, parts + (key,), message, fix, rule_id=rule_id, severity=severity)
        return finding(ctx, (), message, fix, rule_id=rule_id, severity=severity, recipe_path=where(key))

    for key, item in value.items():
        if key in skip:
            continue
        if key not in known:
            hint = did_you_mean(key, known)
            yield at(
                key,
                f"unknown key {key!r} in {where()}; AutoModel's {getattr(model, 'AUTOMODEL_CLASS', model.__name__)} has no such field "
                f"(TypeError: unexpected keyword argument){note}",
                f"remove it{'; ' + hint if hint else ''} (valid: {', '.join(sorted(known))})",
            )
            continue
        nested = _nested(model).get(key)
        if nested is None and value_ok(model, key, item):
            continue
        info = known[key]
        if nested is not None and isinstance(item, dict):
            yield from pydantic_findings(
                ctx, nested, item, parts + (key,), rule_id, severity=severity, note=note, section=section
            )
            continue
        if nested is not None:
            message = f"must be a mapping, got {clip(repr(item))}; AutoModel raises TypeError when it builds the config"
            fix = f"remove {key}: to keep the defaults, or write a mapping with keys {', '.join(fields(nested))}"
        else:
            message = f"must be {describe(model, key)}, got {clip(repr(item))}"
            fix = f"{key}: {yaml_value(_plain(info.get_default(call_default_factory=True)))} (the default) or a valid value"
        yield at(key, f"{where(key)} {message}{note}", fix)


def fitting_sizes(ctx: Context, axis: str, values: Iterable[int]) -> list[int]:
    """The ``values`` of ``axis`` (tp, cp, pp or ep) a fix hint may offer: those that keep the layout on the world
    size (tp*cp*pp dividing it; ep dividing dp*cp*tp) and, for tp, dividing the GPUs per node when known. Falls
    back to ``values`` when the world size is unknown or the other degrees already fail it."""
    d, values = ctx.dims, list(values)
    world = d.world_size
    if world is None:
        return values
    if axis == "ep":
        non_pp = world // d.pp if world % d.pp == 0 else None
        return [v for v in values if non_pp is not None and non_pp % v == 0] or values
    others = {"tp": d.cp * d.pp, "cp": d.tp * d.pp, "pp": d.tp * d.cp}[axis]
    if world % others:
        return values
    node = ctx.gpus_per_node
    return [v for v in values if world % (v * others) == 0 and (axis != "tp" or not node or node % v == 0)]


def flag_on(ctx: Context, key: str) -> bool:
    """AutoModel's reading of a boolean option of the block: the raw value's truthiness (its dataclasses do not
    coerce)."""
    value = ctx.block.get(key)
    return bool(value) and not isinstance(value, Unresolved)
