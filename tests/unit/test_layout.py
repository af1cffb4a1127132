"""Mesh arithmetic: strides-based groups vs a brute-force enumeration, node crossing, big worlds,
and the pipeline stage helpers vs AutoModel's own functions."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import build_mesh
from automodel_dist.layout import FSDP2_DIMS, FSDP2_FLATTENED, Layout, StageError, stage_ids, virtual_stages
from support import oracle


def _brute_groups(names: tuple[str, ...], sizes: tuple[int, ...], flattened: dict[str, tuple[str, ...]]):
    """Enumerate every rank's coordinates and build each axis group by definition."""
    coords = list(itertools.product(*(range(s) for s in sizes)))  # row-major == rank order
    rank_of = {c: r for r, c in enumerate(coords)}
    axes = {n: (n,) for n in names} | flattened
    out: dict[int, dict[str, list[int]]] = {}
    for r, c in enumerate(coords):
        out[r] = {}
        for axis, dims in axes.items():
            idx = [names.index(d) for d in dims]
            group = []
            for combo in itertools.product(*(range(sizes[i]) for i in idx)):
                cc = list(c)
                for i, v in zip(idx, combo):
                    cc[i] = v
                group.append(rank_of[tuple(cc)])
            out[r][axis] = group
    return out


@st.composite
def fsdp2_sizes(draw):
    pp, rep, shard, cp, tp = (draw(st.sampled_from([1, 2, 3])) for _ in range(5))
    ep = draw(st.sampled_from([d for d in range(1, rep * shard * cp * tp + 1) if (rep * shard * cp * tp) % d == 0]))
    return pp, rep, shard, cp, tp, ep


def _fsdp2(sizes: tuple[int, ...]) -> Layout | None:
    """The FSDP2 layout of (pp, dp_replicate, dp_shard, cp, tp, ep); None when HSDP would be pure replication."""
    pp, rep, shard, cp, tp, ep = sizes
    if rep > 1 and rep >= rep * shard:
        return None
    return Layout.build(
        "fsdp2",
        world_size=pp * rep * shard * cp * tp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        dp_replicate=rep,
        dp_size=rep * shard,
    )


