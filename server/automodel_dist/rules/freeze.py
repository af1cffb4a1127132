"""``freeze_config:`` as AutoModel 0.7.0 parses it (``model_utils.parse_freeze_config``, called in the model build
of every recipe that reads the section): its options, the legacy booleans and the module selectors. An error here
is a ValueError or TypeError raised while the model is built, after the job has started on every node."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..config.kinds import FREEZE_CONFIG_RECIPES
from ..report import Finding
from .base import Context, finding, rule
from .helpers import closest, yaml_value

F = "recipe"
# model_utils._FREEZE_CONFIG_OPTIONS (0.7.0)
OPTIONS = (
    "freeze_modules",
    "unfreeze_modules",
    "freeze_vision_tower",
    "freeze_audio_tower",
    "freeze_language_model",
    "freeze_video_embedder",
)
SELECTOR_LISTS = ("freeze_modules", "unfreeze_modules")
BOOLEANS = ("freeze_vision_tower", "freeze_audio_tower", "freeze_language_model", "freeze_video_embedder")
# freeze_embeddings: accepted and ignored before AutoModel's generic selectors (PR #3681) made the option list strict;
# recipes written earlier still carry it (AutoModel removed it from its own, PR #3851: trainability unchanged)
REMOVED = {
    "freeze_embeddings": "earlier AutoModel versions accepted and ignored it (AutoModel dropped it from its own "
    "recipes with trainability unchanged); to really freeze the token embeddings name the model's embedding module "
    "in a selector, e.g. freeze_modules: [{path: model.embed_tokens}] (a VLM's: model.language_model.embed_tokens), "
    "and in a VLM recipe also say freeze_vision_tower: true outright: a selector turns the implicit vision freeze off"
}


def _sections(ctx: Context) -> Iterator[str]:
    """The freeze sections this recipe's model builds parse: the student's, and the VLM distillation's teacher's."""
    if ctx.kind.recipe is not None and ctx.kind.recipe not in FREEZE_CONFIG_RECIPES:
        return
    yield "freeze_config"
    if ctx.kind.recipe == "KnowledgeDistillationRecipeForVLM":
        yield "teacher_freeze_config"


def _selector_problem(entry: Any) -> str | None:
    """What ``_parse_module_selector`` and ``ModuleSelector`` reject in one selector entry."""
    if not isinstance(entry, Mapping):
        return f"entries must be mappings with exactly one of `path` or `glob`; got {entry!r}"
    unknown = sorted(str(k) for k in set(entry) - {"path", "glob"})
    if unknown:
        return f"entry {dict(entry)!r} has unsupported key(s) {unknown}; use exactly one of `path` or `glob`"
    path, glob = entry.get("path"), entry.get("glob")
    if (path is None) == (glob is None):
        return f"a selector needs exactly one of `path` or `glob`; got path={path!r}, glob={glob!r}"
    value = path if path is not None else glob
    if not isinstance(value, str) or not value:
        return f"selector values must be non-empty strings; got {value!r}"
    return None


@rule(
    "freeze-config-invalid",
    family=F,
    severity="error",
    title="freeze_config: option or value AutoModel rejects at model build",
    patterns=(
        r"freeze_config has unsupported option\(s\) \[(.*)\]",
        r"freeze_config\.(\w+) must be a boolean",
        r"freeze_config\.(\w+) (?:must be a list|entries must be mappings|entry .* has unsupported key)",
        r"ModuleSelector requires exactly one of `path` or `glob`",
        r"freeze_config must be a mapping of freeze options",
    ),
    cause="AutoModel 0.7.0 parses freeze_config strictly while it builds the model (parse_freeze_config): an option "
    "outside its six (freeze_modules, unfreeze_modules and four modality booleans), a non-boolean modality flag or a "
    "malformed module selector raises there, after every node has started. freeze_embeddings, which earlier "
    "versions ignored, is one such option.",
    fix="Keep to its options: freeze_vision_tower / freeze_audio_tower / freeze_language_model / "
    "freeze_video_embedder as true or false, and freeze_modules / unfreeze_modules as lists of {path: ...} or "
    "{glob: ...}.",
    section="recipe",
)
def freeze_config_invalid(ctx: Context) -> Iterator[Finding]:
    if not ctx.recipe:
        return
    for section in _sections(ctx):
        if section not in ctx.recipe or ctx.recipe[section] is None:
            continue
        raw = ctx.recipe[section]
        if not isinstance(raw, Mapping):
            yield finding(
                ctx,
                (),
                f"{section} must be a mapping of freeze options, got {type(raw).__name__}: AutoModel raises "
                "TypeError while building the model",
                f"{section}: {{freeze_vision_tower: true}} (or remove the section: nothing is frozen then)",
                recipe_path=section,
            )
            continue
        unknown = [k for k in raw if k not in OPTIONS]
        for key in unknown:
            near = closest(str(key), OPTIONS) if str(key) not in REMOVED else None
            if near:
                fix = f"rename it: {near}: {yaml_value(raw[key])}"
            else:
                fix = f"remove {key}: " + (REMOVED.get(str(key)) or f"its options are {', '.join(OPTIONS)}")
            yield finding(
                ctx,
                (),
                f"{section}.{key} is not an option of AutoModel 0.7.0's freeze_config: it raises \"freeze_config "
                f'has unsupported option(s) {sorted(map(str, unknown))}" while building the model',
                fix,
                recipe_path=f"{section}.{key}",
            )
        for key in BOOLEANS:
            value = raw.get(key)
            if value is not None and not isinstance(value, bool):
                yield finding(
                    ctx,
                    (),
                    f"{section}.{key} must be a boolean, got {value!r}: AutoModel raises ValueError while building "
                    "the model",
                    f"{key}: true or {key}: false",
                    recipe_path=f"{section}.{key}",
                )
        for key in SELECTOR_LISTS:
            if key not in raw:
                continue
            entries = raw[key]
            if not isinstance(entries, list):
                yield finding(
                    ctx,
                    (),
                    f"{section}.{key} must be a list of `path`/`glob` selector mappings, got {yaml_value(entries)}",
                    f"{key}: [{{path: model.language_model.embed_tokens}}] (a list, one mapping per module)",
                    recipe_path=f"{section}.{key}",
                )
                continue
            for i, entry in enumerate(entries):
                problem = _selector_problem(entry)
                if problem:
                    yield finding(
                        ctx,
                        (),
                        f"{section}.{key}[{i}]: {problem}: AutoModel raises ValueError while building the model",
                        "write each entry as {path: <module path>} (exact) or {glob: '<pattern>'} (fnmatch, * "
                        "crosses dots)",
                        recipe_path=f"{section}.{key}",
                    )
