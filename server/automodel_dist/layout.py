"""AutoModel 0.7.0's device meshes as pure arithmetic (no torch), for any world size.

Mirrors ``components/distributed/mesh_utils.py``:

- FSDP2: device_mesh (pp, dp_replicate, dp_shard, cp, tp), row-major over global ranks, with
  flattened dp = (dp_replicate, dp_shard), dp_shard_cp = (dp_shard, cp),
  dp_cp = (dp_replicate, dp_shard, cp); moe_mesh (ep_shard, ep) per pipeline stage when ep > 1
  (the non-pp dims flattened, then unflattened).
- MegatronFSDP: (dp, cp, tp), flattened dp_cp when cp > 1.
- DDP: no mesh.

Groups are computed on demand from strides: nothing proportional to the world size is built
unless a caller asks for a whole group (a 131,072-rank layout costs microseconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

FSDP2_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FSDP2_FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
MFSDP_DIMS = ("dp", "cp", "tp")
MOE_DIMS = ("ep_shard", "ep")
MAX_LISTED = 4096  # reports list a group's members up to this size; larger groups are given as a GroupSpec


# --------------------------------------------------------------------------- size arithmetic
def non_dp_factor(strategy: str, *, tp: int, cp: int, pp: int) -> int:
    """The product world must be divisible by when dp is inferred (``_infer_dp_size``)."""
    return tp * cp * pp if strategy == "fsdp2" else tp * cp


def infer_dp(strategy: str, *, world_size: int, tp: int, cp: int, pp: int, dp_size: int | None) -> int | None:
    """AutoModel's dp: an explicit positive dp_size, else world // (tp*cp*pp); None if not divisible."""
    if strategy == "ddp":
        return world_size
    if dp_size is not None and dp_size > 0:
        return dp_size
    factor = non_dp_factor(strategy, tp=tp, cp=cp, pp=pp)
    return world_size // factor if world_size % factor == 0 else None


def ep_shard_size(*, dp: int, cp: int, tp: int, ep: int) -> int:
    """``ep_shard = dp*cp*tp // ep`` (1 when ep covers all non-pp ranks)."""
    non_pp = dp * cp * tp
    return non_pp // ep if ep < non_pp else 1


def fsdp_mesh_dims(*, dp_replicate: int, cp: int) -> list[str]:
    """The data-parallel mesh FSDP2 shards over (``get_fsdp_dp_mesh``)."""
    if dp_replicate > 1 and cp > 1:
        return ["dp_replicate", "dp_shard_cp"]
    if dp_replicate > 1:
        return ["dp_replicate", "dp_shard"]
    if cp > 1:
        return ["dp_shard_cp"]
    return ["dp_shard"]


_EXAMPLE_BUDGET = 1 << 20  # group members looked at for a node-crossing example before giving up (the count is exact)


# --------------------------------------------------------------------------- groups
@dataclass(frozen=True)
class _Dims:
    """A row-major mesh over consecutive global ranks: names, sizes, strides."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for s in reversed(self.sizes):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    @property
    def total(self) -> int:
        return math.prod(self.sizes)

    def coords(self, rank: int) -> tuple[int, ...]:
        return tuple((rank // st) % sz for st, sz in zip(self.strides, self.sizes))


@dataclass(frozen=True)
class Axis:
    """A named axis: one dim, or several dims flattened (outermost first)."""

    name: str
    kind: str  # device_mesh | flattened | moe_mesh
    dims: tuple[str, ...]


_FSDP2_AXES = tuple(
    [Axis(n, "device_mesh", (n,)) for n in FSDP2_DIMS]
    + [Axis(n, "flattened", src) for n, src in FSDP2_FLATTENED.items()]
)
_MOE_AXES = tuple(Axis(n, "moe_mesh", (n,)) for n in MOE_DIMS)
_MFSDP_AXES = tuple(Axis(n, "device_mesh", (n,)) for n in MFSDP_DIMS)
_MFSDP_DP_CP = Axis("dp_cp", "flattened", ("dp", "cp"))


def dp_shard_of(strategy: str, dp: int, dp_replicate: int) -> int:
    """FSDP2 shards over dp // dp_replicate (HSDP); the other strategies shard (or replicate) over all of dp."""
    return dp // dp_replicate if strategy == "fsdp2" else dp


