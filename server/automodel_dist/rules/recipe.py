"""Recipe-level rules: checks that combine distributed: with other recipe sections
(step_scheduler, packed_sequence, dataset). They run only when those sections exist."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import kinds
from ..config.kinds import NO_PP_RECIPES, RECIPE_CLASSES, TRAIN_FT_RECIPES
from ..config.load import clip
from ..config.values import is_positive_int
from ..report import Finding
from .base import Context, finding, rule
from .helpers import closest

F = "recipe"


def _lbs(ctx: Context) -> tuple[object, bool]:
    """step_scheduler.local_batch_size (recipe default 1) and whether the section exists."""
    if not isinstance(ctx.recipe_get("step_scheduler"), dict):
        return None, False
    return ctx.recipe_get("step_scheduler.local_batch_size", 1), True


def _mbs(ctx: Context) -> int | None:
    pipe = ctx.block.get("pipeline")
    if not isinstance(pipe, dict):
        return 1
    v = pipe.get("pp_microbatch_size", 1)
    return v if is_positive_int(v) else None


@rule(
    "batch-size-invalid",
    family=F,
    severity="error",
    title="Batch size not a positive integer",
    patterns=(r"(global|local)_batch_size must be greater than 0",),
    cause="step_scheduler.global_batch_size and local_batch_size must be positive integers.",
    fix="Give positive integers.",
)
def batch_size_invalid(ctx: Context) -> Iterator[Finding]:
    if not isinstance(ctx.recipe_get("step_scheduler"), dict):
        return
    for key in ("global_batch_size", "local_batch_size"):
        v = ctx.recipe_get(f"step_scheduler.{key}")
        if v is not None and not is_positive_int(v):
            yield finding(
                ctx,
                (),
                f"step_scheduler.{key} must be a positive integer, got {v!r}",
                f"{key}: 1",
                recipe_path=f"step_scheduler.{key}",
            )


def _nmb_requirements(schedule: str | None, pp: int, nmb: int) -> str | None:
    """torch schedule constraints on the microbatch count (2.13)."""
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, nmb // pp)
        if nmb % rounds:
            return (
                f"{schedule} needs the number of microbatches ({nmb}) to be a multiple of the number of rounds "
                f"({rounds} = max(1, {nmb} // pp_size {pp}))"
            )
    if schedule == "DualPipeV" and nmb < 2 * pp:
        return f"DualPipeV needs at least as many microbatches as stages ({2 * pp}), got {nmb}"
    return None


def _batch_ok(lbs: int, mbs: int, pp: int, schedule: str | None) -> bool:
    """local_batch_size and pp_microbatch_size the recipe and torch's schedule both accept."""
    return lbs % mbs == 0 and lbs // mbs >= pp and _nmb_requirements(schedule, pp, lbs // mbs) is None


