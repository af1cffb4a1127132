"""The dry run under ``strategy: megatron_fsdp``: AutoModel 0.7.0's MegatronFSDP path runs megatron-fsdp 0.5.0 (its
pin) as written on fake tensors, and the estimate's MegatronFSDP terms are held to it. Llama-3.2-1B at full depth on 8
ranks, the corpus recipe's model and layout: its prefetch window (9 of 16 blocks), its reduce-scatter queue (all 16),
its persistent gradient buffer, at each ZeRO level and with its fp32 main weights, where the peak falls at the start of
backward (long sequences) and at the root's backward (short ones)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from automodel_dist import estimate_memory
from automodel_dist.catalog.hf_config import hf_config
from automodel_dist.catalog.models import lookup
from automodel_dist.dry_run import dry_run, missing_packages

needs_megatron = pytest.mark.skipif(
    bool(missing_packages()) or importlib.util.find_spec("megatron_fsdp") is None,
    reason="the dry run needs AutoModel, torch, transformers and megatron-fsdp",
)
L1B = "meta-llama/Llama-3.2-1B"
# Llama-3.2-1B: 16 blocks, the tied embedding and the final norm
LAYER = 2048 * 2048 * 2 + 2 * 512 * 2048 + 3 * 2048 * 8192 + 2 * 2048
PARAMS = 16 * LAYER + 128256 * 2048 + 2048
RANKS = 8


def _megatron(block: str = "", *, seq: int, mbs: int):
    """The dry run's report and the estimate's peak phase, of one layout."""
    text = f"distributed:\n  strategy: megatron_fsdp\n{block}"
    report = dry_run(text, model=L1B, world_size=RANKS, seq_len=seq, micro_batch_size=mbs)
    assert report.status == "measured", [(r.status, r.error, r.reason) for r in report.ranks]
    est = estimate_memory(text, model=L1B, world_size=RANKS, seq_len=seq, micro_batch_size=mbs)
    return report, est.memory_gib.peak_phase


def _agree(report, tolerance: float = 0.01):
    """The estimate within ``tolerance`` of the dry run in total and, where the peak is not in the optimizer step, in
    each category (there torch's tracker files the step's foreach temporaries under the optimizer's states, the
    estimate under temporaries)."""
    [rank] = report.ranks
    rows = {c.category: c for c in report.estimate_vs_dry_run}
    total = rows["total"].dry_run_gib
    assert abs(rows["total"].estimate_gib - total) <= tolerance * total, rows["total"]
    for c in rows.values() if rank.peak_phase != "optimizer" else ():
        assert abs(c.estimate_gib - c.dry_run_gib) <= tolerance * total, c
    return rank


@needs_megatron
def test_zero3_long_sequences_peak_with_the_prefetch_window():
    report, phase = _megatron(seq=1024, mbs=8)
    r = _agree(report)
    assert report.params_total == PARAMS and r.peak_phase == "backward"
    # the rank's parameters, gradients and states: bf16 shards of MegatronFSDP's buffers (padded to its alignment)
    shard = 2 * PARAMS / RANKS
    assert r.peak.params * (1 << 30) == pytest.approx(shard, rel=1e-3)
    assert r.peak.grads * (1 << 30) == pytest.approx(shard, rel=1e-3)  # its gradient buffer, there from the start
    # the parameters' .grad, attached by finish_grad_sync for the optimizer: views of that buffer's shards
    assert r.local_grad_bytes == pytest.approx(shard, rel=1e-3)
    # a later step's: the root alone gathered as backward starts (the final norm prefetches only on the first forward)
    assert phase == "start-of-backward"
    assert any(s.startswith("MegatronFSDP (megatron-fsdp") for s in report.substitutions)
    assert any(n.startswith("built at full depth: MegatronFSDP") for n in report.notes)
    hits = r.shim_hits
    for name in ("megatron_fsdp_fake_build", "megatron_fsdp_device", "megatron_fsdp_runtime"):
        assert hits.get(name, 0) > 0, (name, hits)
    assert hits.get("megatron_fsdp_uncoalesced", 0) >= 2 * 17  # every bucket gathered in forward and in backward


def _config(tmp: Path, name: str, **fields) -> str:
    """Llama-3.2-1B's config.json with ``fields`` changed, written under ``tmp``."""
    path = tmp / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**hf_config(lookup(L1B)), **fields}))
    return str(path)


