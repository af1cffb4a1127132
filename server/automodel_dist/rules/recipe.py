"""Recipe-level rules: checks that combine distributed: with other recipe sections
(step_scheduler, packed_sequence, dataset). They run only when those sections exist."""

from __future__ import annotations

from collections.abc import Iterator

from ..config.values import is_positive_int
from ..report import Finding
from .base import Context, finding, rule

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


@rule("batch-size-invalid", family=F, severity="error", title="Batch size not a positive integer",
      patterns=(r"(global|local)_batch_size must be greater than 0",),
      cause="step_scheduler.global_batch_size and local_batch_size must be positive integers.",
      fix="Give positive integers.")
def batch_size_invalid(ctx: Context) -> Iterator[Finding]:
    if not isinstance(ctx.recipe_get("step_scheduler"), dict):
        return
    for key in ("global_batch_size", "local_batch_size"):
        v = ctx.recipe_get(f"step_scheduler.{key}")
        if v is not None and not is_positive_int(v):
            yield finding(ctx, "batch-size-invalid", (), f"step_scheduler.{key} must be a positive integer, got {v!r}",
                          f"{key}: 1", recipe_path=f"step_scheduler.{key}")


@rule("pp-batch-divisibility", family=F, severity="error", title="local_batch_size not divisible by pp_microbatch_size",
      patterns=(r"Batch size (\d+) must be divisible by number of microbatches",),
      cause="With pp_size > 1 the local batch is cut into local_batch_size // pp_microbatch_size microbatches.",
      fix="Make step_scheduler.local_batch_size a multiple of pipeline.pp_microbatch_size.")
def pp_batch_divisibility(ctx: Context) -> Iterator[Finding]:
    lbs, present = _lbs(ctx)
    mbs = _mbs(ctx)
    if not present or ctx.size("pp_size") <= 1 or mbs is None or not is_positive_int(lbs):
        return
    if lbs % mbs:
        yield finding(ctx, "pp-batch-divisibility", ("pipeline", "pp_microbatch_size"),
                      f"step_scheduler.local_batch_size={lbs} is not divisible by pipeline.pp_microbatch_size={mbs}: "
                      "AutoModel's pipeline schedule build raises ValueError",
                      f"local_batch_size: {max(mbs, lbs - lbs % mbs)} or a pp_microbatch_size dividing {lbs}")


def _nmb_requirements(schedule: str | None, pp: int, nmb: int) -> str | None:
    """torch schedule constraints on the microbatch count (2.13)."""
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, nmb // pp)
        if nmb % rounds:
            return (f"{schedule} needs the number of microbatches ({nmb}) to be a multiple of the number of rounds "
                    f"({rounds} = max(1, {nmb} // pp_size {pp}))")
    if schedule == "DualPipeV" and nmb < 2 * pp:
        return f"DualPipeV needs at least as many microbatches as stages ({2 * pp}), got {nmb}"
    return None


@rule("pp-microbatches", family=F, severity="error", title="Too few pipeline microbatches",
      patterns=(r"pp_batch_size (\d+) // pp_microbatch_size (\d+) must be >= pp_size (\d+)",
                r"requires the number of microbatches to be a multiple of the number of rounds",
                r"DualPipeV requires at least as many microbatches as stages"),
      cause="The recipe asserts local_batch_size // pp_microbatch_size >= pp_size; interleaved schedules also "
            "need the microbatch count to be a multiple of max(1, n // pp_size).",
      fix="Raise step_scheduler.local_batch_size or lower pipeline.pp_microbatch_size.")
