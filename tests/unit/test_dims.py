"""ParallelDims: the one typed reading of a block. Every layout suggest can enumerate reads back from its own block
(``read_dims(d.to_block(), world) == d``), survives the smoke spec's JSON, and reports what validate reports."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import validate_config
from automodel_dist.catalog.models import catalog, lookup
from automodel_dist.dims import FSDP2_DEFAULT_MP, MixedPrecision, ParallelDims, read_dims
from automodel_dist.suggest import _options

MODELS = sorted(m.name for m in catalog())
WORLDS = [1, 2, 4, 8, 12, 16, 24, 32, 64, 128]


@settings(max_examples=60)
@given(
    model=st.sampled_from(MODELS),
    world=st.sampled_from(WORLDS),
    gpn=st.sampled_from([4, 8]),
    seq=st.sampled_from([2048, 4096, 8192]),
    mbs=st.sampled_from([1, 2]),
    strategies=st.sampled_from([("fsdp2",), ("megatron_fsdp",), ("ddp",), ("fsdp2", "megatron_fsdp", "ddp")]),
)
def test_every_enumerated_layout_reads_back_from_its_block(model, world, gpn, seq, mbs, strategies):
    spec = lookup(model)
    gbs = world * mbs * 8
    for d in _options(spec, world, gpn, seq, gbs, mbs, True, strategies):
        for variant in (d, dataclasses.replace(d, defer_fsdp_grad_sync=False) if d.strategy == "fsdp2" else d):
            block = variant.to_block()
            assert read_dims(block, world) == variant, block
            assert ParallelDims.from_json(variant.to_json()) == variant


def test_the_round_trip_is_exercised_on_real_layouts():
    """The property above is not vacuous: 64-GPU searches for a dense and an MoE model enumerate every axis."""
    opts = [
        o
        for model in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B")
        for o in _options(lookup(model), 64, 8, 4096, 512, 1, True, ("fsdp2", "megatron_fsdp"))
    ]
    assert len(opts) > 100
    assert {o.strategy for o in opts} == {"fsdp2", "megatron_fsdp"}
    for axis in ("tp", "pp", "cp", "ep", "dp_replicate"):
        assert any(getattr(o, axis) > 1 for o in opts), axis
    assert {o.activation_checkpointing for o in opts} == {False, "selective", True}
    for o in opts:
        assert read_dims(o.to_block(), 64) == o


@pytest.mark.parametrize(
    "block",
    [
        {},
        {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True, "dp_replicate_size": 2},
        {"strategy": "fsdp2", "pp_size": 2, "pipeline": {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 2}},
        {"strategy": "fsdp2", "ep_size": 4, "moe": {"reshard_after_forward": True}, "reshard_after_forward": False},
        {"strategy": "fsdp2", "mp_policy": {"param_dtype": "float32", "reduce_dtype": "float32"}},
        {"strategy": "fsdp2", "dp_size": 4, "defer_fsdp_grad_sync": False, "activation_checkpointing": "selective"},
        {"strategy": "megatron_fsdp", "zero_dp_strategy": 2, "cp_size": 2},
        {"strategy": "megatron_fsdp", "preserve_fp32_weights": True, "grad_reduce_in_fp32": True},
        {"strategy": "ddp"},
    ],
)
def test_written_blocks_read_back_and_report_as_validate_does(block):
    d = read_dims(block, 16)
    assert read_dims(d.to_block(), 16) == d
    assert validate_config(d.to_block(), world_size=16).resolved == validate_config(block, world_size=16).resolved


def test_raw_values_read_as_automodel_reads_them():
    d = read_dims(
        {
            "strategy": "MFSDP",
            "tp_size": 2.0,
            "cp_size": True,
            "dp_size": 0,
            "activation_checkpointing": "on",
            "pp_size": 2,
            "pipeline": {"pp_schedule": "GPIPE", "pp_microbatch_size": "x"},
        },
        8,
    )
    assert (d.strategy, d.tp, d.cp, d.dp_size, d.activation_checkpointing) == ("megatron_fsdp", 1, 1, None, True)
    assert (d.pp_schedule, d.pp_microbatch_size, d.mp_policy) == ("GPipe", None, None)
    assert read_dims({"strategy": "fsdp"}, 8).strategy is None  # unknown: the rules say so
    # MegatronFSDP's fp32 options, read by their truth as its parallelizer reads them, for that strategy alone
    mf = read_dims({"strategy": "mfsdp", "preserve_fp32_weights": True, "grad_reduce_in_fp32": 0}, 8)
    assert (mf.megatron_fp32_main_weights, mf.megatron_fp32_grads) == (True, False)
    assert not read_dims({"preserve_fp32_weights": True}, 8).megatron_fp32_main_weights
    assert read_dims({"activation_checkpointing": "sometimes"}).activation_checkpointing is None
    assert read_dims({"mp_policy": None}).mp_policy == FSDP2_DEFAULT_MP
    assert read_dims({"mp_policy": {"param_dtype": "bf16"}}).mp_policy == MixedPrecision("bfloat16", None, None)


def test_derived_sizes():
    d = read_dims({"tp_size": 2, "cp_size": 2, "ep_size": 8, "dp_replicate_size": 2}, 32)
    assert (d.dp, d.dp_shard, d.ep_shard, d.layout.mesh_ranks) == (8, 4, 4, 32)
    assert read_dims({"tp_size": 3}, 8).dp is None  # not divisible
    assert read_dims({"dp_size": 4}).dp == 4  # explicit, without a world size
    assert read_dims({"strategy": "ddp"}, 8).resolved().dp_replicate == 8  # every rank a replica
    broken = read_dims({"tp_size": 2, "ep_size": 3}, 8)  # ep does not divide dp*cp*tp: no layout, tp groups still
    assert broken.layout is None and broken.tp_cp_layout is not None and broken.ep_shard is None