@pytest.mark.parametrize(
    ("block", "microbatches"),
    [
        ("strategy: megatron_fsdp\n", 1),  # zero_dp_strategy 3 (AutoModel's default)
        ("strategy: megatron-fsdp\n  zero_dp_strategy: 2\n", 1),  # the weights whole, the gradients sharded
        ("strategy: mfsdp\n  zero_dp_strategy: 1\n", 1),  # the gradients whole too (no buckets, no queue)
        # an fp32 main copy and fp32 states (under -m slow: about 9 s; the two-microbatch case below runs by default)
        pytest.param("strategy: megatron_fsdp\n  preserve_fp32_weights: true\n", 1, marks=pytest.mark.slow),
        # two microbatches: the fp32 gradient copies finish_grad_sync makes after the first stay through the second
        ("strategy: megatron_fsdp\n  preserve_fp32_weights: true\n", 2),
        pytest.param("strategy: megatron_fsdp\n  zero_dp_strategy: 0\n", 1, marks=pytest.mark.slow),
        pytest.param(
            "strategy: megatron_fsdp\n  zero_dp_strategy: 0\n  preserve_fp32_weights: true\n",
            1,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["zero3", "zero2", "zero1", "fp32-main-weights", "fp32-main-weights-accumulating", "zero0", "zero0-fp32"],
)
@needs_megatron
def test_short_sequences_peak_late_in_backward(block, microbatches):
    """AutoModel's strategy aliases (megatron-fsdp, mfsdp) take the same path; the peak falls in the root's backward,
    or (ZeRO 0, nothing sharded) in the optimizer step."""
    text = f"distributed:\n  {block}"
    kw = dict(model=L1B, world_size=RANKS, seq_len=256, micro_batch_size=1, global_batch_size=RANKS * microbatches)
    report, est = dry_run(text, **kw), estimate_memory(text, **kw)
    assert report.status == "measured" and report.microbatches == microbatches
    assert report.layout.strategy == "megatron_fsdp"
    r = _agree(report)
    zero0 = "zero_dp_strategy: 0" in block
    assert (r.peak_phase, est.memory_gib.peak_phase) == (
        ("optimizer", "optimizer-step") if zero0 else ("backward", "end-of-backward")
    )
    if microbatches > 1:
        assert r.peak.grads * (1 << 30) == pytest.approx((2 + 4) * PARAMS / RANKS, rel=1e-3)


@needs_megatron
def test_an_untied_head_moves_its_gradient_into_the_roots_bucket(tmp_path):
    """Untied, the head's weight is no shared parameter: its gradient goes into the root's bucket as it arrives, so
    the root's backward holds the embedding's alone (tied, the shared weight's is held to the step's end)."""
    model = _config(tmp_path, "untied", tie_word_embeddings=False)
    text = "distributed:\n  strategy: megatron_fsdp\n"
    report = dry_run(text, model=model, world_size=RANKS, seq_len=256, micro_batch_size=1)
    assert report.status == "measured"
    _agree(report)


@needs_megatron
def test_a_full_reduce_scatter_queue(tmp_path):
    """Blocks of 470M elements: the queue's 1e9-element unit holds 3 of 8 blocks' gradient buckets (two fit, and the
    new one), the prefetch takes 2 behind the block a backward needs; at 256 tokens the block that fills the queue
    peaks, the earlier blocks' activations still saved."""
    model = _config(
        tmp_path,
        "wide",
        hidden_size=4096,
        intermediate_size=32768,
        num_hidden_layers=8,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    text = "distributed:\n  strategy: megatron_fsdp\n"
    kw = dict(model=model, world_size=RANKS, seq_len=256, micro_batch_size=1)
    report, est = dry_run(text, **kw), estimate_memory(text, **kw)
    assert report.status == "measured" and report.ranks[0].peak_phase == "backward"
    assert est.memory_gib.peak_phase == "queue-full-backward"
    rows = {c.category: c for c in report.estimate_vs_dry_run}
    assert abs(rows["total"].difference) <= 0.03, rows["total"]  # (-1.9%: a block's own backward transients)


@needs_megatron
def test_transformer_engines_fused_adam_keeps_fp32_moments():
    """TE's FusedAdam (CUDA only) is measured as torch AdamW with its fp32 moments: under MegatronFSDP too, where
    megatron-fsdp's own zero-gradient step made the states in the shards' bf16."""
    optimizer = "optimizer:\n  _target_: transformer_engine.pytorch.optimizers.FusedAdam\n  lr: 1.0e-5\n"
    text = f"distributed:\n  strategy: megatron_fsdp\n{optimizer}"
    report = dry_run(text, model=L1B, world_size=RANKS, seq_len=256, micro_batch_size=1)
    assert report.status == "measured"
    [r] = report.ranks
    assert r.optimizer_state_bytes == pytest.approx(2 * 4 * PARAMS / RANKS, rel=1e-3)  # exp_avg, exp_avg_sq in fp32
    # MaskedCrossEntropy uses lm_head's output, so megatron-fsdp's root post-backward runs (its finish_grad_sync)
    assert not any("finish_grad_sync never ran" in s for s in report.substitutions)


@pytest.mark.slow
@needs_megatron
@pytest.mark.parametrize("seq,mbs", [(512, 2), (4096, 1)])
def test_fused_linear_cross_entropy(seq, mbs):
    """megatron-fsdp 0.5.0 hangs its root backward hook on lm_head's output, which a linear cross entropy never uses:
    the root's post-backward never runs, and what the backward gathered stays gathered from step to step. The
    estimate counts it (-34% and -20% before), and validate says why."""
    loss = "loss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\n"
    text = f"distributed:\n  strategy: megatron_fsdp\n{loss}"
    report = dry_run(text, model=L1B, world_size=RANKS, seq_len=seq, micro_batch_size=mbs, global_batch_size=16)
    assert report.status == "measured"
    assert "megatron-fsdp-linear-ce" in {f.rule for f in report.findings}
    [note] = [s for s in report.substitutions if "finish_grad_sync never ran" in s]  # counted in the step itself
    assert "sits on the output of lm_head" in note
    rows = {c.category: c for c in report.estimate_vs_dry_run}
    assert abs(rows["total"].difference) <= 0.05, rows["total"]


def test_what_megatron_fsdp_needs_and_does_not_model_is_refused_by_name(monkeypatch):
    """The plan (no torch): without megatron-fsdp, or with the options whose fixed CUDA pool the dry run does not stand
    in, no rank runs and the reason names it; an alias is the strategy; the spec says MegatronFSDP."""
    from automodel_dist.dry_run import plan as plan_module
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    def plan(block: str):
        return plan_dry_run(Request.of(f"distributed:\n  {block}", world_size=RANKS, model=L1B), num_layers=2)

    double = plan("strategy: mfsdp\n  fsdp_double_buffer: true\n  nccl_ub: true\n")
    assert any("fsdp_double_buffer and nccl_ub: true" in why for why in double.not_measured)
    dion = plan("strategy: megatron_fsdp\noptimizer:\n  _target_: dion.Muon\n  lr: 0.01\n")
    assert any("does not support fully_shard_optimizer" in why for why in dion.not_measured)
    if importlib.util.find_spec("megatron_fsdp") is not None:
        ok = plan("strategy: megatron-fsdp\n")
        assert not ok.unmeasured_ranks and all(s.megatron_fsdp for s in ok.specs)
    monkeypatch.setattr(plan_module, "find_spec", lambda name: None if name == "megatron_fsdp" else object())
    missing = plan("strategy: megatron_fsdp\n")
    assert "pip install --no-deps megatron-fsdp==0.5.0" in missing.unmeasured_ranks[0]
    assert not any(
        s.megatron_fsdp for s in plan_dry_run(Request.of("distributed: {}\n", world_size=RANKS, model=L1B)).specs
    )
