"""The rule table: small named checks over one :class:`Context`, all run, none stops the others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config.load import Document, PathKey, Unresolved
from ..config.values import SIZE_KEYS, automodel_degree, is_positive_int
from ..report import Finding, Severity

if TYPE_CHECKING:
    from ..catalog.models import ModelSpec
    from ..layout import Layout

log = logging.getLogger(__name__)


@dataclass
class Context:
    """Everything a rule may look at. Built once per validation by ``api.validate_config``."""

    doc: Document
    block: dict[str, Any]
    base: PathKey  # ("distributed",) for a recipe, () for a bare block
    recipe: dict[str, Any] | None = None
    world_size: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    model: ModelSpec | None = None
    strategy: str | None = None  # canonical strategy, None when unknown
    sizes: dict[str, int | None] = field(default_factory=dict)  # effective sizes (AutoModel's reading)
    dp: int | None = None  # data-parallel size AutoModel derives (None if it cannot)
    ep_shard: int | None = None
    pp_schedule: str | None = None  # torch class name, when pp > 1 and it is known
    ac: bool | str | None = None
    layout: Layout | None = None  # the meshes, when the sizes resolve to a buildable layout
    tp_cp_layout: Layout | None = None  # ``layout``, or one without EP and HSDP (same tp/cp groups) when they fail
    torch_version: str | None = None  # the torch release the job will run on, when the caller says

    def has(self, key: str) -> bool:
        return key in self.block

    def get(self, key: str, default: Any = None) -> Any:
        return self.block.get(key, default)

    def path(self, *parts: Any) -> str:
        out = ""
        for part in self.base + tuple(parts):
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out or "<root>"

    def line(self, *parts: Any) -> int | None:
        return self.doc.line(self.base + tuple(parts))

    def recipe_get(self, dotted: str, default: Any = None) -> Any:
        """A value from another recipe section (``step_scheduler.local_batch_size``)."""
        node: Any = self.recipe
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def recipe_line(self, dotted: str) -> int | None:
        return self.doc.line(tuple(dotted.split(".")))

    def size(self, key: str) -> int:
        """The size AutoModel's mesh code uses (``_degree``): a positive int, else 1."""
        value = self.sizes.get(key)
        return value if value is not None else 1

    def size_known(self, key: str) -> bool:
        """True when the user's value for ``key`` is usable (absent, null or a positive int)."""
        raw = self.block.get(key)
        return raw is None or (is_positive_int(raw) and not isinstance(raw, Unresolved))


Check = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """One named check, with what ``explain_error`` needs to map error text back to it."""

    id: str
    family: str
    severity: Severity
    title: str
    check: Check | None  # None: the findings come from the loader or the API (see ``note``)
    patterns: tuple[str, ...] = ()  # regexes matching AutoModel / torch error text
    cause: str = ""
    fix: str = ""
    consequence: bool = False  # explain: usually caused by another rank's failure (timeouts, vanished peers)


RULES: dict[str, Rule] = {}


def rule(
    rule_id: str,
    *,
    family: str,
    severity: Severity,
    title: str,
    patterns: tuple[str, ...] = (),
    cause: str = "",
    fix: str = "",
) -> Callable[[Check], Check]:
    """Register a check under a stable id. Every check runs on every config and returns early where it has
    nothing to look at (``if ctx.model is None: return``)."""

    def deco(fn: Check) -> Check:
        if rule_id in RULES:
            raise ValueError(f"duplicate rule id {rule_id}")
        RULES[rule_id] = Rule(rule_id, family, severity, title, fn, patterns, cause, fix)
        return fn

    return deco


def note(rule_id: str, title: str, *, family: str, severity: Severity, patterns: tuple[str, ...] = (),
         cause: str = "", fix: str = "", consequence: bool = False) -> None:
    """Register a rule id whose findings are produced elsewhere (the loader, the API, or only a run)."""
    RULES[rule_id] = Rule(rule_id, family, severity, title, None, patterns, cause, fix, consequence=consequence)


def finding(ctx: Context, rule_id: str, parts: tuple[Any, ...], message: str, fix: str | None = None,
            *, severity: Severity | None = None, recipe_path: str | None = None) -> Finding:
    """Make a finding for ``rule_id`` at ``parts`` (relative to the block) or at ``recipe_path``."""
    r = RULES[rule_id]
    if recipe_path is not None:
        path, line = recipe_path, ctx.recipe_line(recipe_path)
    else:
        path, line = ctx.path(*parts), ctx.line(*parts)
    return Finding(rule=rule_id, severity=severity or r.severity, path=path, line=line, message=message, fix=fix)


def run_rules(ctx: Context) -> list[Finding]:
    """Run every rule; a rule that crashes becomes a warning finding, never an exception."""
    out: list[Finding] = []
    for r in RULES.values():
        if r.check is None:
            continue
        try:
            out.extend(r.check(ctx))
        except Exception as exc:  # noqa: BLE001 - a bug in one rule must not hide the others
            log.exception("rule %s crashed", r.id)
            out.append(
                Finding(rule="internal-error", severity="warning", path=ctx.path(), line=None,
                        message=f"rule {r.id} could not run: {type(exc).__name__}: {exc}")
            )
    return out


def effective_sizes(block: dict[str, Any]) -> dict[str, int | None]:
    """AutoModel's reading of each size key: ``_degree`` for tp/pp/cp/ep/dp_replicate, dp as given."""
    sizes: dict[str, int | None] = {}
    for key in SIZE_KEYS:
        raw = block.get(key)
        if raw is None:  # absent or null: AutoModel's default
            sizes[key] = None if key == "dp_size" else 1
        elif isinstance(raw, Unresolved):
            sizes[key] = None
        elif key == "dp_size":
            sizes[key] = raw if is_positive_int(raw) else None
        else:
            sizes[key] = automodel_degree(raw) if not isinstance(raw, bool) else 1
    return sizes


def iter_dict(value: Any) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, dict) else iter(())
