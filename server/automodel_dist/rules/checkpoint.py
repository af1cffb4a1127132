"""``checkpoint:`` as AutoModel 0.7.0 reads it (``CheckpointingConfig``), and the saves that are cheap to get
wrong at scale: an inline consolidated Hugging Face checkpoint written by a few ranks while the others wait."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ..config import schema
from ..config.load import Unresolved
from ..config.values import clip
from ..report import Finding
from .base import Context, finding, rule
from .helpers import pydantic_findings

F = "checkpoint"
GB = 1e9
SHARD_BYTES = 5 * (1 << 30)  # AutoModel's size-based consolidated shard when the model's own index is not at hand
WRITE_GBPS = 2.0  # one rank's sustained write to a parallel filesystem, GB/s (stated in every message)
TRAIN_FT_TIMEOUT_MIN = 1  # dist_env.timeout_minutes default of the LLM, VLM, retrieval and diffusion recipes
SPECULATIVE_TIMEOUT_MIN = 30


def _section(ctx: Context) -> dict[str, Any] | None:
    value = ctx.recipe_get("checkpoint") if ctx.recipe else None
    return value if isinstance(value, dict) else None


def _mode(section: dict[str, Any]) -> str | None:
    """AutoModel's SaveConsolidatedMode of the section: false, final or every (None: a value it rejects)."""
    return _save_mode(section.get("save_consolidated", "final"))


@rule(
    "checkpoint-invalid",
    family=F,
    severity="error",
    title="checkpoint: key or value AutoModel rejects at setup",
    patterns=(
        r"CheckpointingConfig\.__init__\(\) got an unexpected keyword argument '(\w+)'",
        r"Unsupported model save format: (\S+)",
        r"Unsupported save_consolidated value: (\S+)",
        r"checkpoint\.consolidation_timeout_minutes must be greater than 0",
    ),
    cause="The recipe passes every checkpoint: key to AutoModel's CheckpointingConfig (only restore_from is read "
    "apart): an unknown key is a TypeError and a bad model_save_format, save_consolidated or timeout a ValueError "
    "or AssertionError, raised in setup after the job has started.",
    fix="Use CheckpointingConfig's keys and values (see references/config-reference.md).",
    section="recipe",
)
def checkpoint_invalid(ctx: Context) -> Iterator[Finding]:
    if not ctx.kind.checks_checkpoint or not ctx.recipe or "checkpoint" not in ctx.recipe:
        return
    raw = ctx.recipe["checkpoint"]
    if raw is None:
        return  # the recipe reads a null section as no keys
    if not isinstance(raw, dict):
        yield finding(
            ctx,
            (),
            f"checkpoint: must be a mapping, got {clip(repr(raw))}; AutoModel fails building its CheckpointingConfig",
            "remove checkpoint: for the defaults, or give its keys",
            recipe_path="checkpoint",
        )
        return
    # the recipe passes the YAML values through: a string such as "yes" for a bool is not converted
    section = {k: v for k, v in raw.items() if k not in schema.CHECKPOINT_READ_APART and not isinstance(v, Unresolved)}
    known = schema.fields(schema.CheckpointOptions)
    unknown = {k: v for k, v in section.items() if k not in known}
    yield from pydantic_findings(
        ctx, schema.CheckpointOptions, unknown, (), "checkpoint-invalid", note=AT_SETUP, section="checkpoint"
    )
    is_peft = isinstance(ctx.recipe.get("peft"), dict) if ctx.kind.checkpoint_from_recipe_config else None
    for key, message, fix in rejections(section, is_peft=is_peft):
        yield finding(ctx, (), message + AT_SETUP, fix, recipe_path=f"checkpoint.{key}")
    unchecked = {k: v for k, v in section.items() if k in known and k not in CHECKED_BY_AUTOMODEL}
    yield from pydantic_findings(
        ctx,
        schema.CheckpointOptions,
        unchecked,
        (),
        "checkpoint-invalid",
        severity="warning",
        note="; AutoModel does not check it at setup and uses the value as given",
        section="checkpoint",
    )


AT_SETUP = " (raised in setup, after the job has started)"
# The keys CheckpointingConfig.__post_init__ checks (components/checkpoint/config.py), in its order.
CHECKED_BY_AUTOMODEL = frozenset(
    {"consolidation_timeout_minutes", "allow_legacy_pickle_restore", "max_recent_checkpoints", "model_save_format"}
    | {"save_consolidated"}
)
SAVE_FORMATS = ("torch_save", "safetensors")


