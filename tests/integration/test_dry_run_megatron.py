"""The dry run under ``strategy: megatron_fsdp``: AutoModel 0.7.0's MegatronFSDP path runs megatron-fsdp 0.5.0 (its
pin) as written on fake tensors, and the estimate's MegatronFSDP terms are held to it. Llama-3.2-1B at full depth on 8
ranks, the corpus recipe's model and layout: its prefetch window (9 of 16 blocks), its reduce-scatter queue (all 16),
its persistent gradient buffer, at each ZeRO level and with its fp32 main weights, where the peak falls at the start of
backward (long sequences) and at the root's backward (short ones)."""

from __future__ import annotations

import importlib.util

import pytest

from automodel_dist import estimate_memory
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
    """The estimate within ``tolerance`` of the dry run in total and in each category (GiB, or 1% of the total)."""
    [rank] = report.ranks
    rows = {c.category: c for c in report.estimate_vs_dry_run}
    total = rows["total"].dry_run_gib
    assert abs(rows["total"].estimate_gib - total) <= tolerance * total, rows["total"]
    for c in rows.values():
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


@pytest.mark.parametrize(
    ("block", "mbs"),
    [
        ("", 1),  # zero_dp_strategy 3 (AutoModel's default)
        ("  zero_dp_strategy: 2\n", 1),  # the whole model's weights kept, the gradients sharded
        ("  zero_dp_strategy: 1\n", 1),  # the gradients whole too (no buckets, no queue)
        ("  preserve_fp32_weights: true\n", 1),  # an fp32 main copy and fp32 states
        # two microbatches: the fp32 gradient copies finish_grad_sync makes after the first stay through the second
        ("  preserve_fp32_weights: true\n", 2),
    ],
    ids=["zero3", "zero2", "zero1", "fp32-main-weights", "fp32-main-weights-accumulating"],
)
@needs_megatron
def test_short_sequences_peak_in_the_roots_backward(block, mbs):
    text = f"distributed:\n  strategy: megatron_fsdp\n{block}"
    report = dry_run(text, model=L1B, world_size=RANKS, seq_len=256, micro_batch_size=1, global_batch_size=8 * mbs)
    est = estimate_memory(text, model=L1B, world_size=RANKS, seq_len=256, micro_batch_size=1, global_batch_size=8 * mbs)
    assert report.status == "measured" and report.microbatches == mbs
    r = _agree(report)
    assert r.peak_phase == "backward" and est.memory_gib.peak_phase == "end-of-backward"
    if mbs > 1:
        assert r.peak.grads * (1 << 30) == pytest.approx((2 + 4) * PARAMS / RANKS, rel=1e-3)


@pytest.mark.xfail(
    strict=True,
    reason="FusedLinearCrossEntropy under MegatronFSDP with gradient accumulation: the second microbatch's backward "
    "runs with 1.4 GiB of activations and the tied head's 0.49 GiB gradient the first left (7.5 GiB measured at 512 "
    "tokens x 2 a microbatch, two microbatches; 5.4 estimated, -28%; with one microbatch 5.46 against 5.41). The "
    "estimate's MegatronFSDP terms are held to MaskedCrossEntropy, the corpus recipe's loss, above",
)
@needs_megatron
def test_fused_linear_cross_entropy_accumulating():
    loss = "loss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\n"
    text = f"distributed:\n  strategy: megatron_fsdp\n{loss}"
    report = dry_run(text, model=L1B, world_size=RANKS, seq_len=512, micro_batch_size=2, global_batch_size=32)
    assert report.status == "measured" and report.microbatches == 2
    rows = {c.category: c for c in report.estimate_vs_dry_run}
    assert abs(rows["total"].difference) <= 0.15, rows["total"]