@settings(max_examples=80)
@given(fsdp2_sizes())
def test_fsdp2_groups_match_brute_force(sizes):
    lay = _fsdp2(sizes)
    if lay is None:
        return
    pp, rep, shard, cp, tp, ep = sizes
    world = lay.world_size
    ref = _brute_groups(FSDP2_DIMS, (pp, rep, shard, cp, tp), FSDP2_FLATTENED)
    non_pp = rep * shard * cp * tp
    for rank in range(world):
        groups = lay.rank_groups(rank)
        assert groups is not None
        for axis, members in ref[rank].items():
            assert groups[axis] == members, (axis, rank)
        if ep > 1:  # moe mesh: the stage's non-pp ranks, unflattened to (ep_shard, ep)
            stage, local = divmod(rank, non_pp)
            block = list(range(stage * non_pp, (stage + 1) * non_pp))
            assert groups["ep"] == block[(local // ep) * ep : (local // ep) * ep + ep]
            assert groups["ep_shard"] == block[local % ep :: ep]


@settings(max_examples=200)
@given(
    fsdp2_sizes(),
    st.integers(1, 40),
    st.sampled_from(["tp", "cp", "dp_shard", "dp", "dp_shard_cp", "pp", "ep", "ep_shard", "dp_cp"]),
)
def test_crossing_matches_brute_force(sizes, gpn, axis):
    lay = _fsdp2(sizes)
    if lay is None or axis not in {a.name for a in lay.axes}:
        return
    groups = {tuple(g) for g in lay.iter_groups(axis)}
    expected = sum(1 for g in groups if len({r // gpn for r in g}) > 1)
    count, example = lay.crossing(axis, gpn)
    assert count == expected
    assert (example is None) == (expected == 0)


def test_megatron_mesh_and_ddp():
    lay = Layout.build("megatron_fsdp", world_size=16, tp=2, cp=2)
    assert lay.device_mesh() == (["dp", "cp", "tp"], [4, 2, 2])
    assert lay.rank_groups(5) == {"dp": [1, 5, 9, 13], "cp": [5, 7], "tp": [4, 5], "dp_cp": [1, 3, 5, 7, 9, 11, 13, 15]}
    ddp = Layout.build("ddp", world_size=4)
    assert ddp.device_mesh() is None and ddp.rank_groups(3) == {} and ddp.rank_groups(4) is None


def test_131072_ranks_are_arithmetic_not_lists():
    lay = Layout.build("fsdp2", world_size=131072, tp=8, pp=16, cp=2, ep=64, dp_replicate=8)
    assert lay.device_mesh() == (list(FSDP2_DIMS), [16, 8, 64, 2, 8])
    groups = lay.rank_groups(131071)
    assert groups["tp"] == list(range(131064, 131072))
    assert len(groups["dp_cp"]) == 8 * 64 * 2
    assert lay.moe_mesh() == (["ep_shard", "ep"], [128, 64])
    count, example = lay.crossing("cp", 8)
    assert count == lay.axis_group_count("cp") and example == [0, 8]
    assert "..." in lay.picture("tp", gpus_per_node=8)  # 16,384 nodes: bounded picture


def test_group_enumeration_is_lazy_at_any_size():
    """Taking the first groups of an axis over 16.7M ranks allocates next to nothing (no per-rank or per-group
    list); so does finding a node-crossing example, which walks the groups until one crosses."""
    import tracemalloc

    lay = Layout.build("fsdp2", world_size=3 << 22, tp=3)  # 4,194,304 tp groups
    tracemalloc.start()
    try:
        groups = lay.iter_groups("tp")
        assert [next(groups), next(groups)] == [[0, 1, 2], [3, 4, 5]]
        assert lay.crossing("tp", 8) == (lay.axis_group_count("tp") // 4, [6, 7, 8])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_build_mesh_defaults_to_rank_zero_for_big_worlds():
    report = build_mesh({"tp_size": 8}, world_size=4096)
    assert list(report.rank_groups) == ["0"]
    small = build_mesh({"tp_size": 2}, world_size=8)
    assert list(small.rank_groups) == [str(r) for r in range(8)]


def test_build_mesh_rejects_bad_ranks_and_axes():
    with pytest.raises(ValueError, match="outside"):
        build_mesh({"tp_size": 2}, world_size=8, ranks=[8])
    with pytest.raises(ValueError, match="not in this layout"):
        build_mesh({"tp_size": 2}, world_size=8, picture_axis="ep")


# --------------------------------------------------------------------------- pipeline helpers
SCHEDULE_KIND = {"single": (True, False), "multi": (False, False), "v": (False, True)}


@pytest.mark.skipif(not oracle.AVAILABLE, reason="AutoModel oracle not installed")
@settings(max_examples=300)
@given(
    st.integers(1, 96),
    st.sampled_from([2, 3, 4, 8]),
    st.sampled_from(["single", "multi"]),
    st.one_of(st.none(), st.integers(1, 12)),
    st.sampled_from([None, "up", "down"]),
)
def test_virtual_stages_match_automodel(layers, pp, kind, lps, round_to):
    from nemo_automodel.components.distributed.pipelining.functional import (
        calculate_virtual_stages,
        generate_hf_model_fqn_per_model_part,
    )

    single, v = SCHEDULE_KIND[kind]
    try:
        total, per_rank = calculate_virtual_stages(layers, lps, pp, single, round_to)
        generate_hf_model_fqn_per_model_part(total, layers)
        expected = (total, per_rank)
    except (ValueError, AssertionError):
        expected = None
    try:
        ours = virtual_stages(layers, pp=pp, single_stage=single, layers_per_stage=lps, round_to=round_to, v_style=v)
    except StageError:
        ours = None
    assert ours == expected


@pytest.mark.skipif(not oracle.AVAILABLE, reason="AutoModel oracle not installed")
@pytest.mark.parametrize("pp,stages", [(2, 4), (4, 8), (4, 12), (3, 6)])
def test_stage_ids_match_automodel(pp, stages):
    from nemo_automodel.components.distributed.pipelining.functional import stage_ids_this_rank

    for r in range(pp):
        assert stage_ids(r, pp, stages) == stage_ids_this_rank(r, pp, stages, "loop")
        if stages == 2 * pp:
            assert stage_ids(r, pp, stages, v_style=True) == stage_ids_this_rank(r, pp, stages, "v")


def test_stage_layer_counts_sum():
    from automodel_dist.layout import stage_layer_counts

    for layers in range(1, 50):
        for s in range(1, layers + 1):
            counts = stage_layer_counts(layers, s)
            assert sum(counts) == layers and max(counts) - min(counts) <= 1
    assert math.prod([1]) == 1


def test_large_groups_are_exact_specs_not_lists():
    from automodel_dist.rules.helpers import divisors

    mesh = build_mesh({"tp_size": 2, "cp_size": 2}, world_size=1 << 15, ranks=[5])
    groups, big = mesh.rank_groups["5"], mesh.large_groups["5"]
    assert set(groups) == {"pp", "dp_replicate", "cp", "tp"} and set(big) == {"dp_shard", "dp", "dp_shard_cp", "dp_cp"}
    spec = big["dp_shard_cp"]
    members = [spec.first]
    for count, stride in spec.dims:
        members = [m + c * stride for m in members for c in range(count)]
    assert spec.size == len(members) == 1 << 14
    assert members == sorted(r for r in range(1 << 15) if r % 2 == 5 % 2)  # every rank with the same tp coordinate
    assert divisors(360) == [d for d in range(1, 361) if 360 % d == 0]
    assert divisors(2**61 - 1) == [1, 2**61 - 1] and divisors(2**40, 8) == [1, 2, 4, 8]


def test_max_listed_none_lists_every_group():
    mesh = build_mesh({"tp_size": 2}, world_size=1 << 13, ranks=[3], max_listed=None)
    assert mesh.large_groups == {} and len(mesh.rank_groups["3"]["dp"]) == 1 << 12
    capped = build_mesh({"tp_size": 2}, world_size=1 << 14, ranks=[3])
    assert "dp" not in capped.rank_groups["3"] and capped.large_groups["3"]["dp"].size == 1 << 13


@settings(max_examples=300)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=24), st.integers(0, 60), st.integers(0, 60))
def test_spread_matches_brute_force(dist, n, s):
    from automodel_dist.layout import _spread

    g = len(dist)
    expected = [sum(dist[(r - c * s) % g] for c in range(n)) for r in range(g)]
    assert _spread(dist, n, s % g) == expected