def pp_microbatches(ctx: Context) -> Iterator[Finding]:
    lbs, present = _lbs(ctx)
    mbs = _mbs(ctx)
    pp = ctx.size("pp_size")
    if not present or pp <= 1 or mbs is None or not is_positive_int(lbs) or lbs % mbs:
        return
    nmb = lbs // mbs
    if nmb < pp:
        yield finding(ctx, "pp-microbatches", (), f"local_batch_size {lbs} // pp_microbatch_size {mbs} = {nmb} "
                      f"microbatches, fewer than pp_size={pp}: the recipe's assertion fails",
                      f"local_batch_size: {pp * mbs} (or more), or pp_microbatch_size: {max(1, lbs // pp)}",
                      recipe_path="step_scheduler.local_batch_size")
        return
    problem = _nmb_requirements(ctx.pp_schedule, pp, nmb)
    if problem:
        reach = min(4 * pp, 1000)  # bounded scan; multiples of pp always qualify
        ok = [n for n in range(max(pp, nmb - reach), nmb + reach + 1)
              if _nmb_requirements(ctx.pp_schedule, pp, n) is None]
        below = [n for n in ok if n < nmb][-1:] or ([nmb // pp * pp] if nmb // pp * pp >= pp else [])
        above = [n for n in ok if n > nmb][:1] or [(nmb // pp + 1) * pp]
        options = " or ".join(str(n * mbs) for n in below + above)
        yield finding(ctx, "pp-microbatches", (), problem + ": torch raises ValueError when building the schedule",
                      f"local_batch_size: {options} (with pp_microbatch_size={mbs})",
                      recipe_path="step_scheduler.local_batch_size")


@rule("global-batch-divisibility", family=F, severity="error",
      title="global_batch_size not divisible by local_batch_size * dp",
      patterns=(r"global_batch_size \((\d+)\) must be divisible by local_batch_size \* dp_size",),
      cause="StepScheduler needs global_batch_size % (local_batch_size * dp) == 0 (grad accumulation steps).",
      fix="Make global_batch_size a multiple of local_batch_size * dp.")
def global_batch_divisibility(ctx: Context) -> Iterator[Finding]:
    if not isinstance(ctx.recipe_get("step_scheduler"), dict) or ctx.dp is None:
        return
    gbs = ctx.recipe_get("step_scheduler.global_batch_size", 32)
    lbs = ctx.recipe_get("step_scheduler.local_batch_size", 1)
    if not (is_positive_int(gbs) and is_positive_int(lbs)):
        return
    per_step = lbs * ctx.dp
    if gbs % per_step:
        lower = max(per_step, gbs - gbs % per_step)
        yield finding(ctx, "global-batch-divisibility", (),
                      f"global_batch_size ({gbs}) must be divisible by local_batch_size * dp_size ({lbs} * {ctx.dp} = "
                      f"{per_step}): StepScheduler raises ValueError",
                      f"global_batch_size: {lower} or {lower + per_step}",
                      recipe_path="step_scheduler.global_batch_size")


@rule("cp-seq-divisibility", family=F, severity="error", title="Sequence length not divisible by 2*cp_size",
      patterns=(r"must be divisible by 2 \* cp_size",),
      cause="Load-balanced context parallelism cuts each sequence into 2*cp_size chunks (head-tail pairing).",
      fix="Make packed_sequence_size / seq_len multiples of 2*cp_size.")
def cp_seq_divisibility(ctx: Context) -> Iterator[Finding]:
    cp = ctx.size("cp_size")
    if cp <= 1 or ctx.recipe is None:
        return
    need = 2 * cp
    candidates = ["packed_sequence.packed_sequence_size"]
    for section in ("dataset", "validation_dataset"):
        for key in ("seq_len", "seq_length", "max_length"):
            candidates.append(f"{section}.{key}")
    for dotted in candidates:
        v = ctx.recipe_get(dotted)
        if not is_positive_int(v) or v % need == 0:
            continue
        yield finding(ctx, "cp-seq-divisibility", (),
                      f"{dotted}={v} is not divisible by 2*cp_size={need}: load-balanced context parallelism splits "
                      f"each sequence into {need} chunks",
                      f"{dotted.rsplit('.', 1)[-1]}: {v + (-v) % need}", recipe_path=dotted)
