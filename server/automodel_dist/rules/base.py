"""The rule table: small named checks over one :class:`Context`, all run, none stops the others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..config.kinds import RecipeKind
from ..config.load import Document, PathKey, Unresolved
from ..config.values import is_positive_int
from ..dims import ParallelDims
from ..report import Finding, Severity
from ..workload import Workload, read_workload

if TYPE_CHECKING:
    from ..catalog.models import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Context:
    """Everything a rule may look at: the raw block and recipe (for the checks of what is written) and AutoModel's
    reading of the block (:class:`ParallelDims`, for the checks of what it resolves to). Built once per validation
    by :func:`automodel_dist.api.analyze`."""

    doc: Document
    block: dict[str, Any]
    base: PathKey  # ("distributed",) for a recipe, () for a bare block
    dims: ParallelDims
    kind: RecipeKind = field(default_factory=lambda: RecipeKind("training", None))
    recipe: dict[str, Any] | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    model: ModelSpec | None = None
    torch_version: str | None = None  # the torch release the job will run on, when the caller says
    model_skipped: str | None = None  # why no model was resolved (model is None), for the reports that need one

    @cached_property
    def workload(self) -> Workload:
        """What the recipe trains (:func:`read_workload`), read once per validation for every rule and tool."""
        return read_workload(self.recipe)

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
    section: str = "distributed"  # what it checks: the distributed setup, or the rest of the recipe ("recipe")


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
    section: str = "distributed",
) -> Callable[[Check], Check]:
    """Register a check under a stable id. Every check runs on every config and returns early where it has
    nothing to look at (``if ctx.model is None: return``)."""

    def deco(fn: Check) -> Check:
        if rule_id in RULES:
            raise ValueError(f"duplicate rule id {rule_id}")
        RULES[rule_id] = Rule(rule_id, family, severity, title, fn, patterns, cause, fix, section=section)
        return fn

    return deco


def note(
    rule_id: str,
    title: str,
    *,
    family: str,
    severity: Severity,
    patterns: tuple[str, ...] = (),
    cause: str = "",
    fix: str = "",
    consequence: bool = False,
) -> None:
    """Register a rule id whose findings are produced elsewhere (the loader, the API, or only a run)."""
    RULES[rule_id] = Rule(rule_id, family, severity, title, None, patterns, cause, fix, consequence=consequence)


_RUNNING: ContextVar[str | None] = ContextVar("rule_running", default=None)


def finding(
    ctx: Context,
    parts: tuple[Any, ...],
    message: str,
    fix: str | None = None,
    *,
    rule_id: str | None = None,
    severity: Severity | None = None,
    recipe_path: str | None = None,
) -> Finding:
    """Make a finding at ``parts`` (relative to the block) or at ``recipe_path``, for the rule whose check is running
    (``rule_id`` names another)."""
    rule_id = rule_id or _RUNNING.get()
    if rule_id is None:
        raise ValueError("finding() outside a rule's check needs rule_id")
    r = RULES[rule_id]
    if recipe_path is not None:
        path, line = recipe_path, ctx.recipe_line(recipe_path)
    else:
        path, line = ctx.path(*parts), ctx.line(*parts)
    return Finding(rule=rule_id, severity=severity or r.severity, path=path, line=line, message=message, fix=fix)


def run_rules(ctx: Context) -> list[Finding]:
    """Run every rule of what this kind of config has (a kind AutoModel builds no distributed setup for gets only
    the recipe-level rules); a rule that crashes becomes a warning finding, never an exception."""
    out: list[Finding] = []
    for r in RULES.values():
        if r.check is None or (r.section == "distributed" and ctx.kind.section is None):
            continue
        token = _RUNNING.set(r.id)
        try:
            out.extend(r.check(ctx))
        except Exception as exc:  # noqa: BLE001 - a bug in one rule must not hide the others
            log.exception("rule %s crashed", r.id)
            out.append(
                Finding(
                    rule="internal-error",
                    severity="warning",
                    path=ctx.path(),
                    line=None,
                    message=f"rule {r.id} could not run: {type(exc).__name__}: {exc}",
                )
            )
        finally:
            _RUNNING.reset(token)
    return out


def iter_dict(value: Any) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, dict) else iter(())
