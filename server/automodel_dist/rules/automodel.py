"""Rules for what AutoModel 0.7.0 itself raises (or silently misreads) while parsing the block
and building its meshes (``recipes/_dist_utils.py``, ``components/distributed/config.py``,
``mesh_utils.py``, ``pipelining/config.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..config import schema
from ..config.load import Unresolved
from ..config.values import (
    AC_STRATEGIES_SELECTIVE,
    FLOAT_DTYPES,
    HYDRA_KEYS,
    MANAGER_TARGETS,
    RUNNABLE_SCHEDULES,
    SCHEDULES,
    SIZE_KEYS,
    STRATEGY_ALIASES,
    TOP_LEVEL_KEYS,
    dtype_name,
    is_nonneg_int,
    is_positive_int,
    normalize_ac_scope,
    normalize_activation_checkpointing,
)
from ..layout import non_dp_factor
from ..report import Finding
from .base import Context, finding, rule
from .helpers import closest, describe, did_you_mean, divisors, fmt_set, pydantic_findings, value_ok, yaml_value

F = "automodel"
MP_POLICY_TARGETS = frozenset(
    {
        "torch.distributed.fsdp.MixedPrecisionPolicy",
        "torch.distributed.fsdp._fully_shard.MixedPrecisionPolicy",
        "torch.distributed.fsdp._fully_shard._fsdp_api.MixedPrecisionPolicy",
        "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
    }
)
OFFLOAD_TARGETS = frozenset(
    {
        "torch.distributed.fsdp.CPUOffloadPolicy",
        "torch.distributed.fsdp._fully_shard.CPUOffloadPolicy",
        "torch.distributed.fsdp._fully_shard._fsdp_api.CPUOffloadPolicy",
        "torch.distributed._composable.fsdp.CPUOffloadPolicy",
    }
)
# Spellings from older docs / AutoModel's own PipelineConfig docstring that torch rejects.
SCHEDULE_HINTS = {
    "interleaved_1f1b": "interleaved1f1b",
    "interleaved-1f1b": "interleaved1f1b",
    "looped_bfs": "loopedbfs",
    "dfs": "interleaved1f1b",
    "zero_bubble": "interleavedzerobubble",
    "zb": "interleavedzerobubble",
    "v_schedule": "zbvzerobubble",
    "zbv": "zbvzerobubble",
    "dualpipe": "dualpipev",
    "one_f_one_b": "1f1b",
}


def _raw_strategy(ctx: Context) -> Any:
    return ctx.block.get("strategy", "fsdp2")


# =========================================================================== strategy
@rule(
    "strategy-unknown",
    family=F,
    severity="error",
    title="Unknown or non-string strategy",
    patterns=(
        r"Unknown strategy: .*Valid strategies",
        r"'NoneType' object has no attribute 'lower'",
        r"object has no attribute 'lower'",
    ),
    cause="distributed.strategy is not one of fsdp2, megatron_fsdp (megatron-fsdp, mfsdp) or ddp.",
    fix="Set strategy to fsdp2, megatron_fsdp or ddp.",
)
def strategy_unknown(ctx: Context) -> Iterator[Finding]:
    if "strategy" not in ctx.block:
        return
    raw = ctx.block["strategy"]
    valid = sorted(STRATEGY_ALIASES)
    if isinstance(raw, str) and raw.lower() in STRATEGY_ALIASES:
        return
    if not isinstance(raw, str):
        yield finding(
            ctx,
            ("strategy",),
            f"strategy must be a string, got {raw!r}; AutoModel calls .lower() on it and fails with AttributeError",
            "remove the key (fsdp2 is the default) or set strategy: fsdp2",
        )
        return
    hint = closest(raw.lower(), ["fsdp2", "megatron_fsdp", "ddp"]) or closest(raw.lower(), valid)
    yield finding(
        ctx,
        ("strategy",),
        f"unknown strategy {raw!r}; AutoModel 0.7.0 accepts {valid}",
        f"strategy: {hint}" if hint else "strategy: fsdp2",
    )


# =========================================================================== sizes
def _size_consequence(key: str, raw: Any) -> str:
    if key == "dp_size":
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw <= 0:
            return "AutoModel silently ignores it and infers dp from the world size"
        return "AutoModel crashes on it (TypeError/AssertionError in the mesh build)"
    if isinstance(raw, bool):
        return (
            "AutoModel keeps True as the integer 1 in the mesh shape and torch's mesh build fails"
            if raw and key != "ep_size"
            else "AutoModel silently uses 1"
        )
    if key in ("pp_size", "ep_size") and isinstance(raw, str):
        return "AutoModel crashes comparing it with 1 (TypeError)"
    if key == "pp_size" and isinstance(raw, float) and raw > 1:
        return "AutoModel demands a pipeline: block for it yet builds the mesh with pp=1"
    return "AutoModel silently uses 1 instead"


@rule(
    "size-invalid",
    family=F,
    severity="error",
    title="A parallel size is not a positive integer",
    patterns=(
        r"sizes \(True,?\) and strides",
        r"Expected \w+ to be an int",
        r"Expected \w+ > 0",
        r"'[<>]=?' not supported between instances of 'str' and 'int'",
    ),
    cause="A *_size is 0, negative, a float such as 2.0, a boolean or a string. AutoModel's mesh code "
    "(_degree) silently turns such tp/cp/ep/pp values into 1, or crashes for some.",
    fix="Give every *_size as a positive integer.",
)
def size_invalid(ctx: Context) -> Iterator[Finding]:
    for key in SIZE_KEYS:
        raw = ctx.block.get(key)
        if raw is None or isinstance(raw, Unresolved) or is_positive_int(raw):
            continue
        suggestion: Any = 1
        if isinstance(raw, float) and raw.is_integer() and raw > 0:
            suggestion = int(raw)
        if key in ("dp_size", "dp_replicate_size"):
            fix = f"remove {key} (or set a positive integer such as {suggestion})"
        else:
            fix = f"{key}: {suggestion}"
        yield finding(
            ctx,
            (key,),
            f"{key} must be a positive integer, got {raw!r} ({type(raw).__name__}); {_size_consequence(key, raw)}",
            fix,
        )


# =========================================================================== activation checkpointing
@rule(
    "ac-invalid",
    family=F,
    severity="error",
    title="activation_checkpointing value not accepted",
    patterns=(r"activation_checkpointing must be a boolean or one of",),
    cause="activation_checkpointing must be a boolean, or full/true/on/yes, false/off/none/no, or selective.",
    fix="activation_checkpointing: true (full), selective, or false.",
)
def ac_invalid(ctx: Context) -> Iterator[Finding]:
    if "activation_checkpointing" not in ctx.block:
        return
    raw = ctx.block["activation_checkpointing"]
    try:
        normalize_activation_checkpointing(raw)
    except ValueError:
        yield finding(
            ctx,
            ("activation_checkpointing",),
            f"activation_checkpointing={raw!r} is not accepted: AutoModel raises 'must be a boolean or "
            "one of full, selective, false'",
            "activation_checkpointing: true | selective | false",
        )


@rule(
    "ac-selective-strategy",
    family=F,
    severity="error",
    title="Selective AC with megatron_fsdp",
    patterns=(r"selective activation checkpointing is supported only for FSDP2 and DDP",),
    cause="activation_checkpointing: selective is implemented only on the fsdp2 and ddp paths (and megatron_fsdp "
    "skips full checkpointing too, see megatron-fsdp-ac-ignored).",
    fix="Switch to fsdp2 for activation checkpointing, or remove it.",
)
def ac_selective_strategy(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.activation_checkpointing != "selective":
        return
    raw = _raw_strategy(ctx)
    name = raw.lower() if isinstance(raw, str) else raw
    if name in AC_STRATEGIES_SELECTIVE:
        return
    yield finding(
        ctx,
        ("activation_checkpointing",),
        f"activation_checkpointing: selective is supported only for fsdp2 and ddp, not strategy {raw!r}",
        "strategy: fsdp2 (megatron_fsdp does not apply full checkpointing either), or remove activation_checkpointing",
    )


@rule(
    "ac-scope-invalid",
    family=F,
    severity="error",
    title="activation_checkpointing_scope not accepted",
    patterns=(r"activation_checkpointing_scope (entries )?must", r"activation_checkpointing_scope='all' cannot"),
    cause="activation_checkpointing_scope takes all, language, vision, audio, multimodal (all alone).",
    fix="activation_checkpointing_scope: all",
)
def ac_scope_invalid(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy not in ("fsdp2", "ddp") or "activation_checkpointing_scope" not in ctx.block:
        return
    raw = ctx.block["activation_checkpointing_scope"]
    try:
        normalize_ac_scope(raw)
    except ValueError as exc:
        yield finding(
            ctx,
            ("activation_checkpointing_scope",),
            f"{exc} (got {raw!r})",
            "activation_checkpointing_scope: all (or language, vision, audio, multimodal)",
        )


# =========================================================================== _target_
@rule(
    "hydra-target",
    family=F,
    severity="warning",
    title="_target_ in distributed: is ignored",
    cause="AutoModel 0.7.0 drops _target_/_recursive_/_convert_ from distributed:; only strategy: selects "
    "the strategy (default fsdp2).",
    fix="Replace _target_ with strategy: fsdp2 | megatron_fsdp | ddp.",
)
def hydra_target(ctx: Context) -> Iterator[Finding]:
    if "_target_" not in ctx.block:
        return
    target = ctx.block["_target_"]
    wanted = MANAGER_TARGETS.get(target) if isinstance(target, str) else None
    effective = ctx.dims.strategy or "fsdp2"
    if wanted and wanted != effective:
        yield finding(
            ctx,
            ("_target_",),
            f"_target_ names {target.rsplit('.', 1)[-1]} ({wanted}) but AutoModel 0.7.0 ignores "
            f"_target_ and runs strategy {effective!r}: the intended strategy is silently replaced",
            f"strategy: {wanted} (and drop _target_)",
            severity="error",
        )
        return
    extra = (
        ""
        if wanted
        else (" (AutoModel's YAML loader still imports it at load time and fails if it cannot be imported)")
    )
    yield finding(
        ctx,
        ("_target_",),
        f"_target_ is ignored by AutoModel 0.7.0; the strategy is {effective!r}"
        f"{' (the default)' if 'strategy' not in ctx.block else ''}{extra}",
        f"replace _target_ with strategy: {effective}",
    )


# =========================================================================== strategy options
@rule(
    "option-unknown",
    family=F,
    severity="error",
    title="Option the strategy does not have",
    patterns=(r"Unknown options for strategy '(\w[\w-]*)': \[(.*)\]",),
    cause="Every key of distributed: other than the sizes, strategy, pipeline, moe and "
    "activation_checkpointing is passed to the strategy's config class; a key it lacks is an error "
    "(e.g. sequence_parallel under ddp or megatron_fsdp).",
    fix="Remove the key or switch to a strategy that has it (fsdp2 has sequence_parallel, mp_policy, ...).",
)
def option_unknown(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy is None:
        return
    fields = schema.fields(schema.STRATEGY_OPTIONS[ctx.dims.strategy])
    for key in ctx.block:
        if key in TOP_LEVEL_KEYS or key in fields:
            continue
        others = [s for s, m in schema.STRATEGY_OPTIONS.items() if s != ctx.dims.strategy and key in schema.fields(m)]
        if others:
            fix = f"remove {key!r}: it is an option of {' and '.join(others)} only"
            if key == "sequence_parallel":
                fix += " (sequence parallelism needs strategy: fsdp2 with tp_size > 1)"
        else:
            hint = did_you_mean(str(key), list(fields) + list(TOP_LEVEL_KEYS))
            fix = f"remove {key!r}" + (f"; {hint}" if hint else "")
        yield finding(
            ctx,
            (key,),
            f"unknown option {key!r} for strategy {ctx.dims.strategy!r}: AutoModel raises "
            f"\"Unknown options for strategy '{ctx.dims.strategy}': ['{key}']\"",
            fix,
        )


_SPECIAL_OPTIONS = frozenset(
    {"mp_policy", "offload_policy", "multimodal", "activation_checkpointing_scope", "autocast_dtype"}
)


@rule(
    "option-type",
    family=F,
    severity="error",
    title="Option value of the wrong type",
    cause="AutoModel does not type-check strategy options: a string such as 'no' is truthy and turns a bool "
    "option on; null turns a default-true option off.",
    fix="Give booleans as true/false and numbers as numbers.",
)
def option_type(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy is None:
        return
    model = schema.STRATEGY_OPTIONS[ctx.dims.strategy]
    fields = schema.fields(model)
    for key, value in ctx.block.items():
        if key not in fields or key in _SPECIAL_OPTIONS or value_ok(model, key, value):
            continue
        if isinstance(value, Unresolved):
            continue
        default = fields[key].get_default(call_default_factory=True)
        if value is None and fields[key].annotation is bool:
            if default is True:
                yield finding(
                    ctx,
                    (key,),
                    f"{key}: null is read as false, silently turning off an option that defaults to true",
                    f"{key}: true (or remove the key)",
                )
            else:
                yield finding(
                    ctx,
                    (key,),
                    f"{key}: null is read as false (the default)",
                    f"remove {key} or write {key}: false",
                    severity="warning",
                )
            continue
        truthy = " (a non-empty string is truthy: AutoModel treats it as true)" if isinstance(value, str) else ""
        yield finding(
            ctx,
            (key,),
            f"{key} must be {describe(model, key)}, got {value!r}; AutoModel passes it on unchecked{truthy}",
            f"{key}: {yaml_value(default)} (the default) or a valid value",
        )


def _dtype_problem(value: Any, *, floating: bool = True) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{value!r} is not a dtype name (AutoModel passes it to torch unconverted)"
    name = dtype_name(value)
    if name is None:
        return f"unknown dtype {value!r}: AutoModel's dtype_from_str raises KeyError"
    if floating and name not in FLOAT_DTYPES:
        return f"{value!r} is {name}, not a floating-point dtype"
    return None


@rule(
    "dtype-invalid",
    family=F,
    severity="error",
    title="Unknown or non-float dtype",
    patterns=(r"Unknown dtype string: (\S+)",),
    cause="Dtype strings go through AutoModel's dtype_from_str, which knows float32/float/bfloat16/bf16/"
    "float16/half/float64/... (torch. prefix optional).",
    fix="Use bfloat16, float32 or float16.",
)
def dtype_invalid(ctx: Context) -> Iterator[Finding]:
    places: list[tuple[tuple[Any, ...], Any]] = []
    if "autocast_dtype" in ctx.block:  # converted for every strategy, before the options are checked
        places.append((("autocast_dtype",), ctx.block["autocast_dtype"]))
    pipe = ctx.block.get("pipeline")
    if isinstance(pipe, dict) and "dtype" in pipe:
        places.append((("pipeline", "dtype"), pipe["dtype"]))
    for parts, value in places:
        problem = _dtype_problem(value)
        if problem:
            sev = "warning" if parts[0] == "pipeline" and ctx.dims.pp <= 1 else None
            yield finding(
                ctx,
                parts,
                f"{parts[-1]}: {problem}",
                f"{parts[-1]}: bfloat16 (or float32, float16)",
                severity=sev,
            )


def _policy_findings(
    ctx: Context,
    parts: tuple[Any, ...],
    value: Any,
    *,
    fields: set[str],
    targets: frozenset[str],
    what: str,
    rule_id: str,
    require_target: bool = False,
    severity: Any = None,
) -> Iterator[Finding]:
    """Check an ``mp_policy`` / ``offload_policy`` mapping without ever importing its ``_target_``."""
    if value is None:
        return
    if not isinstance(value, dict):
        yield finding(
            ctx,
            parts,
            f"{ctx.path(*parts)} must be a mapping of {what} fields, got {value!r}; AutoModel passes it "
            "through and FSDP fails when it uses it",
            f"write it as a mapping: {sorted(fields)}",
            severity=severity,
            rule_id=rule_id,
        )
        return
    target = value.get("_target_")
    canonical = f"torch.distributed.fsdp.{what}"
    if target is not None and target not in targets:
        yield finding(
            ctx,
            parts + ("_target_",),
            f"{ctx.path(*parts)}._target_ is {target!r}: AutoModel imports and calls this target; only "
            f"{what} is meaningful here (never imported by this tool)",
            f"_target_: {canonical} (or drop _target_)",
            severity=severity,
            rule_id=rule_id,
        )
    if require_target and target is None:
        yield finding(
            ctx,
            parts,
            f"{ctx.path(*parts)} has no _target_: AutoModel 0.7.0 instantiates moe.mp_policy only from "
            "the _target_ form and otherwise passes the plain dict to the MoE parallelizer",
            "add _target_: torch.distributed.fsdp.MixedPrecisionPolicy",
            severity=severity,
            rule_id=rule_id,
        )
    for key, item in value.items():
        if key == "_target_":
            continue
        since = schema.TORCH_LATER_FIELDS.get(what, {}).get(key)
        if since:
            yield finding(
                ctx,
                parts + (key,),
                f"{what} has {key!r} only from torch {since}: with an older torch AutoModel raises "
                f"TypeError (unexpected keyword argument) when it reads the config",
                f"remove it, unless every node runs torch >= {since}",
                severity=severity,
                rule_id=rule_id,
            )
        elif key not in fields:
            hint = did_you_mean(str(key), fields)
            yield finding(
                ctx,
                parts + (key,),
                f"unknown {what} field {key!r}: AutoModel raises TypeError (unexpected keyword argument)",
                f"remove it{'; ' + hint if hint else ''} (valid: {', '.join(sorted(fields))})",
                severity=severity,
                rule_id=rule_id,
            )
        elif key.endswith("_dtype"):
            problem = _dtype_problem(item)
            if problem:
                yield finding(
                    ctx,
                    parts + (key,),
                    f"{parts[-1]}.{key}: {problem}",
                    f"{key}: bfloat16 (or float32)",
                    severity=severity,
                    rule_id="dtype-invalid",
                )
        elif not isinstance(item, bool):
            yield finding(
                ctx,
                parts + (key,),
                f"{parts[-1]}.{key} must be true or false, got {item!r}",
                f"{key}: false",
                severity=severity,
                rule_id=rule_id,
            )


@rule(
    "mp-policy-invalid",
    family=F,
    severity="error",
    title="mp_policy malformed",
    patterns=(r"MixedPrecisionPolicy.__init__\(\) got an unexpected keyword argument '(\w+)'",),
    cause="mp_policy must map param_dtype/reduce_dtype/output_dtype/cast_forward_inputs (optional _target_: "
    "torch.distributed.fsdp.MixedPrecisionPolicy).",
    fix="mp_policy: {param_dtype: bfloat16, reduce_dtype: float32}",
)
def mp_policy_invalid(ctx: Context) -> Iterator[Finding]:
    if "mp_policy" not in ctx.block:  # coerced for every strategy, before the options are checked
        return
    yield from _policy_findings(
        ctx,
        ("mp_policy",),
        ctx.block["mp_policy"],
        fields=set(schema.fields(schema.MixedPrecisionPolicy)),
        targets=MP_POLICY_TARGETS,
        what="MixedPrecisionPolicy",
        rule_id="mp-policy-invalid",
    )


@rule(
    "offload-policy-invalid",
    family=F,
    severity="error",
    title="offload_policy malformed",
    patterns=(r"CPUOffloadPolicy.__init__\(\) got an unexpected keyword argument",),
    cause="offload_policy must be a mapping of CPUOffloadPolicy fields (pin_memory); a _target_ string there "
    "is imported by AutoModel.",
    fix="offload_policy: {pin_memory: true}",
)
def offload_policy_invalid(ctx: Context) -> Iterator[Finding]:
    if "offload_policy" not in ctx.block:
        return
    yield from _policy_findings(
        ctx,
        ("offload_policy",),
        ctx.block["offload_policy"],
        fields=set(schema.fields(schema.CPUOffloadPolicy)),
        targets=OFFLOAD_TARGETS,
        what="CPUOffloadPolicy",
        rule_id="offload-policy-invalid",
    )


@rule(
    "multimodal-invalid",
    family=F,
    severity="error",
    title="multimodal: malformed",
    patterns=(
        r"distributed\.multimodal\.",
        r"MultimodalDistributedConfig",
        r"MultimodalVisionConfig",
        r"CpVisionFrameShardingConfig",
        r"frame_sharding",
    ),
    cause="multimodal: takes frozen_sharding (root|per_layer|replicate) and vision.frame_sharding settings.",
    fix="Remove multimodal: or use the documented keys.",
)
def multimodal_invalid(ctx: Context) -> Iterator[Finding]:
    if "multimodal" not in ctx.block:
        return
    value = ctx.block["multimodal"]
    if not isinstance(value, dict):
        if ctx.dims.strategy != "fsdp2":
            return  # not coerced; option-unknown reports it
        yield finding(
            ctx,
            ("multimodal",),
            f"multimodal must be a mapping, got {value!r}; AutoModel raises TypeError "
            "('FSDP2Config.multimodal must be a MultimodalDistributedConfig instance')",
            "remove multimodal: (defaults apply) or give a mapping",
        )
        return
    norm = dict(value)
    fs = norm.get("frozen_sharding")
    if isinstance(fs, str):
        norm["frozen_sharding"] = fs.lower().replace("-", "_")
    yield from pydantic_findings(ctx, schema.Multimodal, norm, ("multimodal",), "multimodal-invalid")
    frame = (norm.get("vision") or {}).get("frame_sharding") if isinstance(norm.get("vision"), dict) else None
    if isinstance(frame, dict) and isinstance(frame.get("mesh_dims"), list) and frame["mesh_dims"] != ["cp"]:
        yield finding(
            ctx,
            ("multimodal", "vision", "frame_sharding", "mesh_dims"),
            f'mesh_dims currently supports only ["cp"], got {frame["mesh_dims"]!r}',
            'mesh_dims: ["cp"]',
        )


# =========================================================================== pipeline
def _pipeline(ctx: Context) -> Any:
    return ctx.block.get("pipeline")


@rule(
    "pipeline-ignored",
    family=F,
    severity="warning",
    title="pipeline: with pp_size 1 is ignored",
    patterns=(r"`distributed.pipeline` is set but pp_size=\d+",),
    cause="A pipeline: block only takes effect when pp_size > 1 (AutoModel logs a warning and drops it).",
    fix="Set pp_size > 1, or keep the block on purpose for launch-time overrides.",
)
def pipeline_ignored(ctx: Context) -> Iterator[Finding]:
    if _pipeline(ctx) is not None and ctx.dims.pp <= 1:
        yield finding(
            ctx,
            ("pipeline",),
            f"pipeline: is set but pp_size={ctx.dims.pp}: pipeline parallelism is off and AutoModel ignores the block",
            "set pp_size > 1 to use it, or remove the block",
        )


@rule(
    "pipeline-missing",
    family=F,
    severity="error",
    title="pp_size > 1 without a pipeline: block",
    patterns=(r"enables pipeline parallelism but no `distributed.pipeline` block",),
    cause="pp_size > 1 needs a distributed.pipeline block (an empty `pipeline: {}` selects defaults). A bare "
    "`pipeline:` line is YAML null and counts as missing.",
    fix="Add `pipeline: {pp_schedule: 1f1b, pp_microbatch_size: 1}` (or `pipeline: {}`).",
)
def pipeline_missing(ctx: Context) -> Iterator[Finding]:
    pp = ctx.block.get("pp_size")
    if not (is_positive_int(pp) and pp > 1) or _pipeline(ctx) is not None:
        return
    null = " (`pipeline:` with nothing after it is YAML null)" if "pipeline" in ctx.block else ""
    yield finding(
        ctx,
        ("pipeline",) if "pipeline" in ctx.block else ("pp_size",),
        f"pp_size={pp} enables pipeline parallelism but there is no distributed.pipeline block{null}; "
        "AutoModel raises ValueError",
        "add `pipeline: {pp_schedule: 1f1b, pp_microbatch_size: 1}` (an empty `pipeline: {}` selects the defaults)",
    )


_PIPELINE_DEDICATED = frozenset({"pp_schedule", "pp_microbatch_size", "pp_recv_buffer_pool_slack", "dtype"})
# Keys the recipe overwrites before the pipeline is built (train_ft / vlm finetune): their values never matter,
# so they are not type-checked (a *_fn string is still checked as an import path by the loader).
_PIPELINE_OVERWRITTEN = {
    "pp_batch_size": "step_scheduler.local_batch_size",
    "loss_fn": "the recipe's loss_fn",
    "patch_stage_backward_maybe_with_nosync": "model.backend.enable_fsdp_optimizations",
}
_PIPELINE_UNTYPED = _PIPELINE_DEDICATED | frozenset(_PIPELINE_OVERWRITTEN)


def _pipeline_severity(ctx: Context) -> Any:
    return "warning" if ctx.dims.pp <= 1 else None


def _pipeline_note(ctx: Context) -> str:
    return " (ignored now since pp_size=1, an error once pp_size > 1)" if ctx.dims.pp <= 1 else ""


@rule(
    "pipeline-invalid",
    family=F,
    severity="error",
    title="pipeline: has unknown keys or bad values",
    patterns=(
        r"PipelineConfig.__init__\(\) got an unexpected keyword argument '(\w+)'",
        r"PipelineConfig\(\) argument after \*\* must be a mapping",
        r"object has no attribute 'copy'",
    ),
    cause="pipeline: keys go to PipelineConfig(**pipeline); an unknown key raises TypeError.",
    fix="Use the PipelineConfig keys (pp_schedule, pp_microbatch_size, layers_per_stage, ...).",
)
def pipeline_invalid(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if pipe is None:
        return
    sev = _pipeline_severity(ctx)
    if not isinstance(pipe, dict):
        yield finding(
            ctx,
            ("pipeline",),
            f"pipeline must be a mapping, got {pipe!r}{_pipeline_note(ctx)}",
            "pipeline: {pp_schedule: 1f1b, pp_microbatch_size: 1}",
            severity=sev,
        )
        return
    yield from pydantic_findings(
        ctx,
        schema.PipelineConfig,
        pipe,
        ("pipeline",),
        "pipeline-invalid",
        severity=sev,
        skip=_PIPELINE_UNTYPED,
        note=_pipeline_note(ctx),
    )


@rule(
    "pipeline-recv-slack",
    family=F,
    severity="error",
    title="pp_recv_buffer_pool_slack not an integer >= 0",
    patterns=(
        r"pp_recv_buffer_pool_slack must be >= 0",
        r"'<' not supported between instances of '(?:NoneType|str|list|dict)' and 'int'",
    ),
    cause="PipelineConfig rejects a negative pp_recv_buffer_pool_slack and fails (TypeError) on null, a string or "
    "a list; true is read as 1 and a fraction breaks the recv ring size.",
    fix="pp_recv_buffer_pool_slack: 2",
)
def pipeline_recv_slack(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if not isinstance(pipe, dict) or "pp_recv_buffer_pool_slack" not in pipe:
        return
    v = pipe["pp_recv_buffer_pool_slack"]
    if is_nonneg_int(v):
        return
    yield finding(
        ctx,
        ("pipeline", "pp_recv_buffer_pool_slack"),
        f"pp_recv_buffer_pool_slack must be an integer >= 0, got {v!r}{_pipeline_note(ctx)}",
        "pp_recv_buffer_pool_slack: 2 (the default)",
        severity=_pipeline_severity(ctx),
    )


@rule(
    "pp-schedule-unknown",
    family=F,
    severity="error",
    title="pp_schedule torch does not know",
    patterns=(r"Unknown schedule name '([^']*)'",),
    cause="pp_schedule goes to torch's get_schedule_class (case-insensitive): 1F1B, GPipe, Interleaved1F1B, "
    "LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV. AutoModel's own docstring lists "
    "'interleaved_1f1b', 'looped_bfs', 'dfs', 'v_schedule', 'zero_bubble', which torch rejects.",
    fix="pp_schedule: 1f1b (single stage per rank) or interleaved1f1b (multi-stage).",
)
def pp_schedule_unknown(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if not isinstance(pipe, dict) or "pp_schedule" not in pipe:
        return
    raw = pipe["pp_schedule"]
    sev = _pipeline_severity(ctx)
    valid = ", ".join(RUNNABLE_SCHEDULES)
    if raw is None:
        if pipe.get("pp_schedule_csv"):
            yield finding(
                ctx,
                ("pipeline", "pp_schedule"),
                "pp_schedule is null: AutoModel still calls get_schedule_class(pp_schedule) to split the "
                "model even with pp_schedule_csv, and fails (AttributeError)",
                "pp_schedule: 1f1b (or the multi-stage schedule matching the CSV)",
                severity=sev,
            )
        else:
            yield finding(
                ctx,
                ("pipeline", "pp_schedule"),
                f"pp_schedule is null and no pp_schedule_csv is given{_pipeline_note(ctx)}",
                "pp_schedule: 1f1b",
                severity=sev,
            )
        return
    if not isinstance(raw, str):
        yield finding(
            ctx,
            ("pipeline", "pp_schedule"),
            f"pp_schedule must be a schedule name, got {raw!r}",
            "pp_schedule: 1f1b",
            severity=sev,
        )
        return
    cls = SCHEDULES.get(raw.lower())
    if cls is not None and cls in RUNNABLE_SCHEDULES:
        return
    if cls is not None:  # abstract base classes get_schedule_class also returns
        yield finding(
            ctx,
            ("pipeline", "pp_schedule"),
            f"pp_schedule {raw!r} names torch's abstract base class {cls}, not a runnable schedule "
            "(it is only meaningful with pp_schedule_csv)",
            f"use one of {valid}",
            severity=sev,
        )
        return
    hint = SCHEDULE_HINTS.get(raw.lower().replace(" ", "")) or closest(raw.lower(), list(SCHEDULES))
    hint_name = SCHEDULES.get(hint, hint) if hint else None
    doc = " (a spelling from older docs / AutoModel's docstring)" if raw.lower() in SCHEDULE_HINTS else ""
    yield finding(
        ctx,
        ("pipeline", "pp_schedule"),
        f"pp_schedule {raw!r} is not a schedule torch's get_schedule_class knows{doc}: AutoModel fails "
        f'with "Unknown schedule name"; valid (case-insensitive): {valid}',
        f"pp_schedule: {hint.lower() if hint else '1f1b'}"
        + (f" ({hint_name})" if hint_name and hint_name.lower() != (hint or "").lower() else ""),
        severity=sev,
    )


@rule(
    "pp-microbatch-invalid",
    family=F,
    severity="error",
    title="pp_microbatch_size < 1",
    patterns=(r"integer division or modulo by zero",),
    cause="pp_microbatch_size must be a positive integer; 0 divides by zero in the schedule build, negative "
    "values give a negative microbatch count.",
    fix="pp_microbatch_size: 1",
)
def pp_microbatch_invalid(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if not isinstance(pipe, dict) or "pp_microbatch_size" not in pipe:
        return
    v = pipe["pp_microbatch_size"]
    if is_positive_int(v):
        return
    yield finding(
        ctx,
        ("pipeline", "pp_microbatch_size"),
        f"pp_microbatch_size must be a positive integer, got {v!r}; AutoModel does not check it and the "
        f"pipeline schedule build fails (division by zero / negative microbatch count){_pipeline_note(ctx)}",
        "pp_microbatch_size: 1",
        severity=_pipeline_severity(ctx),
    )


def _activation_dtype(ctx: Context) -> str | None:
    """The FSDP activation dtype AutoModel derives pipeline.dtype from (mp_policy output or param dtype)."""
    if ctx.dims.strategy != "fsdp2":
        return None
    mp = ctx.block.get("mp_policy")
    if mp is None:
        return "bfloat16"
    if not isinstance(mp, dict):
        return None
    for key in ("output_dtype", "param_dtype"):
        v = mp.get(key)
        if isinstance(v, str) and dtype_name(v):
            return dtype_name(v)
    return None


@rule(
    "pipeline-dtype-mismatch",
    family=F,
    severity="warning",
    title="pipeline.dtype differs from mp_policy's",
    patterns=(r"pipeline\.dtype=\S+ does not match the FSDP activation dtype",),
    cause="Tensors crossing stages have the FSDP activation dtype; a different pipeline.dtype can corrupt "
    "stage shape inference and recv buffers.",
    fix="Remove pipeline.dtype; AutoModel derives it from mp_policy.",
)
def pipeline_dtype_mismatch(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if ctx.dims.pp <= 1 or not isinstance(pipe, dict) or not isinstance(pipe.get("dtype"), str):
        return
    chosen, act = dtype_name(pipe["dtype"]), _activation_dtype(ctx)
    if chosen and act and chosen != act:
        yield finding(
            ctx,
            ("pipeline", "dtype"),
            f"pipeline.dtype={chosen} does not match the FSDP activation dtype {act} (mp_policy) used for "
            "inter-stage communication; this can corrupt pipeline stage shape inference",
            "remove pipeline.dtype (AutoModel derives it from mp_policy)",
        )


@rule(
    "pipeline-overwritten",
    family=F,
    severity="info",
    title="pipeline: keys the recipe overwrites",
    cause="The recipe sets pp_batch_size from step_scheduler.local_batch_size, loss_fn from the recipe's loss_fn "
    "and patch_stage_backward_maybe_with_nosync from model.backend.enable_fsdp_optimizations.",
    fix="Set these in their recipe sections instead.",
)
def pipeline_overwritten(ctx: Context) -> Iterator[Finding]:
    pipe = _pipeline(ctx)
    if not isinstance(pipe, dict) or ctx.dims.pp <= 1:
        return
    for key, src in _PIPELINE_OVERWRITTEN.items():
        if key in pipe:
            yield finding(
                ctx,
                ("pipeline", key),
                f"pipeline.{key} is overwritten at runtime by {src}",
                f"remove pipeline.{key}",
            )
    if pipe.get("pp_schedule_csv"):
        yield finding(
            ctx,
            ("pipeline", "pp_schedule_csv"),
            f"the schedule comes from the CSV {pipe['pp_schedule_csv']!r} (it must exist on every node)",
            None,
        )


@rule(
    "pp-schedule-dualpipev",
    family=F,
    severity="warning",
    title="DualPipeV with AutoModel's stage placement",
    cause="AutoModel 0.7.0 places stages V-style only for ZBVZeroBubble; DualPipeV gets loop placement while "
    "torch's DualPipeV routes stages V-style, so stage peers disagree.",
    fix="Use ZBVZeroBubble (V-style) or Interleaved1F1B.",
)
def pp_schedule_dualpipev(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.pp_schedule == "DualPipeV" and ctx.dims.pp > 1:
        yield finding(
            ctx,
            ("pipeline", "pp_schedule"),
            "AutoModel 0.7.0 assigns pipeline stages loop-style for DualPipeV (stages r and r+pp on rank r) "
            "but torch's DualPipeV expects V-style placement (r and 2*pp-1-r): stage-to-rank maps disagree "
            "and the run is expected to hang or fail at the first step",
            "pp_schedule: zbvzerobubble (V-style, placed correctly) or interleaved1f1b",
        )


# =========================================================================== moe
@rule(
    "moe-ignored",
    family=F,
    severity="warning",
    title="moe: with ep_size 1 is dropped",
    cause="AutoModel silently drops the moe: block unless ep_size > 1.",
    fix="Set ep_size > 1 or remove moe:.",
)
def moe_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.block.get("moe") is not None and ctx.dims.ep <= 1:
        yield finding(
            ctx,
            ("moe",),
            f"moe: is set but ep_size={ctx.dims.ep}: AutoModel silently drops the block",
            "set ep_size > 1 to use it, or remove moe:",
        )


@rule(
    "moe-invalid",
    family=F,
    severity="error",
    title="moe: has unknown keys or bad values",
    patterns=(
        r"MoEParallelizerConfig.__init__\(\) got an unexpected keyword argument '(\w+)'",
        r"MoEParallelizerConfig\(\) argument after \*\* must be a mapping",
    ),
    cause="moe: keys go to MoEParallelizerConfig(**moe): ignore_router_for_ac, reshard_after_forward, "
    "lm_head_precision, wrap_outer_model, mp_policy.",
    fix="Use the MoEParallelizerConfig keys.",
)
def moe_invalid(ctx: Context) -> Iterator[Finding]:
    moe = ctx.block.get("moe")
    if moe is None:
        return
    sev = "warning" if ctx.dims.ep <= 1 else None
    if not isinstance(moe, dict):
        yield finding(ctx, ("moe",), f"moe must be a mapping, got {moe!r}", "moe: {} (or remove it)", severity=sev)
        return
    yield from pydantic_findings(
        ctx,
        schema.MoEConfig,
        moe,
        ("moe",),
        "moe-invalid",
        severity=sev,
        skip=frozenset({"mp_policy", "lm_head_precision"}),
    )
    if moe.get("mp_policy") is not None:
        yield from _policy_findings(
            ctx,
            ("moe", "mp_policy"),
            moe["mp_policy"],
            fields=set(schema.fields(schema.MixedPrecisionPolicy)),
            targets=MP_POLICY_TARGETS,
            what="MixedPrecisionPolicy",
            rule_id="moe-invalid",
            require_target=True,
            severity=sev,
        )
    lm = moe.get("lm_head_precision")
    problem = _dtype_problem(lm)
    if problem:
        yield finding(
            ctx,
            ("moe", "lm_head_precision"),
            f"moe.lm_head_precision: {problem}",
            "lm_head_precision: float32",
            severity=sev,
            rule_id="dtype-invalid",
        )


@rule(
    "moe-ac-router",
    family=F,
    severity="warning",
    title="MoE router recomputed under activation checkpointing",
    cause="With activation checkpointing and ignore_router_for_ac: false, the MoE router's top-k is recomputed in "
    "backward and can pick a different token count per expert, which raises CheckpointError.",
    fix="Keep moe.ignore_router_for_ac: true (the default).",
)
def moe_ac_router(ctx: Context) -> Iterator[Finding]:
    moe = ctx.block.get("moe")
    if (
        ctx.dims.activation_checkpointing
        and ctx.dims.ep > 1
        and isinstance(moe, dict)
        and moe.get("ignore_router_for_ac") is False
    ):
        yield finding(
            ctx,
            ("moe", "ignore_router_for_ac"),
            "ignore_router_for_ac: false with activation checkpointing recomputes the router in backward; "
            "tied top-k picks can route a different number of tokens per expert and torch.utils.checkpoint "
            "raises CheckpointError",
            "ignore_router_for_ac: true (the default)",
        )


# =========================================================================== mesh sizes
_FEATURES = {
    "tp_size": "tensor parallelism",
    "pp_size": "pipeline parallelism",
    "cp_size": "context parallelism",
    "ep_size": "expert parallelism",
}


@rule(
    "strategy-unsupported",
    family=F,
    severity="error",
    title="Parallelism the strategy cannot do",
    patterns=(
        r"(megatron_fsdp|ddp) does not support (tensor|pipeline|context|expert) parallelism",
        r"MegatronFSDPConfig is not supported when pipeline parallelism is enabled",
    ),
    cause="megatron_fsdp has no pp or ep; ddp has no tp, pp, cp or ep (AutoModel 0.7.0 mesh_utils).",
    fix="Use strategy: fsdp2 for tp/pp/cp/ep, or set the size to 1.",
)
def strategy_unsupported(ctx: Context) -> Iterator[Finding]:
    banned = {"megatron_fsdp": ("pp_size", "ep_size"), "ddp": ("tp_size", "pp_size", "cp_size", "ep_size")}
    for key in banned.get(ctx.dims.strategy or "", ()):
        if ctx.dims.degree(key) > 1:
            yield finding(
                ctx,
                (key,),
                f"{ctx.dims.strategy} does not support {_FEATURES[key]} ({key}={ctx.dims.degree(key)})",
                f"set {key}: 1, or use strategy: fsdp2 which supports it",
            )


@rule(
    "dp-replicate-strategy",
    family=F,
    severity="error",
    title="dp_replicate_size with a non-FSDP2 strategy",
    patterns=(r"dp_replicate_size is only supported with FSDP2Config",),
    cause="HSDP (dp_replicate_size > 1) exists only for fsdp2.",
    fix="Remove dp_replicate_size or use fsdp2.",
)
def dp_replicate_strategy(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy in ("megatron_fsdp", "ddp") and ctx.dims.dp_replicate > 1:
        yield finding(
            ctx,
            ("dp_replicate_size",),
            f"dp_replicate_size={ctx.dims.dp_replicate} (HSDP) is only supported with fsdp2, not {ctx.dims.strategy}",
            "remove dp_replicate_size, or use strategy: fsdp2",
        )


def _mesh_strategy(ctx: Context) -> bool:
    return ctx.dims.strategy in ("fsdp2", "megatron_fsdp")


def _world_options(world: int, factor: int) -> str:
    lower = (world // factor) * factor
    opts = sorted({x for x in (lower, lower + factor) if x > 0})
    return " or ".join(str(x) for x in opts)


@rule(
    "world-not-divisible",
    family=F,
    severity="error",
    title="World size not divisible by tp*cp*pp",
    patterns=(r"world_size \((\d+)\) must be divisible by \(tp_size \* cp_size(?: \* pp_size)?\)",),
    cause="With dp_size unset, dp = world_size // (tp*cp*pp) (tp*cp for megatron_fsdp), which must divide.",
    fix="Pick sizes whose product divides the world size, or change the number of GPUs.",
)
def world_not_divisible(ctx: Context) -> Iterator[Finding]:
    if not _mesh_strategy(ctx) or ctx.dims.world_size is None or ctx.dims.dp_size is not None:
        return
    tp, cp, pp = ctx.dims.tp, ctx.dims.cp, ctx.dims.pp
    factor = non_dp_factor(ctx.dims.strategy or "fsdp2", tp=tp, cp=cp, pp=pp)
    if ctx.dims.world_size % factor == 0:
        return
    if ctx.dims.strategy == "fsdp2":
        expr, nums = "tp_size * cp_size * pp_size", f"{tp} * {cp} * {pp}"
    else:
        expr, nums = "tp_size * cp_size", f"{tp} * {cp}"
    keys = [
        k
        for k in ("tp_size", "cp_size", "pp_size")
        if ctx.dims.degree(k) > 1 and (k != "pp_size" or ctx.dims.strategy == "fsdp2")
    ]
    at = (keys[0],) if keys else ()
    yield finding(
        ctx,
        at,
        f"world_size ({ctx.dims.world_size}) must be divisible by ({expr}) ({nums} = {factor})",
        _factor_fix(ctx.dims.world_size, factor, tp),
    )


def _factor_fix(world: int, factor: int, tp: int) -> str:
    """How to make the non-dp factor (tp*cp*pp) divide the world: another world size, or a tp_size."""
    fix = f"use a world size that is a multiple of {factor} (e.g. {_world_options(world, factor)})"
    rest = factor // tp
    if tp > 1 and world % rest == 0:
        fix += f", or tp_size in {fmt_set(divisors(world // rest, 64))}"
    return fix


def _mesh_product(ctx: Context) -> int | None:
    dp = ctx.dims.dp_size
    if dp is None or not _mesh_strategy(ctx):
        return None
    factor = non_dp_factor(ctx.dims.strategy or "fsdp2", tp=ctx.dims.tp, cp=ctx.dims.cp, pp=ctx.dims.pp)
    return dp * factor


@rule(
    "dp-size-exceeds-world",
    family=F,
    severity="error",
    title="Explicit dp_size makes the mesh too big",
    patterns=(r"Mesh should not be bigger than default world size (\d+), but found (\d+) ranks",),
    cause="An explicit dp_size is not cross-checked by AutoModel; dp*tp*cp*pp above the world size fails in "
    "torch's mesh build.",
    fix="Remove dp_size (AutoModel infers it) or make dp*tp*cp*pp equal the world size.",
)
def dp_size_exceeds_world(ctx: Context) -> Iterator[Finding]:
    mesh = _mesh_product(ctx)
    if mesh is None or ctx.dims.world_size is None or mesh <= ctx.dims.world_size:
        return
    factor = mesh // (ctx.dims.dp_size or 1)
    good = ctx.dims.world_size // factor if ctx.dims.world_size % factor == 0 else None
    yield finding(
        ctx,
        ("dp_size",),
        f"dp_size={ctx.dims.dp_size} gives a mesh of {mesh} ranks (dp*tp*cp*pp), more than "
        f"world_size={ctx.dims.world_size}: torch fails with 'Mesh should not be bigger than default world size'",
        f"dp_size: {good} (or remove it)"
        if good
        else f"remove dp_size, and {_factor_fix(ctx.dims.world_size, factor, ctx.dims.tp)}",
    )


@rule(
    "dp-size-leaves-ranks",
    family=F,
    severity="warning",
    title="Explicit dp_size leaves ranks outside the mesh",
    patterns=(
        r"needs to either have all its original dimensions \(e\.g\., no slicing\) or it needs to contain "
        r"the local rank",
    ),
    cause="dp*tp*cp*pp smaller than the world leaves the last ranks outside the device mesh; with the standard "
    "recipes those ranks fail in the mesh build.",
    fix="Remove dp_size or make dp*tp*cp*pp equal the world size.",
)
def dp_size_leaves_ranks(ctx: Context) -> Iterator[Finding]:
    mesh = _mesh_product(ctx)
    if mesh is None or ctx.dims.world_size is None or mesh >= ctx.dims.world_size:
        return
    factor = mesh // (ctx.dims.dp_size or 1)
    good = ctx.dims.world_size // factor if ctx.dims.world_size % factor == 0 else None
    yield finding(
        ctx,
        ("dp_size",),
        f"dp_size={ctx.dims.dp_size} gives a mesh of {mesh} ranks but world_size={ctx.dims.world_size}: "
        f"ranks {mesh}..{ctx.dims.world_size - 1} are outside the mesh; on torch 2.13 AutoModel's mesh build "
        "fails on those ranks ('needs to contain the local rank') unless they are deliberately idle",
        f"dp_size: {good} (or remove it)" if good else "remove dp_size",
    )


@rule(
    "dp-replicate-not-multiple",
    family=F,
    severity="error",
    title="dp not a multiple of dp_replicate_size",
    patterns=(r"dp_size must be a multiple of dp_replicate_size",),
    cause="HSDP splits dp into dp_replicate x dp_shard.",
    fix="Pick dp_replicate_size dividing dp.",
)
def dp_replicate_not_multiple(ctx: Context) -> Iterator[Finding]:
    rep = ctx.dims.dp_replicate
    if ctx.dims.strategy != "fsdp2" or ctx.dims.dp is None or rep <= 1 or ctx.dims.dp % rep == 0:
        return
    ok = [d for d in divisors(ctx.dims.dp) if d < ctx.dims.dp][-4:]
    yield finding(
        ctx,
        ("dp_replicate_size",),
        f"dp_size ({ctx.dims.dp}) must be a multiple of dp_replicate_size ({rep})",
        f"dp_replicate_size in {fmt_set(ok)}" if ok else "remove dp_replicate_size",
    )


@rule(
    "dp-replicate-too-large",
    family=F,
    severity="error",
    title="dp_replicate_size >= dp",
    patterns=(r"dp_replicate_size=(\d+) must be less than dp_size=(\d+)",),
    cause="dp_replicate == dp would mean pure replication (DDP), which FSDP2's HSDP path does not support.",
    fix="Use a smaller dp_replicate_size, or strategy: ddp for pure replication.",
)
def dp_replicate_too_large(ctx: Context) -> Iterator[Finding]:
    rep = ctx.dims.dp_replicate
    if ctx.dims.strategy != "fsdp2" or ctx.dims.dp is None or rep <= 1 or rep < ctx.dims.dp or ctx.dims.dp % rep:
        return
    ok = [d for d in divisors(ctx.dims.dp) if d < ctx.dims.dp][-4:]
    yield finding(
        ctx,
        ("dp_replicate_size",),
        f"dp_replicate_size={rep} must be less than dp_size={ctx.dims.dp} (DDP-style pure replication is not "
        "supported by FSDP2)",
        f"dp_replicate_size in {fmt_set(ok)} or strategy: ddp" if ok else "strategy: ddp",
    )


@rule(
    "ep-not-divisible",
    family=F,
    severity="error",
    title="ep_size does not divide dp*cp*tp",
    patterns=(r"non_pp_size=(\d+) must be a multiple of ep_size=(\d+)",),
    cause="AutoModel 0.7.0 requires (dp*cp*tp) % ep == 0 (older docs say dp*cp: the code uses dp*cp*tp); "
    "ep_shard = dp*cp*tp // ep.",
    fix="Pick ep_size dividing dp*cp*tp.",
)
def ep_not_divisible(ctx: Context) -> Iterator[Finding]:
    ep = ctx.dims.ep
    if ctx.dims.strategy != "fsdp2" or ep <= 1 or ctx.dims.dp is None:
        return
    non_pp = ctx.dims.dp * ctx.dims.cp * ctx.dims.tp
    if non_pp % ep == 0:
        return
    ok = [d for d in divisors(non_pp) if d > 1][-6:]
    yield finding(
        ctx,
        ("ep_size",),
        f"non_pp_size={non_pp} (dp*cp*tp = {ctx.dims.dp}*{ctx.dims.cp}*{ctx.dims.tp}) must be a "
        f"multiple of ep_size={ep} (the 0.7.0 code requires dp*cp*tp, not dp*cp as older docs say)",
        f"ep_size in {fmt_set(ok)}" if ok else "ep_size: 1",
    )


@rule(
    "world-size-missing",
    family=F,
    severity="info",
    title="World size unknown",
    cause="Without world_size (or nodes x gpus_per_node, or a ci: block) the checks that depend on dp are skipped.",
    fix="Pass --world-size N or --nodes/--gpus-per-node.",
)
def world_size_missing(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.world_size is None and ctx.dims.strategy in ("fsdp2", "megatron_fsdp"):
        fix = "pass world_size (or nodes and gpus_per_node)"
        why = ""
        if ctx.gpus_per_node or ctx.nodes:
            half = "gpus_per_node without nodes" if ctx.gpus_per_node else "nodes without gpus_per_node"
            why = f" ({half} gives no world size, and the recipe has no ci: block to complete it)"
        yield finding(
            ctx,
            (),
            f"world_size not given{why}: the checks that need dp (world divisibility, HSDP, EP, batch sizes, "
            "node placement) were skipped",
            fix,
        )


# Registered here so they exist in the table for explain_error even though other layers emit them.
__all__ = ["HYDRA_KEYS"]