def _save_mode(value: Any) -> str | None:
    """_normalize_save_consolidated: the mode a value means, or None where AutoModel raises ValueError."""
    if isinstance(value, bool):
        return "every" if value else "false"
    if isinstance(value, str):
        return {"true": "every", "every": "every", "final": "final", "false": "false"}.get(value.strip().lower())
    return None


def rejections(section: dict[str, Any], *, is_peft: bool | None) -> Iterator[tuple[str, str, str]]:
    """What CheckpointingConfig(**section).__post_init__ raises, every failure rather than its first:
    (key, message, fix). ``is_peft``: what the recipe sets (None: the YAML's own value stands)."""
    get = section.get
    peft = get("is_peft", False) if is_peft is None else is_peft
    cloud = isinstance(get("checkpoint_dir"), str) and get("checkpoint_dir").startswith("msc://")
    if "consolidation_timeout_minutes" in section:
        t = get("consolidation_timeout_minutes")
        if not isinstance(t, (int, float)):
            yield (
                "consolidation_timeout_minutes",
                f"checkpoint.consolidation_timeout_minutes={clip(repr(t))} is not a number: AutoModel's "
                "'<=' comparison raises TypeError",
                "consolidation_timeout_minutes: 30 (the default), or more minutes for a slow filesystem",
            )
        elif t <= 0:
            yield (
                "consolidation_timeout_minutes",
                f"checkpoint.consolidation_timeout_minutes={t!r}: AutoModel raises ValueError (must be greater than 0)",
                "consolidation_timeout_minutes: 30 (the default), or more minutes for a slow filesystem",
            )
    if "allow_legacy_pickle_restore" in section and not isinstance(get("allow_legacy_pickle_restore"), bool):
        yield (
            "allow_legacy_pickle_restore",
            f"checkpoint.allow_legacy_pickle_restore={clip(repr(get('allow_legacy_pickle_restore')))}: AutoModel "
            "raises ValueError (must be a boolean)",
            "allow_legacy_pickle_restore: false (true only for checkpoints from a trusted source)",
        )
    keep = get("max_recent_checkpoints")
    if keep is not None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            yield (
                "max_recent_checkpoints",
                f"checkpoint.max_recent_checkpoints={clip(repr(keep))}: AutoModel raises ValueError (must be unset "
                "or a positive integer)",
                "max_recent_checkpoints: a positive integer, or remove it to keep every checkpoint",
            )
        elif cloud:
            yield (
                "max_recent_checkpoints",
                "checkpoint.max_recent_checkpoints with an msc:// checkpoint_dir: AutoModel raises ValueError "
                "(retention works on local directories only)",
                "remove max_recent_checkpoints",
            )
    fmt = get("model_save_format", "safetensors")
    if peft and fmt == "torch_save":
        fmt, mode = "safetensors", "final"  # AutoModel's PEFT fallback, before its checks
    else:
        mode = _save_mode(get("save_consolidated", "final"))
    if fmt not in SAVE_FORMATS:
        yield (
            "model_save_format",
            f"checkpoint.model_save_format={clip(repr(fmt))}: AutoModel raises AssertionError ('Unsupported "
            f"model save format', supported: {list(SAVE_FORMATS)})",
            "model_save_format: safetensors (the default) or torch_save",
        )
    if mode is None:
        yield (
            "save_consolidated",
            f"checkpoint.save_consolidated={clip(repr(get('save_consolidated')))}: AutoModel raises ValueError "
            "(supported: false, final, every, and the legacy booleans)",
            "save_consolidated: final (the default), false or every",
        )
    elif mode != "false" and cloud:
        yield (
            "save_consolidated",
            f"save_consolidated: {mode} with an msc:// checkpoint_dir: AutoModel raises ValueError (a consolidated "
            "export needs a local filesystem)",
            "save_consolidated: false (DCP shards on msc:// storage)",
        )


