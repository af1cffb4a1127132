"""The smoke run on AutoModel's own stack: the recipe's architecture at tiny dims, built, parallelized, trained and
clipped by AutoModel 0.7.0's code on real gloo processes, against the same class on one process.

Each case is a real multi-process run (seconds each). Together they cover AutoModel's own classes (Llama, Qwen3-MoE,
DeepSeek-V3 with MLA + MoE, the Qwen3-Next hybrid of linear and full attention) and a Hugging Face class (Mistral),
across FSDP2, HSDP, TP + SP, EP, EP + FSDP, PP (1F1B and interleaved), activation checkpointing and LoRA; an
injected gradient skew is caught, and a layout AutoModel rejects comes back with AutoModel's own message and the
validator's rule for it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist.catalog.hf_config import hf_config
from automodel_dist.catalog.sources import resolve
from automodel_dist.smoke.request import SmokeRequest
from automodel_dist.smoke.stack_plan import StackUnavailable, tiny_hf_config
from support.paths import ROOT

pytest.importorskip("nemo_automodel")
pytest.importorskip("transformers")

from automodel_dist.smoke import run_smoke_test  # noqa: E402


def _recipe(model: str, distributed: str, extra: str = "") -> str:
    return f"model:\n  pretrained_model_name_or_path: {model}\n{extra}distributed:\n{distributed}"


LORA = "peft:\n  match_all_linear: true\n  dim: 8\n  alpha: 32\n  use_triton: true\n"
# CUDA-only kernels a recipe names (Transformer Engine attention and linears, DeepEP's dispatcher): each runs as what
# AutoModel itself uses without them, and the report names it
CUDA_BACKEND = "  backend:\n    attn: te\n    linear: te\n    dispatcher: deepep\n"
CASES = {
    # name: (model, distributed: block, extra sections, world size)
    "llama-tp2-sp-ac-fsdp2": (
        "meta-llama/Llama-3.1-8B",
        "  tp_size: 2\n  sequence_parallel: true\n  activation_checkpointing: true\n",
        "",
        4,
    ),
    "llama-pp2-1f1b": ("meta-llama/Llama-3.1-8B", "  pp_size: 2\n  pipeline:\n    pp_schedule: 1F1B\n", "", 2),
    "llama-pp2-interleaved-dp2": (
        "meta-llama/Llama-3.1-8B",
        "  pp_size: 2\n  pipeline:\n    pp_schedule: Interleaved1F1B\n",
        "",
        4,
    ),
    "llama-lora-hsdp": ("meta-llama/Llama-3.2-1B", "  dp_replicate_size: 2\n", LORA, 4),
    "qwen3moe-ep2-fsdp2": ("Qwen/Qwen3-30B-A3B", "  ep_size: 2\n", CUDA_BACKEND, 4),
    "deepseek-v3-ep2": ("deepseek-ai/DeepSeek-V3", "  ep_size: 2\n", "", 2),
    "mistral-hf-tp2": ("mistralai/Mistral-7B-v0.3", "  tp_size: 2\n", "", 2),
    # Llama through AutoModel's Hugging Face fallback (force_hf: the transformers class, AutoModel's parallelizer)
    "llama-hf-fallback-fsdp2": ("meta-llama/Llama-3.1-8B", "  strategy: fsdp2\n", "  force_hf: true\n", 2),
    "mistral-hf-cp2-dp2": ("mistralai/Mistral-7B-v0.3", "  cp_size: 2\n", "", 4),
    # GPT-OSS's own class asserts TE or FlexAttention (neither runs backward on a CPU): AutoModel's Hugging Face
    # fallback for it (attention sinks, its MoE) is what runs, chosen without force_hf in the recipe
    "gptoss-hf-fallback-fsdp2": ("openai/gpt-oss-20b", "  strategy: fsdp2\n", "", 2),
}


# Run by the default suite elsewhere on AutoModel's stack with the same checks, so their cases here wait for -m slow:
# PP 2 Interleaved1F1B (the README's and docs/smoke.md's Llama examples), CP on a Hugging Face class (docs/smoke.md's
# CP examples, Llama's Hugging Face class through AutoModel's fallback) and the fallback itself (docs/smoke.md, and
# GPT-OSS's case here); Mistral's TP 2 repeats Llama's TP path on a Hugging Face class (to keep the suite under 10 min)
SLOW_CASES = {"llama-pp2-interleaved-dp2", "mistral-hf-cp2-dp2", "mistral-hf-tp2", "llama-hf-fallback-fsdp2"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in sorted(CASES)]
)
def test_automodel_stack_matches_one_process(name: str) -> None:
    model, block, extra, world = CASES[name]
    # a generous collective timeout: these check parity, not hangs, and the default suite runs them beside other
    # multi-process tests on 2 cores, where a rank can wait over the default 60 s for a peer (test_smoke.py tests hangs)
    report = run_smoke_test(
        _recipe(model, block, extra), world_size=world, stack="automodel", timeout_s=300, pg_timeout_s=240
    )
    assert report.stack == "automodel", report.notes
    assert report.passed, (report.reason, report.traceback_tail[-6:])
    assert report.model_class and report.model_class.startswith("FSDP"), report.model_class
    # AutoModel picks its own class where its registry has one, else the transformers class (force_hf forces that)
    assert ("Hugging Face class" in report.model_class) == ("-hf" in name), report.model_class
    assert len(report.losses) == len(report.reference_losses) == 3
    assert len(report.grad_norms) == len(report.reference_grad_norms) == 3
    assert report.max_param_rel_diff is not None and report.max_param_rel_diff <= report.tolerance.param_rel
    assert report.losses[-1] < report.losses[0]  # the same batch each step: the loss must fall
    assert any("AutoModel's stack" in n for n in report.notes)
    if extra == CUDA_BACKEND:
        for named in ("attn: te runs as sdpa", "linear: te runs as torch", "dispatcher: deepep runs as torch"):
            assert any(named in x for x in report.substitutions), (named, report.substitutions)
    if "use_triton" in extra and importlib.util.find_spec("triton") is None:
        assert any(x.startswith("peft.use_triton: false") for x in report.rewrites), report.rewrites


def test_hybrid_linear_attention_class_matches_one_process(tmp_path: Path) -> None:
    """Qwen3-Next (gated delta-rule linear attention every 3 of 4 layers, full attention the 4th, MoE MLPs), from
    a config.json on disk (no Hub): 4 layers keep one full period of its layer pattern."""
    folder = tmp_path / "qwen3-next"
    folder.mkdir()
    shutil.copy(ROOT / "tests/models/qwen3_next_80b_a3b.json", folder / "config.json")
    report = run_smoke_test(_recipe(str(folder), "  ep_size: 2\n"), world_size=2, stack="automodel", timeout_s=300)
    assert report.passed, (report.reason, report.traceback_tail[-6:])
    assert report.model == "Qwen3NextForCausalLM"
    assert report.model_dims["num_hidden_layers"] == 4


def test_an_injected_gradient_skew_is_caught() -> None:
    """Noise at half each gradient's RMS on one rank before the optimizer: the first-step gradients, the loss after
    it and the final parameters all leave the reference."""
    report = run_smoke_test(
        _recipe("meta-llama/Llama-3.2-1B", "  strategy: fsdp2\n"), world_size=2, stack="automodel", fault="skew@1:0"
    )
    assert report.status == "failed"
    assert report.max_grad_rel_diff > report.tolerance.grad_rel
    assert "first-step gradients differ" in report.reason and "final parameters differ" in report.reason


def test_a_layout_automodel_rejects_returns_its_message_and_the_rule() -> None:
    """TP + SP + PP: AutoModel's pipeline stage 1 fails in its first forward (q has tp x the sequence of RoPE's
    cos/sin). Validation calls it an error; run anyway, the failure is AutoModel's own and explain_error ties it to
    the rule and the AutoModel function."""
    text = _recipe("meta-llama/Llama-3.1-8B", "  tp_size: 2\n  pp_size: 2\n  sequence_parallel: true\n  pipeline: {}\n")
    refused = run_smoke_test(text, world_size=4, stack="automodel")
    assert refused.status == "failed" and "pp-sequence-parallel" in [f.rule for f in refused.findings]
    assert not refused.ranks  # nothing was launched
    report = run_smoke_test(text, world_size=4, stack="automodel", run_invalid=True)
    assert report.status == "failed"
    assert "must match the size of tensor b" in report.reason
    assert any("rope_utils.py" in line for line in report.traceback_tail)
    assert "pp-sequence-parallel" in [e.rule for e in report.explanations]
    assert any("_precompute_stage_shapes" in e.cause for e in report.explanations)


def _plan(text: str, world: int, stack: str):
    from automodel_dist.smoke.launch import make_plan

    return make_plan(
        SmokeRequest.of(
            text,
            world_size=world,
            steps=3,
            model="tiny-llama",
            precision="auto",
            stack=stack,
        )
    )


def test_the_tiny_stack_runs_only_without_automodel_or_when_asked_for(monkeypatch) -> None:
    """With AutoModel here a config naming no model runs AutoModel's stack on a default architecture (untied, so a
    pipeline trains the same model as one process); the tiny stack is the path without AutoModel, or asked for."""
    from automodel_dist.smoke import launch

    block = "distributed:\n  strategy: fsdp2\n"
    for stack in ("auto", "automodel"):
        plan = _plan(block, 2, stack)
        assert plan.spec.stack == "automodel" and plan.spec.automodel["architecture"] == "LlamaForCausalLM"
        assert any("names no model: meta-llama/Llama-3.1-8B's architecture ran" in n for n in plan.report_base["notes"])
    assert _plan(block, 2, "tiny").spec.stack == "tiny"
    unknown = _plan(_recipe("someorg/NotAModel-7B", "  strategy: fsdp2\n"), 2, "auto")  # named, not found: not run
    assert unknown.status == "not_run" and "the recipe's model cannot be built here" in unknown.reason
    monkeypatch.setattr(launch, "automodel_installed", lambda: False)
    without = _plan(block, 2, "auto")
    assert without.spec.stack == "tiny"
    assert any("tiny home-made stack ran" in n and "not installed here" in n for n in without.report_base["notes"])


def test_context_parallelism_on_automodels_own_class_runs_through_its_hugging_face_fallback() -> None:
    """AutoModel's own classes take only Transformer Engine attention under CP (CUDA): CP runs through AutoModel's
    Hugging Face fallback for the architecture (its CP sharder, parallelizer, loss and step), said in the report;
    with expert parallelism too (its experts exist only in its own class) it is not run, with why and how to run
    the tiny stack instead."""
    # planned here; docs/smoke.md's CP examples run it with parity (CP 2 x dp 2, CP 2 x TP 2), the class line saying
    # "the Hugging Face class through AutoModel's fallback"
    plan = _plan(_recipe("meta-llama/Llama-3.1-8B", "  cp_size: 2\n"), 2, "auto")
    assert plan.spec.stack == "automodel" and plan.spec.automodel["recipe"]["force_hf"]
    assert plan.spec.automodel["recipe"]["backend"] is None  # model.backend configures the own class only
    assert any("force_hf" in n and "context parallelism" in n for n in plan.report_base["notes"])
    assert any("SDPA's math kernel" in x for x in plan.report_base["substitutions"])
    moe = _recipe("Qwen/Qwen3-30B-A3B", "  cp_size: 2\n  ep_size: 2\n")
    refused = run_smoke_test(moe, world_size=4)
    assert refused.status == "not_run" and not refused.ranks
    assert "Transformer Engine" in refused.reason and "expert parallelism" in refused.reason
    assert "--stack tiny" in refused.reason
    assert _plan(moe, 4, "tiny").spec.stack == "tiny"
    from automodel_dist.smoke.launch import make_plan

    exported = make_plan(SmokeRequest.of(moe, world_size=4), local=False)  # an export targets AutoModel's stack too
    assert exported.status == "not_run" and "expert parallelism" in exported.reason
    fallback = _plan(_recipe("Qwen/Qwen3-30B-A3B", "  cp_size: 2\n"), 2, "auto")  # run by hand: parity 4e-6
    assert fallback.spec.stack == "automodel" and fallback.spec.automodel["recipe"]["force_hf"]


# ------------------------------------------------------------------------------------------- tiny dims (pure)
ARCHS = [
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-30B-A3B",
    "deepseek-ai/DeepSeek-V3",
    "zai-org/GLM-4.5-Air",
    "google/gemma-2-2b",
    "microsoft/phi-4",
    "mistralai/Mixtral-8x7B-v0.1",
]


@settings(max_examples=60, deadline=None)
@given(
    arch=st.sampled_from(ARCHS),
    tp=st.sampled_from([1, 2, 4, 8]),
    ep=st.sampled_from([1, 2, 4, 8]),
    stages=st.integers(1, 8),
    cp=st.sampled_from([1, 2, 4]),
)
def test_tiny_dims_keep_the_layouts_divisibility_rules(arch: str, tp: int, ep: int, stages: int, cp: int) -> None:
    cfg = hf_config(resolve(arch).spec)
    seq = 8 * 2 * cp * tp
    tiny = tiny_hf_config(cfg, tp=tp, ep=ep, stages=stages, seq_len=seq)
    assert tiny["architectures"] == cfg["architectures"] and tiny["model_type"] == cfg["model_type"]
    assert tiny["num_attention_heads"] % tp == 0 and tiny["num_key_value_heads"] % tp == 0
    assert tiny["num_hidden_layers"] % stages == 0 and tiny["num_hidden_layers"] >= max(2, stages)
    assert tiny["vocab_size"] % tp == 0 and tiny["hidden_size"] % tp == 0
    experts = next((tiny[k] for k in ("num_experts", "n_routed_experts", "num_local_experts") if cfg.get(k)), None)
    if experts is not None:
        assert experts % ep == 0 and tiny["num_experts_per_tok"] <= experts
    assert tiny["hidden_size"] * tiny["num_hidden_layers"] <= 64 * 64  # a few thousand parameters per layer
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = tiny.get(key)
        for i in ids if isinstance(ids, list) else [ids]:
            assert i is None or 0 <= i < tiny["vocab_size"]


def test_tiny_dims_keep_a_full_period_of_the_layer_pattern() -> None:
    cfg = json.loads((ROOT / "tests/models/qwen3_next_80b_a3b.json").read_text())
    tiny = tiny_hf_config(cfg, tp=1, ep=1, stages=1, seq_len=16)
    assert tiny["num_hidden_layers"] == 4 and tiny["full_attention_interval"] == 4
    gemma = tiny_hf_config(
        {**cfg, "layer_types": ["sliding_attention", "full_attention"] * 13}, tp=1, ep=1, stages=3, seq_len=16
    )
    assert gemma["layer_types"][:2] == ["sliding_attention", "full_attention"] and gemma["num_hidden_layers"] == 3


def test_a_multimodal_config_is_refused_with_the_reason() -> None:
    with pytest.raises(StackUnavailable, match="multimodal"):
        tiny_hf_config({"model_type": "x", "vision_config": {}}, tp=1, ep=1, stages=1, seq_len=16)


def test_an_exported_run_on_automodels_stack_is_judged_like_a_local_one(tmp_path: Path) -> None:
    """--export writes the AutoModel-stack spec; its printed torchrun command runs it (as on a cluster's node);
    --judge gives the local verdict, with the same stack, class and parity checks."""
    import subprocess
    import sys

    from automodel_dist.smoke import export_smoke_test, judge_smoke_test

    out = tmp_path / "run"
    recipe = _recipe("Qwen/Qwen3-30B-A3B", "  ep_size: 2\n")
    exported = export_smoke_test(recipe, out, world_size=2)
    spec = json.loads((out / "spec.json").read_text())
    assert spec["stack"] == "automodel" and spec["automodel"]["architecture"] == "Qwen3MoeForCausalLM"
    command = exported.command.replace("torchrun", f"{sys.executable} -m torch.distributed.run", 1)
    done = subprocess.run(["bash", "-c", command], cwd=out, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = judge_smoke_test(out)
    assert report.passed and report.stack == "automodel" and report.launcher == "external", report.reason
    assert report.model_class == "FSDPQwen3MoeForCausalLM" and len(report.grad_norms) == 3
