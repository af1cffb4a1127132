"""What a recipe trains, as the estimate sizes it: LoRA (matched as AutoModel matches it), QLoRA, each loss, each
optimizer, the parameters' dtype."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import estimate_memory
from automodel_dist.catalog.models import lookup
from automodel_dist.estimate.peft import QLORA_BYTES, lora_of, quantized_linear_weights, wildcard_match

GIB = float(1 << 30)
L8 = "meta-llama/Llama-3.1-8B"
HAS_AUTOMODEL = importlib.util.find_spec("nemo_automodel") is not None
LLM = "recipe: TrainFinetuneRecipeForNextTokenPrediction\n"


def test_lora_on_every_projection_of_llama_3_1_8b_counts_by_hand():
    m = lookup(L8)
    h, kv, inter = 4096, 8 * 128, 14336
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + inter) + (inter + h)  # q, k and v, o, gate and up, down
    assert lora_of(m, {"target_modules": ["*_proj"], "dim": 16}).total(m) == 32 * 16 * per_layer == 41_943_040
    assert lora_of(m, {}).total(m) == 32 * 8 * per_layer  # nothing given: *_proj, AutoModel's default dim 8
    assert lora_of(m, {"target_modules": ["q_proj"], "dim": 16}).total(m) == 0  # a bare name matches no full name
    assert lora_of(m, {"match_all_linear": True, "dim": 16}).lm_head == 16 * (h + 128256)
    assert lora_of(m, {"exclude_modules": ["*.mlp.*"], "dim": 16}).total(m) == 32 * 16 * (
        (h + h) + 2 * (h + kv) + (h + h)
    ) + 16 * (h + 128256)  # every other Linear, the lm_head too
    first_two = lora_of(m, {"target_modules": ["*.layers.1.*"], "dim": 16})
    assert first_two.adapted == ()  # the pattern names layer 1 only; the layers per kind are read at layer 0


PATTERN = st.lists(
    st.sampled_from(["*", ".*", "model", "layers", "1", "10", "self_attn", "q_proj", "_proj", "mlp", ".", "experts"]),
    min_size=1,
    max_size=6,
).map("".join)
NAME = st.sampled_from(
    [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.10.mlp.down_proj",
        "model.layers.1.mlp.experts",
        "lm_head",
        "backbone.layers.3.mixer.in_proj",
    ]
)


@pytest.mark.skipif(not HAS_AUTOMODEL, reason="AutoModel oracle not installed")
@settings(max_examples=400, deadline=None)
@given(PATTERN, NAME)
def test_wildcards_match_as_automodels_matcher_does(pattern, name):
    from nemo_automodel.components._peft.module_matcher import wildcard_match as automodel_match

    assert wildcard_match(pattern, name) == automodel_match(pattern, name)


@pytest.mark.skipif(not HAS_AUTOMODEL, reason="AutoModel oracle not installed")
@pytest.mark.parametrize(
    "peft",
    [
        {"target_modules": ["*_proj"], "dim": 16},
        {"target_modules": ["*.q_proj", "*.v_proj"], "dim": 8},
        {"match_all_linear": True, "dim": 4},
        {"exclude_modules": ["*.mlp.*", "*lm_head*"], "dim": 32},
    ],
    ids=["all-projections", "q-and-v", "match-all-linear", "exclude-mlp-and-head"],
)
def test_lora_counts_match_automodels_matcher_on_the_built_model(peft):
    """AutoModel's ModuleMatcher over the module tree of the transformers class built on the meta device."""
    import torch
    import transformers
    from nemo_automodel.components._peft.module_matcher import ModuleMatcher

    from automodel_dist.catalog.models import from_hf_config

    cfg = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    matcher = ModuleMatcher(
        peft.get("target_modules", []), peft.get("exclude_modules", []), peft.get("match_all_linear", False), True
    )
    expected = sum(
        peft["dim"] * (mod.in_features + mod.out_features)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and matcher.match(mod, name)
    )
    spec = from_hf_config(cfg)
    assert lora_of(spec, peft).total(spec) == expected


def _params(text: str, world: int = 8, model: str = L8, **kw):
    return estimate_memory(LLM + text, world_size=world, model=model, seq_len=2048, **kw)


def test_lora_leaves_the_base_frozen_without_gradients_or_optimizer_states():
    full = _params("distributed: {}\n")
    lora = _params("peft:\n  target_modules: ['*_proj']\n  dim: 16\ndistributed: {}\n")
    m = lookup(L8)
    adapters = 41_943_040
    assert lora.trainable_params == adapters and full.trainable_params == m.param_count()
    assert lora.memory_gib.optimizer * GIB == pytest.approx(adapters / 8 * 4, rel=1e-9)  # two bf16 AdamW states
    assert lora.memory_gib.params * GIB == pytest.approx((m.param_count() + adapters) / 8 * 2, rel=1e-9)
    assert lora.step_time_s < full.step_time_s  # the frozen weights run no weight-gradient matmul
    assert lora.workload[0].startswith("LoRA dim 16 on down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj")


