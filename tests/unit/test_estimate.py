"""Memory/communication model and search: checked against torch's memory tracker and published facts."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import estimate_memory, suggest_strategy, validate_config
from automodel_dist.api import analyze
from automodel_dist.catalog.models import lookup, with_mtp_depth
from automodel_dist.cli import main
from automodel_dist.estimate.memory import (
    LOSS_BYTES,
    MAX_ACTIVE_STAGES,
    Training,
    _memory_of_pp_rank,
    activation_formula_korthikanti,
    grad_sync_deferred,
    head_gathers_in_forward,
    megatron_prefetch_layers,
    megatron_queued_layers,
    memory_per_rank,
    moe_forward_bytes,
)
from automodel_dist.estimate.peft import QLORA_BYTES, lora_of
from automodel_dist.report import ConfigError
from automodel_dist.request import Request
from support.builders import dims, torch_version
from support.paths import EXAMPLES, TESTS

GIB = float(1 << 30)
_TORCH = torch_version()


L8 = "meta-llama/Llama-3.1-8B"


def test_mixed_precision_adam_is_16_bytes_per_param():
    spec = lookup(L8)  # ZeRO (Rajbhandari et al. 2020): 2 + 2 + 12 = 16 bytes/param for mixed-precision Adam
    mem = memory_per_rank(spec, dims("ddp", dp=1), Training(storage_dtype="float32"))
    assert mem.model_states * GIB == pytest.approx(16 * spec.param_count())
    bf16 = memory_per_rank(spec, dims("ddp", dp=1), Training(storage_dtype="bfloat16"))
    assert bf16.model_states * GIB == pytest.approx(8 * spec.param_count())  # AutoModel's default bf16 weights
    sharded = memory_per_rank(spec, dims("fsdp2", dp=8), Training(storage_dtype="float32"))
    assert sharded.model_states == pytest.approx(mem.model_states / 8)


def test_korthikanti_formula_at_published_settings():
    # GPT-3 175B (a=96, s=2048, h=12288): "5as/h = 80", larger than the 34 of the rest of the layer.
    s, b, h, a = 2048, 1, 12288, 96
    assert 5 * a * s / h == 80
    assert activation_formula_korthikanti(s, b, h, a) == s * b * h * (34 + 80)
    # Table 2: tensor parallel (10 + 24/t + 5as/ht), +SP (34/t + 5as/ht), selective+SP (34/t), full (2sbh).
    assert activation_formula_korthikanti(s, b, h, a, 8) == s * b * h * (10 + 24 / 8 + 80 / 8)
    assert activation_formula_korthikanti(s, b, h, a, 8, sp=True) == s * b * h / 8 * (34 + 80)
    assert activation_formula_korthikanti(s, b, h, a, 8, sp=True, recompute="selective") == s * b * h * 34 / 8
    assert activation_formula_korthikanti(s, b, h, a, recompute="full") == 2 * s * b * h


def test_estimate_memory_api_on_a_real_recipe():
    est = estimate_memory(EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml", model="Qwen/Qwen3-30B-A3B")
    assert est.world_size == 16 and est.seq_len == 1024 and est.fits
    assert set(est.comm_bytes_per_step) == {"dp_shard_cp", "ep_shard", "cp", "pp", "ep"}
    assert est.step_time_s > 0 and 0 < est.mfu < 1
    m = est.memory_gib
    assert m.total == pytest.approx(
        m.params
        + m.optimizer
        + m.activations
        + m.buffers
        + m.overhead
        + (m.grads if m.peak_phase == "end-of-backward" else 0),
        rel=1e-6,
    )
    # PP with FSDP2 and AutoModel's default defer_fsdp_grad_sync: true: torch's schedule runs a stage's backwards
    # without gradient sync and reduce-scatters right after that stage's last microbatch (REDUCE_GRAD). This recipe's
    # interleaved schedule (24 stages of 2 layers, 12 per rank) runs its 2 microbatches in one round, so about one
    # stage's gradients are held unsharded in fp32 at a time, not the rank's 12 (AutoModel's own step on fake
    # tensors: 18.6 GiB peak; the recipe: "Verified at ~19 GiB/GPU", AutoModel's max_memory_allocated)
    from automodel_dist.estimate.memory import GIB, _rank_groups

    p = analyze(Request.of(EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml", model="Qwen/Qwen3-30B-A3B")).dims
    g = _rank_groups(lookup("Qwen/Qwen3-30B-A3B"), p, m.worst_pp_rank)
    spr = p.stages_per_rank_of(48)
    assert spr == 12
    if m.deferred_grads:
        # (the last rank's peak, its last microbatch's loss, comes in its last stage's backward: the head's whole)
        head = g.lm_head if m.worst_pp_rank == p.pp - 1 else 0.0
        assert m.deferred_grads == pytest.approx(((g.dense + g.experts - head) / spr + head) * 4 / GIB, rel=1e-9)
    assert m.tracked_peak == pytest.approx(19.0, rel=0.20)
    # defer_fsdp_grad_sync: false reduce-scatters after every backward: no held gradients, more traffic; the sharded
    # gradients of the step's earlier accumulation steps (two pipeline steps of this recipe's batch) stay through the
    # next one's backward, in the parameters' dtype
    eager = estimate_memory(
        EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml",
        model="Qwen/Qwen3-30B-A3B",
        overrides=["distributed.defer_fsdp_grad_sync=false"],
    )
    assert eager.memory_gib.deferred_grads == 0
    assert eager.memory_gib.peak_phase == "in-backward"
    assert eager.memory_gib.grads == pytest.approx(eager.memory_gib.params, rel=1e-6)
    assert eager.memory_gib.tracked_peak == pytest.approx(19.0, rel=0.20)
    for axis in ("dp_shard_cp", "ep_shard"):  # (deferred, torch's stage reduces once a schedule step)
        assert eager.comm_bytes_per_step[axis] > est.comm_bytes_per_step[axis]


def test_deferred_gradient_sync_is_held_only_when_automodel_defers_it():
    """Held gradients exist with several backward passes per step (gradient accumulation, or PP with any
    number) and defer_fsdp_grad_sync true, on FSDP2 only; PP does not keep blocks gathered by itself (AutoModel
    0.7.0's dense path never sees a pp dim in its FSDP mesh) but a deferred pipeline backward does."""
    spec = lookup("meta-llama/Llama-3.1-8B")
    tr = Training(seq_len=2048, micro_batch_size=1, storage_dtype="bfloat16")

    def held(p: Any, gbs: int | None = None, n_mb: int | None = None) -> float:
        return memory_per_rank(
            spec, p, dataclasses.replace(tr, global_batch_size=gbs, pp_microbatches=n_mb)
        ).deferred_grads

    assert held(dims("fsdp2", dp=8)) == 0  # one backward per step
    assert held(dims("fsdp2", dp=8), gbs=16) > 25  # two: all 8B gradients unsharded in fp32 (~30 GiB)
    assert held(dims("fsdp2", dp=8, defer_fsdp_grad_sync=False), gbs=16) == 0
    assert held(dims("megatron_fsdp", dp=8), gbs=16) == 0
    assert held(dims("ddp", dp=8), gbs=16) == 0
    assert held(dims("fsdp2", dp=4, pp=2, pp_schedule="1F1B"), n_mb=1) > 12  # PP: always deferred
    assert held(dims("fsdp2", dp=4, pp=2, pp_schedule="1F1B", defer_fsdp_grad_sync=False), n_mb=4) == 0
    assert dims("fsdp2", pp=2).blocks_reshard and dims("fsdp2", ep=2).blocks_reshard is False
    assert dims("fsdp2", ep=2, moe_reshard_after_forward=True).blocks_reshard
    assert dims("fsdp2", ep=2, reshard_after_forward=True).blocks_reshard


@pytest.mark.parametrize(
    ("wrap_outer", "sync_class", "optimizations", "defer", "pp", "passes", "deferred"),
    [
        # an FSDP module wraps the model part: defer_fsdp_grad_sync decides (get_sync_ctx; torch's stage, or
        # AutoModel's patched FSDPModule branch with reduce_grad_per_microbatch = not defer)
        (True, True, True, True, 2, 1, True),
        (True, True, True, False, 2, 1, False),
        (True, True, False, True, 1, 4, True),
        (True, True, True, False, 1, 4, False),
        (True, False, False, True, 1, 1, False),  # one backward, nothing to defer
        # moe.wrap_outer_model false: only the class's MoEFSDPSyncMixin turns the sync off on the inner units
        (False, True, False, True, 2, 1, False),  # torch's stage: a plain backward (nemotron_ultra_v3_squad)
        (False, True, True, True, 2, 1, True),  # the patched stage backward's MoEFSDPSyncMixin branch
        (False, True, False, False, 2, 1, True),  # patched for reduce_grad_per_microbatch: that branch ignores it
        (False, False, False, False, 2, 1, False),  # no mixin: a plain backward either way
        (False, True, False, True, 1, 4, False),  # get_sync_ctx finds no FSDP module; no optimizations
        (False, True, True, False, 1, 4, True),  # prepare_for_grad_accumulation, whatever defer says
        # the LLM KD recipe calls prepare_for_grad_accumulation only under PP (kd.py); a VLM class's decoder units
        # hang under its text module, which the mixin's walk does not reach (_iter_fsdp_module_candidates)
        pytest.param(False, True, True, True, 1, 4, False, id="kd-no-pp"),
        pytest.param(False, True, True, True, 2, 1, True, id="kd-pp"),
        pytest.param(False, True, True, True, 1, 4, False, id="vlm"),
        pytest.param(True, True, True, True, 1, 4, True, id="vlm-outer-wrapped"),
    ],
)
def test_gradient_sync_deferral_follows_whichever_module_automodel_makes_the_fsdp_root(
    request: pytest.FixtureRequest,
    wrap_outer: bool,
    sync_class: bool,
    optimizations: bool,
    defer: bool,
    pp: int,
    passes: int,
    deferred: bool,
) -> None:
    """AutoModel 0.7.0's paths that turn FSDP2's gradient sync off (distributed/utils.get_sync_ctx,
    moe/fsdp_mixin.py prepare_for_grad_accumulation and patched_backward_maybe_with_nosync, pipelining/functional.py
    where it installs that patch, torch's PipelineStage.backward_maybe_with_nosync)."""
    p = dims(
        "fsdp2", dp=8, ep=8, pp=pp, moe_wrap_outer_model=wrap_outer, defer_fsdp_grad_sync=defer, pp_schedule="1F1B"
    )
    case = request.node.callspec.id
    tr = Training(
        moe_sync_class=sync_class,
        fsdp_sync_mixin=sync_class and optimizations,
        teacher=lookup("Qwen/Qwen3-30B-A3B") if case.startswith("kd") else None,
        vlm_step=case.startswith("vlm"),
    )
    assert grad_sync_deferred(p, tr, passes) is deferred
    assert not grad_sync_deferred(dims("ddp", dp=8), tr, 4)


def test_the_estimate_trains_what_automodel_trains_on_nemotron_ultras_pipeline():
    """nemotron_ultra_v3_squad's layout (PP 4 x EP 64, moe.wrap_outer_model and enable_fsdp_optimizations false,
    patch_causal_lm_model false, FusedLinearCrossEntropy): AutoModel trains MaskedCrossEntropy (its fallback: the
    model's own forward returns logits) and reduces the gradients after every backward (no FSDP module wraps the
    model part and nothing patches the stage). The dry run of the recipe, 54.3 GiB on its last rank, holds no
    unsharded gradient at its peak; the estimate had counted 17.8 GiB of them, and no logits."""
    recipe = {
        "recipe": "TrainFinetuneRecipeForNextTokenPrediction",
        "model": {
            "pretrained_model_name_or_path": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
            "backend": {"enable_fsdp_optimizations": False},
        },
        "distributed": {
            "strategy": "fsdp2",
            "pp_size": 4,
            "ep_size": 64,
            "activation_checkpointing": True,
            "pipeline": {
                "pp_schedule": "interleaved1f1b",
                "pp_microbatch_size": 1,
                "layers_per_stage": 14,
                "round_virtual_stages_to_pp_multiple": "down",
                "patch_causal_lm_model": False,
            },
            "moe": {"wrap_outer_model": False},
        },
        "step_scheduler": {"global_batch_size": 256, "local_batch_size": 4},
        "loss_fn": {"_target_": "nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy"},
    }
    est = estimate_memory(recipe, world_size=256, seq_len=4096)
    assert est.memory_gib.deferred_grads == 0
    assert any("MaskedCrossEntropy in place of the recipe's FusedLinearCrossEntropy" in r for r in est.workload)
    assert est.memory_gib.tracked_peak == pytest.approx(54.31, rel=0.07)  # the dry run's rank 192 (-4.7%)
    patched = json.loads(json.dumps(recipe))
    patched["model"]["backend"]["enable_fsdp_optimizations"] = True  # the mixin's patched stage backward defers
    assert estimate_memory(patched, world_size=256, seq_len=4096).memory_gib.deferred_grads > 10
    own = json.loads(json.dumps(recipe))
    del own["distributed"]["pipeline"]["patch_causal_lm_model"]  # its class keeps its own forward under PP anyway
    assert any("keeps its own forward" in r for r in estimate_memory(own, world_size=256, seq_len=4096).workload)
    unsplit = json.loads(json.dumps(recipe))
    unsplit["distributed"].update(pp_size=1, pipeline=None)  # without PP the hidden states reach the loss
    unsplit["step_scheduler"]["global_batch_size"] = 1024
    assert not any("in place of" in r for r in estimate_memory(unsplit, world_size=256, seq_len=4096).workload)


def test_suggest_sizes_each_candidate_with_the_loss_automodel_trains_for_it():
    """A recipe with FusedLinearCrossEntropy on Nemotron-3 Ultra, whose class keeps its own forward under PP: every
    pipeline candidate trains MaskedCrossEntropy (AutoModel's fallback), and suggest's figure for it is the estimate's
    for the candidate's own recipe."""
    recipe = {
        "recipe": "TrainFinetuneRecipeForNextTokenPrediction",
        "model": {"pretrained_model_name_or_path": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"},
        "distributed": {"strategy": "fsdp2", "pp_size": 4, "ep_size": 64, "activation_checkpointing": True},
        "step_scheduler": {"global_batch_size": 256, "local_batch_size": 4},
        "dataset": {"seq_length": 4096},
        "loss_fn": {"_target_": "nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy"},
    }
    rep = suggest_strategy(config=recipe, nodes=32, gpus_per_node=8, top_k=8)
    piped = [c for c in rep.candidates if c.distributed.get("pp_size", 1) > 1]
    assert piped
    for c in rep.candidates:
        est = estimate_memory({**recipe, **yaml.safe_load(c.yaml)}, world_size=256)
        assert c.memory_gib.total == pytest.approx(est.memory_gib.total, rel=1e-9)
        fell_back = any("MaskedCrossEntropy in place of" in r for r in est.workload)
        assert fell_back is (c.distributed.get("pp_size", 1) > 1)


def test_suggest_checks_each_candidate_with_the_recipes_loss_and_recipe_as_written():
    """Each candidate is validated with the recipe's loss_fn and its recipe: value as written: the linear cross
    entropy's MegatronFSDP warning reaches a MegatronFSDP candidate, and a recipe class named by its dotted path stays
    the recipe's own (no candidate rejected as an unknown recipe)."""
    loss = {"_target_": "nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy"}
    base = {"model": {"pretrained_model_name_or_path": "meta-llama/Llama-3.2-1B"}, "loss_fn": loss}
    base |= {"step_scheduler": {"global_batch_size": 32, "local_batch_size": 4}, "dataset": {"seq_length": 2048}}
    rep = suggest_strategy(config=base, nodes=1, gpus_per_node=8, top_k=8, strategies=["megatron_fsdp"])
    assert rep.candidates and all(c.distributed["strategy"] == "megatron_fsdp" for c in rep.candidates)
    for c in rep.candidates:
        assert "megatron-fsdp-linear-ce" in {f.rule for f in c.findings}
    custom = {**base, "recipe": {"_target_": "mypkg.recipes.MyRecipe"}}
    rep = suggest_strategy(config=custom, nodes=1, gpus_per_node=8, top_k=4)
    assert rep.candidates, [r.reason for r in rep.rejected]


def test_an_embedding_of_its_own_stays_gathered_where_the_blocks_do_not_reshard_after_forward():
    """AutoModel's MoE parallelizer wraps the untied embedding with the blocks' reshard_after_forward
    (moe.reshard_after_forward, false by default): it stays gathered from its forward to its post-backward at the
    step's end (the dry run of moonlight_16b_te_deepep and customizer_gpt_oss_full_sft_chat after the loss). Read as
    the extra table a doubled vocabulary adds, with and without the reshard (the head's is there in both)."""
    spec = lookup("moonshotai/Moonlight-16B-A3B")
    assert not spec.tie_word_embeddings
    wide = dataclasses.replace(spec, vocab_size=2 * spec.vocab_size)
    tr = Training(seq_len=4096)

    def added(reshard: bool) -> float:
        p = dims("fsdp2", dp=8, ep=8, moe_reshard_after_forward=reshard)
        at = [_memory_of_pp_rank(m, p, tr, 0)["phases"]["start-of-backward"][2] for m in (spec, wide)]
        return at[1] - at[0]

    assert added(False) - added(True) == pytest.approx(spec.vocab_size * spec.hidden_size * 2)
    # resharded after forward, it is gathered again for the first block's backward (FSDP's default backward prefetch
    # of the unit before it in forward order) and its own: in the late-backward and end-of-backward moments alone
    p = dims("fsdp2", dp=8, ep=8, moe_reshard_after_forward=True)
    narrow, broad = (_memory_of_pp_rank(m, p, tr, 0)["phases"] for m in (spec, wide))
    table = spec.vocab_size * spec.hidden_size * 2

    def grew(phase: str) -> float:
        return broad[phase][2] - narrow[phase][2]

    assert grew("late-backward") - grew("in-backward") == pytest.approx(table)


def test_an_mtps_use_of_the_embedding_holds_it_gathered_and_its_gradient_through_the_decoders_backward():
    """The MTP embeds its shifted tokens with the model's own embedding and runs its backward first: from there to the
    step's end the embedding's own FSDP unit stays gathered and autograd holds the MTP's gradient of the table, two
    tables beside the decoder's backward (the dry run of nemotron_ultra_v3_te_deepep: both 2 GiB tables at its first
    layer's backward, 47.9 GiB); the MTP's activations are gone by then. At the embedding's own backward it is
    gathered, MTP or not. Not with a tied or LoRA-frozen embedding (no unit of its own), nor where the MTP is handed
    the decoder's embeddings (Qwen3.5's VLM classes under CP)."""
    spec = lookup("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16")
    assert spec.mtp_layers and not spec.tie_word_embeddings
    tr = Training(seq_len=4096, loss="FusedLinearCrossEntropy")
    # (the recipe's moe.reshard_after_forward: true; false keeps the table gathered from the forward on, one less here)
    p = dims("fsdp2", dp=128, ep=64, activation_checkpointing=True, moe_reshard_after_forward=True)
    table = spec.vocab_size * spec.hidden_size * 2
    with_mtp = _memory_of_pp_rank(spec, p, tr, 0)["phases"]
    without = _memory_of_pp_rank(dataclasses.replace(spec, mtp_layers=0), p, tr, 0)["phases"]
    # (beside the MTP depth's own gathered parameters, there from the loss on)
    gathered = with_mtp["start-of-backward"][2] - without["start-of-backward"][2]
    # (without an MTP the first block's backward prefetches the embedding too: one table of the two there either way)
    for phase, held in (("in-backward", 2 * table + gathered), ("late-backward", table + gathered)):
        assert with_mtp[phase][2] - without[phase][2] == pytest.approx(held), phase
    assert with_mtp["end-of-backward"][2] - without["end-of-backward"][2] == pytest.approx(0)
    kept = dataclasses.replace(p, moe_reshard_after_forward=False)
    on, off = (_memory_of_pp_rank(s, kept, tr, 0)["phases"] for s in (spec, dataclasses.replace(spec, mtp_layers=0)))
    assert on["in-backward"][2] - off["in-backward"][2] == pytest.approx(
        table + on["start-of-backward"][2] - off["start-of-backward"][2]
    )
    # the MTP depth's activations: at the loss, not at the decoder's last block's backward
    assert with_mtp["start-of-backward"][1] > without["start-of-backward"][1]
    assert with_mtp["in-backward"][1] - without["in-backward"][1] < (
        with_mtp["start-of-backward"][1] - without["start-of-backward"][1]
    )
    # a repeated depth's MoE sublayer is not checkpointed (AutoModel's apply_ac): more kept at the loss than two
    # physical depths, checkpointed
    repeated = _memory_of_pp_rank(with_mtp_depth(spec, 2, repeated=True), p, tr, 0)["phases"]
    twice = _memory_of_pp_rank(with_mtp_depth(spec, 2), p, tr, 0)["phases"]
    assert repeated["start-of-backward"][1] > twice["start-of-backward"][1]
    # Qwen3.5's VLM classes hand their MTP the decoder's own embeddings under CP: no second use of the table
    qwen = lookup("Qwen/Qwen3.6-27B")
    assert qwen.mtp_layers and not qwen.tie_word_embeddings
    vlm = Training(seq_len=4096, vlm_step=True)
    for cp, tables in ((1, 2), (2, 0)):
        q = dims("fsdp2", dp=8 // cp, cp=cp, activation_checkpointing=True)
        on = _memory_of_pp_rank(qwen, q, vlm, 0)["phases"]
        off = _memory_of_pp_rank(dataclasses.replace(qwen, mtp_layers=0), q, vlm, 0)["phases"]
        extra = (
            on["in-backward"][2] - off["in-backward"][2] - (on["start-of-backward"][2] - off["start-of-backward"][2])
        )
        assert extra == pytest.approx(tables * qwen.vocab_size * qwen.hidden_size * 2), cp
    lora = Training(seq_len=4096, loss="FusedLinearCrossEntropy", lora=lora_of(spec, {"match_all_linear": True}))
    adapted = _memory_of_pp_rank(spec, p, lora, 0)["phases"]
    plain = _memory_of_pp_rank(dataclasses.replace(spec, mtp_layers=0), p, lora, 0)["phases"]
    for phase in ("in-backward", "late-backward"):
        assert adapted[phase][2] - plain[phase][2] == pytest.approx(
            adapted["start-of-backward"][2] - plain["start-of-backward"][2]
        )


@pytest.mark.parametrize("ep", [1, 8])
def test_qlora_leaves_a_transformers_moe_classs_routed_experts_in_the_compute_dtype(ep):
    """bitsandbytes quantizes Linear modules; transformers' MoE classes hold their routed experts as 3D parameters
    (test_catalog builds them), so they stay bf16 (qwen1_5_moe_a2_7b_qlora: the dry run's 3.5 GiB of parameters on a
    rank, the estimate 3.1, where it had 1.0 with the experts quantized: -13.5% -> -7.7%). Under QLoRA AutoModel
    always builds transformers' class (its own do not load BnB weights: test_workload), so the estimate reads it so."""
    spec = lookup("Qwen/Qwen3-30B-A3B")
    lora = lora_of(spec, {"match_all_linear": True}, {"load_in_4bit": True})
    assert lora.quant_bits == 4
    p = dims("fsdp2", dp=8, ep=ep)
    own, hf = (_memory_of_pp_rank(spec, p, Training(lora=lora, hf_class=c), 0)["params"] for c in (False, True))
    experts = spec.num_layers * spec.num_experts * spec.expert_params() / 8  # a rank's share (FSDP or EP over 8)
    assert hf - own == pytest.approx(experts * (2 - QLORA_BYTES[4]), rel=0.01)


def test_a_recipes_own_foreach_true_keeps_the_foreach_step_under_tp():
    """AutoModel turns foreach off under TP only where the recipe gives none (optim/optimizer.py: the factory path
    keeps an explicit value): the foreach step's group-sized temporary is there under TP with foreach: true."""
    from automodel_dist.estimate.training import optimizer_of
    from automodel_dist.workload import read_workload

    def step(kwargs: dict, tp: int) -> float:
        w = read_workload({"optimizer": {"_target_": "torch.optim.Adam", **kwargs}})
        return optimizer_of(w, storage="bfloat16")[0].step_bytes(2, tp)

    assert step({}, 1) == step({"foreach": True}, 1) == step({"foreach": True}, 2) == 2.0
    assert step({}, 2) == step({"foreach": False}, 1) == 0.0


def test_plain_expert_gradients_are_made_layer_by_layer_within_one_backward():
    """Routed experts outside FSDP (ep_shard 1) keep plain .grad from their layer's backward to the optimizer step.
    Within one microbatch's backward they are made layer by layer: at the last layer's backward that layer's alone,
    every one by the first layer's (the late-backward moment), where the activations are gone (the dry run of
    customizer_nemotron_nano_full_sft, one microbatch: its peak at the optimizer step, 36.8 GiB, where the estimate
    had held them all beside every activation, +12%). Accumulating, the earlier microbatches' are there throughout."""
    spec = lookup("Qwen/Qwen3-30B-A3B")
    p = dims("fsdp2", dp=8, ep=8, activation_checkpointing=True)
    assert p.experts_outside_fsdp
    experts = 128 // 8 * 3 * spec.hidden_size * spec.moe_intermediate_size * 2  # a layer's 16 experts, bf16
    one = _memory_of_pp_rank(spec, p, Training(seq_len=4096, global_batch_size=8), 0)["phases"]
    assert one["in-backward"][0] == pytest.approx(experts)
    assert one["late-backward"][0] >= experts * (spec.num_layers - 1)
    accumulating = _memory_of_pp_rank(spec, p, Training(seq_len=4096, global_batch_size=16), 0)["phases"]
    assert accumulating["in-backward"][0] >= experts * spec.num_layers


def test_the_last_stages_plain_expert_gradients_are_held_at_its_later_backwards():
    """Routed experts on a one-rank ep_shard mesh keep plain .grad from their layer's backward to the optimizer
    step. The last pipeline stage alternates forward and backward, so at its last microbatch's backward, with as
    many activations in flight as at its first, its experts' gradients from the earlier backwards are there (the
    dry run of nemotron_ultra_v3_squad's last rank: 14 expert gradients of 160 MiB at its peak, its last stage's
    fourth backward). Other ranks, one microbatch, and sharded experts: not counted."""
    spec = lookup("Qwen/Qwen3-30B-A3B")
    tr = Training(seq_len=4096, pp_microbatches=4, loss="FusedLinearCrossEntropy")  # (no logits to peak at)
    p = dims("fsdp2", dp=8, pp=2, ep=8, pp_schedule="1F1B", activation_checkpointing=True)

    def grads(p: Any, tr: Training, rank: int) -> float:
        return _memory_of_pp_rank(spec, p, tr, rank)["grads"]

    # a rank's 24 MoE layers' 16 experts (gate, up and down projections), bf16
    experts = 16 * 3 * spec.hidden_size * spec.moe_intermediate_size * spec.num_layers / 2
    assert _memory_of_pp_rank(spec, p, tr, 1)["peak_phase"] == "in-backward"
    assert grads(p, tr, 1) == pytest.approx(experts * 2, rel=0.01)
    # the term is read in the in-backward phase itself, where it is or is not the peak
    assert _memory_of_pp_rank(spec, p, tr, 1)["phases"]["in-backward"][0] == pytest.approx(experts * 2, rel=0.01)
    sharded = dims("fsdp2", dp=16, pp=2, ep=8, pp_schedule="1F1B", activation_checkpointing=True)
    for other, training, rank in ((p, tr, 0), (p, dataclasses.replace(tr, pp_microbatches=1), 1), (sharded, tr, 1)):
        assert _memory_of_pp_rank(spec, other, training, rank)["phases"]["in-backward"][0] == 0
    # two schedule steps an optimizer step (8 ranks x 4 microbatches x 2): from the second on, every stage's, the
    # first rank's too
    accumulating = dataclasses.replace(tr, global_batch_size=64)
    for rank in (0, 1):
        held = _memory_of_pp_rank(spec, p, accumulating, rank)["phases"]["in-backward"][0]
        assert held == pytest.approx(experts * 2, rel=0.01)


def test_megatron_fsdp_prefetch_window_and_reduce_queue():
    """megatron_fsdp 0.5.0's sizes (megatron_fsdp.py: under ZeRO-3 the communication unit is twice the mean block's
    parameters, counted whole, at least 1e9 elements, and 1e9 below it; the all-gather prefetch takes half of it, the
    reduce-scatter queue all of it, both filled with the rank's local, padded buckets). Llama-3.2-1B's 16 blocks of
    60,882,944 elements prefetch 9 (8 are 487M, under 500M) and queue all 16; Llama-3.1-70B's 855.6M-element blocks
    make the unit 1.71e9: one block ahead, two queued (a padded bucket is a little over half of it), two under
    ZeRO-2's 1e9; under TP 4 its local quarter-blocks fill the same whole-block unit four and eight times."""
    l1b = 60_882_944
    assert megatron_prefetch_layers(l1b, l1b, 16) == 9
    assert megatron_queued_layers(l1b, l1b, 16, 3) == 16
    l70 = 855_654_400
    assert megatron_prefetch_layers(l70, l70, 80) == 1
    assert megatron_queued_layers(l70, l70, 80, 3) == 2
    assert megatron_queued_layers(l70, l70, 80, 2) == 2  # (a 1e9 unit: one bucket fits, and the new one)
    assert megatron_prefetch_layers(l70 / 4, l70, 80) == 4 and megatron_queued_layers(l70 / 4, l70, 80, 3) == 8
    assert megatron_prefetch_layers(l1b, l1b, 4) == 4 and megatron_prefetch_layers(0, 0, 0) == 0
    assert megatron_queued_layers(0, 0, 0, 3) == 0


def test_megatron_fsdp_terms_move_the_estimate_as_its_buffers_do():
    """Against the same layout under FSDP2's accounting: MegatronFSDP's sharded gradient buffer is there in every
    phase (a bf16 shard of the model), preserve_fp32_weights adds an fp32 main copy, fp32 states and, at the end of
    backward, fp32 gradients; grad_reduce_in_fp32 makes the buffer fp32. (The figures themselves are held to the dry
    run of megatron-fsdp in tests/integration/test_dry_run_megatron.py.)"""
    spec, tr = lookup("meta-llama/Llama-3.2-1B"), Training(seq_len=1024, micro_batch_size=8)
    base = memory_per_rank(spec, dims("megatron_fsdp", dp=8), tr)
    shard = spec.param_count() * 2 / 8 / GIB
    assert base.grads == pytest.approx(shard, rel=1e-3) and base.peak_phase == "start-of-backward"
    main = memory_per_rank(spec, dims("megatron_fsdp", dp=8, megatron_fp32_main_weights=True), tr)
    assert main.params - base.params == pytest.approx(2 * shard, rel=1e-3)  # fp32 copy: 4 bytes a parameter
    assert main.optimizer == pytest.approx(2 * base.optimizer, rel=1e-3)
    fp32 = memory_per_rank(spec, dims("megatron_fsdp", dp=8, megatron_fp32_grads=True), tr)
    assert fp32.grads == pytest.approx(2 * shard, rel=1e-3)
    short = Training(seq_len=256, micro_batch_size=1)  # activations small: the root's backward peaks
    assert memory_per_rank(spec, dims("megatron_fsdp", dp=8), short).peak_phase == "end-of-backward"


def test_moe_fsdp_optimizations_keep_every_unit_gathered_into_the_next_microbatch():
    """AutoModel's MoE classes with model.backend.enable_fsdp_optimizations turn reshard_after_backward off for every
    backward but a step's last (moe/fsdp_mixin.py): the next microbatch's forward starts with the rank's units all
    gathered. Its dry run on fake tensors (Nemotron-3 Super, LoRA, EP 64 on 64 GPUs, 4 microbatches, blocks that
    reshard after forward) peaks there; without accumulation, without the flag, or with blocks kept gathered anyway
    the phases are not there. The dry run peaks in a microbatch's backward at its first MoE layer's recompute with
    every unit gathered again (24.3 GiB; 23.9 in the next forward)."""
    spec = lookup("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16")
    p = dims("fsdp2", dp=64, ep=64, moe_reshard_after_forward=True, activation_checkpointing=True)
    lora = lora_of(spec, {"dim": 32, "exclude_modules": ["*.out_proj"], "moe_rank_scaling": True})
    tr = Training(
        seq_len=4096,
        micro_batch_size=2,
        global_batch_size=512,
        lora=lora,
        loss="MaskedCrossEntropy",
        fp32_upcast=False,  # the recipe's bf16 logits
        dispatcher="hybridep",
        experts="torch_mm",
        fsdp_sync_mixin=True,
    )
    out = memory_per_rank(spec, p, tr)
    assert out.peak_phase == "gathered-late-backward"
    # every non-expert layer parameter (6.85e9, bf16) gathered
    assert out.buffers > 6.85e9 * 2 / 2**30
    phases = _memory_of_pp_rank(spec, p, tr, 0)["phases"]
    nxt = phases["next-microbatch-forward"]
    assert nxt[1] == pytest.approx(8192 * moe_forward_bytes(spec, tr))  # one MoE layer's routed working set
    assert phases["gathered-late-backward"][2] > nxt[2]  # every unit and the first blocks' backward
    mixin_phases = ("next-microbatch-forward", "gathered-late-backward")
    for other in (
        dataclasses.replace(tr, fsdp_sync_mixin=False),
        dataclasses.replace(tr, global_batch_size=128),  # one microbatch a step
    ):
        assert memory_per_rank(spec, p, other).peak_phase not in mixin_phases
    kept = dims("fsdp2", dp=64, ep=64, moe_reshard_after_forward=False, activation_checkpointing=True)
    assert memory_per_rank(spec, kept, tr).peak_phase not in mixin_phases
    # the mixin drives torch FSDP2 units only: Megatron-FSDP's wrapper is none
    megatron = dims("megatron_fsdp", dp=64, activation_checkpointing=True)
    assert memory_per_rank(spec, megatron, tr).peak_phase not in mixin_phases


def test_the_report_says_when_the_fsdp_optimizations_set_the_peak(capsys, tmp_path):
    """The estimate's text names the cause and the ways out where the next microbatch's forward is the peak."""
    recipe = tmp_path / "super_lora.yaml"
    recipe.write_text(
        "model:\n  pretrained_model_name_or_path: nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16\n"
        "  backend: {experts: torch_mm, dispatcher: hybridep, enable_fsdp_optimizations: true}\n"
        "peft: {dim: 32, exclude_modules: ['*.out_proj'], moe_rank_scaling: true}\n"
        "loss_fn: {_target_: nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy, fp32_upcast: false}\n"
        "step_scheduler: {global_batch_size: 512, local_batch_size: 2}\n"
        "dataset: {seq_len: 4096}\n"
        "distributed: {strategy: fsdp2, ep_size: 64, activation_checkpointing: true, moe: {reshard_after_forward: true}}\n"
    )
    assert main(["estimate", str(recipe), "--world-size", "64", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "peak at gathered-late-backward" in out and "enable_fsdp_optimizations" in out
    flag_off = recipe.read_text().replace("enable_fsdp_optimizations: true", "enable_fsdp_optimizations: false")
    recipe.write_text(flag_off)
    assert main(["estimate", str(recipe), "--world-size", "64", "--seq-len", "4096"]) == 0
    text = capsys.readouterr().out
    assert "gathered-late-backward" not in text and "enable_fsdp_optimizations turns" not in text


def test_transformers_nemotron_h_layers_keep_what_the_dry_run_measured():
    """transformers' Nemotron-H class (force_hf) with LoRA (out_proj excluded, as AutoModel's recipe does): bytes a
    token each layer kind keeps, measured by the dry run layer by layer on Nemotron-Nano-9B-v2 (configs of one to four
    layers, 4,096 tokens): a Mamba layer 281,640 (its cache on: the conv, the chunk scan and transformers' gated norm
    apart), an MLP layer 89,608; AutoModel's own class keeps far less per Mamba layer (its fused kernel)."""
    from automodel_dist.estimate.memory import _act_per_token

    m = lookup("nvidia/NVIDIA-Nemotron-Nano-9B-v2")
    lora = lora_of(m, {"dim": 8, "exclude_modules": ["*.out_proj"]})
    hf = Training(seq_len=4096, micro_batch_size=1, lora=lora, hf_class=True)
    p = dims("fsdp2", dp=8)
    assert _act_per_token(m, p, hf, "mamba", 2)[1] == pytest.approx(281_640, rel=1e-3)
    assert _act_per_token(m, p, hf, "mlp", 2)[1] == pytest.approx(89_608, rel=1e-3)
    own = dataclasses.replace(hf, hf_class=False)
    assert _act_per_token(m, p, own, "mamba", 2)[1] < _act_per_token(m, p, hf, "mamba", 2)[1] / 3


def _unknown_model_recipe(tmp_path):
    """The Qwen3-MoE chat recipe naming a model neither in the catalog nor in the Hugging Face cache."""
    text = (
        (EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml")
        .read_text()
        .replace("Qwen/Qwen3-30B-A3B-Thinking-2507", "acme/unreleased-30b")
    )
    (path := tmp_path / "unknown_model.yaml").write_text(text)
    return path


def test_estimate_takes_the_model_from_the_recipe(capsys, tmp_path):
    """Like validate: without a model argument the recipe's model.pretrained_model_name_or_path is sized when the
    catalog has it; otherwise a usage error that names the recipe's value."""
    recipe = EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml"
    assert estimate_memory(recipe) == estimate_memory(recipe, model="Qwen/Qwen3-30B-A3B")
    assert main(["estimate", str(recipe), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "Qwen/Qwen3-30B-A3B"
    unknown = _unknown_model_recipe(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"no model to size: .*'acme/unreleased-30b': not a config.json path, not in the Hugging Face cache",
    ):
        estimate_memory(unknown)
    with pytest.raises(ValueError, match=r"^no model to size\. Pass a model: .*\(list_models\)$"):
        estimate_memory("tp_size: 2\n", world_size=8)
    assert main(["estimate", str(unknown)]) == 2
    assert "no model to size" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(
        [
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Llama-3.1-70B",
            "Qwen/Qwen3-30B-A3B",
            "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
            "deepseek-ai/DeepSeek-V3",
        ]
    ),
    tp=st.sampled_from([1, 2, 8]),
    cp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 4]),
    dp=st.sampled_from([1, 8, 64]),
    ac=st.sampled_from([False, "selective", True]),
    seq=st.sampled_from([1024, 4096, 32768]),
    mbs=st.sampled_from([1, 2, 8]),
    budget=st.sampled_from([20.0, 72.0, 126.0]),
)
def test_fit_limits_are_the_largest_sizes_that_fit(model, tp, cp, pp, dp, ac, seq, mbs, budget):
    """max_seq_len fits and one more step (128 tokens, times what CP/SP split by) does not; the same for the micro
    batch; None only when the smallest size does not fit."""
    import math

    from automodel_dist.estimate import fit_limits

    spec = lookup(model)
    p = dims("fsdp2", dp=dp, tp=tp, cp=cp, pp=pp, sequence_parallel=tp > 1, activation_checkpointing=ac)
    tr = Training(seq_len=seq, micro_batch_size=mbs)
    max_seq, max_mbs = fit_limits(spec, p, tr, budget)
    step = math.lcm(128, 2 * cp if cp > 1 else 1, tp if tp > 1 else 1)

    def peak(**kw):
        return memory_per_rank(spec, p, dataclasses.replace(tr, **kw)).total

    if max_seq is None:
        assert peak(seq_len=step) > budget
    else:
        assert max_seq % step == 0 and peak(seq_len=max_seq) <= budget
        assert max_seq + step > 1 << 21 or peak(seq_len=max_seq + step) > budget
    if max_mbs is None:
        assert peak(micro_batch_size=1) > budget
    else:
        assert peak(micro_batch_size=max_mbs) <= budget
        assert max_mbs == 4096 or peak(micro_batch_size=max_mbs + 1) > budget


def test_estimate_reports_the_limits_of_its_layout(capsys):
    est = estimate_memory(EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml", seq_len=4096)
    assert not est.fits and est.seq_len == 4096 and est.micro_batch_size == 4 and est.assumed == []
    unknown = estimate_memory(EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml")  # the recipe fixes no length
    assert unknown.fits is None and not unknown.seq_len_known and unknown.assumed == ["seq_len"]
    assert list(unknown.micro_batch_at_lengths) == [2048, 4096, 8192]
    assert unknown.micro_batch_at_lengths[4096] == unknown.max_micro_batch_size
    assert estimate_memory(EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml").assumed == []
    assert estimate_memory("tp_size: 2\n", model=L8, world_size=8).assumed == ["seq_len", "micro_batch_size"]
    assert est.max_seq_len is not None and est.max_seq_len < 4096 and est.max_micro_batch_size == 1
    assert main(["estimate", str(EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml"), "--seq-len", "4096"]) == 1
    printed = capsys.readouterr().out
    assert (
        f"limits of this layout with 10% headroom: seq_len up to {est.max_seq_len:,} at micro batch 4; micro "
        "batch up to 1 at seq_len 4,096"
    ) in printed
    assert main(["estimate", str(EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml")]) == 0
    lead = capsys.readouterr().out.splitlines()[1]
    assert lead.startswith("the sequence length is the unknown (neither --seq-len nor the recipe fixes it): with 10%")
    assert "give no verdict: pass --seq-len" in lead
    long = estimate_memory("tp_size: 1\n", model=L8, world_size=8, seq_len=65536)
    assert not long.fits and long.max_seq_len < 65536 and long.max_micro_batch_size is None
    huge = estimate_memory("tp_size: 2\n", model="meta-llama/Llama-3.1-405B", world_size=8)
    assert huge.max_seq_len is None and huge.max_micro_batch_size is None
    from automodel_dist.render import estimate_text

    assert "no micro batch fits at seq_len 65,536" in estimate_text(long)
    low = huge.shortest
    assert huge.shortest_seq_len == 128 and low.total > 72 and low.model_states == pytest.approx(378.0, abs=0.05)
    assert low.total == pytest.approx(
        estimate_memory("tp_size: 2\n", model="meta-llama/Llama-3.1-405B", world_size=8, seq_len=128).memory_gib.total
    )
    assert (
        f"not even 128 tokens at micro batch 1 fit: they need params {low.params:.1f} + grads {low.grads:.1f} "
        f"+ optimizer {low.optimizer:.1f} + activations {low.activations:.1f}"
    ) in estimate_text(huge)
    assert long.shortest is None and est.shortest is None


def test_estimate_memory_rejects_invalid_configs():
    with pytest.raises(ConfigError):
        estimate_memory({"tp_size": 3}, model=L8, world_size=8)
    with pytest.raises(ValueError):
        estimate_memory({"tp_size": 2}, model="nope/nope", world_size=8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seq_len": 0}, "seq_len must be a positive integer, got 0"),
        ({"micro_batch_size": -1}, "micro_batch_size must be a positive integer, got -1"),
        ({"global_batch_size": 2.5}, "global_batch_size must be a positive integer, got 2.5"),
        ({"headroom": 1.0}, "headroom must be in [0, 1), got 1.0"),
        ({"memory_gib": -3}, "memory_gib must be a positive number, got -3"),
        ({"intra_gbps": 0}, "intra_gbps must be a positive number, got 0"),
        ({"inter_gbps": float("nan")}, "inter_gbps must be a positive number, got nan"),
    ],
)
def test_estimate_and_suggest_reject_bad_sizing_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        estimate_memory({"tp_size": 2}, model=L8, world_size=8, **kwargs)
    if "seq_len" not in kwargs and "micro_batch_size" not in kwargs:  # suggest's own checks cover these two
        with pytest.raises(ValueError, match=re.escape(message)):
            suggest_strategy(L8, nodes=1, **kwargs)


def test_bandwidth_overrides_reach_the_communication_times():
    block = {"tp_size": 8, "pp_size": 2, "pipeline": {}}
    base = estimate_memory(block, model=L8, nodes=2, gpus_per_node=8)
    slow = estimate_memory(block, model=L8, nodes=2, gpus_per_node=8, inter_gbps=base.inter_gbps / 4)
    assert (base.intra_gbps, base.inter_gbps) == (450.0, 50.0) and slow.inter_gbps == 12.5
    assert slow.crosses_nodes["pp"] and slow.comm_time_s["pp"] > 3 * base.comm_time_s["pp"]
    assert slow.comm_time_s["tp"] == base.comm_time_s["tp"]  # inside a node: unchanged
    fast = estimate_memory(block, model=L8, nodes=2, gpus_per_node=8, intra_gbps=900)
    assert fast.comm_time_s["tp"] < base.comm_time_s["tp"] and fast.comm_time_s["pp"] == base.comm_time_s["pp"]
    rep = suggest_strategy(L8, nodes=2, top_k=1, inter_gbps=12.5, memory_gib=40)
    assert (rep.inter_gbps, rep.gpu_memory_gib) == (12.5, 40.0)


@pytest.mark.parametrize(
    "model, nodes",
    [
        ("meta-llama/Llama-3.1-70B", 4),
        ("Qwen/Qwen2.5-14B", 1),
        ("meta-llama/Llama-3.1-8B", 1),
        ("deepseek-ai/DeepSeek-V3", 2),
    ],
)
def test_rejected_layouts_called_faster_are_faster_than_the_pick(model, nodes):
    rep = suggest_strategy(model, nodes=nodes, gpus_per_node=8, top_k=1)
    best = rep.candidates[0].step_time_s if rep.candidates else None
    for r in rep.rejected:
        m = re.search(r"it would be faster: ([\d.]+) vs ([\d.]+) s/step", r.reason)
        if "faster" in r.reason:
            assert m and best is not None and float(m[1]) < float(m[2]) and float(m[2]) == round(best, 2), r
        if best is not None:
            assert "if it fit" not in r.reason, r


def test_suggest_text_lists_rejected_layouts_as_yaml():
    """Each "not chosen" line starts with the layout as a YAML flow mapping, pasteable under distributed:."""
    import yaml

    from automodel_dist.render import suggest_text

    rep = suggest_strategy("meta-llama/Llama-3.1-70B", nodes=4, gpus_per_node=8, top_k=3)
    text = suggest_text(rep)
    lines = text.split("not chosen:\n", 1)[1].splitlines()
    assert rep.rejected and len(lines) >= len(rep.rejected)
    for r, line in zip(rep.rejected, lines):
        flow = line.removeprefix("    - ").split("}: ", 1)[0] + "}"
        assert yaml.safe_load(flow) == r.distributed, line


@pytest.mark.parametrize("strategies", [("fsdp2",), ("megatron_fsdp",)])
def test_suggest_rationale_says_what_the_layout_does(strategies):
    """The rationale names the real shard group (never "over 1 ranks") and claims sequence parallelism only where
    the layout turns it on (MegatronFSDP's TP runs without it)."""
    rep = suggest_strategy("meta-llama/Llama-3.1-70B", nodes=2, gpus_per_node=8, top_k=10, strategies=strategies)
    assert len(rep.candidates) >= 5
    for c in rep.candidates:
        d, text = c.distributed, " ".join(c.rationale)
        tp, cp, pp = (d.get(k, 1) for k in ("tp_size", "cp_size", "pp_size"))
        shard = 16 // (tp * pp)  # dp_shard * cp (FSDP2) or dp * cp (MegatronFSDP), no replication here
        assert "over 1 ranks" not in text
        assert (f"over {shard} ranks" in text) == (shard > 1), text
        assert ("with sequence parallelism" in text) == bool(d.get("sequence_parallel")), text
        if tp > 1 and strategies == ("megatron_fsdp",):
            assert "no sequence parallelism" in text
    if strategies != ("fsdp2",):
        return
    moe = suggest_strategy("deepseek-ai/DeepSeek-V3", nodes=32, top_k=5)
    texts = [" ".join(c.rationale) for c in moe.candidates]
    assert any("ep_shard=1" in t for t in texts) and not any("over ep_shard=1" in t for t in texts), texts


def test_suggest_searches_only_the_strategies_asked_for(capsys):
    """strategies= (CLI --strategy, repeatable, AutoModel's aliases accepted) limits candidates and the "not chosen"
    examples to those strategies; an unknown or empty list is a usage error naming the valid ones."""
    from automodel_dist.suggest import search_strategies

    assert search_strategies(None) == ("fsdp2", "megatron_fsdp", "ddp")
    assert search_strategies(["DDP", "mfsdp", "megatron-fsdp"]) == ("megatron_fsdp", "ddp")
    assert search_strategies("fsdp2") == ("fsdp2",)
    for bad in ([], ["zero3"], [None]):
        with pytest.raises(ValueError, match="strategies must name at least one of fsdp2, megatron_fsdp, ddp"):
            search_strategies(bad)
    full = suggest_strategy("meta-llama/Llama-3.1-70B", nodes=2, top_k=20)
    only = suggest_strategy("meta-llama/Llama-3.1-70B", nodes=2, top_k=20, strategies=["megatron-fsdp"])
    assert only.strategies == ["megatron_fsdp"] and only.candidates and 0 < only.searched < full.searched
    assert {c.distributed["strategy"] for c in only.candidates} == {"megatron_fsdp"}
    assert {r.distributed["strategy"] for r in only.rejected} <= {"megatron_fsdp"}
    picked = {c.yaml for c in full.candidates if c.distributed["strategy"] == "megatron_fsdp"}
    assert picked <= {c.yaml for c in only.candidates}  # the same layouts, ranked among their own strategy
    ddp = suggest_strategy("meta-llama/Llama-3.1-405B", nodes=1, gpu="L40S", strategies=("ddp",))
    assert not ddp.candidates and "({strategy: ddp})" in ddp.note  # the smallest layout, as YAML
    assert (
        main(
            [
                "suggest",
                "--model",
                "meta-llama/Llama-3.1-70B",
                "--nodes",
                "2",
                "--strategy",
                "mfsdp",
                "--strategy",
                "ddp",
                "--verify",
                "0",
                "--top",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "layouts searched (megatron_fsdp, ddp only)" in out.splitlines()[0] and "strategy: fsdp2" not in out
    assert main(["suggest", "--model", L8, "--strategy", "zero3"]) == 2
    assert "invalid choice: 'zero3'" in capsys.readouterr().err


def test_suggest_for_a_recipe_fills_the_sizes_and_compares_its_layout(capsys, tmp_path):
    """A recipe gives the model, cluster (ci:), seq_len and batch sizes not passed; the report says which, and
    measures the recipe's own layout as the candidates are measured."""
    from automodel_dist.render import suggest_text

    recipe = EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml"
    rep = suggest_strategy(config=recipe, top_k=3)
    same = suggest_strategy(
        "Qwen/Qwen3-30B-A3B", nodes=2, gpus_per_node=8, seq_len=1024, global_batch_size=16, micro_batch_size=1, top_k=3
    )
    assert same.from_recipe == {} and same.current is None and same.workload == []
    # the recipe's own workload sizes every layout (its optimizer is torch Adam, its loss the masked one)
    assert rep.workload[0].startswith("optimizer torch Adam: two states") and rep.workload[1].startswith("loss Masked")
    assert rep.from_recipe == {
        "model": "model.pretrained_model_name_or_path",
        "nodes": "ci.nodes",
        "gpus_per_node": "ci.nproc_per_node",
        "seq_len": "dataset.seq_length",
        "global_batch_size": "step_scheduler.global_batch_size",
        "micro_batch_size": "distributed.pipeline.pp_microbatch_size",
    }
    cur = rep.current
    est = estimate_memory(recipe)
    assert cur.valid and cur.fits and cur.distributed["ep_size"] == 4
    assert (cur.step_time_s, cur.memory_gib) == (est.step_time_s, est.memory_gib.total)
    assert cur.best_speedup == round(est.step_time_s / rep.candidates[0].step_time_s, 2)
    text = suggest_text(rep).splitlines()
    assert text[1].startswith(
        "from the recipe: model Qwen/Qwen3-30B-A3B (model.pretrained_model_name_or_path), nodes 2 (ci.nodes)"
    )
    assert text[2] == "from the recipe: " + rep.workload[0] and text[3] == "from the recipe: " + rep.workload[1]
    assert text[4].startswith(
        "the recipe's layout {strategy: fsdp2, cp_size: 2, pp_size: 2, ep_size: 4, "
        "activation_checkpointing: true, pipeline: {pp_schedule: interleaved1f1b, "
        "pp_microbatch_size: 1}}: est. "
    )
    assert text[4].endswith(f"fits; #1 is {cur.best_speedup:.2f}x faster")
    small = suggest_strategy(config=recipe, seq_len=4096, nodes=1, gpus_per_node=4, top_k=1)  # arguments win
    assert small.seq_len == 4096 and small.world_size == 4 and not {"seq_len", "nodes"} & set(small.from_recipe)
    assert not small.current.valid and any("must be a multiple of ep_size=4" in e for e in small.current.errors), (
        small.current.errors
    )
    assert "the recipe's layout {strategy: fsdp2, cp_size: 2" in suggest_text(small)
    assert rep.assumed == [] and same.assumed == []
    guessed = suggest_strategy(config=EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml", top_k=1)
    assert guessed.assumed == ["seq_len"]
    shown = suggest_text(guessed).splitlines()
    assert "assumed (neither passed nor in the recipe): seq_len 4096" in shown
    assert any(line.startswith("the sequence length is the unknown: ranked at an assumed 4,096") for line in shown)
    assert suggest_strategy(L8, top_k=1).assumed == [
        "nodes",
        "gpus_per_node",
        "seq_len",
        "global_batch_size",
        "micro_batch_size",
    ]
    oom = suggest_strategy(config=EXAMPLES / "llama3_2_1b_squad_megatron_fsdp.yaml", top_k=1)
    assert oom.current.valid and oom.current.fits is False and oom.candidates
    assert "does NOT fit; #1 fits" in suggest_text(oom)
    unknown = _unknown_model_recipe(tmp_path)
    with pytest.raises(
        ValueError, match="'acme/unreleased-30b': not a config.json path, not in the Hugging Face cache"
    ):
        suggest_strategy(config=unknown)
    gemma = suggest_strategy("google/gemma-3-1b-pt", config=unknown, top_k=1)
    assert "model" not in gemma.from_recipe and gemma.model == "google/gemma-3-1b-pt"
    with pytest.raises(ValueError, match="give a model"):
        suggest_strategy()
    assert main(["suggest", str(recipe), "--top", "1", "--json", "--verify", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["current"]["valid"] and out["from_recipe"]["nodes"] == "ci.nodes" and out["world_size"] == 16
    assert main(["suggest", str(unknown)]) == 2
    assert "no model to size" in capsys.readouterr().err


def test_suggest_candidates_are_valid_and_explained():
    rep = suggest_strategy(L8, nodes=1, seq_len=8192, global_batch_size=64, top_k=50)
    # ordered by step time, those that fit even with the estimate's error first
    ranks = [(c.verdict != "fits", c.step_time_s) for c in rep.candidates]
    assert ranks == sorted(ranks) and [c.rank for c in rep.candidates] == list(range(1, len(ranks) + 1))
    # 8 gradient-accumulation steps: AutoModel's default (defer_fsdp_grad_sync) would hold all 8B gradients
    # unsharded in fp32 (~30 GiB) and not fit without checkpointing; reduce-scattering each microbatch does
    # (plain FSDP2 at 66 GiB would be within the estimate's error of the 72 GiB budget; with selective
    # checkpointing it fits for sure)
    [best] = [
        c
        for c in rep.candidates
        if c.distributed.get("defer_fsdp_grad_sync") is False
        and not {"tp_size", "cp_size", "pp_size"} & set(c.distributed)
    ]
    assert best.verdict == "fits" and best.distributed["strategy"] == "fsdp2"
    assert best.memory_gib.deferred_grads == 0 and "defer_fsdp_grad_sync: false" in best.yaml
    assert any(r.startswith("defer_fsdp_grad_sync: false: ") and "needed to fit" in r for r in best.rationale)
    default = estimate_memory(
        best.yaml.replace("  defer_fsdp_grad_sync: false\n", ""), model=L8, world_size=8, seq_len=8192
    )
    assert default.verdict != "fits" and default.memory_gib.deferred_grads > 25
    again = estimate_memory(best.yaml, model=L8, world_size=8, seq_len=8192)
    assert again.memory_gib.total == pytest.approx(best.memory_gib.total)
    for c in rep.candidates:
        assert validate_config(c.yaml, nodes=1, gpus_per_node=8, model=L8).valid
        assert c.memory_gib.total <= 80 * 0.9 and c.rationale and c.step_time_s > 0
        assert set(c.memory_gib.model_dump()) >= {"params", "grads", "optimizer", "activations", "buffers", "total"}
    reasons = " ".join(r.reason for r in rep.rejected)
    assert "DDP replicates the whole model: OOM" in reasons and "tp=3 does not divide" in reasons


def test_suggest_long_context_and_moe_and_nothing_fits():
    rep = suggest_strategy("meta-llama/Llama-3.1-70B", nodes=4, seq_len=32768, global_batch_size=32, top_k=3)
    assert rep.candidates and all(
        c.distributed.get("cp_size", 1) > 1 or c.distributed.get("pp_size", 1) > 1 for c in rep.candidates
    )
    moe = suggest_strategy("Qwen/Qwen3-30B-A3B", nodes=2, seq_len=4096, global_batch_size=64, top_k=3)
    assert moe.candidates
    none = suggest_strategy("meta-llama/Llama-3.1-405B", nodes=1, gpu="L40S", seq_len=4096)
    assert not none.candidates and none.note.startswith("no layout fits")


NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


@pytest.mark.parametrize("model,ep", [(NANO, 1), (NANO, 8), ("nvidia/Nemotron-H-8B-Base-8K", 1)])
def test_hybrid_model_states_are_exact(model, ep):
    """Nemotron-H on 8 ranks: FSDP over 8 (or EP 8 with ep_shard 1) leaves 1/8 of every parameter on each rank."""
    spec = lookup(model)
    est = memory_per_rank(spec, dims("fsdp2", dp=8, ep=ep), Training(seq_len=4096))
    assert est.params * GIB * 8 == pytest.approx(spec.param_count() * 2, rel=1e-9)  # bf16, AutoModel's default
    assert est.optimizer == pytest.approx(2 * est.params, rel=1e-9)


def test_hybrid_activations_follow_automodel_checkpointing_policy():
    """ep_size 1: Nemotron-H's own FSDP2 policy checkpoints only Mamba and MLP blocks (attention and MoE keep their
    activations); ep_size > 1: the MoE path checkpoints every block. CP splits the tokens."""
    tr = Training(seq_len=16384)  # long enough that the peak holds every saved activation

    def acts(model, **kw):
        est = memory_per_rank(lookup(model), dims("fsdp2", **{"dp": 8, **kw}), tr)
        assert est.peak_phase != "end-of-backward"
        return est.activations

    plain, full = acts(NANO), acts(NANO, activation_checkpointing=True)
    full_ep = acts(NANO, ep=8, activation_checkpointing=True)
    assert full_ep < 0.2 * plain < full < plain  # the 23 MoE layers, not checkpointed at ep 1, dominate Nano's
    assert 0.45 * plain < acts(NANO, cp=2, dp=4) < 0.6 * plain
    dense = "nvidia/Nemotron-H-8B-Base-8K"
    assert acts(dense, activation_checkpointing=True) < 0.25 * acts(dense)  # 48 of 52 layers are Mamba or MLP


def test_hybrid_estimate_counts_mamba_context_parallel_traffic():
    base = estimate_memory({"cp_size": 2}, model="nvidia/Nemotron-H-8B-Base-8K", world_size=8, seq_len=8192)
    attn_only = dataclasses.replace(
        lookup("nvidia/Nemotron-H-8B-Base-8K"),
        layer_types=tuple(
            "attention" if t == "attention" else "mlp" for t in lookup("nvidia/Nemotron-H-8B-Base-8K").layer_types
        ),
    )
    ring = estimate_memory({"cp_size": 2}, model=attn_only, world_size=8, seq_len=8192)
    assert base.comm_bytes_per_step["cp"] > 2 * ring.comm_bytes_per_step["cp"] > 0


def test_suggest_for_a_hybrid_model_keeps_to_what_its_class_runs():
    rep = suggest_strategy(NANO, nodes=2, seq_len=8192, global_batch_size=32, top_k=5)
    assert rep.candidates
    for c in rep.candidates:
        assert c.distributed.get("tp_size", 1) == 1 and "sequence_parallel" not in c.distributed
        assert validate_config(c.yaml, nodes=2, gpus_per_node=8, model=NANO).valid


def test_suggest_for_falcon_h1_offers_no_context_pipeline_or_sequence_parallelism():
    """At a length where CP would pay, suggest keeps Falcon-H1 to what AutoModel runs as the model: no cp_size (its
    Mamba branch would scan a share of the sequence: cp-parallel-mamba), no pp_size (the generic stage forward drops
    its multipliers and final norm: pp-falcon-h1-forward) and no sequence_parallel (its TP plan ignores it); TP
    stays."""
    rep = suggest_strategy("tiiuae/Falcon-H1-34B-Instruct", nodes=4, seq_len=32768, global_batch_size=32, top_k=5)
    layouts = [c.distributed for c in rep.candidates] + [r.distributed for r in rep.rejected]
    assert layouts and any(d.get("tp_size", 1) > 1 for d in layouts)
    assert all(d.get("cp_size", 1) == d.get("pp_size", 1) == 1 and "sequence_parallel" not in d for d in layouts)


def test_suggest_on_24_gpus_skips_uneven_expert_shards_but_keeps_plain_fsdp():
    """3 nodes x 8 without PP: every ep_size of Qwen3-30B-A3B leaves an ep_shard with a factor 3 (hidden 2048
    does not split), so the search skips those; with pp 3 the 8 ranks per stage split evenly. Without EP nothing
    constrains the rank count (a dense model still gets its layouts)."""
    dense = suggest_strategy(L8, nodes=3, top_k=3)
    assert dense.candidates and all("ep_size" not in c.distributed for c in dense.candidates)
    moe = suggest_strategy("Qwen/Qwen3-30B-A3B", nodes=3, top_k=5)
    assert moe.candidates and not any("uneven sharding" in r.reason for r in moe.rejected)
    from automodel_dist.rules.model import expert_shard_ok
    from automodel_dist.suggest import _options

    spec = lookup("Qwen/Qwen3-30B-A3B")
    opts = list(_options(spec, 24, 8, 4096, 24, 1, False, ("fsdp2",)))
    assert all(o.ep == 1 or expert_shard_ok(spec, o.ep_shard) for o in opts)
    assert {o.ep for o in opts if o.pp == o.cp == 1} == {1}  # ep_shard 24/ep always has a factor 3
    assert {o.ep for o in opts if o.pp == 3} >= {2, 4, 8}  # 8 ranks per stage split evenly


@pytest.mark.parametrize("world", [1, 8])
def test_suggest_searches_only_megatron_fsdp_layouts_automodel_runs(world):
    from automodel_dist.catalog.models import lookup
    from automodel_dist.suggest import _options

    opts = list(_options(lookup("meta-llama/Llama-3.2-1B"), world, 8, 4096, 8, 1, True, ("megatron_fsdp",)))
    acs = {o.activation_checkpointing for o in opts}
    # selective is rejected for megatron_fsdp; full is skipped by it on more than one rank
    assert acs == ({False, True} if world == 1 else {False})


def test_estimate_and_suggest_cli(tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("distributed:\n  tp_size: 2\n")
    assert main(["estimate", str(cfg), "--model", L8, "--world-size", "8", "--seq-len", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["memory_gib"]["total"] > 0 and out["layout"]["tp"] == 2
    big = ["estimate", str(cfg), "--model", "meta-llama/Llama-3.1-405B", "--world-size", "8"]
    assert main([*big, "--seq-len", "4096"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(big) == 0  # no sequence length: no verdict on an assumed one
    assert "no verdict (the sequence length is unknown)" in capsys.readouterr().out
    assert (
        main(["suggest", "--model", L8, "--nodes", "1", "--gpu", "H100", "--top", "2", "--json", "--verify", "0"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["candidates"]) == 2 and "yaml" in out["candidates"][0]
    assert main(["suggest", "--model", L8, "--gpu", "TPU-v9"]) == 2
    assert (
        main(
            [
                "estimate",
                str(cfg),
                "--model",
                L8,
                "--nodes",
                "2",
                "--gpus-per-node",
                "8",
                "--inter-gbps",
                "12.5",
                "--intra-gbps",
                "900",
            ]
        )
        == 0
    )
    assert "(80 GiB, 900 / 12.5 GB/s in / between nodes)" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["estimate", str(cfg), "--model", L8, "--world-size", "8", "--memory-gib", "-3"]) == 2
    assert "expected a positive number, got '-3'" in capsys.readouterr().err
    assert main(["estimate", str(cfg), "--model", L8, "--world-size", "8", "--headroom", "1.5"]) == 2
    assert "headroom must be in [0, 1), got 1.5" in capsys.readouterr().err


@pytest.mark.slow  # torch's schedules run for real (~30 s); the calibration's pp2-interleaved case checks the figure
def test_pipeline_backward_holds_unsharded_fp32_grads():
    """What the estimate's deferred_grads and gathered blocks under PP stand for, run for real (4 gloo ranks, pp=2 x
    dp=2, FSDP2 with AutoModel's bf16/fp32 mixed precision). torch's Schedule1F1B over 4 microbatches: after a
    stage's first backward it holds every parameter's gradient unsharded in fp32 until the step ends, with torch's
    stage backward (AutoModel's default) and with AutoModel 0.7.0's own patched one when defer_fsdp_grad_sync is
    true; its blocks are gathered by each backward and resharded by the next forward, all but the last; with
    defer_fsdp_grad_sync: false nothing is held and only the block that never reshards stays gathered.
    ScheduleInterleaved1F1B with 2, 3 and 4 stages a rank: at most three stages whole (its UNSHARD prefetch), and
    that many at some backward; with AutoModel's backward for defer_fsdp_grad_sync: false, each stage's last block,
    and three stages whole again with 4 stages a rank."""
    import subprocess
    import sys

    modes = ["torch", "automodel-defer", "automodel-eager"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            str(TESTS / "support" / "pp_defer_worker.py"),
        ],
        env={**os.environ, "MODES": ",".join(modes), "INTERLEAVED": "2,3,4", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines() if "RESULT " in line]
    interleaved = [r for r in results if "stages_per_rank" in r]
    results = [r for r in results if "mode" in r]
    assert out.returncode == 0 and len(results) == 2 * len(modes), out.stdout[-2000:] + out.stderr[-4000:]
    assert sorted(r["stages_per_rank"] for r in interleaved) == [2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]
    for spr in (2, 3, 4):  # in blocks (three a stage) gathered or being gathered, before and after each backward
        for eager in (False, True):
            runs = [r for r in interleaved if r["stages_per_rank"] == spr and r["eager"] is eager]
            seen = [v for r in runs for pair in r["backward"] for v in pair]
            # deferred: up to MAX_ACTIVE_STAGES whole; not deferred: each stage's last block, whole stages again only
            # where the rank has more stages than the schedule keeps active (its UNSHARD gathers evicted ones anew)
            whole = 3 * min(spr, MAX_ACTIVE_STAGES)
            assert max(seen) == (whole if not eager or spr > MAX_ACTIVE_STAGES else spr), (spr, eager, seen)
    for r in results:
        n, held = r["elements"], r["held"]
        block = n // 3 * 2  # one block's parameters in bf16
        assert held[0] == [0, block] and held[-1] == [0, 0]  # before any backward: the last block; after the step: none
        if r["mode"] == "automodel-eager":
            assert all(grads == 0 and gathered <= 2 * block for grads, gathered in held)
            assert held[-2] == [0, block]
        else:  # the fourth microbatch's forward comes after at least one backward on both stages
            assert held[-2] == [n * 4, n * 2]  # all gradients unsharded in fp32, all blocks gathered in bf16
        # each forward reshards the blocks that reshard after forward again: at the start of a backward the stage
        # holds its last block alone (the estimate's start-of-backward under PP; torch's first step runs one more
        # forward to infer the stage's shapes)
        assert len(r["after_forward"]) >= 4 and all(gathered == block for _, gathered in r["after_forward"])
        # a receive buffer per microbatch, for the inputs of a stage that is not the first and the output gradients
        # of one that is not the last, kept after the step (the estimate's p2p buffers): 2 rows x H bf16 each
        hidden = math.isqrt(n // 3)  # a block is hidden x (hidden + 1) parameters
        mb = 2 * hidden * 2
        first = r["stage"] == 0
        assert r["input_buffers"] == ([] if first else [mb] * 4) and r["grad_buffers"] == ([mb] * 4 if first else [])


@pytest.mark.parametrize(
    "block",
    [
        {"pp_size": 2, "pipeline": {}},
        {"pp_size": 2, "cp_size": 2, "dp_replicate_size": 2, "pipeline": {}},
        {},
        {"pp_size": 2, "pipeline": {}, "reshard_after_forward": False},
        {"reshard_after_forward": True},
    ],
)
def test_block_resharding_is_automodels_own(block):
    """The estimate's and the smoke runner's block_reshard against AutoModel 0.7.0's own wrapping on its own meshes:
    blocks reshard after forward but the last, PP included (its keep-gathered-under-PP branch looks for a pp dim in
    the data-parallel mesh, which has none), unless reshard_after_forward says otherwise."""
    from automodel_dist.dims import block_reshard
    from support import oracle

    theirs = oracle.block_reshards(block, 16)
    chosen = block_reshard(block.get("reshard_after_forward"), False, 1)
    assert theirs == ([i < 3 for i in range(4)] if chosen is None else [chosen] * 4)


KD = (
    "recipe: KnowledgeDistillationRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: "
    "meta-llama/Llama-3.1-8B\nteacher_model:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\n"
    "distributed:\n  tp_size: 1\n"
)


def test_a_distillation_teacher_counts_on_the_students_gpus():
    """The teacher, built with the student's setup: sharded bf16 weights, its root and head gathered, its fp32
    probabilities for the KD loss; none of it when it is offloaded or on ranks of its own."""
    kd = estimate_memory(KD, world_size=8, seq_len=4096)
    plain = estimate_memory(KD.replace("KnowledgeDistillation", "TrainFinetune"), world_size=8, seq_len=4096)
    t = lookup("meta-llama/Llama-3.1-70B")
    expected = (t.param_count() / 8 + t.lm_head_params() + t.hidden_size) * 2 + 4 * t.vocab_size * 4096
    assert kd.memory_gib.teacher * (1 << 30) == pytest.approx(expected, rel=1e-9)
    assert kd.memory_gib.params == plain.memory_gib.params
    # its forward is 2 FLOPs per parameter per token against the student's 6: 70B over 8B adds ~3x the compute
    assert 3.0 < kd.step_time_s / plain.step_time_s < 4.5
    assert kd.memory_gib.total > plain.memory_gib.total + kd.memory_gib.teacher  # its share of the overhead too
    assert any(a.startswith("teacher meta-llama/Llama-3.1-70B: sharded like the student") for a in kd.assumptions)
    for extra in ("offload_teacher_model: true\n", "separate_meshes: true\n"):
        moved = estimate_memory(KD + extra, world_size=8, seq_len=4096)
        assert moved.memory_gib.teacher == 0 and moved.memory_gib.total == plain.memory_gib.total
    unknown = estimate_memory(KD.replace("Llama-3.1-70B", "Llama-9-1T"), world_size=8, seq_len=4096)
    assert (
        unknown.fits is None
        and unknown.assumptions[-1].startswith("teacher: unknown model 'meta-llama/Llama-9-1T': not a config.json")
        and unknown.assumptions[-1].endswith(": its memory is NOT counted (no fit verdict)")
    )
    with pytest.raises(ValueError, match=r"teacher cannot be sized on the student's GPUs: teacher: unknown model"):
        suggest_strategy(config=KD.replace("Llama-3.1-70B", "Llama-9-1T"), nodes=1, gpus_per_node=8, seq_len=4096)


TEACHER_FSDP = """
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
mesh = init_device_mesh("cpu", (2,))
m = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 64))
fully_shard(m[1], mesh=mesh)
fully_shard(m[2], mesh=mesh, reshard_after_forward=False)  # AutoModel's output-embedding unit
fully_shard(m, mesh=mesh, reshard_after_forward=False)  # AutoModel's root unit
m.requires_grad_(False)
with torch.inference_mode():
    m(torch.randint(0, 64, (2, 8)))
state = lambda mod: mod._get_fsdp_state()._fsdp_param_group.fsdp_params[0].sharded_state.name
print(state(m), state(m[1]), state(m[2]))
"""


def test_fsdp2_keeps_a_gradient_free_forwards_unresharded_units_gathered():
    """The fact the teacher's memory rests on: after a forward without gradients, FSDP2 units built with
    reshard_after_forward=False stay gathered (no backward comes to reshard them); the others reshard."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TEACHER_FSDP], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["UNSHARDED", "SHARDED", "UNSHARDED"]


# What the estimate's activation and gradient terms follow, each read off AutoModel's own step on fake tensors (the dry
# run) at the corpus recipe named; the totals here are the dry run's peaks of docs/corpus-sweep.md.
def _est(recipe: str, **kw: Any):
    from support.paths import ROOT

    return estimate_memory(ROOT.parent / "shared" / "corpus" / recipe, **kw).memory_gib


CORPUS_THERE = pytest.mark.skipif(
    not (TESTS.parent.parent / "shared" / "corpus").is_dir(), reason="no corpus beside the checkout"
)


def test_liger_kernel_on_a_hugging_face_class_keeps_less_and_tp_turns_it_off():
    """Mistral-7B is a Hugging Face class: under Liger (AutoModel's default, no TP or CP) a layer keeps 8h for its
    norms and 6I for its MLP; without Liger (use_liger_kernel: false, or TP) 16h and 8I (the HF norm's fp32 copies,
    silu's output)."""
    from automodel_dist.estimate.memory import _act_per_token

    m = lookup("mistralai/Mistral-7B-v0.1")
    h, inter = m.hidden_size, m.intermediate_size
    on = Training(hf_class=True, seq_len=2048)  # below its 4,096 sliding window: no repeated keys (sdpa_repeats_kv)
    off = dataclasses.replace(on, liger=False)
    p1 = dims("fsdp2", dp=8)
    with_liger, _ = _act_per_token(m, p1, on, "dense", 2)
    without, _ = _act_per_token(m, p1, off, "dense", 2)
    assert without - with_liger == 8 * h + 2 * inter
    own, _ = _act_per_token(m, p1, dataclasses.replace(on, hf_class=False), "dense", 2)
    assert own - with_liger == 2 * inter  # AutoModel's own classes keep silu's output too
    p2 = dims("fsdp2", dp=4, tp=2)
    assert _act_per_token(m, p2, on, "dense", 2) == _act_per_token(m, p2, off, "dense", 2)  # Liger is off under TP


def test_lora_dropout_keeps_a_byte_per_adapted_output():
    """PeftConfig's dropout with dropout_position post (its default) keeps a one-byte mask of every adapted Linear's
    output: Llama-3.1-8B with *_proj adapted keeps 43,008 bytes a token a layer more (the dry run's hooks at
    _peft/lora.py)."""
    from automodel_dist.estimate.peft import lora_of

    m = lookup(L8)
    with_dropout = lora_of(m, {"target_modules": "*_proj", "dim": 8, "dropout": 0.1})
    assert with_dropout.dropout_bytes("dense") == 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096 == 43_008
    assert lora_of(m, {"target_modules": "*_proj", "dim": 8}).dropout_bytes("dense") == 0
    # under TP the column-parallel outputs are split, the row-parallel ones (o_proj, down_proj) full width
    assert with_dropout.dropout_bytes("dense", 2) == (4096 + 1024 + 1024 + 14336 + 14336) / 2 + 4096 + 4096
    pre = lora_of(m, {"target_modules": "*_proj", "dim": 8, "dropout": 0.1, "dropout_position": "pre"})
    assert pre.dropout_bytes("dense") == 3 * (6 * 4096 + 14336)  # a dropped bf16 copy of each input and its mask


def test_expert_adapters_are_split_over_ep_with_their_experts():
    """GroupedExpertsLoRA's adapters are sharded over EP like the experts (_peft/lora_experts.py): Qwen3-30B-A3B LoRA
    on 8 ranks at ep 8 trains 47.2M parameters a rank, 39.3M of them expert adapters (the dry run's local bytes)."""
    from automodel_dist.estimate.peft import lora_of

    m = lookup("Qwen/Qwen3-30B-A3B")
    lora = lora_of(m, {"target_modules": ["*experts*", "*_proj"], "dim": 8})
    experts = lora.experts("moe")
    assert 0 < experts < lora.layer("moe")
    p = dims("fsdp2", dp=8, ep=8)
    tr = Training(lora=lora, storage_dtype="bfloat16", seq_len=1024)
    mem = memory_per_rank(m, p, tr)
    dense = (lora.layer("moe") - experts) * m.num_layers + lora.lm_head
    per_rank = (experts * m.num_layers / 8 + dense / 8) * 2  # bf16; experts over ep 8, the rest FSDP over 8
    assert mem.optimizer * GIB == pytest.approx(2 * per_rank, rel=1e-6)  # AdamW: two states in the params' dtype


@CORPUS_THERE
@pytest.mark.parametrize(
    ("recipe", "dry_run_gib"),
    [
        ("llm_finetune/phi/phi_4_squad_tp2.yaml", 243.4),  # AutoModel's Phi-3 TP plan splits no attention, no MLP
        ("llm_finetune/phi/phi_3_mini_it_squad.yaml", 74.4),  # Phi-3 under Liger
        ("llm_finetune/qwen/qwen3_moe_30b_te_packed_sequence_lora.yaml", 37.7),  # expert LoRA over EP, MoE terms
        ("llm_finetune/qwen/qwen3_moe_30b_lora.yaml", 1009.7),  # a checkpointed MoE block keeps 2h + router
        ("llm_finetune/llama3_1/llama3_1_8b_columnmapped_lora.yaml", 130.8),  # LoRA dropout masks
        ("llm_finetune/llama3_2/customizer_llama_3_2_1b_full_sft_chat.yaml", 15.0),  # .grad kept over accumulation
        ("llm_benchmark/qwen/qwen3_moe_30b_torch.yaml", 53.8),  # experts outside FSDP keep plain gradients
        ("llm_finetune/glm/glm_4.5_air_te_deepep.yaml", 520.9),  # routing weights after the down projection
    ],
)
def test_the_estimate_follows_the_dry_run_on_corpus_recipes(recipe: str, dry_run_gib: float):
    assert _est(recipe).tracked_peak == pytest.approx(dry_run_gib, rel=0.10)


_PP_SCHEDULES = ("1f1b", "gpipe", "interleaved1f1b", "loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev")


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(
        [
            "meta-llama/Llama-3.1-8B",
            "deepseek-ai/DeepSeek-V3",
            "moonshotai/Kimi-K2-Instruct",
            "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
            "nvidia/Nemotron-H-8B-Base-8K",
            "google/gemma-2-9b",
            "Qwen/Qwen3-30B-A3B",
        ]
    ),
    pp=st.sampled_from([2, 3, 4, 6, 8, 16]),
    schedule=st.sampled_from(_PP_SCHEDULES),
    lps=st.sampled_from([None, 1, 2, 3, 4, 5]),
    tp=st.sampled_from([1, 2, 8]),
    ep=st.sampled_from([1, 4, 8]),
    ac=st.booleans(),
    n_mb=st.sampled_from([1, 2, 4, 8]),
    teacher=st.sampled_from([None, "deepseek-ai/DeepSeek-V3", "meta-llama/Llama-3.1-70B"]),
)
def test_the_worst_pipeline_rank_is_a_candidate(name, pp, schedule, lps, tp, ep, ac, n_mb, teacher):
    """The estimate searches only peak_candidate_pp_ranks (and the dry run measures only them): no other pipeline rank
    is ever worse, with dense prefixes (DeepSeek-V3, Kimi-K2) and hybrid patterns (Nemotron-H) spread over stages and
    a distillation teacher split as the student."""
    from automodel_dist.dims import read_dims
    from automodel_dist.estimate.memory import _memory_of_pp_rank, peak_candidate_pp_ranks

    m = lookup(name)
    block: dict[str, Any] = {
        "pp_size": pp,
        "tp_size": tp,
        "ep_size": ep if m.is_moe else 1,
        "activation_checkpointing": ac,
        "pipeline": {"pp_schedule": schedule, "pp_microbatch_size": 1, "layers_per_stage": lps},
    }
    p = read_dims(block, 8 * tp * pp)
    t = lookup(teacher) if teacher else None
    tr = Training(seq_len=2048, pp_microbatches=n_mb * pp, teacher=t)
    every = [_memory_of_pp_rank(m, p, tr, r)["total"] for r in range(pp)]
    ranks = peak_candidate_pp_ranks(m, p, t)
    assert ranks[:2] == [0, 1] and ranks[-1] == pp - 1
    assert max(every[r] for r in ranks) == max(every)
    every_rank = p.v_schedule or p.pp_schedule == "InterleavedZeroBubble"
    uniform = not any(x.first_dense_layers or x.layer_types or x.layer_attention for x in (m, t) if x)
    if every_rank:
        assert ranks == list(range(pp))
    elif uniform:
        assert ranks == sorted({0, 1, pp - 1})  # rank 0, the first with receive buffers, the last


def test_an_ungated_mlp_keeps_the_activations_input_and_the_down_projections_only_where_it_trains():
    """Phi-2 (fc1 / gelu_new / fc2) and StarCoder2 (c_fc / gelu / c_proj) have no gate: the activation keeps the up
    projection's output (transformers' python GELU also its tanh, 0.5x and 1+tanh: 8 bytes an element, counted with
    saved-tensor hooks on PhiMLP), and the down projection keeps its input only where it trains. LoRA's target names
    are transformers' (Phi's q/k/v_proj and dense, fc1, fc2), so '*_proj' leaves Phi's MLP frozen."""
    from automodel_dist.estimate.memory import _act_per_token
    from automodel_dist.estimate.peft import down_adapted, lora_of

    phi, star = lookup("microsoft/phi-2"), lookup("bigcode/starcoder2-7b")
    assert phi.mlp_names == ("fc1", "fc2") and phi.o_name == "dense" and star.mlp_names == ("c_fc", "c_proj")
    proj = lora_of(phi, {"target_modules": "*_proj", "dim": 8})
    assert {n.rsplit(".", 1)[-1] for n in proj.adapted} == {"q_proj", "k_proj", "v_proj"}
    fc2 = lora_of(phi, {"target_modules": ["*_proj", "*.fc2"], "dim": 8})
    assert not down_adapted(phi, proj) and down_adapted(phi, fc2) and down_adapted(phi, None)
    p1 = dims("fsdp2", dp=8)
    frozen, _ = _act_per_token(phi, p1, Training(hf_class=True, lora=proj), "dense", 2)
    trained, _ = _act_per_token(phi, p1, Training(hf_class=True, lora=fc2), "dense", 2)
    assert trained - frozen == 2 * phi.intermediate_size  # fc2 trains: its input stays for its weight gradient
    full, _ = _act_per_token(star, p1, Training(hf_class=True), "dense", 2)
    gated, _ = _act_per_token(dataclasses.replace(star, gated_mlp=True), p1, Training(hf_class=True), "dense", 2)
    assert gated - full == 4 * star.intermediate_size  # 8I gated (gate, up, silu out, product) against 4I
    python_gelu, _ = _act_per_token(phi, p1, Training(hf_class=True), "dense", 2)
    fused, _ = _act_per_token(dataclasses.replace(phi, python_gelu=False), p1, Training(hf_class=True), "dense", 2)
    assert python_gelu - fused == 6 * phi.intermediate_size


def test_a_checkpointed_dsa_block_keeps_its_indexers_top_k_with_or_without_a_pipeline():
    """AutoModel's block policy must-saves every aten.topk in a block: beside the router's, the DSA indexer's fp32
    values and int64 indices on the dense path (12 bytes a kept key a token), with or without PP (the dry run of
    glm_5_te_deepep's last pipeline rank: 96 MiB a layer and microbatch at 4,096 tokens); the THD kernels' top-k is
    no aten.topk."""
    from automodel_dist.estimate.memory import _act_per_token, indexer_topk_bytes

    glm = lookup("zai-org/GLM-5")
    for backend, kept in (("sdpa", 2048), ("tilelang", glm.index_topk), ("cudnn", 0)):
        # (GLM's TileLang IndexerFunction takes torch.topk over logits padded to index_topk; cuDNN's is its own kernel)
        assert indexer_topk_bytes(glm, Training(seq_len=2048, attn_backend=backend)) == 12 * kept
    v32, v3 = lookup("deepseek-ai/DeepSeek-V3.2"), lookup("deepseek-ai/DeepSeek-V3")
    tr = Training(seq_len=4096)
    for p in (
        dims("fsdp2", dp=4, pp=2, ep=4, activation_checkpointing=True),
        dims("fsdp2", dp=8, ep=8, activation_checkpointing=True),
    ):
        assert _act_per_token(v32, p, tr, "moe", 2)[0] - _act_per_token(v3, p, tr, "moe", 2)[0] == 12 * 2048
        kernels = dataclasses.replace(tr, attn_backend="tilelang")
        assert _act_per_token(v32, p, kernels, "moe", 2)[0] == _act_per_token(v3, p, kernels, "moe", 2)[0]


@pytest.mark.parametrize(
    "model,block,eager",
    [
        ("google/gemma-2-9b-it", {}, True),  # a Hugging Face class honours the recipe's choice
        (L8, {}, True),  # so does AutoModel's own Llama class (it dispatches on config._attn_implementation)
        ("Qwen/Qwen3-8B", {}, True),  # and its Qwen3 class, built on transformers' Qwen3 layers
        ("Qwen/Qwen3-30B-A3B", {}, False),  # AutoModel's MoE class takes its attention from model.backend.attn
        ("google/gemma-2-9b-it", {"cp_size": 2}, False),  # AutoModel runs SDPA under CP
    ],
)
def test_eager_attention_keeps_every_heads_scores_where_automodel_runs_it(model, block, eager):
    """model.attn_implementation: eager runs transformers' eager_attention_forward, which keeps each head's seq x seq
    fp32 softmax and its bf16 copy (6 bytes a score, 8 with Gemma-2's softcap tanh) where flash keeps a log-sum-exp;
    AutoModel's pre-load overrides turn it into SDPA under CP and into flash for packed sequences. The dry run
    measures the same (tests/oracle/test_calibration.py eager-attention cases)."""

    def mem(attn: str | None, packed: bool = False) -> float:
        recipe: dict[str, Any] = {
            "recipe": "TrainFinetuneRecipeForNextTokenPrediction",
            "model": {"pretrained_model_name_or_path": model, **({"attn_implementation": attn} if attn else {})},
            "distributed": block,
            "step_scheduler": {"local_batch_size": 1, "global_batch_size": 8},
        }
        if packed:
            recipe["packed_sequence"] = {"packed_sequence_size": 2048}
        return estimate_memory(recipe, world_size=8, seq_len=2048).memory_gib.activations

    flash = mem(None)
    if not eager:
        assert mem("eager") == pytest.approx(flash)
        return
    spec = lookup(model)
    per_score = 8 if spec.attn_softcap else 6
    scores = spec.num_layers * spec.num_attention_heads * 2048 * 2048 * per_score / GIB
    # the scores, and keys and values repeated to every query head in place of the kernel's k, v and log-sum-exp
    swap = spec.num_layers * 2048 * 4 * (spec.num_attention_heads - spec.num_key_value_heads) * spec.hd / GIB
    swap -= spec.num_layers * 2048 * 4 * spec.num_attention_heads / GIB
    assert mem("eager") - flash == pytest.approx(scores + swap, rel=1e-6)
    assert mem("sdpa") == pytest.approx(flash)
    assert mem("eager", packed=True) == pytest.approx(mem(None, packed=True))  # AutoModel picks flash for packing


def test_eager_scores_only_where_there_are_scores_and_no_copy_in_fp32():
    """A hybrid's linear-attention layers have no seq x seq scores (the eager term of what a stage keeps is the
    attention layers' share; one layer's, the heavier kind's whole); in fp32 compute the softmax's cast to the query's
    dtype is the same tensor (4 bytes a score, not 8)."""
    from automodel_dist.catalog.models import from_hf_config
    from automodel_dist.estimate.memory import _act_per_token

    cfg = json.loads((TESTS / "models" / "qwen3_next_80b_a3b.json").read_text())
    m = from_hf_config(cfg)
    p1 = dims("fsdp2", dp=8)
    flash = Training(hf_class=True, seq_len=2048)
    eager = dataclasses.replace(flash, attn_implementation="eager")
    share = 1 - m.layer_attention.count("linear") / m.num_layers
    assert 0 < share < 1
    q, kv, a = m.num_attention_heads * m.hd, m.num_key_value_heads * m.hd, m.num_attention_heads
    extra = _act_per_token(m, p1, eager, "moe", 2)[0] - _act_per_token(m, p1, flash, "moe", 2)[0]
    assert extra == pytest.approx(share * (a * 2048 * 6 + 4 * q - 4 * kv - 4 * a))
    # one layer: the attention layer with its scores outweighs a Gated DeltaNet layer
    saved, one_layer = _act_per_token(m, p1, eager, "moe", 2)
    assert one_layer - saved == pytest.approx((1 - share) * (a * 2048 * 6 + 4 * q - 4 * kv - 4 * a), rel=0.5)
    assert one_layer > saved
    llama = lookup(L8)
    fp32 = [_act_per_token(llama, p1, dataclasses.replace(t, hf_class=True), "dense", 4)[1] for t in (flash, eager)]
    q, kv, a = llama.num_attention_heads * llama.hd, llama.num_key_value_heads * llama.hd, llama.num_attention_heads
    assert fp32[1] - fp32[0] == pytest.approx(a * 2048 * 4 + 2 * (4 * q - 4 * kv - 4 * a))


def test_gemma2s_final_logit_softcap_keeps_a_copy_of_the_logits():
    """transformers' Gemma2ForCausalLM softcaps the logits (tanh, whose output backward needs): one bf16 vocabulary
    row a token more on the last stage, none where the loss never materialises the logits (the dry run: Gemma-2-9B at
    2,048 and 4,096 tokens, within 0.3%)."""
    m = lookup("google/gemma-2-9b-it")
    assert m.final_softcap
    plain = dataclasses.replace(m, final_softcap=False)
    p1 = dims("fsdp2", dp=8)
    tr = Training(hf_class=True, seq_len=2048)
    extra = memory_per_rank(m, p1, tr).activations - memory_per_rank(plain, p1, tr).activations
    assert extra * GIB == pytest.approx(2 * m.vocab_size * 2048)
    fused = dataclasses.replace(tr, loss="FusedLinearCrossEntropy")
    assert memory_per_rank(m, p1, fused).activations == memory_per_rank(plain, p1, fused).activations


def test_pooled_pipeline_receive_buffers_are_automodels_ring():
    """pipeline.pp_recv_buffer_pool (1f1b only, as AutoModel's autopipeline installs it): each stage keeps a ring of
    max(2, min(microbatches, pp - stage + slack)) receive buffers a direction instead of one a microbatch
    (pipelining/recv_buffer_pool._ring_size, read here from AutoModel when it is installed)."""
    from automodel_dist.dims import read_dims

    spec = lookup("meta-llama/Llama-3.1-8B")
    tr = Training(seq_len=4096, pp_microbatches=16)
    block = {"pp_size": 4, "pipeline": {"pp_schedule": "1f1b", "pp_microbatch_size": 1}}
    plain = read_dims(block, world_size=8)
    pooled = read_dims({**block, "pipeline": {**block["pipeline"], "pp_recv_buffer_pool": True}}, world_size=8)
    interleaved = {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 1, "pp_recv_buffer_pool": True}
    assert plain.recv_pool_slack is None and pooled.recv_pool_slack == 2
    assert read_dims({**block, "pipeline": interleaved}, world_size=8).recv_pool_slack is None
    hidden_state = 4096 * spec.hidden_size * 2
    for rank in range(4):
        ring = max(2, min(16, 4 - rank + 2))
        directions = (rank > 0) + (rank < 3)  # inputs on all but the first stage, output gradients all but the last
        saved = (16 - ring) * directions * hidden_state
        a = memory_per_rank_of(spec, plain, tr, rank)
        b = memory_per_rank_of(spec, pooled, tr, rank)
        assert a - b == pytest.approx(saved, rel=1e-9), rank
    automodel = pytest.importorskip("nemo_automodel.components.distributed.pipelining.recv_buffer_pool")
    stage = type("Stage", (), {"num_stages": 4, "stage_index": 1})()
    assert automodel._ring_size(stage, 16, 2) == max(2, min(16, 4 - 1 + 2))


def memory_per_rank_of(spec: Any, p: Any, tr: Training, rank: int) -> float:
    from automodel_dist.estimate.memory import _memory_of_pp_rank

    return _memory_of_pp_rank(spec, p, tr, rank)["tracked_peak"]


def test_a_frozen_tower_is_held_gathered_in_the_root_unit_unless_the_recipe_says_otherwise():
    """AutoModel's distributed.multimodal.frozen_sharding (distributed/multimodal_fsdp.py) in the VLM step: root (its
    default) leaves a frozen vision tower in the root FSDP unit, gathered with it from the forward's start to the
    backward's end, whole in the compute dtype on every TP rank; replicate keeps it out of FSDP, whole on every rank
    (not sharded, not gathered); per_layer shards it layer by layer. LoRA freezes it as freeze_config does. The dry
    run's VLM rows (docs/corpus-sweep.md) hold the root case."""
    recipe = (
        "recipe: FinetuneRecipeForVLM\nmodel:\n  pretrained_model_name_or_path: mistralai/Mistral-Medium-3.5-128B\n"
        "{freeze}distributed:\n  tp_size: 8\n  pp_size: 2\n"
        "  pipeline: {{pp_schedule: 1f1b, pp_microbatch_size: 1}}\n{extra}"
    )
    frozen = "freeze_config:\n  freeze_vision_tower: true\n"
    sizes = {"world_size": 64, "seq_len": 2048, "global_batch_size": 8, "micro_batch_size": 1}
    policy = "  multimodal:\n    frozen_sharding: {}\n"
    root = estimate_memory(recipe.format(freeze=frozen, extra=""), **sizes).memory_gib
    replicate = estimate_memory(recipe.format(freeze=frozen, extra=policy.format("replicate")), **sizes).memory_gib
    per_layer = estimate_memory(recipe.format(freeze=frozen, extra=policy.format("per_layer")), **sizes).memory_gib
    m = lookup("mistralai/Mistral-Medium-3.5-128B")
    tower = m.vision_params * 2 / 2**30  # bf16, whole on every TP rank (its projector gathered with it)
    dp = 64 // (8 * 2)
    assert root.buffers - per_layer.buffers == pytest.approx(tower, rel=1e-6)
    assert replicate.buffers == pytest.approx(per_layer.buffers)
    frozen_gib = (m.vision_params - m.projector_params) * 2 / 2**30  # (the projector trains: FSDP-sharded either way)
    assert replicate.params - per_layer.params == pytest.approx(frozen_gib * (1 - 1 / dp), rel=1e-3)
    # LoRA without freeze_config: AutoModel freezes every base parameter, the tower's too
    lora = "peft:\n  target_modules: ['*.language_model.*_proj']\n  dim: 8\n"
    with_lora = estimate_memory(recipe.format(freeze=lora, extra=""), **sizes).memory_gib
    with_lora_frozen = estimate_memory(recipe.format(freeze=lora + frozen, extra=""), **sizes).memory_gib
    assert with_lora.buffers == pytest.approx(with_lora_frozen.buffers)


@CORPUS_THERE
def test_deepseek_v4_suggestions_keep_its_recipes_backend_and_its_own_stage_forward():
    """suggest from DeepSeek-V4's CP recipe: its layouts are checked with the recipe's own backend.attn (tilelang, the
    only one its class runs CP with), and a pipeline layout turns AutoModel's generic stage forward off, as
    pp-patched-forward asks; the recipe's own layout is among the candidates it compares."""
    from automodel_dist.suggest.search import suggest_strategy

    recipe = TESTS.parent.parent / "shared" / "corpus" / "llm_finetune/deepseek_v4/deepseek_v4_flash_cp_tulu3.yaml"
    rep = suggest_strategy(config=recipe, top_k=40)
    assert rep.candidates and any(c.distributed.get("cp_size", 1) > 1 for c in rep.candidates)
    piped = [c.distributed["pipeline"] for c in rep.candidates if c.distributed.get("pp_size", 1) > 1]
    assert piped and all(p["patch_inner_model"] is False and p["patch_causal_lm_model"] is False for p in piped)
    assert not [r for r in rep.rejected if "requires the TileLang attention backend" in r.reason]


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-V4-Flash", "meta-llama/Llama-3.1-8B"])
def test_the_last_stages_kept_logits_are_fp32_where_fsdp_casts_deepseek_v4s_head(name):
    """torch's schedule keeps every microbatch's output on the last stage until the step ends. DeepSeek-V4's
    hyper-connection head is an fp32 FSDP unit whose policy casts its output to fp32, so its final norm's output and
    the logits AutoModel casts back to that dtype are fp32 where FSDP shards (dp x cp > 1: AutoModel's MoE
    parallelizer wraps nothing on a one-rank mesh): 2 bytes a logit more than in the compute dtype (the dry run of the
    Pro recipe's last rank: 8 microbatches of fp32 logits; tests/integration/test_dry_run.py holds the term to the dry
    run). Other models' logits are in the compute dtype either way."""
    from automodel_dist.estimate.memory import _memory_of_pp_rank

    m = lookup(name)
    tr = Training(seq_len=2048, pp_microbatches=4)
    acts = {dp: _memory_of_pp_rank(m, dims("fsdp2", dp=dp, pp=2), tr, 1)["activations"] for dp in (1, 2)}
    fp32_more = 2.0 * m.vocab_size * 2048 * 4 if m.hc_mult else 0.0  # bytes
    assert acts[2] - acts[1] == pytest.approx(fp32_more, abs=1.0)


def test_a_dsa_indexers_scores_stand_beside_everything_in_flight_and_its_top_k_with_each_checkpointed_block(
    monkeypatch,
):
    """DeepSeek-V3.2's and GLM-5's indexer on AutoModel's dense path scores every query-key pair of every index head
    in fp32 at each layer's start (indexer_scores_bytes, held to AutoModel's indexers in tests/oracle): the
    indexer-forward moment holds it beside everything in flight but the running layer's own share and the microbatch's
    loss, and a checkpointed layer makes it again in its recompute. The block policy must-saves its top-k's fp32 values
    and int64 indices (12 bytes a kept key) with each checkpointed layer. The THD kernels (tilelang, cudnn) make
    neither."""
    import automodel_dist.estimate.memory as memory
    from automodel_dist.estimate.memory import indexer_scores_bytes

    # (the MoE layers' recomputed working set held out: the recompute's transient here is the indexer's alone)
    monkeypatch.setattr(memory, "moe_forward_bytes", lambda m, tr: 0.0)
    spec = lookup("deepseek-ai/DeepSeek-V3.2")
    p = dims("fsdp2", dp=32, pp=4, ep=32, pp_schedule="Interleaved1F1B", activation_checkpointing=True)
    dense, kernels = Training(seq_len=4096, attn_backend="te"), Training(seq_len=4096, attn_backend="tilelang")
    per_mb, per_token = indexer_scores_bytes(spec, dense)
    scores = per_mb + (per_token + 2 * spec.hidden_size) * 4096  # (with the layer's normed input, made before it)
    assert per_mb == 4096 * (8 * 64 + 4) * 4096 and indexer_scores_bytes(spec, kernels) == (0.0, 0.0)
    for rank in (0, 1, 3):  # (the last rank's loss is not made yet at that moment)
        on, off = (_memory_of_pp_rank(spec, p, t, rank)["phases"] for t in (dense, kernels))
        assert "indexer-forward" in on and "indexer-forward" not in off
        if rank < 3:
            assert on["indexer-forward"][2] - on["start-of-backward"][2] == pytest.approx(scores)
        assert on["indexer-forward"][1] < on["start-of-backward"][1]  # the running layer's and the loss's not yet
        assert on["in-backward"][2] - off["in-backward"][2] >= scores - 2 * GIB  # its recompute, not the layer's
        # the top-k kept with each checkpointed layer in flight: the same count of layer-microbatches either way
        kept = on["start-of-backward"][1] - off["start-of-backward"][1]
        assert kept >= 12 * min(spec.index_topk, 4096) * 4096  # at least one layer's
        narrow = dataclasses.replace(spec, index_topk=spec.index_topk // 2)
        halved = (
            _memory_of_pp_rank(narrow, p, dense, rank)["phases"]["start-of-backward"][1] - off["start-of-backward"][1]
        )
        assert halved == pytest.approx(kept / 2)
    no_ac = dataclasses.replace(p, activation_checkpointing=False)
    assert _memory_of_pp_rank(spec, no_ac, dense, 0)["phases"]["start-of-backward"][1] == pytest.approx(
        _memory_of_pp_rank(spec, no_ac, kernels, 0)["phases"]["start-of-backward"][1]
    )


def test_a_pipeline_rank_before_the_last_peaks_in_a_forward_beside_its_moe_layers_working_set():
    """Before the last pipeline rank nothing stands above the in-flight activations at the start of backward (no
    loss): the peak comes in a forward, where a MoE layer's routed experts hold their working set beside everything in
    flight (moe_forward_bytes). The last rank's loss moment stands for it there."""
    spec = lookup("moonshotai/Moonlight-16B-A3B")
    tr = Training(seq_len=4096)
    p = dims("fsdp2", dp=8, pp=4, ep=8, pp_schedule="1F1B")
    first = _memory_of_pp_rank(spec, p, tr, 0)["phases"]
    working = moe_forward_bytes(spec, tr) * 4096
    assert first["moe-forward"][1] == first["start-of-backward"][1]
    assert first["moe-forward"][2] - first["start-of-backward"][2] == pytest.approx(working)
    assert "moe-forward" not in _memory_of_pp_rank(spec, p, tr, 3)["phases"]
    assert "moe-forward" not in _memory_of_pp_rank(lookup(L8), dims("fsdp2", dp=8, pp=4), tr, 0)["phases"]


def test_the_heads_own_fsdp_unit_peaks_at_its_forward_with_its_all_gather_buffer_beside_its_logits():
    """FSDP2 keeps a forward all-gather's output until the root's post-forward for the last unit, the lm_head: its
    buffer beside the gathered head and its logits (twice under LoRA on the head), with everything in flight but the
    microbatch's loss. It wins only where a sequence's logits are small beside the head (few tokens, a wide model),
    as in AutoModel's two-layer Qwen3-MoE proxy (256 tokens), whose dry run peaks there."""
    spec = lookup("Qwen/Qwen3-30B-A3B")
    p = dims("fsdp2", dp=8, ep=2)
    short = Training(seq_len=256, moe_sync_class=True, lora=lora_of(spec, {"target_modules": ["*"], "dim": 32}))
    assert "lm_head" in short.lora.adapted
    phases = _memory_of_pp_rank(spec, p, short, 0)["phases"]
    (_, sob_acts, sob_rest), (_, hf_acts, hf_rest) = phases["start-of-backward"], phases["head-forward"]
    per_saved, per_temp = LOSS_BYTES[("MaskedCrossEntropy", True)]
    logits = spec.vocab_size * 256
    # the head's all-gather output (bf16) where the loss's temporaries are not made yet; the same gathered units
    assert hf_rest - (sob_rest - per_temp * logits) == pytest.approx(2 * spec.lm_head_params())
    # the base output and the LoRA sum in bf16 where the loss's saved logits are not made yet
    assert hf_acts - (sob_acts - per_saved * logits) == pytest.approx(2 * 2 * logits)
    assert sum(phases["head-forward"]) > sum(phases["start-of-backward"])
    # at 4,096 tokens the loss's logits outweigh the head: the start of backward stays the larger
    long = _memory_of_pp_rank(spec, p, dataclasses.replace(short, seq_len=4096), 0)["phases"]
    assert sum(long["head-forward"]) < sum(long["start-of-backward"])

    last = type("Groups", (), {"last": True, "lm_head": 1.0})()
    q_only = lora_of(spec, {"target_modules": ["*.q_proj"]})
    dense = dims("fsdp2", dp=8)
    # with ep_size 1 the dense parallelizer shards only a trainable untied head on its own (a frozen one stays in the
    # root, gathered at the forward's start); with ep_size > 1 the MoE parallelizer any untied head
    assert not head_gathers_in_forward(spec, dense, Training(lora=q_only), last, q_only, True)
    assert head_gathers_in_forward(spec, p, Training(lora=q_only), last, q_only, True)
    assert head_gathers_in_forward(spec, dense, Training(), last, None, True)
    # a linear cross entropy: without PP the model still runs the head (each sequence's last token); a pipeline's
    # last stage returns hidden states and the loss takes the weight
    assert head_gathers_in_forward(spec, dense, Training(loss="ChunkedCrossEntropy"), last, None, True)
    assert not head_gathers_in_forward(
        spec, dims("fsdp2", dp=2, pp=4), Training(loss="ChunkedCrossEntropy"), last, None, True
    )
    # MegatronFSDP, one rank, or a shard group of one rank (tensor parallelism over all 8) gather otherwise or not
    assert not head_gathers_in_forward(spec, dims("megatron_fsdp", dp=8), Training(), last, None, True)
    assert not head_gathers_in_forward(spec, dense, Training(), last, None, False)
    assert not head_gathers_in_forward(spec, dims("fsdp2", dp=1, tp=8), Training(), last, None, True)
    # a tied head is the embedding's, in the root; a pipeline's last stage holds no embedding
    tied = lookup("meta-llama/Llama-3.2-1B")
    assert not head_gathers_in_forward(tied, dense, Training(), last, None, True)
    assert head_gathers_in_forward(tied, dims("fsdp2", dp=2, pp=4), Training(), last, None, True)
    # where the head stays gathered between microbatches (the MoE sync mixin accumulating; a pipeline stage), only a
    # step's first microbatch gathers it: no gradient made, no output kept yet
    accumulating = dataclasses.replace(short, global_batch_size=64, fsdp_sync_mixin=True)
    kept = _memory_of_pp_rank(spec, p, accumulating, 0)
    regathered = _memory_of_pp_rank(spec, p, dataclasses.replace(accumulating, fsdp_sync_mixin=False), 0)
    assert kept["phases"]["head-forward"][0] == 0.0 and regathered["phases"]["head-forward"][0] >= 0.0
    assert kept["phases"]["head-forward"][2] < regathered["phases"]["head-forward"][2]  # (no deferred gradients)


def test_a_recomputed_moe_layer_runs_its_experts_forward_again_inside_its_backward(monkeypatch):
    """Under activation checkpointing a MoE layer's backward first runs its forward again: its routed experts' working
    set (moe_forward_bytes) stands there in place of what they keep, beside the rest of what the layer keeps (autograd
    keeps the recompute's saved tensors). Without checkpointing, on a dense model, or where the MoE blocks are not
    checkpointed, nothing changes."""
    import automodel_dist.estimate.memory as memory

    spec = lookup("moonshotai/Moonlight-16B-A3B")
    tr = Training(seq_len=4096)
    p = dims("fsdp2", dp=8, ep=8, activation_checkpointing=True)

    def in_backward(per_token: float, dims_=p, model=spec) -> float:
        monkeypatch.setattr(memory, "moe_forward_bytes", lambda m, tr: per_token)
        return memory._memory_of_pp_rank(model, dims_, tr, 0)["phases"]["in-backward"][2]

    big, bigger = 1e6, 2e6  # bytes a token: above what the recompute keeps
    assert in_backward(bigger) - in_backward(big) == pytest.approx((bigger - big) * 4096)
    assert in_backward(0.0) < in_backward(big)
    no_ac = dataclasses.replace(p, activation_checkpointing=False)
    assert in_backward(bigger, no_ac) == in_backward(big, no_ac)
    dense = lookup(L8)
    dense_ac = dims("fsdp2", dp=8, activation_checkpointing=True)
    assert in_backward(bigger, dense_ac, dense) == in_backward(big, dense_ac, dense)
    # Nemotron-H's own policy (ep_size 1) checkpoints its Mamba and MLP blocks, not its MoE ones: nothing recomputed
    nano = lookup("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert in_backward(bigger, dense_ac, nano) == in_backward(big, dense_ac, nano)
    assert in_backward(bigger, p, nano) > in_backward(big, p, nano)  # (ep 8: AutoModel's MoE path checkpoints them)


def test_under_the_moe_sync_mixin_a_microbatchs_late_backward_runs_beside_every_unit_gathered():
    """AutoModel's MoE sync mixin turns reshard after backward off for every microbatch but a step's last: each unit a
    backward gathers stays gathered, so the first blocks' backward runs with every unit gathered (the dry run of
    nemotron_super_v3_lora: all 88 layers' units, the head's and the MTP's live at its first MoE layer's recompute)."""
    spec = lookup("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16")
    # (the recipe's moe.reshard_after_forward: true; AutoModel's default false keeps the blocks gathered anyway)
    p = dims("fsdp2", dp=64, ep=64, activation_checkpointing=True, moe_reshard_after_forward=True)
    lora = lora_of(spec, {"target_modules": ["*"], "dim": 32})
    kept = Training(seq_len=4096, micro_batch_size=2, global_batch_size=512, lora=lora, fsdp_sync_mixin=True)
    phases = _memory_of_pp_rank(spec, p, kept, 0)["phases"]
    # every unit gathered, at least, where the next microbatch's forward starts with them all
    assert phases["gathered-late-backward"][2] >= phases["next-microbatch-forward"][2]
    # the step's last microbatch reshards after its backward: its late backward holds one block gathered, not 88
    assert phases["late-backward"][2] < phases["gathered-late-backward"][2] - 10 * GIB
    plain = _memory_of_pp_rank(spec, p, dataclasses.replace(kept, fsdp_sync_mixin=False), 0)["phases"]
    assert "gathered-late-backward" not in plain and "next-microbatch-forward" not in plain
    assert plain["late-backward"] == phases["late-backward"]


def test_the_last_pipeline_ranks_held_gradients_at_its_loss_are_its_last_stages_with_the_heads():
    """With every microbatch in one round of the interleaved schedule, each stage's unsharded gradients are reduced
    after its last microbatch's backward, so about one stage's are held at a time. The last rank's peak, its last
    microbatch's loss, comes in its last stage's backward: the head's gradient is held there whole (the dry run of
    glm_5.2_tulu3_4k_cudnn_100k's last rank: the head's fp32 gradient, 3.5 GiB, beside that stage's blocks'), not a
    stage's share of it."""
    spec = lookup("moonshotai/Moonlight-16B-A3B")
    wide = dataclasses.replace(spec, vocab_size=2 * spec.vocab_size)
    tr = Training(seq_len=4096, pp_microbatches=4)
    p = dims("fsdp2", dp=8, pp=4, ep=8, pp_schedule="Interleaved1F1B", activation_checkpointing=True)
    assert p.stages_per_rank_of(spec.num_layers) > 1

    def held(m, rank: int) -> float:
        return _memory_of_pp_rank(m, p, tr, rank)["deferred_grads"]

    head = spec.vocab_size * spec.hidden_size
    assert held(wide, 3) - held(spec, 3) == pytest.approx(head * 4)  # fp32, AutoModel's reduce dtype
    assert held(wide, 1) == pytest.approx(held(spec, 1))  # no head on a middle rank
    # reduced with its stage, it is gone by the end of backward (where the last unit's own gradient is counted)
    narrow, broad = (_memory_of_pp_rank(m, p, tr, 3)["phases"] for m in (spec, wide))
    for phase in ("start-of-backward", "in-backward"):
        assert broad[phase][2] - narrow[phase][2] >= head * 4
    assert broad["end-of-backward"][2] - narrow["end-of-backward"][2] == pytest.approx(head * 6)  # (2 + 4 bytes)


def test_a_linear_cross_entropy_makes_no_gradient_of_a_head_lora_leaves_frozen():
    """AutoModel's linear cross entropies take the head's own weight (prepare_lm_weight: lm_head.weight), frozen under
    LoRA: chunked_ce's backward makes its fp32 gradient (and the cast) only where the weight takes one (the dry run of
    glm_5.2_lora, ChunkedCrossEntropy under LoRA: no [vocab, hidden] gradient at its loss)."""
    spec = lookup("moonshotai/Moonlight-16B-A3B")
    p = dims("fsdp2", dp=8, ep=8)
    table = spec.vocab_size * spec.hidden_size
    for loss, weight_grad in (("ChunkedCrossEntropy", 6), ("FusedLinearCrossEntropy", 2)):
        full = _memory_of_pp_rank(spec, p, Training(seq_len=4096, loss=loss), 0)["phases"]["start-of-backward"][2]
        lora = Training(seq_len=4096, loss=loss, lora=lora_of(spec, {"match_all_linear": True, "dim": 8}))
        adapted = _memory_of_pp_rank(spec, p, lora, 0)["phases"]["start-of-backward"][2]
        assert full - adapted >= weight_grad * table


def test_a_fused_expert_activation_holds_its_output_alone_in_the_moe_working_set():
    """AutoModel's torch.compile'd expert activations (Nemotron-3's relu2, GPT-OSS's quick_geglu, DeepSeek-V4's clamped
    SwiGLU) are one fused kernel that writes its output alone: the routed working set counts 2 bytes a routed copy and
    expert width for it where an eager activation's two outputs count 4; transformers' classes run their own eager
    code."""
    tr = Training(seq_len=4096)
    for model, fused in (
        ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", True),
        ("openai/gpt-oss-20b", True),
        ("deepseek-ai/DeepSeek-V4-Flash", True),
        ("Qwen/Qwen3-30B-A3B", False),
    ):
        spec = lookup(model)
        assert spec.fused_expert_activation is fused, model
        k, i = spec.experts_per_token, spec.moe_intermediate_size
        eager = moe_forward_bytes(dataclasses.replace(spec, fused_expert_activation=False), tr)
        assert eager - moe_forward_bytes(spec, tr) == (2 * k * i if fused else 0), model
        assert moe_forward_bytes(spec, dataclasses.replace(tr, hf_class=True)) == eager, model
    assert not lookup("nvidia/NVIDIA-Nemotron-Nano-9B-v2").fused_expert_activation  # no MoE layers


def test_transformers_sdpa_path_keeps_keys_and_values_repeated_where_a_sliding_window_mask_is_built():
    """A transformers class that masks every layer with its config's sliding window (Mistral-7B-v0.1: 4,096) builds
    the SDPA mask once a sequence reaches the window, and with a mask its SDPA path repeats the keys and values to
    every query head, which the kernel saves: 4 bytes a token for each query-head column past the key-value heads,
    every layer (the dry run of mistral_7b_squad_peft). Below the window, without GQA, under eager attention (counted
    there already) or flash_attention_2, nothing changes."""
    from automodel_dist.estimate.memory import sdpa_repeats_kv

    spec = lookup("mistralai/Mistral-7B-v0.1")
    assert spec.mask_window == 4096 and lookup("mistralai/Mistral-Nemo-Base-2407").mask_window is None
    p = dims("fsdp2", dp=8)
    at = Training(seq_len=4096, hf_class=True)
    assert sdpa_repeats_kv(spec, p, at)
    assert not sdpa_repeats_kv(spec, p, dataclasses.replace(at, seq_len=4095))
    assert not sdpa_repeats_kv(spec, p, dataclasses.replace(at, attn_implementation="flash_attention_2"))
    assert not sdpa_repeats_kv(spec, p, dataclasses.replace(at, attn_implementation="eager"))
    assert not sdpa_repeats_kv(spec, dims("fsdp2", dp=4, cp=2), at)
    assert not sdpa_repeats_kv(spec, p, dataclasses.replace(at, hf_class=False))
    assert not sdpa_repeats_kv(dataclasses.replace(spec, num_key_value_heads=32), p, at)
    from automodel_dist.estimate.memory import _act_per_token

    q, kv = spec.num_attention_heads * spec.hd, spec.num_key_value_heads * spec.hd
    saved = _act_per_token(spec, p, at, "dense", 2)[0]
    assert saved - _act_per_token(dataclasses.replace(spec, mask_window=None), p, at, "dense", 2)[0] == 4 * (q - kv)
    # at the peak (the last block's backward) the other 31 layers' saved sets stand
    with_mask = memory_per_rank(spec, p, at)
    without = memory_per_rank(dataclasses.replace(spec, mask_window=None), p, at)
    assert with_mask.peak_phase == "in-backward"
    held = (spec.num_layers - 1) * 4096 * 4 * (q - kv) / 2**30
    assert with_mask.activations - without.activations == pytest.approx(held, rel=1e-6)
