"""The estimate against what AutoModel really produced: its published H100 runs (tests/calibration/README.md, every
row ran on 80 GB GPUs) and its own code at full width on fake tensors (the dry run), per memory category.

The published table's sizes are the measured runs'; where a recipe in AutoModel's repository has since changed, the
table wins (``TABLE_OVERRIDES`` says what and why)."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from automodel_dist import suggest_strategy
from automodel_dist.dims import read_dims
from automodel_dist.estimate import make_cluster
from automodel_dist.estimate.comm import STEP_TIME_ERROR, axis_gbps
from support.calibration import (
    DRY,
    DRY_SLOW,
    LLM,
    MISSES,
    TABLE_OVERRIDES,
    estimate_row,
    published_rows,
)
from support.paths import CALIBRATION

HAS_AUTOMODEL = importlib.util.find_spec("nemo_automodel") is not None


ROWS = [
    pytest.param(
        r,
        id=r["recipe"].removesuffix(".yaml"),
        marks=[pytest.mark.xfail(strict=True, reason=MISSES[r["recipe"]])] if r["recipe"] in MISSES else [],
    )
    for r in published_rows()
]


def test_the_table_is_read_whole():
    rows = published_rows()
    assert len(rows) == 12 and {r["recipe"] for r in rows} == {p.name for p in (CALIBRATION / "recipes").glob("*.yaml")}


@pytest.mark.parametrize("row", ROWS)
def test_a_published_run_fits_and_takes_its_time(row):
    """Each published layout ran on an 80 GB H100 at the measured sizes, so the estimate never calls it "does not
    fit" (fits, or tight: within the estimate's error of the GPU's memory, and then under 80 GiB itself), and its step
    time is within the model's stated error of the measured one."""
    est = estimate_row(row)
    assert est.layout.tp == row["TP"] and est.layout.pp == row["PP"] and est.layout.cp == row["CP"]
    assert est.verdict in ("fits", "tight") and est.fits is not False, f"{est.memory_gib.total:.1f} GiB"
    assert est.verdict == "fits" or est.memory_gib.total < 80, f"{est.memory_gib.total:.1f} GiB"
    ratio = est.step_time_s / row["s/step"]
    assert abs(ratio - 1) <= STEP_TIME_ERROR, f"{est.step_time_s:.2f} s vs {row['s/step']} s measured ({ratio:.2f}x)"