@rule(
    "checkpoint-overwritten",
    family=F,
    severity="warning",
    title="checkpoint: key the recipe overwrites",
    cause="RecipeConfig.checkpoint (the LLM, VLM, retrieval and diffusion recipes) sets model_repo_id, "
    "model_cache_dir and is_peft from the model: and peft: sections after reading checkpoint:, so the YAML's "
    "values are dropped silently (its comment says the YAML wins; the code does not).",
    fix="Set them where the recipe reads them: model.pretrained_model_name_or_path, model.cache_dir, peft:.",
    section="recipe",
)
def checkpoint_overwritten(ctx: Context) -> Iterator[Finding]:
    section = _section(ctx)
    if section is None or not ctx.kind.checkpoint_from_recipe_config or not ctx.kind.checks_checkpoint:
        return
    source = {
        "model_repo_id": "model.pretrained_model_name_or_path",
        "model_cache_dir": "model.cache_dir",
        "is_peft": "whether peft: is given",
    }
    for key in schema.CHECKPOINT_FROM_MODEL:
        if key in section:
            yield finding(
                ctx,
                (),
                f"checkpoint.{key} is overwritten by the recipe with {source[key]}: the value here is ignored",
                f"remove checkpoint.{key} (set "
                f"{source[key].removeprefix('whether ').removesuffix(' is given')} instead)",
                recipe_path=f"checkpoint.{key}",
            )


@rule(
    "checkpoint-torch-save-consolidation",
    family=F,
    severity="warning",
    title="No Hugging Face checkpoint with torch_save",
    patterns=(r"save_consolidated=\w+ is ignored when checkpoint\.model_save_format=torch_save",),
    cause="With model_save_format: torch_save AutoModel writes DCP shards only: save_consolidated (final by default) "
    "is ignored with one warning at startup, so no consolidated Hugging Face checkpoint is ever written. With "
    "peft: it falls back to safetensors and save_consolidated: final instead.",
    fix="model_save_format: safetensors, or export after training with AutoModel's scripts/export_llm_dcp_to_hf.py.",
    section="recipe",
)
def checkpoint_torch_save(ctx: Context) -> Iterator[Finding]:
    section = _section(ctx)
    if section is None or section.get("model_save_format") != "torch_save" or not ctx.kind.checks_checkpoint:
        return
    if ctx.recipe and isinstance(ctx.recipe.get("peft"), dict):
        yield finding(
            ctx,
            (),
            "model_save_format: torch_save with peft: "
            "AutoModel falls back to safetensors (and save_consolidated: final) for PEFT checkpoints: "
            "the adapters are saved as safetensors, not torch_save",
            "model_save_format: safetensors",
            recipe_path="checkpoint.model_save_format",
        )
        return
    mode = _mode(section)
    if mode == "false":
        return
    yield finding(
        ctx,
        (),
        f"model_save_format: torch_save with "
        f"save_consolidated: {mode} (the default is final): AutoModel writes no consolidated Hugging Face "
        "checkpoint at all, only DCP shards (one startup warning says so)",
        "model_save_format: "
        "safetensors, or save_consolidated: false and AutoModel's scripts/export_llm_dcp_to_hf.py after "
        "training",
        recipe_path="checkpoint.model_save_format",
    )


def _timeout_minutes(ctx: Context) -> tuple[float, str]:
    """The world process group's timeout (dist_env.timeout_minutes, or the recipe's default) and where from."""
    value = ctx.recipe_get("dist_env.timeout_minutes") if ctx.recipe else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value), "dist_env.timeout_minutes"
    default = SPECULATIVE_TIMEOUT_MIN if ctx.kind.name == "speculative" else TRAIN_FT_TIMEOUT_MIN
    return float(default), f"dist_env.timeout_minutes (the recipe's default, {default})"


