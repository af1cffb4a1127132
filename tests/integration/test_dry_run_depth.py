"""The dry run at depth: a model whose layers repeat is built twice per rank at a shallow depth and extrapolated per
layer. The arithmetic against AutoModel's own stage split; the extrapolated figures against the same rank built at
full depth (per category, exactly up to rounding); a world-size-1 Hugging Face build that allocates nothing real."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from automodel_dist.catalog.hf_config import hf_config
from automodel_dist.catalog.models import from_hf_config
from automodel_dist.catalog.sources import resolve_model as lookup_model
from automodel_dist.dims import read_dims
from automodel_dist.dry_run import dry_run, missing_packages
from automodel_dist.dry_run.depth import (
    built_kinds,
    by_phase,
    extrapolate_splits,
    layer_kinds,
    line,
    peak_phase,
    period_of,
    plan_depth,
    truncated_config,
)
from automodel_dist.dry_run.plan import plan_dry_run
from automodel_dist.dry_run.run import largest_moments
from automodel_dist.estimate.memory import peak_candidate_pp_ranks
from automodel_dist.layout import stage_ids, stage_layer_counts
from automodel_dist.request import Request
from support.paths import ROOT

needs_automodel = pytest.mark.skipif(
    bool(missing_packages()), reason="the dry run needs AutoModel, torch, transformers"
)


def test_period_of_layer_kinds():
    assert period_of(["a"] * 7) == 1
    assert period_of(["l", "l", "l", "f"] * 12) == 4
    assert period_of(["s", "f"] * 5 + ["s"]) == 2  # a last, partial period
    assert period_of(list("abcdefghij")) is None


def test_kinds_of_real_models():
    ds = lookup_model("deepseek-ai/DeepSeek-V3")
    kinds = layer_kinds(ds)
    assert kinds[: ds.first_dense_layers] == [("attention", "-", "dense")] * 3 and kinds[3][2] == "moe"
    assert period_of(kinds) is None and period_of(kinds[3:]) == 1
    next80 = lookup_model("tests/models/qwen3_next_80b_a3b.json")
    assert period_of(layer_kinds(next80)) == 4  # three Gated DeltaNet layers, one full-attention layer
    # Gemma-4-E2B: four sliding layers and a full one, but its last 20 share keys and values (their MLP double-wide):
    # no period runs through the whole model, so it is built whole
    e2b = lookup_model("google/gemma-4-E2B-it")
    kinds = layer_kinds(e2b)
    assert period_of(kinds[:15]) == period_of(kinds[15:]) == 5 and period_of(kinds) is None
    assert plan_depth(e2b, read_dims({"strategy": "fsdp2"}, world_size=8), 0) is None


@needs_automodel
@pytest.mark.parametrize("layers,stages", [(48, 24), (61, 4), (80, 8), (30, 4), (7, 7)])
def test_stage_split_is_automodels(layers, stages):
    from nemo_automodel.components.distributed.pipelining.functional import generate_hf_model_fqn_per_model_part

    theirs = generate_hf_model_fqn_per_model_part(stages, layers)
    assert stage_layer_counts(layers, stages) == [sum(".layers." in m for m in names) for names in theirs]


@needs_automodel
@pytest.mark.parametrize("pp,spr,v", [(2, 12, False), (4, 2, False), (4, 2, True), (8, 1, False)])
def test_rank_stages_are_automodels(pp, spr, v):
    from nemo_automodel.components.distributed.pipelining.functional import stage_ids_this_rank

    for r in range(pp):
        assert list(stage_ids(r, pp, pp * spr, v_style=v)) == list(
            stage_ids_this_rank(r, pp, pp * spr, "v" if v else "loop")
        )


def test_plan_depth_uniform_prefix_and_pipeline():
    l8 = lookup_model("meta-llama/Llama-3.1-8B")
    d = plan_depth(l8, read_dims({}, 8), 0)
    assert d is not None and d.layers == (3, 4) and d.units == (3, 4) and d.target_units == 32
    ds = lookup_model("deepseek-ai/DeepSeek-V3")
    d = plan_depth(ds, read_dims({"ep_size": 8}, 64), 0)
    assert d is not None and d.prefix == 3 and d.layers == (6, 7) and d.target_units == 58
    pp = read_dims({"pp_size": 4, "pipeline": {"pp_schedule": "interleaved1f1b"}}, 32)
    assert plan_depth(l8, pp, 1) is None  # 8 stages of 4 layers: as shallow as the builds
    pp = read_dims({"pp_size": 2, "pipeline": {"pp_schedule": "interleaved1f1b"}}, 16)
    d = plan_depth(l8, pp, 1)  # 4 stages of 8 layers; rank 1 holds stages 1 and 3
    assert d is not None and d.layers_per_stage == (3, 4) and d.layers == (12, 16)
    assert d.units == (6, 8) and d.target_units == 16 and d.same_actions  # the same stages: a line per action
    d = plan_depth(ds, read_dims({"pp_size": 4, "ep_size": 8}, 64), 0)
    assert d is not None and d.prefix == 0 and any("dense layers" in n for n in d.notes)
    assert d.target_units == 16  # 61 layers over 4 stages: 16, 15, 15, 15
    shallow = read_dims({"pp_size": 2, "pipeline": {"pp_schedule": "interleaved1f1b", "layers_per_stage": 2}}, 16)
    # stages already as shallow as a build, 12 of them per rank: built with 3 and 4 stages, extrapolated per stage
    d = plan_depth(lookup_model("Qwen/Qwen3-30B-A3B"), shallow, 0)
    assert d is not None and d.layers_per_stage == (2, 2) and d.units == (3, 4) and d.target_units == 12
    assert d.layers == (12, 16) and "per stage" in d.notes[0]
    assert not d.same_actions  # 3 and 4 stages run different pipeline actions: a line per phase
    assert plan_depth(dataclasses.replace(l8, num_layers=3), read_dims({}, 8), 0) is None  # as shallow as a build
    # GLM-5.2: 3 dense layers, then a period of four (three layers sharing an indexer, one with its own) that leaves a
    # tail of three shared layers: both builds end with that tail, so the backward starts at the model's kind of layer
    glm = lookup_model("zai-org/GLM-5.2")
    d = plan_depth(glm, read_dims({"ep_size": 128}, 128), 0)
    assert d is not None and d.prefix == 3 and d.period == 4 and d.layers == (10, 14)
    assert d.units == (7, 11) and d.target_units == 75


def test_plan_depth_uneven_stages_take_the_common_size():
    """94 layers at 2 a stage, rounded up to 48 stages on PP 4 (Qwen3-VL-235B's benchmark recipe): AutoModel gives 46
    stages 2 layers and the last two 1. The builds hold stages of the common size (2 layers), not of the smallest (a
    rank of 1-layer stages would hold twice the stages and their per-stage buffers), and the model's parameter count
    is read off the line where every rank's builds hold the model, not pp x this rank's layers."""
    spec = lookup_model("Qwen/Qwen3-VL-235B-A22B-Instruct")
    dims = read_dims(
        {
            "pp_size": 4,
            "ep_size": 32,
            "pipeline": {
                "pp_schedule": "interleaved1f1b",
                "layers_per_stage": 2,
                "round_virtual_stages_to_pp_multiple": "up",
            },
        },
        256,
    )
    assert stage_layer_counts(94, 48).count(1) == 2
    first, last = plan_depth(spec, dims, 0), plan_depth(spec, dims, 3)
    assert first is not None and last is not None
    assert first.layers_per_stage == (2, 2) and first.layers == (24, 32) and first.units == (3, 4)
    assert first.target_units == 12 and last.target_units == 11.5  # 24 layers on rank 0, 23 on rank 3
    assert first.model_units == last.model_units == 94 / 8
    assert "its stages hold 1 or 2" in first.notes[0]


def test_plan_depth_builds_whole_where_the_two_builds_would_run_more_layers():
    """Two shallow builds of 3 and 4 units run 7 units' worth of layers: a rank holding no more is built once, whole
    (one build and one step, and nothing extrapolated)."""
    l8 = lookup_model("meta-llama/Llama-3.1-8B")
    assert plan_depth(dataclasses.replace(l8, num_layers=6), read_dims({}, 8), 0) is None  # 3 + 4 > 6
    assert plan_depth(dataclasses.replace(l8, num_layers=7), read_dims({}, 8), 0) is None  # 3 + 4 = 7
    assert plan_depth(dataclasses.replace(l8, num_layers=8), read_dims({}, 8), 0) is not None  # 3 + 4 < 8
    ling = lookup_model("inclusionAI/Ling-1T")  # 80 layers, PP 8 at 2 layers a stage: 5 stages a rank
    pp8 = read_dims(
        {"pp_size": 8, "ep_size": 8, "pipeline": {"pp_schedule": "interleaved1f1b", "layers_per_stage": 2}}, 64
    )
    assert plan_depth(ling, pp8, 0) is None  # 3 + 4 stages > 5
    assert plan_depth(dataclasses.replace(ling, num_layers=112), pp8, 0) is None  # 7 stages a rank: 3 + 4 = 7
    assert plan_depth(dataclasses.replace(ling, num_layers=128), pp8, 0) is not None  # 8 stages a rank
    # 6 stages of 6 layers a rank: builds of 3 and 4 layers a stage would run 7 of every 6
    pp2 = read_dims({"pp_size": 2, "pipeline": {"pp_schedule": "interleaved1f1b", "layers_per_stage": 6}}, 16)
    assert plan_depth(dataclasses.replace(l8, num_layers=72), pp2, 0) is None
    pp2 = read_dims({"pp_size": 2, "pipeline": {"pp_schedule": "interleaved1f1b", "layers_per_stage": 8}}, 16)
    assert plan_depth(dataclasses.replace(l8, num_layers=96), pp2, 0) is not None  # 7 of every 8


def test_truncated_config_cuts_per_layer_lists():
    cfg = {"num_hidden_layers": 8, "layer_types": ["s", "f"] * 4, "hybrid_override_pattern": "M*M*M*M*"}
    out = truncated_config(cfg, 4)
    assert out["num_hidden_layers"] == 4 and out["layer_types"] == ["s", "f", "s", "f"]
    assert out["hybrid_override_pattern"] == "M*M*" and cfg["num_hidden_layers"] == 8
    assert truncated_config({"first_k_dense_replace": 3}, 8, moe_prefix_as_moe=True)["first_k_dense_replace"] == 0
    ernie = truncated_config({"moe_layer_start_index": 1, "moe_layer_end_index": 27}, 4, moe_prefix_as_moe=True)
    assert ernie["moe_layer_start_index"] == 0 and ernie["num_hidden_layers"] == 4  # ERNIE-4.5's dense prefix
    # a multimodal config: its language model is cut (AutoModel builds the text_config's layers), the towers are not
    vlm = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "vision_config": {"depth": 27}, "text_config": cfg}
    out = truncated_config(vlm, 4)
    assert out["text_config"]["num_hidden_layers"] == 4 and out["text_config"]["layer_types"] == ["s", "f", "s", "f"]
    assert out["vision_config"] == {"depth": 27} and "num_hidden_layers" not in out
    assert from_hf_config(truncated_config(lookup_model("Qwen/Qwen3.5-35B-A3B").hf_config, 8)).num_layers == 8
    # Gemma-4's KV-shared layers are its last ones: a cut keeps those of its layers that were shared
    e4b = lookup_model("google/gemma-4-E4B-it").hf_config
    assert [from_hf_config(truncated_config(e4b, n)).kv_shared_layers for n in (42, 30, 24, 6)] == [18, 6, 0, 0]


def test_a_last_layer_that_breaks_the_period_is_kept_at_the_end_of_both_builds():
    """Kimi-Linear's 27 layers: one dense KDA layer, then KDA, KDA, MLA, KDA repeating, and MLA last where the period
    would put KDA. Both builds keep the dense layer first and the MLA layer last (its linear_attn_config renumbered),
    so a build's layers are the model's kinds cut in the middle; a config that cannot be cut so is built whole."""
    kimi = lookup_model("moonshotai/Kimi-Linear-48B-A3B-Instruct")
    depth = plan_depth(kimi, read_dims({"cp_size": 8, "ep_size": 8}, 8), 0)
    assert depth is not None and (depth.prefix, depth.suffix, depth.period, depth.layers) == (1, 1, 4, (7, 11))
    assert depth.units == (6, 10) and depth.target_units == 26
    kinds = layer_kinds(kimi)
    for n in depth.layers:
        cut = truncated_config(kimi.hf_config, n, keep_last=1)
        assert layer_kinds(from_hf_config(cut)) == kinds[: n - 1] + kinds[-1:]
    assert truncated_config(kimi.hf_config, 7, keep_last=1)["linear_attn_config"]["full_attn_layers"] == [4, 7]
    # the same kinds where the config cannot keep a last layer (a period-only spelling): built whole
    assert plan_depth(dataclasses.replace(kimi, hf_config=None), read_dims({"cp_size": 8, "ep_size": 8}, 8), 0) is None
    cfg = {"num_hidden_layers": 8, "layer_types": list("abcabcaz"), "hybrid_override_pattern": "M*M*M*ME"}
    out = truncated_config(cfg, 5, keep_last=1)
    assert out["layer_types"] == list("abcaz") and out["hybrid_override_pattern"] == "M*M*E"


def test_line_and_the_peak_phase_after_extrapolating():
    assert line(2, 10.0, 3, 12.0, 32) == pytest.approx(70.0)
    assert line(2, 10.0, 3, 8.0, 32) == 0.0  # never negative
    depth = plan_depth(lookup_model("meta-llama/Llama-3.1-8B"), read_dims({}, 8), 0)
    shallow = {"loss": {"total": 10.0, "activations": 1.0}, "backward": {"total": 9.0, "activations": 2.0}}
    deeper = {"loss": {"total": 10.5, "activations": 1.5}, "backward": {"total": 10.0, "activations": 3.0}}
    out = extrapolate_splits(depth, shallow, deeper)
    assert peak_phase(shallow) == "loss" and peak_phase(out) == "backward"  # the peak moves with depth
    assert out["backward"] == {"total": 38.0, "activations": 31.0}  # units 3 and 4 -> 32
    # pipeline actions as moments of a phase: each on its own line, the phase its largest after
    shallow = {"pipeline_schedule@F0.0#0": {"total": 10.0}, "pipeline_schedule@B0.0#0!": {"total": 9.0}}
    deeper = {"pipeline_schedule@F0.0#0": {"total": 10.5}, "pipeline_schedule@B0.0#0!": {"total": 10.0}}
    cats = {k: {"Activation": v["total"]} for k, v in shallow.items()}
    assert by_phase(shallow, cats) == (
        {"pipeline_schedule": {"total": 10.0}},
        {"pipeline_schedule": {"Activation": 10.0}},
    )
    phases, _ = by_phase(extrapolate_splits(depth, shallow, deeper), {})
    assert phases == {"pipeline_schedule": {"total": 38.0}}  # drawn through the phase's peaks: 24.0


def test_the_plan_measures_the_pipeline_ranks_where_the_peak_can_fall():
    def ranks(model: str, block: str, world: int) -> list[int]:
        return [s.rank for s in plan_dry_run(Request.of(block, world_size=world, model=model, seq_len=128)).specs]

    pp4 = "distributed:\n  pp_size: 4\n  pipeline:\n    pp_schedule: interleaved1f1b\n"
    # uniform: rank 0 (the embedding), rank 1 (the first with receive buffers) and the last stage position
    assert ranks("meta-llama/Llama-3.1-8B", pp4, 32) == [0, 8, 24]
    # DeepSeek-V3 over 16 stages: ranks 2-14 hold no more layers of any kind than rank 1 and run fewer forwards before
    # their first backward; the last holds the lm_head
    pp16 = "distributed:\n  pp_size: 16\n  ep_size: 8\n  pipeline:\n    pp_schedule: 1f1b\n"
    assert ranks("deepseek-ai/DeepSeek-V3", pp16, 128) == [0, 8, 120]
    zbv = "distributed:\n  pp_size: 4\n  pipeline:\n    pp_schedule: zbvzerobubble\n"
    assert ranks("meta-llama/Llama-3.1-8B", zbv, 32) == [0, 8, 16, 24]  # V schedules: every rank


def test_a_dense_prefix_built_as_moe_leaves_the_dominated_pipeline_ranks_out():
    """GLM-5's benchmark recipe (PP 4 interleaved, 2 layers a stage, 40 stages): on the whole model rank 1's first
    stage holds a dense layer of the prefix where rank 2's holds a MoE one, so neither dominates; every rank past the
    first is built shallow with the prefix as MoE, where rank 1 holds at least rank 2's layers (its last stage has
    one layer) and runs more forwards first. Built whole (--full-depth) every stage position is measured."""
    block = (
        "distributed:\n  pp_size: 4\n  ep_size: 32\n  activation_checkpointing: true\n  pipeline:\n"
        "    pp_schedule: interleaved1f1b\n    pp_microbatch_size: 1\n    round_virtual_stages_to_pp_multiple: up\n"
        "    layers_per_stage: 2\nstep_scheduler:\n  local_batch_size: 4\n  global_batch_size: 512\n"
    )

    def request() -> Request:
        return Request.of(block, world_size=128, model="zai-org/GLM-5", seq_len=4096)

    plan = plan_dry_run(request())
    assert [s.rank for s in plan.specs] == [0, 32, 96] and all(s.builds for s in plan.specs)
    assert any("the first 3 dense layers counted as MoE" in n for n in plan.notes)
    spec = lookup_model("zai-org/GLM-5")
    dims = plan.dims
    assert built_kinds(spec, dims).first_dense_layers == 0 and spec.first_dense_layers == 3
    assert peak_candidate_pp_ranks(spec, dims) == [0, 1, 2, 3]  # the estimate's search, on the whole model
    assert [s.rank for s in plan_dry_run(request(), full_depth=True).specs] == [0, 32, 64, 96]
    # a layer of another attention kind, or a rank built whole, keeps the model's own kinds
    assert built_kinds(dataclasses.replace(spec, index_shared_layers=(5,)), dims).first_dense_layers == 3
    assert built_kinds(dataclasses.replace(spec, num_layers=28), dims).first_dense_layers == 3  # 4 stages a rank


def _tiny_glm5(tmp_path) -> str:
    """A GLM-5-shaped recipe at toy width: 3 dense layers then 59 MoE ones, PP 4 interleaved at 2 layers a stage
    rounded up to 32 stages, the last two one layer short (on ranks 2 and 3, as GLM-5's own 78 layers in 40 stages:
    rank 2 holds 15 layers to rank 1's 16); 8 stages a rank, built 3 and 4; EP 2, AutoModel's own class."""
    cfg = hf_config(lookup_model("zai-org/GLM-5"))
    cfg.update(
        num_hidden_layers=62,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        n_routed_experts=8,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=64,
        q_lora_rank=128,
        qk_rope_head_dim=32,
        qk_nope_head_dim=32,
        v_head_dim=32,
        vocab_size=1024,
        index_topk=64,
        index_head_dim=32,
        index_n_heads=4,
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    recipe = tmp_path / "tiny_glm5.yaml"
    recipe.write_text(
        f"""model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_config
  config:
    _target_: transformers.AutoConfig.from_pretrained
    pretrained_model_name_or_path: {tmp_path / "model"}
  backend:
    _target_: nemo_automodel.components.models.common.BackendConfig
    attn: sdpa
    linear: torch
    rms_norm: torch
    experts: torch_mm
    dispatcher: torch
    fake_balanced_gate: true
step_scheduler:
  local_batch_size: 4
distributed:
  pp_size: 4
  ep_size: 2
  activation_checkpointing: true
  pipeline:
    pp_schedule: interleaved1f1b
    pp_microbatch_size: 1
    layers_per_stage: 2
    round_virtual_stages_to_pp_multiple: up
    patch_inner_model: false
    patch_causal_lm_model: false
"""
    )
    return str(recipe)


@pytest.mark.slow
@needs_automodel
def test_the_pipeline_rank_left_out_peaks_no_higher_than_its_dominator(tmp_path):
    """The oracle for built_kinds: the toy GLM-5 measured on every stage position; the one the plan leaves out (rank
    2's position) peaks no higher than rank 1's, so the plan's ranks hold the peak."""
    recipe = _tiny_glm5(tmp_path)
    kw = dict(world_size=8, seq_len=256)
    plan = plan_dry_run(Request.of(Path(recipe), **kw))
    assert [s.rank for s in plan.specs] == [0, 2, 6]
    report = dry_run(Path(recipe), ranks=[0, 2, 4, 6], **kw)
    assert report.status == "measured", [(r.error, r.reason) for r in report.ranks]
    peak = {r.rank: r.peak_allocated_gib for r in report.ranks}
    assert all(r.builds for r in report.ranks)
    assert peak[4] <= peak[2] * (1 + 1e-6)
    assert max(peak[r] for r in (0, 2, 6)) == max(peak.values())


def test_the_plan_builds_each_rank_twice_and_says_so():
    plan = plan_dry_run(Request.of("distributed: {}\n", world_size=8, model="meta-llama/Llama-3.1-8B", seq_len=128))
    [spec] = plan.specs
    assert [b.hf_config["num_hidden_layers"] for b in spec.builds] == [3, 4]
    assert spec.depth.target_units == 32 and any("extrapolation" in n for n in plan.notes)
    full = plan_dry_run(Request.of("distributed: {}\n", world_size=8, model="meta-llama/Llama-3.1-8B"), full_depth=True)
    assert full.specs[0].builds is None and not any("extrapolation" in n for n in full.notes)
    pp = plan_dry_run(
        Request.of(
            "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n",
            world_size=8,
            model="meta-llama/Llama-3.1-8B",
            seq_len=128,
        )
    )
    for spec in pp.specs:
        assert [b.distributed["pipeline"]["layers_per_stage"] for b in spec.builds] == [3, 4]
        assert [b.hf_config["num_hidden_layers"] for b in spec.builds] == [6, 8]


def _config(tmp_path, name: str, layers: int) -> str:
    cfg = hf_config(lookup_model(name))
    cfg["num_hidden_layers"] = layers
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@needs_automodel
@pytest.mark.parametrize(
    "text,world",
    [
        pytest.param("distributed: {}\n", 8, id="fsdp2"),
        pytest.param(
            "distributed:\n  tp_size: 2\n  sequence_parallel: true\n  activation_checkpointing: true\n",
            8,
            id="tp2-sp-ac",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n    pp_microbatch_size: 1\n",
            4,
            id="pp2-1f1b",
            # at 12 layers (6 a stage) every rank was built whole since its builds would run 3 + 4 layers, so this
            # case compared a whole build with itself. At 16 the last stage's extrapolated total is 3% under the whole
            # build's (6.41 against 6.62 GiB; 6.35 before each pipeline action got its own line): every action's
            # moment but the last backward and the stretch after it lies on its line; those peak, at three layers a
            # stage, in a transient of the head's, and at eight in one layer's gather or reduce over every gathered
            # block (test_pipeline_moments_extrapolate_to_the_whole_build holds the rest)
            marks=[
                pytest.mark.slow,
                pytest.mark.xfail(
                    strict=True, reason="PP 2: the last backward's tail is on another moment's line at 3 layers a stage"
                ),
            ],
        ),
    ],
)
def test_extrapolated_figures_equal_the_full_build(tmp_path, text, world):
    # (under PP 2, 16 layers: 8 a stage, more than the two builds' 3 + 4, which a rank built whole would not be)
    model = _config(tmp_path, "meta-llama/Llama-3.2-1B", 16 if "pp_size" in text else 12)
    kw = dict(world_size=world, model=model, seq_len=256, micro_batch_size=2 if "pp_size" not in text else None)
    shallow = dry_run(text + "step_scheduler:\n  local_batch_size: 2\n", **kw)
    full = dry_run(text + "step_scheduler:\n  local_batch_size: 2\n", full_depth=True, **kw)
    assert shallow.status == full.status == "measured", [(r.error, r.reason) for r in shallow.ranks + full.ranks]
    for a, b in zip(shallow.ranks, full.ranks):
        assert a.builds and not b.builds
        assert a.peak_phase == b.peak_phase
        for cat in ("params", "grads", "optimizer", "total"):
            assert getattr(a.peak, cat) == pytest.approx(getattr(b.peak, cat), rel=0.02, abs=2e-3), cat
        # where the peak moment moves within a phase (PP), activations, temporaries and held gradients trade places
        rest_a, rest_b = a.peak.activations + a.peak.temporaries, b.peak.activations + b.peak.temporaries
        assert rest_a == pytest.approx(rest_b, rel=0.05, abs=2e-3)
        assert a.local_param_bytes == pytest.approx(b.local_param_bytes, rel=1e-3)


def test_the_report_keeps_the_largest_moments_in_step_order():
    moments = {f"pipeline_schedule@F0.{i}#0": float(i % 7) for i in range(40)}
    kept = largest_moments(moments, keep=5)
    assert list(kept) == [k for k in moments if k in kept]  # the order the step reached them
    assert sorted(kept.values(), reverse=True) == sorted(moments.values(), reverse=True)[:5]
    assert largest_moments({"start": 1.0}) == {"start": 1.0}


@needs_automodel
def test_pipeline_moments_extrapolate_to_the_whole_build(tmp_path):
    """Under PP every pipeline action is a moment of its own, drawn on its own line through the two shallow builds (3
    and 4 layers a stage for 8): each moment of both ranks of a 1F1B schedule lands on the whole build's figure but the
    last stage's last backward and the stretch after it, whose peaks at 3 layers a stage fall in a transient that does
    not grow with the layers (the PP 2 case above, still 3% under); each phase is its largest moment, and the peak's
    moment is named."""
    model = _config(tmp_path, "meta-llama/Llama-3.2-1B", 16)
    text = "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n    pp_microbatch_size: 1\n"
    text += "step_scheduler:\n  local_batch_size: 2\n"
    kw = dict(world_size=4, model=model, seq_len=256)
    shallow, full = dry_run(text, **kw), dry_run(text, full_depth=True, **kw)
    assert shallow.status == full.status == "measured"
    for a, b in zip(shallow.ranks, full.ranks):
        assert a.builds and not b.builds and a.pp_stages == b.pp_stages
        assert set(a.moment_peaks_gib) == set(b.moment_peaks_gib)
        stage = a.pp_stages[0]
        assert {
            f"pipeline_schedule@{k}{stage}.{mb}#0{end}" for k in "FB" for mb in (0, 1) for end in ("", "!", "+")
        } < set(a.moment_peaks_gib)
        off = {f"pipeline_schedule@B1.1#0{end}" for end in ("", "+")} if stage == 1 else set()
        for key, value in b.moment_peaks_gib.items():
            if key not in off:
                assert a.moment_peaks_gib[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
        for r in (a, b):
            assert r.peak_moment in r.moment_peaks_gib and r.peak_moment.startswith(f"{r.peak_phase}@")
            for phase, peak in r.phase_peaks_gib.items():
                within = [v for k, v in r.moment_peaks_gib.items() if k.split("@")[0] == phase]
                assert peak == pytest.approx(max(within))
        assert a.peak_allocated_gib == pytest.approx(a.moment_peaks_gib[a.peak_moment])


@pytest.mark.slow
@needs_automodel
def test_extrapolated_figures_equal_the_full_build_with_a_last_layer_off_the_period(tmp_path):
    """A small Kimi-Linear of 19 layers (the model's schedule: a dense first layer, KDA, KDA, MLA, KDA repeating, MLA
    last) under its own CP and EP, built at 7 and 11 layers ending with the MLA layer and extrapolated: the figures of
    the whole build."""
    cfg = hf_config(lookup_model("moonshotai/Kimi-Linear-48B-A3B-Instruct"))
    small = {"hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 8}
    small |= {"num_hidden_layers": 19, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 2048}
    kda = [j for j in range(1, 19) if j % 4]
    small["linear_attn_config"] = {**cfg["linear_attn_config"], "num_heads": 2, "head_dim": 64}
    small["linear_attn_config"] |= {"kda_layers": kda, "full_attn_layers": [4, 8, 12, 16, 19]}
    small["kv_lora_rank"], small["qk_nope_head_dim"], small["v_head_dim"], small["qk_rope_head_dim"] = 64, 32, 32, 16
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg | small))
    recipe = (
        "model:\n  backend:\n    attn: eager\n    experts: torch\n    dispatcher: torch\n"
        "distributed:\n  cp_size: 2\n  ep_size: 2\n  activation_checkpointing: true\n"
        "step_scheduler:\n  local_batch_size: 1\n"
    )
    kw = dict(world_size=2, model=str(path), seq_len=1024, micro_batch_size=1)
    shallow = dry_run(recipe, **kw)
    full = dry_run(recipe, full_depth=True, **kw)
    assert shallow.status == full.status == "measured", [(r.error, r.reason) for r in shallow.ranks + full.ranks]
    assert any("last layer, which breaks its period of 4" in n for n in shallow.notes)
    [a], [b] = shallow.ranks, full.ranks
    assert a.builds and not b.builds and a.peak_phase == b.peak_phase
    for cat in ("params", "grads", "optimizer", "activations", "temporaries", "total"):
        assert getattr(a.peak, cat) == pytest.approx(getattr(b.peak, cat), rel=0.02, abs=2e-3), cat


@needs_automodel
def test_one_rank_hugging_face_build_allocates_nothing_real():
    """AutoModel builds a Hugging Face class with real weights on one rank; the dry run builds it on meta (8B: a few
    hundred MiB of host memory, not 16 GiB)."""
    report = dry_run(
        "model:\n  force_hf: true\ndistributed: {}\n",
        world_size=1,
        model="meta-llama/Llama-3.1-8B",
        seq_len=128,
        micro_batch_size=1,
    )
    [r] = report.ranks
    assert report.status == "measured", (r.error, r.reason)
    assert r.host_peak_rss_mib < 1500 and r.peak.params > 14  # bf16 8B on the (fake) GPU


@pytest.mark.slow
@needs_automodel
def test_the_qwen3_moe_chat_recipe_is_what_it_says_it_measured():
    """AutoModel's Qwen3-30B-A3B chat recipe (CP 2 + PP 2 + EP 4 on 16 GPUs, interleaved 24 stages of 2 layers, TE
    attention) says "Verified at ~19 GiB/GPU" (AutoModel logs max_memory_allocated). Its stages are built 3 and 4 per
    rank and extrapolated per stage (the full build measured 18.5 and 18.6 GiB); the estimate is held to the same
    figure."""
    from automodel_dist import estimate_memory

    recipe = ROOT / "tests" / "examples" / "qwen3_moe_30b_te_chat_thd.yaml"
    report = dry_run(recipe, gpus_per_node=8)
    assert report.status == "measured" and [r.rank for r in report.ranks] == [0, 8]
    for r in report.ranks:
        assert r.builds and r.peak_allocated_gib == pytest.approx(19.0, rel=0.20)
    assert any("stand-in" in s for s in report.substitutions)
    est = estimate_memory(recipe, gpus_per_node=8)
    assert est.memory_gib.tracked_peak == pytest.approx(19.0, rel=0.20) and est.verdict == "fits"


def test_the_qwen3_moe_chat_recipe_estimate_is_what_it_says_it_measured():
    """The estimate's half of the check above (the dry run's half is slow: 16 GPUs of CP + PP + EP, ~30 s)."""
    from automodel_dist import estimate_memory

    est = estimate_memory(ROOT / "tests" / "examples" / "qwen3_moe_30b_te_chat_thd.yaml", gpus_per_node=8)
    assert est.memory_gib.tracked_peak == pytest.approx(19.0, rel=0.20) and est.verdict == "fits"


def _gemma4_e4b_tp2_cp2(tmp_path):
    """AutoModel's Gemma-4 E4B TP 2 x CP 2 example (tests/examples), its freeze_config.freeze_embeddings removed as
    AutoModel's own later recipes removed it (0.7.0 refuses the key; trainability unchanged)."""
    text = (ROOT / "tests" / "examples" / "gemma4_e4b_tulu3_text_tp2_cp2.yaml").read_text()
    path = tmp_path / "gemma4_e4b_tp2_cp2.yaml"
    path.write_text("".join(line for line in text.splitlines(keepends=True) if "freeze_embeddings" not in line))
    return path


# "TP2 x CP2, LBS4 / GBS16 completed at 50.03 GiB per GPU" (the example's own header, AutoModel's logged run)
GEMMA4_E4B_TP2_CP2_GIB = 50.03


@pytest.mark.slow
@needs_automodel
def test_the_gemma4_e4b_tp2_cp2_example_is_what_it_says_it_measured(tmp_path):
    """Gemma-4 E4B under TP 2 x CP 2 on 8 GPUs (AutoModel's ring attention, its TP loss gathering the vocabulary-split
    head, E4B's KV-shared layers under selective checkpointing, which AutoModel turns into sub-module checkpointing
    without the attention): the dry run, built whole, lands on the example's logged 50.03 GiB (50.2)."""
    report = dry_run(_gemma4_e4b_tp2_cp2(tmp_path))
    assert report.status == "measured", [(r.error, r.reason) for r in report.ranks]
    assert max(r.peak.total for r in report.ranks) == pytest.approx(GEMMA4_E4B_TP2_CP2_GIB, rel=0.05)


def test_the_gemma4_e4b_tp2_cp2_example_estimate_is_what_it_says_it_measured(tmp_path):
    from automodel_dist import estimate_memory

    est = estimate_memory(_gemma4_e4b_tp2_cp2(tmp_path))
    assert est.memory_gib.tracked_peak == pytest.approx(GEMMA4_E4B_TP2_CP2_GIB, rel=0.15) and est.verdict == "fits"


@pytest.mark.parametrize(
    "ranks,cores,workers",
    [(1, 2, 1), (2, 2, 2), (3, 2, 3), (4, 2, 2), (5, 2, 2), (8, 2, 2), (4, 3, 4), (3, 16, 3), (6, 16, 4)],
)
def test_measured_ranks_run_in_even_rounds(ranks, cores, workers):
    from automodel_dist.dry_run.run import concurrency

    assert concurrency(ranks, cores) == workers


@pytest.mark.parametrize("ranks,cores,both", [(1, 2, True), (2, 2, False), (3, 2, False), (2, 4, True), (3, 16, False)])
def test_a_ranks_builds_run_side_by_side_only_on_idle_cores(ranks, cores, both):
    from automodel_dist.dry_run.run import side_by_side

    assert side_by_side(ranks, cores) is both


def _stub_measure(fail: tuple[int, ...] = (), die: tuple[int, ...] = ()):
    """A stand-in for one build's measurement: a phase, a note, a stand-in's count and an answered call each; the
    builds of the layer counts in ``fail`` raise, those in ``die`` end their process without a word."""
    import os

    from automodel_dist.stack import shims

    def measure(spec, build, phases, rewrites):
        layers = build.hf_config["num_hidden_layers"]
        with phases("build"):
            rewrites.append(f"built {layers} layers")
            shims.LIGER.hits += layers
            shims.CALLS.setdefault("item@stub", {"answer": 1, "calls": 0})["calls"] += layers
        if layers in die:
            os._exit(3)
        if layers in fail:
            with phases("forward"):
                raise ValueError(f"the {layers}-layer build's own error")
        return {"layers": layers}

    return measure


def _two_builds():
    from automodel_dist.dry_run.spec import Build

    return [Build(hf_config={"num_hidden_layers": n}, distributed={}) for n in (3, 4)]


@pytest.fixture
def stub_counts(monkeypatch):
    from automodel_dist.stack import shims

    monkeypatch.setattr(shims.LIGER, "hits", 0)
    monkeypatch.setattr(shims, "CALLS", {})
    return shims


def test_side_by_side_builds_come_back_in_order_with_both_processes_counts(monkeypatch, stub_counts):
    """The fork itself (a stub for the measurement): the shallower build's figures from the child, the deeper from
    this process, and both processes' phase times, stand-in counts, answered calls and notes added up."""
    from automodel_dist.dry_run import worker

    monkeypatch.setattr(worker, "_measure", _stub_measure())
    phases, rewrites = worker.Phases(), []
    out = worker._side_by_side(None, _two_builds(), phases, rewrites)
    assert out == [{"layers": 3}, {"layers": 4}]
    assert sorted(rewrites) == ["built 3 layers", "built 4 layers"]
    assert stub_counts.LIGER.hits == 7 and stub_counts.CALLS["item@stub"]["calls"] == 7
    assert list(phases.seconds) == ["build"]


@pytest.mark.parametrize(
    "fail,die,error",
    [
        ((3,), (), "ValueError: the 3-layer build's own error"),  # the child's
        ((4,), (), "the 4-layer build's own error"),  # this process's
        ((3, 4), (), "ValueError: the 3-layer build's own error"),  # both: the shallower's, as one after the other
        ((), (3,), "ended (3) without a result"),  # the child died
    ],
)
def test_a_side_by_side_builds_failure_is_the_ranks(monkeypatch, stub_counts, fail, die, error):
    from automodel_dist.dry_run import worker

    monkeypatch.setattr(worker, "_measure", _stub_measure(fail, die))
    with pytest.raises(Exception) as caught:
        worker._side_by_side(None, _two_builds(), worker.Phases(), [])
    exc = caught.value
    text = exc.failure["error"] if isinstance(exc, worker._BuildFailed) else str(exc)
    assert error in text
    if isinstance(exc, worker._BuildFailed):
        assert exc.failure["error_phase"] == "forward" and exc.failure["traceback"]


@needs_automodel
def test_side_by_side_builds_measure_what_one_process_measures(tmp_path, monkeypatch):
    """The same rank, its two shallow builds in one process and side by side: the same figures."""
    from automodel_dist.dry_run import run

    model = _config(tmp_path, "meta-llama/Llama-3.2-1B", 12)
    kw = dict(world_size=8, model=model, seq_len=256, micro_batch_size=2)
    reports = {}
    for both in (False, True):
        monkeypatch.setattr(run, "side_by_side", lambda ranks, cores, both=both: both)
        reports[both] = run.dry_run("distributed: {}\nstep_scheduler:\n  local_batch_size: 2\n", **kw)
    [one], [two] = reports[False].ranks, reports[True].ranks
    assert one.status == two.status == "measured" and two.side_by_side and not one.side_by_side
    assert one.peak == two.peak and one.phase_peaks_gib == two.phase_peaks_gib and one.builds == two.builds
    # the same stand-ins acted (how often can differ: DTensor's sharding propagation is cached per process, so the
    # second build in one process asks for fewer)
    assert one.shim_hits.keys() == two.shim_hits.keys() and reports[False].substitutions == reports[True].substitutions


def test_a_gemma4_ffpa_ring_is_planned_with_the_kernels_stood_in(tmp_path):
    """cp_full_attn_backend: ffpa goes into the built config's text_config (Gemma-4's model attaches its ring by it),
    the rank runs FFPA's stand-ins, and the report says the batch's chunks take FFPA's dense path only."""
    import yaml

    recipe = yaml.safe_load(_gemma4_e4b_tp2_cp2(tmp_path).read_text())
    recipe["model"]["text_config"]["cp_full_attn_backend"] = "ffpa"
    path = tmp_path / "ffpa.yaml"
    path.write_text(yaml.safe_dump(recipe))
    plan = plan_dry_run(Request.of(path))
    [spec] = plan.specs
    assert spec.recipe.ffpa and spec.build.hf_config["text_config"]["cp_full_attn_backend"] == "ffpa"
    assert any("FFPA's dense path" in s and "varlen" in s for s in plan.substitutions)
    flex = plan_dry_run(Request.of(_gemma4_e4b_tp2_cp2(tmp_path)))  # the recipe as AutoModel ships it: flex
    assert not flex.specs[0].recipe.ffpa and "cp_full_attn_backend" not in flex.specs[0].build.hf_config["text_config"]


LAYER_GROUPS = """
import json, warnings
import torch
from nemo_automodel.components.distributed import parallelizer
from nemo_automodel.components.models.common import BackendConfig
from nemo_automodel.components.models.muse_glimmer.config import MuseGlimmerConfig
from nemo_automodel.components.models.muse_glimmer.model import MuseGlimmerForConditionalGeneration
from automodel_dist.stack import shims

def model(layers):
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 50, "num_attention_heads": 2}
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MuseGlimmerForConditionalGeneration(MuseGlimmerConfig(text_config=text, vision_config=vision),
                                                   backend=BackendConfig(attn="sdpa"))

def language(m):
    layers = parallelizer._extract_model_layer_groups(m)["language"]
    return [len(layers), layers[0] is m.model.layers[0]]

shallow = model(4)
out = {"full": language(model(52)), "shallow": language(shallow)}
with shims.full_depth_layer_groups(4, 52):
    out["shallow_at_full_depth"] = language(shallow)
with shims.full_depth_layer_groups(4, 48):  # a model of 48 layers: the tower's 50 blocks win at full depth too
    out["shallow_at_48"] = language(shallow)
out["after"] = type(shallow.model.layers).__name__


class Inner(torch.nn.Module):  # AutoModel's MoE classes keep their layers in a ModuleDict by index
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(2, 2) for i in range(n)})


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner(4)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(6)])

    @property
    def layers(self):  # a wrapper handing back its child's list (found once)
        return self.model.layers


outer = Outer()
first = lambda groups: groups["language"][0] is outer.model.layers["0"]
out["dict_shallow"] = first(parallelizer._discover_layer_groups(outer))
with shims.full_depth_layer_groups(4, 10):
    out["dict_at_full_depth"] = first(parallelizer._discover_layer_groups(outer))
out["dict_after"] = type(outer.model.layers).__name__
out["hits"] = shims.FULL_DEPTH_LAYER_GROUPS.hits
print(json.dumps(out))
"""


@needs_automodel
def test_a_shallow_build_keeps_the_layer_groups_automodel_finds_at_full_depth():
    """AutoModel finds Muse-Glimmer's layers by structure (per group the longest ModuleList), and groups the 50 tower
    blocks under vision_encoder.transformer with the decoder layers (it names no such path as a tower): at full depth
    its 52 decoder layers win, in a 4-layer build the tower blocks would, taking the activation checkpointing and the
    per-layer wrapping (AutoModel's own discovery, on the meta device). With the dry run's shim the shallow build's
    group is its decoder list, as at full depth (and the tower's where the model is shallower than the tower at full
    depth too), a ModuleDict of layers as a ModuleList, a container a property hands back counted once, and every
    container is left its own class."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LAYER_GROUPS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    groups = json.loads(out.stdout.strip().splitlines()[-1])
    assert groups == {
        "full": [52, True],
        "shallow": [50, False],
        "shallow_at_full_depth": [4, True],
        "shallow_at_48": [50, False],
        "after": "ModuleList",
        "dict_shallow": False,
        "dict_at_full_depth": True,
        "dict_after": "ModuleDict",
        "hits": 2,  # the two discoveries whose choice the shallow build would have made otherwise
    }