@dataclass
class Layout:
    """The meshes AutoModel builds for one resolved configuration."""

    strategy: str
    world_size: int
    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp_replicate: int = 1
    ep_shard: int = 1
    _mesh: _Dims | None = field(default=None, repr=False)
    _moe: _Dims | None = field(default=None, repr=False)
    axes: list[Axis] = field(default_factory=list)
    _cross: dict[tuple, int] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        strategy: str,
        *,
        world_size: int,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        dp_size: int | None = None,
        dp_replicate: int = 1,
    ) -> Layout:
        """Build from sizes that already passed validation (see ``rules``); raises ``ValueError`` otherwise."""
        dp = infer_dp(strategy, world_size=world_size, tp=tp, cp=cp, pp=pp, dp_size=dp_size)
        if dp is None:
            raise ValueError(f"world_size ({world_size}) is not divisible by tp*cp*pp")
        lay = cls(
            strategy=strategy, world_size=world_size, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dp_replicate
        )
        if strategy == "fsdp2":
            if dp % dp_replicate:
                raise ValueError("dp_size must be a multiple of dp_replicate_size")
            lay._mesh = _Dims(FSDP2_DIMS, (pp, dp_replicate, dp // dp_replicate, cp, tp))
            lay.axes = list(_FSDP2_AXES)
            if ep > 1:
                if (dp * cp * tp) % ep:
                    raise ValueError("dp*cp*tp must be a multiple of ep_size")
                lay.ep_shard = ep_shard_size(dp=dp, cp=cp, tp=tp, ep=ep)
                # pp is the outer (un-named) dim: one (ep_shard, ep) mesh per pipeline stage
                lay._moe = _Dims(("pp",) + MOE_DIMS, (pp, lay.ep_shard, ep))
                lay.axes += _MOE_AXES
        elif strategy == "megatron_fsdp":
            lay._mesh = _Dims(MFSDP_DIMS, (dp, cp, tp))
            lay.axes = list(_MFSDP_AXES)
            if cp > 1:
                lay.axes.append(_MFSDP_DP_CP)
        if lay._mesh is not None and lay._mesh.total > world_size:
            raise ValueError(f"mesh has {lay._mesh.total} ranks, more than world_size {world_size}")
        return lay

    # ------------------------------------------------------------------ shapes
    @property
    def mesh_ranks(self) -> int:
        return self._mesh.total if self._mesh is not None else self.world_size

    @property
    def dp_shard(self) -> int:
        return dp_shard_of(self.strategy, self.dp, self.dp_replicate)

    def device_mesh(self) -> tuple[list[str], list[int]] | None:
        if self._mesh is None:
            return None
        return list(self._mesh.names), list(self._mesh.sizes)

    def moe_mesh(self) -> tuple[list[str], list[int]] | None:
        if self._moe is None:
            return None
        return list(MOE_DIMS), [self.ep_shard, self.ep]

    def flattened(self) -> dict[str, list[str]]:
        return {a.name: list(a.dims) for a in self.axes if a.kind == "flattened"}

    def fsdp_mesh(self) -> list[str] | None:
        if self.strategy != "fsdp2":
            return None
        return fsdp_mesh_dims(dp_replicate=self.dp_replicate, cp=self.cp)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"axis {name!r} is not in this layout; axes: {[a.name for a in self.axes]}")

    def _dims_for(self, a: Axis) -> _Dims:
        assert self._mesh is not None
        return self._moe if a.kind == "moe_mesh" and self._moe is not None else self._mesh

    def axis_size(self, name: str) -> int:
        a = self.axis(name)
        dims = self._dims_for(a)
        return math.prod(dims.sizes[dims.names.index(d)] for d in a.dims)

    def axis_group_count(self, name: str) -> int:
        return self.mesh_ranks // self.axis_size(name)

    # ------------------------------------------------------------------ groups
    def in_mesh(self, rank: int) -> bool:
        return 0 <= rank < self.mesh_ranks

    def group_spec(self, name: str, rank: int) -> tuple[int, list[tuple[int, int]]]:
        """``rank``'s group on axis ``name`` as (first rank, [(count, stride), ...] outermost first):
        its members are ``first + sum(i_k * stride_k)`` for ``i_k < count_k``, in row-major order."""
        a = self.axis(name)
        dims = self._dims_for(a)
        idx = [dims.names.index(d) for d in a.dims]
        coords, strides = dims.coords(rank), dims.strides
        first = rank - sum(coords[i] * strides[i] for i in idx)
        return first, [(dims.sizes[i], strides[i]) for i in idx]

    def ranks_per_node(self, name: str, gpus_per_node: int) -> int:
        """How many members of rank 0's group on axis ``name`` share its node (the NICs, and rings, NCCL can
        use for the group's traffic between nodes); counted without listing the group (cached)."""
        key = ("per-node", name, gpus_per_node)
        if key not in self._cross:
            _, spec = self.group_spec(name, 0)
            offsets = [0]
            for count, stride in spec:
                offsets = [o + c * stride for o in offsets for c in range(count) if o + c * stride < gpus_per_node]
            self._cross[key] = max(1, len(offsets))
        return self._cross[key]

    def group(self, name: str, rank: int) -> list[int]:
        """Global ranks of ``rank``'s group on axis ``name``, in AutoModel's order."""
        first, spec = self.group_spec(name, rank)
        ranks = [first]
        for count, stride in spec:  # outermost first: row-major order of the flattened group
            ranks = [r + c * stride for r in ranks for c in range(count)]
        return ranks

    def rank_groups(self, rank: int, max_members: int | None = None) -> dict[str, list[int]] | None:
        """Every axis group of ``rank`` (axes whose groups exceed ``max_members`` are left out);
        None outside the mesh; {} for DDP (no mesh)."""
        if self._mesh is None:
            return {} if 0 <= rank < self.world_size else None
        if not self.in_mesh(rank):
            return None
        return {
            a.name: self.group(a.name, rank)
            for a in self.axes
            if max_members is None or self.axis_size(a.name) <= max_members
        }

    def group_index(self, name: str, rank: int) -> int:
        """Index of ``rank``'s group among all groups of the axis (row-major over the other dims)."""
        a = self.axis(name)
        dims = self._dims_for(a)
        coords = dims.coords(rank)
        idx = 0
        for i, n in enumerate(dims.names):
            if n not in a.dims:
                idx = idx * dims.sizes[i] + coords[i]
        return idx

    def iter_groups(self, name: str) -> Iterator[list[int]]:
        """All groups of an axis, lazily (callers bound how many they take)."""
        a = self.axis(name)
        dims = self._dims_for(a)
        others = [(dims.sizes[i], dims.strides[i]) for i, n in enumerate(dims.names) if n not in a.dims]

        def bases(k: int, acc: int) -> Iterator[int]:  # row-major over the other dims; lazy, unlike
            if k == len(others):  # itertools.product, which first copies each range into a tuple
                yield acc
                return
            count, stride = others[k]
            for c in range(count):
                yield from bases(k + 1, acc + c * stride)

        for base in bases(0, 0):
            yield self.group(name, base)

    # ------------------------------------------------------------------ nodes
    def crosses(self, name: str, gpus_per_node: int) -> bool:
        """Whether any group of axis ``name`` spans more than one node (cached)."""
        key = (name, gpus_per_node)
        if key not in self._cross:
            self._cross[key] = self.crossing(name, gpus_per_node, example=False)[0]
        return self._cross[key] > 0

    def crossing(self, name: str, gpus_per_node: int, *, example: bool = True) -> tuple[int, list[int] | None]:
        """How many groups of axis ``name`` span more than one node, and one such group (when the
        groups have at most ``MAX_LISTED`` members).

        Exact and cheap for any world size: a group spans nodes iff its lowest rank's offset in
        the node plus the group's rank span reaches the node size, so only the distribution of
        lowest-rank residues mod ``gpus_per_node`` over the other dims is needed.
        """
        a = self.axis(name)
        dims = self._dims_for(a)
        g = gpus_per_node
        strides = dims.strides
        comp = [(dims.sizes[i], strides[i]) for i, n in enumerate(dims.names) if n in a.dims]
        others = [(dims.sizes[i], strides[i]) for i, n in enumerate(dims.names) if n not in a.dims]
        span = sum((n - 1) * s for n, s in comp)
        if span == 0:
            return 0, None
        if span >= g:
            count = math.prod(n for n, _ in others)
        else:
            dist = [0] * g  # how many groups have their lowest rank at each offset within a node
            dist[0] = 1
            for n, s in others:
                dist = _spread(dist, n, s % g)
            count = sum(dist[g - span :])
        if not example:
            return count, None
        example = None
        size = math.prod(n for n, _ in comp)
        if count and size <= MAX_LISTED:
            for i, grp in enumerate(self.iter_groups(name), 1):
                if grp[0] // g != max(grp) // g:
                    example = grp
                    break
                if i * size > _EXAMPLE_BUDGET:
                    break
        return count, example

    # ------------------------------------------------------------------ picture
    def default_axis(self) -> str | None:
        """The axis worth drawing: the innermost non-trivial device_mesh dim (tp, cp, ...)."""
        if self._mesh is None:
            return None
        inner = [a.name for a in reversed(self.axes) if a.kind == "device_mesh" and self.axis_size(a.name) > 1]
        return inner[0] if inner else self.axes[0].name

    def picture(self, axis: str | None = None, *, gpus_per_node: int | None = None, max_nodes: int = 16) -> str:
        """A text grid of ranks per node; each cell is the rank's group number on ``axis``."""
        g = gpus_per_node or min(self.world_size, 8)
        nodes = math.ceil(self.world_size / g)
        axis = axis or self.default_axis() if self._mesh is not None else None
        label = "gpu" if gpus_per_node else "slot"
        if axis is None:
            head = f"{self.strategy}: {self.world_size} ranks, no device mesh (every rank is a data-parallel replica)"
        else:
            size, groups = self.axis_size(axis), self.axis_group_count(axis)
            head = (
                f"{axis} groups (size {size}, {groups} groups) over {nodes} node(s) x {g} {label}s; "
                f"cell = group number, '-' = outside the mesh"
            )
        width = max(len(str(max(self.world_size - 1, 0))), 3)
        lines = [head, " " * 9 + " ".join(f"{label[0]}{i}".rjust(width) for i in range(g))]
        shown: list[int] | range = range(nodes)
        if nodes > max_nodes:
            shown = list(range(max_nodes // 2)) + [-1] + list(range(nodes - max_nodes // 2 + 1, nodes))
        for node in shown:
            if node < 0:
                lines.append("   ...")
                continue
            cells = []
            for i in range(g):
                rank = node * g + i
                if rank >= self.world_size:
                    cells.append("".rjust(width))
                elif axis is None:
                    cells.append(str(rank).rjust(width))
                elif not self.in_mesh(rank):
                    cells.append("-".rjust(width))
                else:
                    cells.append(str(self.group_index(axis, rank)).rjust(width))
            lines.append(f"node {node:<4}" + " ".join(cells))
        return "\n".join(lines)


def _spread(dist: list[int], n: int, s: int) -> list[int]:
    """``new[r] = sum(dist[(r - c*s) % g] for c in range(n))``, in O(g): each residue cycle of
    ``s`` mod ``g`` is walked once with a sliding window (full turns add the cycle's total)."""
    g = len(dist)
    if s == 0:
        return [k * n for k in dist]
    period = g // math.gcd(s, g)
    full, rem = divmod(n, period)
    new = [0] * g
    for start in range(math.gcd(s, g)):  # one cycle per coset of <s>
        cycle = [(start + j * s) % g for j in range(period)]
        vals = [dist[r] for r in cycle]
        total = sum(vals)
        window = sum(vals[(-c) % period] for c in range(rem))  # window ending at j = 0
        for j, r in enumerate(cycle):
            if j:
                window += vals[j] - vals[(j - rem) % period]
            new[r] = full * total + window
    return new


# --------------------------------------------------------------------------- pipeline stages
class StageError(ValueError):
    """A pipeline split AutoModel rejects (message mirrors ``calculate_virtual_stages``)."""


def virtual_stages(
    num_layers: int,
    *,
    pp: int,
    single_stage: bool,
    layers_per_stage: int | None = None,
    round_to: str | None = None,
    v_style: bool = False,
) -> tuple[int, int]:
    """AutoModel's ``calculate_virtual_stages`` plus the split checks: (total stages, stages per rank).

    Raises :class:`StageError` where AutoModel (or torch's schedule) would.
    """
    if layers_per_stage is not None:
        total = math.ceil(num_layers / layers_per_stage)
        if total % pp:
            if round_to == "up":
                total += pp - total % pp
            elif round_to == "down":
                total -= total % pp
            else:
                raise StageError(
                    f"Number of virtual stages ({total}) must be divisible by pipeline parallel size ({pp}); "
                    f"the model has {num_layers} layers with layers_per_stage={layers_per_stage}"
                )
        per_rank = total // pp
        if single_stage and per_rank != 1:
            raise StageError(
                f"single-stage schedule requires exactly 1 stage per rank, but layers_per_stage={layers_per_stage} "
                f"gives {per_rank} ({total} stages over pp={pp}); use layers_per_stage >= {num_layers // pp}"
            )
        if not single_stage and per_rank < 2:
            raise StageError(
                f"multi-stage schedule requires at least 2 stages per rank, but layers_per_stage={layers_per_stage} "
                f"gives {per_rank} ({total} stages over pp={pp}); use layers_per_stage <= "
                f"{max(num_layers // (2 * pp), 1)}"
            )
    else:
        per_rank = 1 if single_stage else 2
        total = pp * per_rank
    if v_style and per_rank != 2:
        raise StageError(f"V-schedules (ZBVZeroBubble, DualPipeV) require exactly 2 stages per rank, got {per_rank}")
    if total > num_layers:
        raise StageError(f"Number of stages ({total}) cannot exceed number of layers ({num_layers})")
    return total, per_rank


def stage_layer_counts(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage as AutoModel splits them (the first ``L % S`` stages get one more)."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if i < extra else 0) for i in range(num_stages)]


def stage_ids(pp_rank: int, pp: int, num_stages: int, *, v_style: bool = False) -> tuple[int, ...]:
    """Stages a pipeline rank holds: loop style (r, r+pp, ...) or V style (r, 2*pp-1-r)."""
    per_rank = num_stages // pp
    if v_style:
        return (pp_rank, num_stages - 1 - pp_rank)
    return tuple(pp_rank + s * pp for s in range(per_rank))