@rule(
    "checkpoint-inline-consolidation",
    family=F,
    severity="warning",
    title="A consolidated save where few ranks write the whole model",
    patterns=(
        r"save_consolidated=every exports HuggingFace safetensors during every checkpoint save",
        r"save_consolidated=every (?:is|may be) exporting",
    ),
    cause="A consolidated save re-reads every shard and writes the whole model again as Hugging Face safetensors. "
    "AutoModel splits the output files over the ranks (5 GiB files when the model's own index is not at hand), "
    "so a model with fewer files than ranks has a few ranks write everything while the rest wait: on a Gloo group "
    "with checkpoint.consolidation_timeout_minutes (30), or, with single_rank_consolidation, rank 0 alone inside "
    "the save while the others wait in an NCCL broadcast with dist_env.timeout_minutes (1 minute by default).",
    fix="save_consolidated: false (or final) and run bash <checkpoint>/model/consolidate.sh after training; raise "
    "consolidation_timeout_minutes; set staging_dir; do not use single_rank_consolidation on a large model.",
    section="recipe",
)
def checkpoint_inline_consolidation(ctx: Context) -> Iterator[Finding]:
    section = _section(ctx) or {}
    if not ctx.kind.checks_checkpoint or section.get("enabled", True) is False or ctx.model is None:
        return
    if section.get("model_save_format", "safetensors") != "safetensors" or _mode(section) in (None, "false"):
        return
    if ctx.recipe and isinstance(ctx.recipe.get("peft"), dict):
        return  # PEFT saves only the adapters
    world = ctx.dims.world_size
    if world is None:
        return
    mode = _mode(section)
    total = ctx.model.param_count() * 2  # the Hugging Face checkpoint, in bf16
    files = max(1, math.ceil(total / SHARD_BYTES))
    single = section.get("single_rank_consolidation") is True
    if single:
        writer, waiting = total, world - 1
        timeout, where = _timeout_minutes(ctx)
        group = "an NCCL broadcast (the world group)"
    else:
        per_rank_files = math.ceil(files / world)
        writer, waiting = per_rank_files * min(SHARD_BYTES, total), world - min(files, world)
        t = section.get("consolidation_timeout_minutes", 30)
        timeout = float(t) if isinstance(t, int) and not isinstance(t, bool) and t > 0 else 30.0
        where = "checkpoint.consolidation_timeout_minutes"
        group = "the Gloo consolidation group"
    minutes = 2 * writer / GB / WRITE_GBPS / 60  # it reads the shards and writes the same bytes again
    over = minutes > timeout
    if mode == "final" and not over:
        return
    name = ctx.model.name
    writers = (
        "rank 0 writes all"
        if single
        else (f"{min(files, world)} of {world} ranks write {files} file(s), the busiest {writer / GB:,.0f} GB")
    )
    when = "at every checkpoint save (save_consolidated: every)" if mode == "every" else "at the final save"
    verdict = (
        f", past {where} = {timeout:g} min: the waiting ranks time out and the job dies in the save"
        if over
        else f", within {where} = {timeout:g} min, with every GPU idle meanwhile"
    )
    message = (
        f"a consolidated Hugging Face save of {name} ({total / GB:,.0f} GB in bf16) {when}: {writers} while "
        f"{waiting} wait in {group}; at {WRITE_GBPS:g} GB/s per rank (reading and writing) that takes about "
        f"{minutes:,.1f} min{verdict}"
    )
    fix = (
        "save_consolidated: false, then bash <checkpoint>/model/consolidate.sh after training (NPROC_PER_NODE "
        "ranks, off the training job)"
    )
    if over and not single:
        fix += f", or consolidation_timeout_minutes: {math.ceil(2 * minutes)}"
    if single:
        fix = "single_rank_consolidation: false (every rank writes its share), or " + fix
    if section.get("staging_dir") is None:
        fix += "; staging_dir: a local disk keeps a killed save from leaving truncated shards"
    yield finding(
        ctx,
        (),
        message,
        fix,
        recipe_path=(
            "checkpoint.single_rank_consolidation"
            if single
            else "checkpoint.save_consolidated"
            if "save_consolidated" in section
            else "checkpoint"
        ),
    )


@rule(
    "checkpoint-async-torch",
    family=F,
    severity="warning",
    title="Asynchronous save on a torch without it",
    patterns=(r"Async mode is only supported for torch >= 2\.9\.0, disabling async mode",),
    cause="CheckpointingConfig turns is_async off on torch < 2.9 (logging an error): saves block training.",
    fix="torch >= 2.9, or is_async: false.",
    section="recipe",
)
def checkpoint_async_torch(ctx: Context) -> Iterator[Finding]:
    section = _section(ctx)
    if section is None or section.get("is_async") is not True or not ctx.torch_version:
        return
    try:
        major, minor = (int(x) for x in ctx.torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return
    if (major, minor) < (2, 9):
        yield finding(
            ctx,
            (),
            f"checkpoint.is_async: true on torch {ctx.torch_version}: "
            "AutoModel disables it (async saves need torch >= 2.9) and every save blocks training",
            "is_async: false, or torch >= 2.9",
            recipe_path="checkpoint.is_async",
        )


__all__ = ["CHECKED_BY_AUTOMODEL", "SHARD_BYTES", "WRITE_GBPS", "rejections"]