def test_qlora_holds_the_linear_weights_at_four_bits():
    m = lookup(L8)
    q = _params(
        "peft:\n  target_modules: ['*_proj']\n  dim: 16\nquantization:\n  load_in_4bit: true\ndistributed: {}\n",
        world=1,
    )
    linear = quantized_linear_weights(m)
    layers = sum(m.layer_params(i) for i in range(m.num_layers))
    rest = m.param_count() - layers
    expected = (layers - linear) * 2 + linear * QLORA_BYTES[4] + rest * 2 + 41_943_040 * 2
    assert q.memory_gib.params * GIB == pytest.approx(expected, rel=1e-6)
    assert QLORA_BYTES[4] == pytest.approx(0.5159, abs=1e-4)  # NF4 with double quantization
    assert "quantized to 4 bits" in q.workload[0]


@pytest.mark.parametrize(
    "loss,saved,note",
    [
        ("masked_ce.MaskedCrossEntropy", 4.0, "fp32 log-probabilities"),
        ("masked_ce.MaskedCrossEntropy\n  fp32_upcast: false", 2.0, "bf16 logits"),
        ("linear_ce.FusedLinearCrossEntropy", 0.0, "no logits materialised"),
        ("chunked_ce.ChunkedCrossEntropy", 0.0, "512-token chunks"),
    ],
    ids=["masked", "masked-bf16", "fused-linear", "chunked"],
)
def test_each_loss_keeps_what_it_keeps(loss, saved, note):
    small = "meta-llama/Llama-3.2-1B"  # small layers: the peak is at the start of backward for every loss
    base = _params("distributed: {}\n", model=small)
    est = _params(f"loss_fn:\n  _target_: nemo_automodel.components.loss.{loss}\ndistributed: {{}}\n", model=small)
    logits = lookup(small).vocab_size * 2048
    assert any(note in line for line in est.workload)
    if base.memory_gib.peak_phase == est.memory_gib.peak_phase:  # the same moment: exactly less kept
        assert (base.memory_gib.activations - est.memory_gib.activations) * GIB == pytest.approx((4.0 - saved) * logits)
    else:  # no full-vocabulary logits at all: the peak moves into the layers' backward, lower
        assert saved == 0.0 and est.memory_gib.total < base.memory_gib.total


TE = "_target_: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam\n"


@pytest.mark.parametrize(
    "optimizer,per_param",
    [
        ("_target_: torch.optim.AdamW", 4.0),
        ("_target_: torch.optim.SGD\n  momentum: 0.9", 2.0),
        ("_target_: torch.optim.SGD", 0.0),
        ("_target_: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam", 8.0),
        ("_target_: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam\n  master_weights: true", 12.0),
        (TE + "  master_weights: true\n  master_weight_dtype: torch.float16", 10.0),
        (TE + "  master_weights: true\n  store_param_remainders: true", 10.0),  # bf16 parameters: 16-bit remainders
        (TE + "  store_param_remainders: true", 8.0),  # (no master copy to keep remainders of)
        (TE + "  exp_avg_dtype: bf16\n  exp_avg_sq_dtype: Torch.BFloat16", 4.0),  # AutoModel's dtype_from_str
        (TE + "  exp_avg_dtype: torch.uint8\n  exp_avg_sq_dtype: torch.uint8", 2.0),  # TE's FP8 moments
        ("_target_: dion.Muon", 2.0),
    ],
    ids=[
        "adamw",
        "sgd-momentum",
        "sgd",
        "te-fused-adam",
        "te-fused-adam-master",
        "te-fp16-master",
        "te-remainders",
        "te-remainders-no-master",
        "te-short-dtype-names",
        "te-fp8-moments",
        "muon",
    ],
)
def test_each_optimizer_keeps_its_states(optimizer, per_param):
    est = _params(f"optimizer:\n  {optimizer}\ndistributed: {{}}\n")
    assert est.memory_gib.optimizer * GIB * 8 == pytest.approx(lookup(L8).param_count() * per_param, rel=1e-9)


def test_fp32_weights_double_the_parameters_and_their_states():
    bf16 = _params("distributed: {}\n")
    fp32 = _params("model:\n  torch_dtype: float32\ndistributed: {}\n")
    assert fp32.precision == "bf16-mixed" and bf16.precision == "bf16"
    assert fp32.memory_gib.params == pytest.approx(2 * bf16.memory_gib.params)
    assert fp32.memory_gib.optimizer == pytest.approx(2 * bf16.memory_gib.optimizer)
    assert any("model.torch_dtype float32: 4-byte parameters" in line for line in fp32.workload)
    forced = _params("model:\n  torch_dtype: float32\ndistributed: {}\n", precision="bf16")
    assert forced.memory_gib.params == bf16.memory_gib.params  # the argument wins