def _batch_fix(lbs: int, mbs: int, pp: int, schedule: str | None) -> str:
    """The nearest local_batch_size values below and above ``lbs`` that work with ``mbs``, and the
    pp_microbatch_size nearest ``mbs`` that works with ``lbs`` (each checked with :func:`_batch_ok`)."""
    reach = min(4 * pp, 1000)  # bounded scan of microbatch counts; multiples of 2 * pp always qualify
    counts = range(max(pp, lbs // mbs - reach), lbs // mbs + reach + 1)
    ok = [n * mbs for n in counts if _batch_ok(n * mbs, mbs, pp, schedule)]
    sizes = [b for b in ok if b < lbs][-1:] + (
        [b for b in ok if b > lbs][:1] or [2 * pp * mbs * (lbs // (2 * pp * mbs) + 1)]
    )
    fix = f"local_batch_size: {' or '.join(map(str, sizes))} (with pp_microbatch_size={mbs})"
    micro = [m for m in range(1, min(lbs, 4096) + 1) if m != mbs and _batch_ok(lbs, m, pp, schedule)]
    if micro:
        fix += f", or pp_microbatch_size: {min(micro, key=lambda m: (abs(m - mbs), -m))} (with local_batch_size={lbs})"
    return fix


@rule(
    "pp-batch-divisibility",
    family=F,
    severity="error",
    title="local_batch_size not divisible by pp_microbatch_size",
    patterns=(
        r"Batch size (\d+) must be divisible by number of microbatches",
        r"local_batch_size must be divisible by microbatch_size",
    ),
    cause="With pp_size > 1 the local batch is cut into local_batch_size // pp_microbatch_size microbatches.",
    fix="Make step_scheduler.local_batch_size a multiple of pipeline.pp_microbatch_size.",
)
def pp_batch_divisibility(ctx: Context) -> Iterator[Finding]:
    lbs, present = _lbs(ctx)
    mbs = _mbs(ctx)
    pp = ctx.dims.pp
    if not present or pp <= 1 or mbs is None or not is_positive_int(lbs):
        return
    if lbs % mbs:
        yield finding(
            ctx,
            ("pipeline", "pp_microbatch_size"),
            f"step_scheduler.local_batch_size={lbs} is not divisible by pipeline.pp_microbatch_size={mbs}: "
            "AutoModel's pipeline schedule build raises ValueError",
            _batch_fix(lbs, mbs, pp, ctx.dims.pp_schedule),
        )


@rule(
    "pp-microbatches",
    family=F,
    severity="error",
    title="Too few pipeline microbatches",
    patterns=(
        r"pp_batch_size (\d+) // pp_microbatch_size (\d+) must be >= pp_size (\d+)",
        r"requires the number of microbatches to be a multiple of the number of rounds",
        r"DualPipeV requires at least as many microbatches as stages",
    ),
    cause="The recipe asserts local_batch_size // pp_microbatch_size >= pp_size; interleaved schedules also "
    "need the microbatch count to be a multiple of max(1, n // pp_size).",
    fix="Raise step_scheduler.local_batch_size or lower pipeline.pp_microbatch_size.",
)
def pp_microbatches(ctx: Context) -> Iterator[Finding]:
    lbs, present = _lbs(ctx)
    mbs = _mbs(ctx)
    pp = ctx.dims.pp
    if not present or pp <= 1 or mbs is None or not is_positive_int(lbs) or lbs % mbs:
        return
    nmb = lbs // mbs
    if nmb < pp:
        problem = (
            f"local_batch_size {lbs} // pp_microbatch_size {mbs} = {nmb} microbatches, fewer than "
            f"pp_size={pp}: the recipe's assertion fails"
        )
    elif (problem := _nmb_requirements(ctx.dims.pp_schedule, pp, nmb)) is not None:
        problem += ": torch raises ValueError when building the schedule"
    else:
        return
    yield finding(
        ctx,
        (),
        problem,
        _batch_fix(lbs, mbs, pp, ctx.dims.pp_schedule),
        recipe_path="step_scheduler.local_batch_size",
    )


@rule(
    "global-batch-divisibility",
    family=F,
    severity="error",
    title="global_batch_size not divisible by local_batch_size * dp",
    patterns=(r"global_batch_size \((\d+)\) must be divisible by local_batch_size \* dp_size",),
    cause="StepScheduler needs global_batch_size % (local_batch_size * dp) == 0 (grad accumulation steps).",
    fix="Make global_batch_size a multiple of local_batch_size * dp.",
)
def global_batch_divisibility(ctx: Context) -> Iterator[Finding]:
    if not isinstance(ctx.recipe_get("step_scheduler"), dict) or ctx.dims.dp is None:
        return
    gbs = ctx.recipe_get("step_scheduler.global_batch_size", 32)
    lbs = ctx.recipe_get("step_scheduler.local_batch_size", 1)
    if not (is_positive_int(gbs) and is_positive_int(lbs)):
        return
    per_step = lbs * ctx.dims.dp
    if gbs % per_step:
        lower = max(per_step, gbs - gbs % per_step)
        yield finding(
            ctx,
            (),
            f"global_batch_size ({gbs}) must be divisible by local_batch_size * dp_size ({lbs} * {ctx.dims.dp} = "
            f"{per_step}): StepScheduler raises ValueError",
            f"global_batch_size: {lower} or {lower + per_step}",
            recipe_path="step_scheduler.global_batch_size",
        )


_SEQ_LENGTHS = ("packed_sequence.packed_sequence_size",) + tuple(
    f"{section}.{key}"
    for section in ("dataset", "validation_dataset")
    for key in ("seq_len", "seq_length", "max_length")
)
_SEQ_SECTIONS = frozenset(d.split(".", 1)[0] for d in _SEQ_LENGTHS)


@rule(
    "cp-seq-divisibility",
    family=F,
    severity="error",
    title="Sequence length not divisible by 2*cp_size",
    patterns=(
        r"must be divisible by 2 \* cp_size",
        r"CP sequence length (\d+) must be divisible by (\d+)",
        r"CP sequence length must be divisible by cp_size after padding",
        r"padded_seq_len must be divisible by cp_size",
        r"requires seq_length \((\d+)\) divisible by (?:2\*)?cp_size",
    ),
    cause="Load-balanced context parallelism cuts each sequence into 2*cp_size chunks (head-tail pairing).",
    fix="Make packed_sequence_size / seq_len multiples of 2*cp_size.",
)
def cp_seq_divisibility(ctx: Context) -> Iterator[Finding]:
    cp = ctx.dims.cp
    if cp <= 1 or ctx.recipe is None or _SEQ_SECTIONS.isdisjoint(ctx.recipe):
        return
    need = 2 * cp
    for dotted in _SEQ_LENGTHS:
        v = ctx.recipe_get(dotted)
        if not is_positive_int(v) or v % need == 0:
            continue
        yield finding(
            ctx,
            (),
            f"{dotted}={v} is not divisible by 2*cp_size={need}: load-balanced context parallelism splits "
            f"each sequence into {need} chunks",
            f"{dotted.rsplit('.', 1)[-1]}: {v + (-v) % need}",
            recipe_path=dotted,
        )


# --------------------------------------------------------------------------- recipe class
def recipe_class(ctx: Context) -> tuple[str | None, str, bool]:
    """The recipe's class name, the YAML path it is given at, and whether it is a bare name (see config.kinds)."""
    return kinds.recipe_class(ctx.recipe)


@rule(
    "recipe-unknown",
    family=F,
    severity="error",
    title="recipe: names no AutoModel 0.7.0 recipe class",
    patterns=(r"Unknown recipe class '([^']*)'",),
    cause="AutoModel's CLI resolves a bare `recipe:` name among its recipe classes and exits when none matches.",
    fix="Use a recipe class name, e.g. TrainFinetuneRecipeForNextTokenPrediction.",
    section="recipe",
)
def recipe_unknown(ctx: Context) -> Iterator[Finding]:
    name, where, bare = recipe_class(ctx)  # dotted paths import on the cluster (the loader checks their form)
    if bare and name not in RECIPE_CLASSES:
        hit = closest(name, RECIPE_CLASSES)
        yield finding(
            ctx,
            (),
            f"recipe: {clip(name, 80)!r} is not a recipe class of AutoModel 0.7.0: "
            "its CLI stops with 'Unknown recipe class'",
            f"recipe: {hit or 'TrainFinetuneRecipeForNextTokenPrediction'}",
            recipe_path=where,
        )


@rule(
    "recipe-pp-unsupported",
    family=F,
    severity="error",
    title="Recipe without pipeline parallelism",
    patterns=(r"Pipeline parallelism is not supported for (\w+)", r"Encoder does not support pipeline parallelism"),
    cause="The multimodal and retrieval (bi-/cross-encoder) recipes raise NotImplementedError in setup when "
    "pp_size > 1.",
    fix="Use pp_size: 1 with these recipes (shard with FSDP2/TP instead).",
)
def recipe_pp_unsupported(ctx: Context) -> Iterator[Finding]:
    name, where, _ = recipe_class(ctx)
    if name in NO_PP_RECIPES and ctx.dims.pp > 1:
        yield finding(
            ctx,
            ("pp_size",),
            f"pp_size={ctx.dims.pp} with recipe {name} ({where}): its setup raises "
            "NotImplementedError (no pipeline parallelism) after the job has started",
            "pp_size: 1 (use tp_size or more FSDP2 ranks instead)",
        )


@rule(
    "recipe-feature-parallelism",
    family=F,
    severity="error",
    title="Recipe feature that pipeline/context parallelism does not support",
    patterns=(
        r"domain_mixture does not currently support (pipeline|context) parallelism",
        r"embedding_row_repair is not currently supported with pipeline parallelism",
    ),
    cause="The LLM fine-tuning recipe (train_ft) raises ValueError in setup for domain_mixture with pp_size > 1 "
    "or cp_size > 1, and for embedding_row_repair.enabled with pp_size > 1 (after loading the model).",
    fix="Drop the feature, or pp_size/cp_size: 1.",
)
def recipe_feature_parallelism(ctx: Context) -> Iterator[Finding]:
    name, _, _ = recipe_class(ctx)
    if name not in TRAIN_FT_RECIPES:
        return
    pp, cp = ctx.dims.pp, ctx.dims.cp
    if ctx.recipe_get("domain_mixture") is not None:
        for key, size in (("pp_size", pp), ("cp_size", cp)):
            if size > 1:
                what = "pipeline" if key == "pp_size" else "context"
                yield finding(
                    ctx,
                    (),
                    f"domain_mixture with {key}={size}: {name} "
                    f"raises ValueError in setup (domain_mixture does not support {what} parallelism)",
                    f"remove domain_mixture, or {key}: 1",
                    recipe_path="domain_mixture",
                )
    if pp > 1 and ctx.recipe_get("embedding_row_repair.enabled") is True:
        yield finding(
            ctx,
            (),
            f"embedding_row_repair.enabled with pp_size={pp}: {name} "
            "raises ValueError after loading the model (not supported with pipeline parallelism)",
            "embedding_row_repair: {enabled: false}, or pp_size: 1",
            recipe_path="embedding_row_repair.enabled",
        )
