"""Communication per step per rank and axis, and the step time and MFU it implies (pure).

Collective volumes per rank (``n`` = group size, ``V`` = bytes): all-gather and reduce-scatter move
``(n-1)/n * V``, all-reduce ``2(n-1)/n * V``, all-to-all ``(n-1)/n * V``. Each axis uses the
intra-node bandwidth when none of its groups crosses a node, else the inter-node bandwidth (the
engine's layout knows which groups cross). Overlap assumptions (stated, not measured here): FSDP /
DDP / HSDP traffic hides behind up to 80% of compute, CP's ring behind half of attention, TP and EP
are exposed, pipeline bubbles add ``(pp-1)/(v*m)`` (1F1B/GPipe v=1, interleaved v=stages per rank,
zero-bubble schedules a third of that).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from ..catalog.gpus import GPU
from ..catalog.models import ModelSpec
from ..dims import ParallelDims
from .memory import DTYPE_BYTES, Training, _rank_groups, in_flight_microbatches, microbatches

COLLECTIVE_EFFICIENCY = 0.75  # achieved bus bandwidth / link bandwidth
MATMUL_EFFICIENCY = 0.55  # achieved / peak bf16 FLOP/s for transformer training kernels
OVERLAP = 0.8


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    gpus_per_node: int
    intra_gbps: float
    inter_gbps: float


class CommEstimate(BaseModel):
    bytes_per_step: dict[str, float] = Field(default_factory=dict, description="Per rank, per axis.")
    time_s: dict[str, float] = Field(default_factory=dict, description="Per axis, at the axis's bandwidth.")
    crosses_nodes: dict[str, bool] = Field(default_factory=dict)
    compute_s: float = 0.0
    bubble_fraction: float = 0.0
    exposed_comm_s: float = 0.0
    step_time_s: float = 0.0
    mfu: float = 0.0
    tokens_per_step: int = 0
    grad_accumulation_steps: int = 1
    model_tflops_per_step: float = 0.0


def _ag(n: int, v: float) -> float:
    return (n - 1) / n * v if n > 1 else 0.0


def _ar(n: int, v: float) -> float:
    return 2 * (n - 1) / n * v if n > 1 else 0.0


def step_flops(m: ModelSpec, seq_len: int, tokens: float) -> float:
    """Model FLOPs for ``tokens`` trained tokens: 6 * active params + causal attention (6*L*h_attn*s)."""
    attn_width = m.num_attention_heads * m.hd
    attn_layers = m.count("attention") if m.is_hybrid else m.num_layers
    return tokens * (6.0 * m.active_param_count() + 6.0 * attn_layers * attn_width * seq_len)


def estimate_comm(m: ModelSpec, p: ParallelDims, tr: Training, cluster: Cluster) -> CommEstimate:
    comp = DTYPE_BYTES[tr.compute_dtype]
    store = DTYPE_BYTES[tr.storage_dtype]
    gbs = tr.global_batch_size or tr.micro_batch_size * p.dp
    tokens_step = gbs * tr.seq_len
    n_mb, grad_acc = microbatches(p, tr)
    mb_per_step = n_mb * grad_acc
    tok_mb = tr.micro_batch_size * tr.seq_len / p.cp  # local tokens per microbatch
    g = _rank_groups(m, p, 0)
    n_layers = g.n_layers
    h = m.hidden_size
    out: dict[str, float] = {}

    # data parallel: parameters gathered in each forward and, once resharded, again in backward; gradients
    # reduce-scattered once per step when the sync is deferred, else after every backward
    if p.strategy == "ddp":
        out["dp"] = _ar(p.dp, (g.dense + g.experts) * store)
    else:
        shard = p.dp_shard * p.cp if p.strategy == "fsdp2" else p.dp * p.cp
        deferred = p.deferred_sync(mb_per_step)
        if deferred and p.pp > 1:  # backward leaves blocks gathered: a forward after it finds them, until the end
            gathers = grad_acc * (n_mb + 1 if p.blocks_reshard else 1)  # ~ one gather per backward, + the first
        else:  # gathered in each forward, and again in backward when the forward resharded them
            gathers = mb_per_step * (2 if p.blocks_reshard else 1)
        reduces = 1 if deferred or p.strategy != "fsdp2" else mb_per_step
        dense = g.dense
        key = "dp_shard_cp" if p.strategy == "fsdp2" else "dp_cp"
        out[key] = _ag(shard, dense * comp) * gathers + _ag(shard, dense * 4.0) * reduces
        if p.strategy == "fsdp2" and p.dp_replicate > 1:
            out["dp_replicate"] = _ar(p.dp_replicate, dense / shard * 4.0) * reduces
        if g.experts and p.ep_shard > 1:
            out["ep_shard"] = _ag(p.ep_shard, g.experts * comp) * gathers + _ag(p.ep_shard, g.experts * 4) * reduces
        if tr.teacher is not None:  # the KD teacher's layers, gathered in each of its forwards (no backward)
            t = _rank_groups(tr.teacher, p, 0)
            out[key] += _ag(shard, t.dense_layers * comp) * mb_per_step
    per_mb_act = tok_mb * h * comp
    recompute = 1 if p.ac_applied is True else 0
    if p.tp > 1:  # two all-reduces per layer forward (attention, MLP) and two in backward
        out["tp"] = _ar(p.tp, per_mb_act) * (4 + 2 * recompute) * n_layers * mb_per_step
        if g.last:
            out["tp"] += _ag(p.tp, tok_mb * m.vocab_size * comp) * 2 * mb_per_step  # replicated logits
    if p.cp > 1:  # ring passes of K and V: forward once, backward twice (K/V and their gradients)
        kv = 2 * tok_mb * m.num_key_value_heads * m.hd * comp / p.tp
        attn_layers = g.kinds.get("attention", 0) if m.is_hybrid else n_layers
        out["cp"] = (p.cp - 1) * kv * (3 + recompute) * attn_layers * mb_per_step
        if g.kinds.get("mamba"):  # MambaContextParallel: all-to-all into head-parallel before the scan and back
            per_layer = _ag(p.cp, tok_mb * m.mamba_in_proj_width * comp) + _ag(p.cp, tok_mb * m.mamba_inner * comp)
            out["cp"] += per_layer * (2 + recompute) * g.kinds["mamba"] * mb_per_step
    if p.pp > 1:
        out["pp"] = 2 * per_mb_act * p.stages_per_rank * mb_per_step
    if p.ep > 1 and m.is_moe:
        moe_layers = g.kinds.get("moe", 0)
        routed = tok_mb * max(m.experts_per_token, 1) * h * comp
        out["ep"] = _ag(p.ep, routed) * (4 + 2 * recompute) * moe_layers * mb_per_step

    layout = p.layout

    def crosses(axis: str) -> bool:
        if layout is None or layout.device_mesh() is None:
            return p.dp * p.cp * p.tp * p.pp > cluster.gpus_per_node
        names = {a.name for a in layout.axes}
        if axis not in names:
            return False
        return layout.crosses(axis, cluster.gpus_per_node)

    cross = {axis: crosses(axis if axis != "dp" else "dp") for axis in out}
    if p.strategy == "ddp":
        cross["dp"] = p.dp > cluster.gpus_per_node
    times = {}
    for axis, nbytes in out.items():
        bw = (cluster.inter_gbps if cross[axis] else cluster.intra_gbps) * 1e9 * COLLECTIVE_EFFICIENCY
        times[axis] = nbytes / bw

    world = p.dp * p.cp * p.tp * p.pp
    flops_rank_base = step_flops(m, tr.seq_len, tokens_step) / world
    flops_rank = flops_rank_base
    if p.ac_applied is True:
        flops_rank *= 8 / 6  # one more forward
    elif p.ac_applied == "selective":
        flops_rank *= 1.03  # pointwise ops and attention recomputed
    # the KD teacher's forward: a third of a training step's FLOPs at its size (model FLOPs too)
    teacher_flops = step_flops(tr.teacher, tr.seq_len, tokens_step) / 3 / world if tr.teacher is not None else 0.0
    flops_rank += teacher_flops
    compute = flops_rank / (cluster.gpu.bf16_tflops * 1e12 * MATMUL_EFFICIENCY)
    bubble = 0.0
    if p.pp > 1:
        v = p.stages_per_rank
        bubble = (p.pp - 1) / (v * n_mb)
        if (p.pp_schedule or "") in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
            bubble /= 3
        bubble = min(bubble, 1.0)
    overlappable = sum(t for a, t in times.items() if a in ("dp", "dp_shard_cp", "dp_cp", "dp_replicate", "ep_shard"))
    exposed = max(0.0, overlappable - OVERLAP * compute)
    exposed += times.get("tp", 0.0) + times.get("ep", 0.0) + times.get("pp", 0.0) + 0.5 * times.get("cp", 0.0)
    step = compute * (1 + bubble) + exposed
    model_flops = (flops_rank_base + teacher_flops) * world
    mfu = model_flops / (step * world * cluster.gpu.bf16_tflops * 1e12) if step > 0 else 0.0
    return CommEstimate(
        bytes_per_step=out,
        time_s=times,
        crosses_nodes=cross,
        compute_s=compute,
        bubble_fraction=bubble,
        exposed_comm_s=exposed,
        step_time_s=step,
        mfu=mfu,
        tokens_per_step=int(tokens_step),
        grad_accumulation_steps=grad_acc,
        model_tflops_per_step=model_flops / 1e12,
    )


__all__ = ["Cluster", "CommEstimate", "estimate_comm", "step_flops", "in_flight_microbatches"]