def test_fits_agrees_with_the_limits_it_prints():
    """A layout judged to fit has room for its own sizes in both limits; one that does not, not in both; a tight one
    has room exactly when its point estimate is within the budget."""
    for world in (1, 2, 4, 8):
        for gbs in (8, 64):
            est = estimate_memory(
                "distributed: {}\n", model=L8, world_size=world, seq_len=4096, global_batch_size=gbs, micro_batch_size=1
            )
            room = (est.max_seq_len or 0) >= est.seq_len and (est.max_micro_batch_size or 0) >= est.micro_batch_size
            budget = est.gpu_memory_gib * (1 - est.headroom)
            # the limits are the point estimate's; the verdict allows the estimate's error either way
            assert room == (est.memory_gib.total <= budget), (world, gbs, est.max_seq_len, est.max_micro_batch_size)
            if est.verdict == "fits":
                assert room and est.fits is True
            elif est.verdict == "does not fit":
                assert not room and est.fits is False
            else:
                assert est.verdict == "tight" and est.fits is None


@pytest.mark.parametrize(
    "target,extra,pretrained",
    [
        ("nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained", {}, True),
        ("nemo_automodel.NeMoAutoModelForImageTextToText.from_pretrained", {}, True),
        ("nemo_automodel.NeMoAutoModelForCausalLM.from_config", {}, False),
        ("nemo_automodel.NeMoAutoModelForCausalLM.from_config", {"load_base_model": True}, True),
        ("nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained", {"load_base_model": False}, False),
        ("nemo_automodel.NeMoAutoModelBiEncoder.from_pretrained", {}, False),  # its encoder loads its own weights
        (None, {}, False),
    ],
)
def test_automodels_load_base_model_is_read_and_the_dry_run_knows(target, extra, pretrained):
    """AutoModel's load_base_model (from_pretrained's, or from_config's keyword): the dry run's plan hands it to the
    worker, which initializes a pipeline part as AutoModel does before loading a checkpoint (shims.PRETRAINED_PP_INIT)."""
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request
    from automodel_dist.workload import read_workload

    model = {"pretrained_model_name_or_path": L8, **extra, **({"_target_": target} if target else {})}
    recipe = {"model": model, "distributed": {"strategy": "fsdp2", "pp_size": 2}}
    assert read_workload(recipe).load_base_model is pretrained
    plan = plan_dry_run(Request.of(recipe, world_size=4))
    assert plan.specs and all(s.recipe.load_base_model is pretrained for s in plan.specs)


def test_attention_implementation_and_packing_are_read_where_automodel_reads_them():
    from automodel_dist.workload import read_workload

    w = read_workload({"model": {"attn_implementation": "eager"}, "packed_sequence": {"packed_sequence_size": 4096}})
    assert (w.attn_implementation, w.packed) == ("eager", True)
    w = read_workload({"model": {"attn_implementation": 3}, "packed_sequence": {"packed_sequence_size": 0}})
    assert (w.attn_implementation, w.packed) == (None, False)


@pytest.mark.parametrize("attn,eager", [("eager", True), ("sdpa", False), (None, False)])
def test_the_dry_run_builds_with_eager_attention_only_where_the_step_runs_it(attn, eager):
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    model = {"pretrained_model_name_or_path": "google/gemma-2-9b-it", **({"attn_implementation": attn} if attn else {})}
    plan = plan_dry_run(Request.of({"model": model, "distributed": {"strategy": "fsdp2"}}, world_size=8))
    assert all(s.recipe.attn_implementation == ("eager" if eager else None) for s in plan.specs)
    assert any("eager attention" in x for x in plan.substitutions) is eager
    under_cp = plan_dry_run(Request.of({"model": model, "distributed": {"cp_size": 2}}, world_size=8))
    assert all(s.recipe.attn_implementation is None for s in under_cp.specs)


@pytest.mark.parametrize(
    "target,sized",
    [
        ("nemo_automodel.NeMoAutoModelForImageTextToText.from_pretrained", True),
        ("nemo_automodel.NeMoAutoModelForCausalLM.from_config", True),
        ("nemo_automodel.components.models.gemma4_drafter.composite.Gemma4WithDrafter.from_pretrained", False),
        ("nemo_automodel.NeMoAutoModelBiEncoder.from_pretrained", True),
        ("transformers.AutoModelForCausalLM.from_pretrained", True),  # not AutoModel's: sized as before
        (None, True),
    ],
)
def test_a_composite_model_target_is_neither_estimated_nor_dry_run(target, sized):
    """An AutoModel class called directly as model._target_, not one of its NeMoAutoModel entry points, may build
    something around the named model (the joint drafter: a second model and its own checkpointing): both tools say so
    instead of sizing the base alone."""
    from automodel_dist.dry_run.plan import DryRunUsageError, plan_dry_run
    from automodel_dist.request import Request
    from automodel_dist.workload import read_workload, unsized_entry

    model = {"pretrained_model_name_or_path": L8, **({"_target_": target} if target else {})}
    recipe = {"model": model, "distributed": {"strategy": "fsdp2"}}
    assert (unsized_entry(read_workload(recipe)) is None) is sized
    if sized:
        return
    with pytest.raises(ValueError, match="Gemma4WithDrafter directly"):
        estimate_memory(recipe, world_size=8)
    with pytest.raises(DryRunUsageError, match="Gemma4WithDrafter directly"):
        plan_dry_run(Request.of(recipe, world_size=8))


