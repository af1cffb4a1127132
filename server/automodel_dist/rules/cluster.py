"""Cluster-aware rules: the world size against nodes x GPUs, and groups that cross node boundaries."""

from __future__ import annotations

from collections.abc import Iterator

from ..report import Finding
from .base import Context, finding, rule

F = "cluster"


@rule(
    "world-mismatch",
    family=F,
    severity="error",
    title="world_size != nodes x gpus_per_node",
    cause="The world size must equal nodes x gpus_per_node.",
    fix="Make them agree.",
)
def world_mismatch(ctx: Context) -> Iterator[Finding]:
    if ctx.nodes and ctx.gpus_per_node and ctx.dims.world_size and ctx.nodes * ctx.gpus_per_node != ctx.dims.world_size:
        yield finding(
            ctx,
            (),
            f"world_size={ctx.dims.world_size} but nodes x gpus_per_node = {ctx.nodes} x {ctx.gpus_per_node} = "
            f"{ctx.nodes * ctx.gpus_per_node}",
            f"world_size: {ctx.nodes * ctx.gpus_per_node}",
        )


@rule(
    "world-partial-node",
    family=F,
    severity="error",
    title="World size is not whole nodes",
    cause="A world size that is not a multiple of gpus_per_node leaves a partial node.",
    fix="Use whole nodes.",
)
def world_partial_node(ctx: Context) -> Iterator[Finding]:
    g = ctx.gpus_per_node
    if g and ctx.dims.world_size and not ctx.nodes and ctx.dims.world_size % g:
        yield finding(
            ctx,
            (),
            f"world_size={ctx.dims.world_size} is not a whole number of {g}-GPU nodes",
            f"world_size: {ctx.dims.world_size + (-ctx.dims.world_size) % g}",
        )


def _crossing(ctx: Context, axis: str, rule_id: str, why: str) -> Iterator[Finding]:
    layout, g = ctx.dims.tp_cp_layout, ctx.gpus_per_node  # an EP or dp_replicate error does not hide these
    if layout is None or not g or layout.device_mesh() is None:
        return
    if axis not in {a.name for a in layout.axes} or layout.axis_size(axis) <= 1:
        return
    count, example = layout.crossing(axis, g)
    if not count:
        return
    size, total = layout.axis_size(axis), layout.axis_group_count(axis)
    ex = f"; e.g. ranks {example} span nodes {sorted({r // g for r in example})}" if example else ""
    key = f"{axis}_size"
    inner = size if axis == "tp" else size * layout.tp  # a cp group spans tp*cp consecutive ranks
    what = key if axis == "tp" else "tp_size * cp_size"
    fix = f"keep {what} (now {inner}) a divisor of gpus_per_node={g}"
    yield finding(
        ctx,
        (key,),
        f"{count} of {total} {axis} groups (size {size}) cross a node boundary with {g} GPUs per node{ex}: {why}",
        fix,
        rule_id=rule_id,
    )


@rule(
    "tp-cross-node",
    family=F,
    severity="warning",
    title="TP groups span nodes",
    cause="Tensor parallelism all-reduces activations every layer; across nodes it runs at network speed.",
    fix="Keep tp_size within a node (a divisor of gpus_per_node).",
)
def tp_cross_node(ctx: Context) -> Iterator[Finding]:
    yield from _crossing(
        ctx, "tp", "tp-cross-node", "TP collectives run every layer and are bound by the inter-node network"
    )


@rule(
    "cp-cross-node",
    family=F,
    severity="warning",
    title="CP groups span nodes",
    cause="Context parallelism exchanges K/V every attention layer; across nodes it is network bound.",
    fix="Keep tp_size*cp_size within a node where possible.",
)
def cp_cross_node(ctx: Context) -> Iterator[Finding]:
    yield from _crossing(
        ctx, "cp", "cp-cross-node", "CP exchanges keys/values every attention layer over the inter-node network"
    )