SUGGEST_MISSES = {
    "gptoss_120b_te_deepep.yaml": "the published layout (ep 64, no PP or CP) fits by the estimate (53 GiB) but ranks "
    "below five PP/CP layouts the model predicts up to 1.17x faster, inside its 25% step-time error: GPT-OSS's step "
    "times are the model's weakest (the 20B row's 0.74x)"
}


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            r,
            id=r["recipe"].removesuffix(".yaml"),
            marks=[pytest.mark.xfail(strict=True, reason=SUGGEST_MISSES[r["recipe"]])]
            if r["recipe"] in SUGGEST_MISSES
            else [],
        )
        for r in published_rows()
        if r["GPUs"] <= 256
    ],
)
def test_suggest_finds_the_published_layout_or_says_how_much_faster_its_pick_is(row):
    """For the model, cluster and sizes of a published run, NVIDIA's layout is among suggest's top 5, or it is tight
    (within the estimate's memory error of the GPU: ranked after the sure fits), or suggest's pick is predicted
    faster by more than the model's error and the report says by how much."""
    rep = suggest_strategy(
        config=CALIBRATION / "recipes" / row["recipe"],
        nodes=max(1, row["GPUs"] // 8),
        gpus_per_node=min(8, row["GPUs"]),
        seq_len=row["seq"],
        global_batch_size=row["GBS"],
        micro_batch_size=row["MBS"],
        top_k=5,
        headroom=0.0,
    )
    shape = (row["TP"], row["PP"], row["CP"])
    top = [
        (c.distributed.get("tp_size", 1), c.distributed.get("pp_size", 1), c.distributed.get("cp_size", 1))
        for c in rep.candidates
    ]
    if shape in top:
        return
    assert rep.current is not None, top
    if rep.current.fits is None:
        # tight: the published layout is within the estimate's error of the GPU's memory, so the layouts that fit
        # for sure rank first; it is still judged to fit by the point estimate (it ran)
        assert rep.current.memory_gib is not None and rep.current.memory_gib < 80, rep.current
        return
    assert rep.current.best_speedup is not None, (top, rep.current)
    assert rep.current.best_speedup > 1 + STEP_TIME_ERROR, (top, rep.current)


def test_a_group_across_nodes_moves_as_many_nics_as_it_has_ranks_in_a_node():
    """NCCL's multi-node bus bandwidth on DGX H100 (8 x 400 Gb/s NICs per node) is 400-450 GB/s for a group with
    all 8 GPUs of each node (the README's figures); a group with one GPU per node has one NIC."""
    cluster = make_cluster("H100-80GB", 8)
    fsdp = read_dims({"strategy": "fsdp2"}, 64)
    assert 400 <= axis_gbps("dp_shard_cp", fsdp, cluster, True) <= 450
    hsdp = read_dims({"dp_replicate_size": 8}, 64)  # 8 replicas, one per node
    assert axis_gbps("dp_replicate", hsdp, cluster, True) == 50.0
    assert axis_gbps("dp_shard", hsdp, cluster, False) == 450.0


# ------------------------------------------------------------------------------------------ against the dry run
CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")


def _against_dry_run(model: str, block: str, layers: int, seq_len: int) -> None:
    from automodel_dist.dry_run import dry_run

    report = dry_run(LLM + block, world_size=8, model=model, num_layers=layers, seq_len=seq_len)
    measured = [r for r in report.ranks if r.peak is not None]
    assert measured, [(r.status, r.reason or r.error) for r in report.ranks]
    peak = max(r.peak.total for r in measured)
    diffs = {d.category: d for d in report.estimate_vs_dry_run}
    assert set(diffs) >= set(CATEGORIES)
    for cat in CATEGORIES:
        d = diffs[cat]
        assert abs(d.estimate_gib - d.dry_run_gib) <= 0.15 * peak, (cat, d.estimate_gib, d.dry_run_gib, peak)
    total = diffs["total"]
    assert abs(total.estimate_gib / total.dry_run_gib - 1) <= 0.15, (total.estimate_gib, total.dry_run_gib)


@pytest.mark.skipif(not HAS_AUTOMODEL, reason="the dry run needs AutoModel 0.7.0")
@pytest.mark.parametrize("model,block", DRY)
def test_the_estimate_matches_automodels_own_step_per_category(model, block):
    """Each category (parameters, gradients, optimizer states, activations, temporaries) within 15% of the dry run's
    allocated peak, and the total within 15%: four layers at full width, 2,048 tokens (the overhead terms, CUDA context
    and fragmentation, are the estimate's own and not compared)."""
    _against_dry_run(model, block, 4, 2048)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_AUTOMODEL, reason="the dry run needs AutoModel 0.7.0")
@pytest.mark.parametrize("model,block", DRY_SLOW)
def test_more_categories_match_automodels_own_step(model, block):
    _against_dry_run(model, block, 4, 2048)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_AUTOMODEL, reason="the dry run needs AutoModel 0.7.0")
@pytest.mark.parametrize("model,block", DRY + DRY_SLOW)
def test_the_estimate_matches_automodels_own_step_deeper(model, block):
    _against_dry_run(model, block, 8, 4096)


def test_the_table_overrides_name_real_differences():
    for name, items in TABLE_OVERRIDES.items():
        recipe = yaml.safe_load((CALIBRATION / "recipes" / name).read_text())
        for item in items:
            key, value = item.split("=", 1)
            node = recipe
            for part in key.split(".")[:-1]:
                node = node.get(part, {})
            assert str(node.get(key.split(".")[-1])).lower() != value, f"{name}: {key} is already {value}"


@pytest.mark.skipif(importlib.util.find_spec("nemo_automodel") is None, reason="the dry run needs AutoModel")
@pytest.mark.parametrize(
    "recipe",
    ["llama3_1_8b_peft_benchmark.yaml", pytest.param("qwen2_5_7b_peft_benchmark.yaml", marks=pytest.mark.slow)],
)
def test_published_one_gpu_lora_runs_are_under_80_gib_by_the_dry_run_and_the_estimate(recipe):
    """AutoModel's published 1-GPU LoRA runs (8B and 7B, batch 2 x 4,096, one 80 GB H100): AutoModel's own step on
    fake tensors allocates under 80 GiB (what its log calls mem, max_memory_allocated), and the estimate, overhead
    included, is under 80 GiB and never "does not fit"."""
    from automodel_dist.dry_run import dry_run

    [row] = [r for r in published_rows() if r["recipe"] == recipe]
    dr = dry_run(
        CALIBRATION / "recipes" / recipe, world_size=1, seq_len=row["seq"], micro_batch_size=row["MBS"], headroom=0.0
    )
    assert dr.status == "measured", [(r.error, r.reason) for r in dr.ranks]
    assert dr.ranks[0].peak_allocated_gib < 80 and dr.fits is True and dr.verdict == "fits"
    est = estimate_row(row)
    assert est.memory_gib.total < 80 and est.verdict != "does not fit"