@pytest.mark.parametrize("attn,eager", [("sdpa", True), ("flex", True), ("te", False), (None, False)])
def test_mimo_runs_its_own_eager_attention_on_every_backend_but_te_in_both_tools(attn, eager):
    """AutoModel's MiMo-V2-Flash class runs its own eager attention unless model.backend.attn is te (unset: te on a GPU
    with Transformer Engine): the dry run gives it no TE stand-in for another backend and says so, and the estimate
    counts the scores."""
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    backend = {"_target_": "nemo_automodel.components.models.common.BackendConfig", **({"attn": attn} if attn else {})}
    model = {"pretrained_model_name_or_path": "XiaomiMiMo/MiMo-V2-Flash", "backend": backend}
    recipe = {"model": model, "distributed": {"strategy": "fsdp2", "ep_size": 8}}
    plan = plan_dry_run(Request.of(recipe, world_size=8))
    assert any("its own eager attention" in x for x in plan.substitutions) is eager
    assert any("Transformer Engine's shapes" in x for x in plan.substitutions) is not eager
    # (flex needs CUDA: it runs as sdpa, which takes the same eager path in this class)
    assert all((s.recipe.backend["attn"] != "te") is eager for s in plan.specs)
    flash = {"pretrained_model_name_or_path": "XiaomiMiMo/MiMo-V2-Flash", "backend": {**backend, "attn": "te"}}
    kept = estimate_memory(recipe, world_size=8, seq_len=4096).memory_gib.activations
    te = estimate_memory({**recipe, "model": flash}, world_size=8, seq_len=4096).memory_gib.activations
    assert (kept > te) is eager


def test_a_vlm_recipes_packing_is_read_as_automodels_neat_pack_config_reads_it():
    from automodel_dist.vlm_packing import VlmPacking
    from automodel_dist.workload import read_workload

    vlm = {"recipe": "FinetuneRecipeForVLM"}
    w = read_workload({**vlm, "packed_sequence": {"pack_size": 3072, "packing_ratio": 0.9}})
    assert (w.vlm_packing, w.seq_len) == (VlmPacking(3072, 0.9, None), (3072, "packed_sequence.pack_size"))
    assert (w.vlm_packing.capacity, w.vlm_packing.padded) == (2764, False)
    # the collate pads every batch to collate_max_length where it is past the longest pack
    w = read_workload({**vlm, "packed_sequence": {"pack_size": 2048, "collate_max_length": 4096}})
    assert (w.vlm_packing.padded, w.seq_len) == (True, (4096, "packed_sequence.collate_max_length"))
    w = read_workload({**vlm, "packed_sequence": {"pack_size": 4096, "collate_max_length": 2048, "packing_ratio": "x"}})
    assert (w.vlm_packing, w.seq_len[0]) == (VlmPacking(4096, 1.0, 2048), 4096)  # a shorter one pads short packs only
    assert (
        read_workload({"packed_sequence": {"pack_size": 3072}}).vlm_packing is None
    )  # the LLM recipe's key is another


def test_packs_padded_to_their_own_length_say_how_the_packer_fills_them_in_both_tools():
    """gemma4_26b_a4b_moe_packing as the corpus has it: Gemma-4's image takes 256 tokens where AutoModel's packer
    counts 500, so five one-image samples fill a 2,764-token pack; Qwen3.5's takes 961 and its packs fill to
    pack_size. A recipe that pads every batch to collate_max_length gets no such note (its length is what is sized)."""
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    recipe = {
        "recipe": "FinetuneRecipeForVLM",
        "model": {"pretrained_model_name_or_path": "google/gemma-4-26B-A4B-it"},
        "distributed": {"strategy": "fsdp2", "ep_size": 8},
        "packed_sequence": {"pack_size": 3072, "packing_ratio": 0.9},
    }
    est = estimate_memory(recipe, world_size=8)
    (note,) = [line for line in est.workload if line.startswith("VLM packing")]
    assert "sized at 3,072 tokens" in note and "fills a pack to 2,764 tokens" in note
    assert "the assumed image takes 256: a pack holds at most 5 samples" in note and "1,280 image tokens" in note
    shorter = estimate_memory(recipe, world_size=8, seq_len=2048)
    assert shorter.memory_gib.total < est.memory_gib.total
    assert [line for line in plan_dry_run(Request.of(recipe, world_size=8)).assumed if "VLM packing" in line]
    qwen = {**recipe, "model": {"pretrained_model_name_or_path": "Qwen/Qwen3.5-4B"}, "distributed": {}}
    (note,) = [line for line in estimate_memory(qwen, world_size=8).workload if line.startswith("VLM packing")]
    assert "the assumed image takes 961: packs of such samples fill to about 1.92 times that, up to pack_size" in note
    padded = {**recipe, "packed_sequence": {"pack_size": 3072, "collate_max_length": 3072}}
    assert not [line for line in estimate_memory(padded, world_size=8).workload if "VLM packing" in line]
    # a length asked for is said to be that, and a collate_max_length below pack_size is said to be there
    (note,) = [line for line in shorter.workload if line.startswith("VLM packing")]
    assert "sized at 2,048 tokens as asked (a pack can hold up to pack_size 3,072)" in note
    short = {**recipe, "packed_sequence": {"pack_size": 3072, "collate_max_length": 2048}}
    (note,) = [line for line in estimate_memory(short, world_size=8).workload if line.startswith("VLM packing")]
    assert "collate_max_length 2,048 is below pack_size 3,072" in note and "no packed_sequence" not in note


