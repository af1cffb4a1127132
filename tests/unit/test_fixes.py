"""The numbers a fix suggests really fix the finding: applying each suggested value and validating
again clears the rule (and does not trade it for a neighbouring batch-size error)."""

from __future__ import annotations

import os
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import validate_config

BATCH_RULES = {"pp-microbatches", "pp-batch-divisibility", "global-batch-divisibility", "batch-size-invalid"}
SCHEDULES = ["1f1b", "gpipe", "interleaved1f1b", "InterleavedZeroBubble", "DualPipeV", "LoopedBFS"]


def _recipe(lbs: int, gbs: int, mbs: int, pp: int, schedule: str, cp: int, seq: int) -> dict:
    block: dict = {"cp_size": cp}
    if pp > 1:
        block.update(pp_size=pp, pipeline={"pp_microbatch_size": mbs, "pp_schedule": schedule})
    return {
        "step_scheduler": {"local_batch_size": lbs, "global_batch_size": gbs},
        "dataset": {"seq_len": seq},
        "distributed": block,
    }


def _options(fix: str, key: str) -> list[int]:
    """Every value the fix offers for ``key`` ('local_batch_size: 4 or 6', 'pp_microbatch_size: 2')."""
    out = []
    for m in re.finditer(rf"{key}: (\d+(?: or \d+)*)", fix):
        out += [int(v) for v in m.group(1).split(" or ")]
    return out


@settings(max_examples=int(os.environ.get("FIX_EXAMPLES", "300")), deadline=None)
@given(
    lbs=st.integers(1, 64),
    gbs=st.integers(1, 512),
    mbs=st.sampled_from([1, 2, 3, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    schedule=st.sampled_from(SCHEDULES),
    cp=st.sampled_from([1, 2, 4]),
    seq=st.integers(1, 9000),
    world=st.sampled_from([8, 16, 32, 48]),
)
def test_suggested_values_clear_the_finding(lbs, gbs, mbs, pp, schedule, cp, seq, world):
    recipe = _recipe(lbs, gbs, mbs, pp, schedule, cp, seq)
    report = validate_config(recipe, world_size=world)
    before = {f.rule for f in report.findings}
    targets = {
        "pp-microbatches": ("local_batch_size", "pp_microbatch_size"),
        "pp-batch-divisibility": ("local_batch_size",),
        "global-batch-divisibility": ("global_batch_size",),
        "cp-seq-divisibility": ("seq_len",),
    }
    for f in report.findings:
        if f.rule not in targets:
            continue
        tried = 0
        for key in targets[f.rule]:
            for value in _options(f.fix or "", key):
                tried += 1
                fixed = _recipe(
                    **{
                        **dict(lbs=lbs, gbs=gbs, mbs=mbs, pp=pp, schedule=schedule, cp=cp, seq=seq),
                        {
                            "local_batch_size": "lbs",
                            "global_batch_size": "gbs",
                            "pp_microbatch_size": "mbs",
                            "seq_len": "seq",
                        }[key]: value,
                    }
                )
                again = {g.rule for g in validate_config(fixed, world_size=world).findings}
                assert f.rule not in again, (f.rule, f.fix, key, value)
                traded = (again - before) & BATCH_RULES - {"global-batch-divisibility"}  # lbs moves gbs % (lbs * dp)
                assert not traded, (f.rule, f.fix, key, value, traded)
        assert tried, f"no applicable value in the fix of {f.rule}: {f.fix!r}"


SIZE_RULES = {
    "world-not-divisible",
    "ep-not-divisible",
    "dp-replicate-too-large",
    "dp-replicate-not-multiple",
    "tp-heads",
    "ep-experts",
    "dp-size-exceeds-world",
    "pp-stages",
}
MODELS = [None, "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1", "google/gemma-2-9b"]


def _size_options(fix: str) -> list[tuple[str, int | None]]:
    """(key, value) pairs a fix offers: 'tp_size in {1, 2, 4}', 'dp_size: 8', 'remove dp_size' (value None)."""
    out: list[tuple[str, int | None]] = [
        (k, int(v)) for k, vs in re.findall(r"(\w+_size) in \{([\d, ]+)\}", fix) for v in vs.split(",")
    ]
    out += [(k, int(v)) for k, v in re.findall(r"(\w+_size): (\d+)", fix)]
    removed = re.findall(r"remove (\w+_size)", fix)
    return out + [(k, None) for k in removed if not out]  # 'remove X, and Y in {...}': Y is applied with X gone


@settings(max_examples=int(os.environ.get("FIX_EXAMPLES", "300")), deadline=None)
@given(
    sizes=st.fixed_dictionaries(
        {},
        optional={
            k: st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32])
            for k in ("tp_size", "cp_size", "pp_size", "ep_size", "dp_replicate_size", "dp_size")
        },
    ),
    world=st.sampled_from([4, 8, 12, 16, 24, 32, 64, 96, 128]),
    model=st.sampled_from(MODELS),
)
def test_suggested_sizes_clear_the_finding(sizes, world, model):
    block = dict(sizes, **({"pipeline": {}} if sizes.get("pp_size", 1) > 1 else {}))
    report = validate_config({"distributed": block}, world_size=world, model=model)
    for f in report.findings:
        if f.rule not in SIZE_RULES or f.severity != "error":
            continue
        options = _size_options(f.fix or "")
        assert options or "world size" in (f.fix or ""), f"no applicable size in the fix of {f.rule}: {f.fix!r}"
        for key, value in options:
            fixed = {k: v for k, v in block.items() if f"remove {k}" not in (f.fix or "")}
            if value is not None:
                fixed[key] = value
            fixed.pop("pipeline", None) if fixed.get("pp_size", 1) == 1 else fixed.setdefault("pipeline", {})
            again = validate_config({"distributed": fixed}, world_size=world, model=model)
            assert f.rule not in {g.rule for g in again.errors}, (f.rule, f.fix, key, value, block, world)