def test_a_recipes_mtp_depth_is_the_one_both_tools_size_and_build():
    """model.num_nextn_predict_layers (an argument of AutoModel's Qwen3.5 classes; the corpus's Qwen3.6-27B TP 4 recipe
    sets 0) or the text_config override's depth: the estimate sizes, and the dry run builds, that many
    multi-token-prediction layers instead of the config's, and validate says so at its line; a model whose class
    builds none from its config is left as it is."""
    from automodel_dist.api import analyze
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    recipe = {
        "recipe": "FinetuneRecipeForVLM",
        "model": {"pretrained_model_name_or_path": "Qwen/Qwen3.6-27B", "num_nextn_predict_layers": 0},
        "distributed": {"strategy": "fsdp2", "tp_size": 4},
    }
    assert lookup("Qwen/Qwen3.6-27B").mtp_layers == 1
    ctx = analyze(Request.of(recipe, world_size=16)).context
    assert ctx.model.mtp_layers == 0 and ctx.model.mtp_params() == 0
    text = ctx.model.hf_config["text_config"]
    assert text["num_nextn_predict_layers"] == text["mtp_num_hidden_layers"] == 0  # what the dry run builds
    plan = plan_dry_run(Request.of(recipe, world_size=16))
    assert plan.model.mtp_layers == 0
    report = analyze(Request.of(recipe, world_size=16)).report
    (note,) = [f for f in report.findings if f.rule == "model-mtp-depth"]
    assert (
        note.severity == "info"
        and note.path == "model.num_nextn_predict_layers"
        and "not its config's 1" in note.message
    )
    without = estimate_memory({**recipe, "model": {"pretrained_model_name_or_path": "Qwen/Qwen3.6-27B"}}, world_size=16)
    assert estimate_memory(recipe, world_size=16).memory_gib.params < without.memory_gib.params
    same = {
        **recipe,
        "model": {"pretrained_model_name_or_path": "Qwen/Qwen3.6-27B", "text_config": {"mtp_num_hidden_layers": 1}},
    }
    assert not [f for f in analyze(Request.of(same, world_size=16)).report.findings if f.rule == "model-mtp-depth"]
    llama = {**recipe, "model": {"pretrained_model_name_or_path": L8, "num_nextn_predict_layers": 2}}
    assert analyze(Request.of(llama, world_size=16)).context.model.mtp_layers == 0


def test_a_repeated_mtp_layer_is_sized_once_and_run_at_every_depth():
    """Nemotron-3 Ultra's recipes: ``num_nextn_predict_layers: 2`` and ``mtp_use_repeated_layer: true``, arguments of
    AutoModel's Nemotron-V3 class, build one MTP depth and run it twice: the estimate keeps the parameters of one and
    the activations of two (the repeated MoE sublayer not checkpointed: AutoModel's apply_ac), validate says so at its
    line, and the dry run builds with the flag and the depth (test_catalog holds the class to it)."""
    from automodel_dist.api import analyze
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    ultra = "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"
    assert lookup(ultra).mtp_layers == 1
    model = {"pretrained_model_name_or_path": ultra, "num_nextn_predict_layers": 2, "mtp_use_repeated_layer": True}
    recipe = {
        "model": model,
        "distributed": {"strategy": "fsdp2", "ep_size": 64, "activation_checkpointing": True},
        "step_scheduler": {"local_batch_size": 1, "global_batch_size": 128},
        "dataset": {"seq_len": 4096},
    }
    result = analyze(Request.of(recipe, world_size=128))
    assert (result.context.model.mtp_layers, result.context.model.mtp_iterations) == (1, 2)
    (note,) = [f for f in result.report.findings if f.rule == "model-mtp-depth"]
    assert note.path == "model.num_nextn_predict_layers"
    assert "one multi-token-prediction layer run at each of 2 depth(s)" in note.message
    # the flag alone: the config's one depth on a repeated layer (AutoModel skips checkpointing its MoE sublayer)
    flag = {**recipe, "model": {"pretrained_model_name_or_path": ultra, "mtp_use_repeated_layer": True}}
    result = analyze(Request.of(flag, world_size=128))
    assert (result.context.model.mtp_layers, result.context.model.mtp_iterations) == (1, 1)
    (note,) = [f for f in result.report.findings if f.rule == "model-mtp-depth"]
    assert note.path == "model.mtp_use_repeated_layer" and "model.mtp_use_repeated_layer: true:" in note.message
    assert plan_dry_run(Request.of(flag, world_size=128), ranks=[0]).specs[0].recipe.mtp_use_repeated_layer
    plan = plan_dry_run(Request.of(recipe, world_size=128), ranks=[0])
    assert plan.specs[0].recipe.mtp_use_repeated_layer
    assert plan.specs[0].build.hf_config["num_nextn_predict_layers"] == 2
    one = {**recipe, "model": {"pretrained_model_name_or_path": ultra}}
    two = {**recipe, "model": {**model, "mtp_use_repeated_layer": False}}
    repeated, single, built_twice = (estimate_memory(r, world_size=128).memory_gib for r in (recipe, one, two))
    assert repeated.params == single.params < built_twice.params
    assert repeated.activations > single.activations


@pytest.mark.parametrize(
    "mp,expected",
    [
        (None, 4.0),  # AutoModel's default policy: fp32 reduction
        ({"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}, 2.0),
        ({"param_dtype": "bfloat16", "reduce_dtype": None}, 2.0),  # torch reduces in the parameter dtype
        ({"param_dtype": "bfloat16", "reduce_dtype": "float32"}, 4.0),
    ],
)
def test_deferred_gradients_accumulate_in_the_reduce_dtype(mp, expected):
    """FSDP2's deferred unsharded gradients are held in its mp_policy's reduce dtype: the Qwen3.6-27B TP 4 recipe's
    bf16 policy holds half the bytes of AutoModel's fp32 default (its dry run: 16.1 GiB of unsharded gradients)."""
    from automodel_dist.dims import read_dims
    from automodel_dist.estimate.memory import grad_reduce_bytes

    block = {"strategy": "fsdp2", **({"mp_policy": mp} if mp is not None else {})}
    assert grad_reduce_bytes(read_dims(block, world_size=8), 2) == expected
    assert grad_reduce_bytes(read_dims({"strategy": "ddp"}, world_size=8), 2) == 4.0

    def held(policy: dict | None) -> float:
        mp_line = f"  mp_policy: {policy}\n".replace("'", "").replace("None", "null") if policy is not None else ""
        text = LLM + "distributed:\n  strategy: fsdp2\n" + mp_line
        text += "step_scheduler: {global_batch_size: 16, local_batch_size: 1}\n"  # two microbatches: deferred
        return estimate_memory(text, world_size=8, model=L8, seq_len=2048).memory_gib.deferred_grads

    assert held(mp) == pytest.approx(held(None) * expected / 4.0) and held(None) > 25  # all 8B unsharded in fp32


def test_tp_keeps_qwen35s_vocabulary_whole_in_the_estimate():
    """The estimate follows tp_splits_vocab: on AutoModel's Qwen3.5 dense VLM class TP 4 leaves the embedding and the
    head whole on every TP rank (held to its parallelizer in tests/oracle/test_kernel_facts.py), so the parameters a
    rank holds are those of the corpus's TP 4 recipe as its dry run measured them (4.2346 GiB at FSDP 4, no MTP)."""
    recipe = {
        "recipe": "FinetuneRecipeForVLM",
        "model": {"pretrained_model_name_or_path": "Qwen/Qwen3.6-27B", "num_nextn_predict_layers": 0},
        "distributed": {"strategy": "fsdp2", "tp_size": 4},
        "freeze_config": {"freeze_vision_tower": True},
    }
    est = estimate_memory(recipe, world_size=16, seq_len=2048)
    assert est.memory_gib.params == pytest.approx(4.2346, abs=0.002)
    m = lookup("Qwen/Qwen3.6-27B")
    forced = estimate_memory({**recipe, "model": {**recipe["model"], "force_hf": True}}, world_size=16, seq_len=2048)
    # transformers' class splits the embedding: a quarter of it on each TP rank, sharded over 4 more
    assert est.memory_gib.params - forced.memory_gib.params == pytest.approx(
        m.embedding_params() * 3 / 4 / 4 * 2 / 2**30, rel=0.01
    )


def test_a_gemma4_moe_config_gets_no_per_layer_inputs_and_their_table_is_no_active_weight():
    """AutoModel's own Gemma-4 MoE backend builds no per-layer inputs: a 26B-A4B config without the key (transformers'
    default would be 256) is sized as the checkpoint; E2B's per-layer table is a lookup, not an active weight."""
    import json

    from automodel_dist.catalog.models import CATALOG_DIR, from_hf_config

    cfg = json.loads((CATALOG_DIR / "configs" / "google--gemma-4-26B-A4B-it.json").read_text())
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("hidden_size_per_layer_input",)}
    assert from_hf_config({**cfg, "text_config": text}).param_count() == from_hf_config(cfg).param_count()
    e2b = lookup("google/gemma-4-E2B-it")
    table = e2b.ple_table_params()
    assert e2b.active_param_count() == e2b.param_count() - table == 5_104_297_504 - 2_348_810_240


def test_a_text_only_vlm_data_set_carries_automodels_fake_image_where_it_is_pretokenized():
    """AutoModel's typed config (recipes/_typed_config.py) pretokenizes a VLM data set where packed_sequence packs
    (pretokenize defaults to pack_size > 0) or, without one, where dataset.max_length is set; its pretokenizing wrapper
    then injects a 56 x 56 fake image into each text-only sample unless dataset.inject_fake_images is false."""
    from automodel_dist.workload import read_workload

    tulu = "nemo_automodel.components.datasets.vlm.datasets.make_tulu3_dataset"
    vlm = {"recipe": "FinetuneRecipeForVLM"}

    def data(dataset: dict, **extra: object) -> tuple[str | None, str | None]:
        w = read_workload({**vlm, "dataset": {"_target_": tulu, **dataset}, **extra})
        return w.text_only_data, w.fake_images

    packed = {"packed_sequence": {"pack_size": 2048}}
    assert data({}) == ("make_tulu3_dataset", None)
    assert data({}, **packed) == (None, "make_tulu3_dataset")
    assert data({"inject_fake_images": False}, **packed) == ("make_tulu3_dataset", None)
    assert data({}, packed_sequence={"pack_size": 2048, "pretokenize": False}) == ("make_tulu3_dataset", None)
    assert data({"max_length": 1024}) == (None, "make_tulu3_dataset")
    assert data({"max_length": 1024, "pretokenize": False}) == ("make_tulu3_dataset", None)
    # an image data set, or the LLM recipe, is neither
    medpix = read_workload({**vlm, "dataset": {"_target_": tulu.replace("tulu3", "medpix")}, **packed})
    assert (medpix.text_only_data, medpix.fake_images) == (None, None)
    llm = read_workload({"recipe": "TrainFinetuneRecipeForNextTokenPrediction", "dataset": {"_target_": tulu}})
    assert (llm.text_only_data, llm.fake_images) == (None, None)


def test_a_recipes_model_config_fields_are_the_models():
    """Fields a recipe's model.config passes to its config class's from_pretrained set the config.json's (a CI tier's
    num_hidden_layers, DeepSeek-V4's num_nextn_predict_layers: 0): the estimate sizes, and the dry run builds, the
    model they make, and validate says so at model.config; a keyword the config.json does not have is left alone."""
    from automodel_dist.api import analyze
    from automodel_dist.request import Request

    flash = "deepseek-ai/DeepSeek-V4-Flash"
    config = {
        "_target_": "nemo_automodel.components.models.deepseek_v4.config.DeepseekV4Config.from_pretrained",
        "pretrained_model_name_or_path": flash,
        "num_nextn_predict_layers": 0,
        "num_hidden_layers": 8,
        "kda_mode": "chunk",
    }
    recipe = {"model": {"config": config}, "distributed": {"strategy": "fsdp2", "ep_size": 8}}
    analysis = analyze(Request.of(recipe, world_size=16))
    m = analysis.context.model
    assert (m.num_layers, m.mtp_layers, m.name) == (8, 0, flash)
    assert m.hf_config["num_hidden_layers"] == 8 and "kda_mode" not in m.hf_config
    (note,) = [f for f in analysis.report.findings if f.rule == "model-config-fields"]
    assert note.severity == "info" and "num_hidden_layers: 8, num_nextn_predict_layers: 0" in note.message
    plain = {**recipe, "model": {"config": {**config, "num_hidden_layers": 43, "num_nextn_predict_layers": 1}}}
    assert analyze(Request.of(plain, world_size=16)).context.model == lookup(flash)


@pytest.mark.parametrize(
    "efo,wrap_outer,world,gbs,steps",
    [
        (True, False, 32, 128, 2),  # the MoE class's patched stage backward holds across schedule steps
        (True, False, 32, 64, 1),  # one schedule step an optimizer step: nothing to carry
        (False, False, 32, 128, 1),  # torch's plain backward: every unit reduces after each backward
        (True, True, 32, 128, 1),  # an FSDP module wraps the model part: each schedule step reduces at its end
        (True, True, 16, 64, 2),  # ... but routed experts outside FSDP (ep_shard 1) keep their plain .grad
    ],
)
def test_the_dry_run_runs_a_second_schedule_step_where_the_first_leaves_gradients_held(
    efo, wrap_outer, world, gbs, steps
):
    """Under PP AutoModel's patched stage backward (backend.enable_fsdp_optimizations) on its MoE class, under a model
    part that is no FSDP module, reduces and reshards only at the optimizer step's last schedule step
    (get_is_optim_step), and routed experts outside FSDP keep their plain gradients to the optimizer step: the second
    schedule step starts with what the first left. The dry run then runs two (the corpus's GLM-5 PP recipe: 57.3 GiB
    in one, 80.4 in the second)."""
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    recipe = {
        "model": {"pretrained_model_name_or_path": "Qwen/Qwen3-30B-A3B", "backend": {"enable_fsdp_optimizations": efo}},
        "distributed": {
            "strategy": "fsdp2",
            "pp_size": 2,
            "ep_size": 8,
            "pipeline": {"pp_schedule": "1f1b", "pp_microbatch_size": 1},
            "moe": {"wrap_outer_model": wrap_outer},
        },
        "step_scheduler": {"local_batch_size": 4, "global_batch_size": gbs},
    }
    plan = plan_dry_run(Request.of(recipe, world_size=world))  # 4 sequences a rank a schedule step
    assert plan.specs and {s.schedule_steps for s in plan.specs} == {steps}
    assert any("ran 2" in n and "schedule steps" in n for n in plan.notes) is (steps == 2)


def test_te_fused_adam_keeps_a_whole_fp32_master_of_fp32_parameters():
    """store_param_remainders keeps 16 bits of a bf16 parameter's fp32 master; an fp32 parameter has no bits to spare,
    and TE keeps its whole fp32 copy (the dry run's stand-in makes the same)."""
    from automodel_dist.estimate.training import optimizer_of
    from automodel_dist.workload import read_workload

    te = {"_target_": "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam", "master_weights": True}
    w = read_workload({"optimizer": {**te, "store_param_remainders": True}})
    assert optimizer_of(w, storage="bfloat16")[0].master == 2.0
    assert optimizer_of(w, storage="float32")[0].master == 4.0


@pytest.mark.parametrize(
    ("given", "kept", "said"),
    [
        ({"foreach": False}, {"foreach": False}, False),  # AutoModel's factory path hands it to torch
        ({"foreach": True}, {"foreach": True}, False),  # kept under TP too, where AutoModel's default is false
        ({"fused": True}, {}, True),  # CUDA only: torch's unfused step, and said so
        ({}, {}, False),
    ],
)
def test_the_dry_runs_optimizer_takes_the_recipes_foreach_false(given, kept, said):
    """A recipe's foreach: false reaches torch through AutoModel's factory path (optim/optimizer.py
    OptimizerFromFactoryConfig honours an explicit value), so torch steps a tensor at a time: the dry run's optimizer
    gets it too, where it had dropped it and stepped foreach (a parameter-sized temporary the GPU never makes)."""
    from automodel_dist.stack.recipe import optimizer_for
    from automodel_dist.workload import read_workload

    w = read_workload({"optimizer": {"_target_": "torch.optim.Adam", "lr": 1e-4, **given}})
    out: list[str] = []
    spec = optimizer_for(w, out)
    assert spec["target"] == "torch.optim.Adam" and spec["kwargs"] == {"lr": 1e-4, **kept}
    assert bool([line for line in out if "fused: true" in line]) is said
    # AutoModel's recipe layer builds such a section through its factory path, which keeps an explicit foreach
    optim = pytest.importorskip("nemo_automodel.components.optim.optimizer")
    built = optim.build_optimizer_config(spec["target"], spec["kwargs"])
    assert isinstance(built, optim.OptimizerFromFactoryConfig) and built.kwargs == spec["kwargs"]


@pytest.mark.parametrize(
    ("quantization", "force_hf", "built"),
    [
        ({"load_in_4bit": True}, None, True),
        ({"load_in_8bit": True}, None, True),
        ({"load_in_4bit": False}, None, False),  # create_bnb_config returns None: AutoModel's own class
        (None, True, True),
        (None, None, False),
    ],
)
def test_a_bitsandbytes_quantization_has_automodel_build_transformers_class(quantization, force_hf, built):
    """AutoModel's own classes do not load BnB weights: with a quantization: section that asks for 4 or 8 bits, its
    model init falls through to transformers' class, as model.force_hf does (_transformers/model_init.py), so both
    tools build and size that class (llama3_1_8b_squad_qlora: 130.8 GiB with AutoModel's own Llama, 116.8 with
    transformers', which AutoModel runs; the estimate 115.9)."""
    from automodel_dist.workload import read_workload

    recipe: dict = {"model": {"pretrained_model_name_or_path": L8}}
    if quantization is not None:
        recipe["quantization"] = quantization
    if force_hf is not None:
        recipe["model"]["force_hf"] = force_hf
    assert read_workload(recipe).force_hf is built
    nemo = pytest.importorskip("nemo_automodel._transformers.model_init")
    assert "custom implementations do not support BnB quantization" in Path(nemo.__file__).read_text()
