"""Communication per step per rank and axis, and the step time and MFU it implies (pure).

Collective volumes per rank (``n`` = group size, ``V`` = bytes): all-gather and reduce-scatter move
``(n-1)/n * V``, all-reduce ``2(n-1)/n * V``, all-to-all ``(n-1)/n * V``. Each axis uses the
intra-node bandwidth when none of its groups crosses a node; a group that spans nodes moves as many NICs'
worth as it has ranks in a node (NCCL's one ring per NIC, ``axis_gbps``), so FSDP over 8 GPUs per node
sees 8 x 50 GB/s on H100s, a replica group of one GPU per node one NIC. Overlap assumptions (stated, not measured here): FSDP /
DDP / HSDP traffic hides behind up to 80% of compute, CP's ring behind half of attention, TP and EP
are exposed, pipeline bubbles add ``(pp-1)/(v*m)`` (1F1B/GPipe v=1, interleaved v=stages per rank,
zero-bubble schedules a third of that).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, Field

from ..catalog.gpus import GPU
from ..catalog.kernels import LOCAL_DISPATCHERS, tp_splits_vocab
from ..catalog.models import ModelSpec
from ..dims import ParallelDims
from .memory import (
    DTYPE_BYTES,
    Training,
    _groups_of,
    _rank_groups,
    grad_reduce_bytes,
    grad_sync_deferred,
    holds_across_schedule_steps,
    microbatches,
)
from .peft import Lora

COLLECTIVE_EFFICIENCY = 0.75  # achieved bus bandwidth / link bandwidth
MATMUL_EFFICIENCY = 0.55  # achieved / peak bf16 FLOP/s for transformer training kernels
OVERLAP = 0.8
# DeepEP's published internode dispatch/combine: 43-46 GB/s of RDMA per GPU on 400 Gb/s (50 GB/s) NICs
DEEPEP_RDMA_EFFICIENCY = 0.9
# How far the step time is from AutoModel's published H100 runs (tests/oracle/test_calibration.py holds it to this on every
# row the model reaches; bench/bench_calibration.py prints each ratio): suggest does not rank layouts apart by less.
STEP_TIME_ERROR = 0.25


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


def step_flops(m: ModelSpec, seq_len: int, tokens: float, lora: Lora | None = None) -> float:
    """Model FLOPs for ``tokens`` trained tokens: 6 * active params + causal attention (6*L*h_attn*s). With LoRA
    the frozen weights run forward and the input gradient only (4 per parameter), the adapters all three (6)."""
    return tokens * _flops_per_token(m, seq_len, lora)


@lru_cache(maxsize=1024)
def _flops_per_token(m: ModelSpec, seq_len: int, lora: Lora | None) -> float:
    attn_width = m.num_attention_heads * m.hd
    attn_layers = m.attention_layers  # not Mamba or Gated DeltaNet layers: no softmax attention there
    weights = 6.0 * m.active_param_count() if lora is None else 4.0 * m.active_param_count() + 6.0 * lora.total(m)
    return weights + 6.0 * attn_layers * attn_width * seq_len


def forward_flops(m: ModelSpec, seq_len: int, tokens: float) -> float:
    """One forward pass (what activation checkpointing runs again): a third of a full training step's."""
    return step_flops(m, seq_len, tokens) / 3


def axis_gbps(axis: str, p: ParallelDims, cluster: Cluster, crosses: bool) -> float:
    """GB/s per GPU a collective on ``axis`` moves at. Inside a node, NVLink's. Across nodes NCCL runs one
    ring (or tree) per NIC and carries the in-node hops on NVLink, so a group with g ranks in each node moves
    about g NICs' worth (capped by the node's NICs and by NVLink); the all-to-all of expert parallelism and
    the pipeline's point-to-point sends leave through each GPU's own NIC."""
    if not crosses:
        return cluster.intra_gbps
    if axis in ("ep", "pp"):
        return cluster.inter_gbps
    layout = p.layout
    g = 1
    if layout is not None and layout.device_mesh() is not None and axis in {a.name for a in layout.axes}:
        g = layout.ranks_per_node(axis, cluster.gpus_per_node)
    elif axis == "dp":  # DDP: every rank
        g = cluster.gpus_per_node
    return min(cluster.intra_gbps, min(g, cluster.gpu.nics_per_node) * cluster.inter_gbps)


def _ep_time(m: ModelSpec, p: ParallelDims, tr: Training, cluster: Cluster, nbytes: float) -> float:
    """The token exchange of an expert-parallel group that spans nodes: the copies for experts in the same node
    move on NVLink, the rest through each GPU's NIC. The standard all-to-all sends a token once per remote expert;
    DeepEP / HybridEP send it once per remote node and fan it out there on NVLink."""
    n = p.ep
    layout = p.layout
    g = layout.ranks_per_node("ep", cluster.gpus_per_node) if layout is not None and layout.device_mesh() else 1
    g = max(1, min(g, n))
    nodes = max(1, n // g)
    k = max(m.experts_per_token, 1)
    copies = nbytes / ((n - 1) / n)  # what the k-copy exchange carries before the (n-1)/n of the others
    intra = copies * (g - 1) / n
    eff = COLLECTIVE_EFFICIENCY * 1e9
    rdma = eff
    if tr.dispatcher in LOCAL_DISPATCHERS:
        distinct = nodes * (1 - (1 - 1 / nodes) ** k)  # expected nodes a token's k experts fall in
        inter = copies / k * distinct * (nodes - 1) / nodes
        rdma = DEEPEP_RDMA_EFFICIENCY * 1e9
    else:
        inter = copies * (n - g) / n
    return intra / (cluster.intra_gbps * eff) + inter / (cluster.inter_gbps * rdma)


def estimate_comm(m: ModelSpec, p: ParallelDims, tr: Training, cluster: Cluster) -> CommEstimate:
    comp = DTYPE_BYTES[tr.compute_dtype]
    store = DTYPE_BYTES[tr.storage_dtype]
    gbs = tr.global_batch_size or tr.micro_batch_size * p.dp
    tokens_step = gbs * tr.seq_len
    n_mb, grad_acc = microbatches(p, tr)
    mb_per_step = n_mb * grad_acc
    tok_mb = tr.micro_batch_size * tr.seq_len / p.cp  # local tokens per microbatch
    spr = p.stages_per_rank_of(m.num_layers)
    g = _groups_of(m, p.tp, p.ep, p.pp, spr, p.v_schedule, 0, tp_splits_vocab(m.architecture, tr.hf_class))
    reduce = grad_reduce_bytes(p, store)
    n_layers = g.n_layers
    h = m.hidden_size
    out: dict[str, float] = {}

    # data parallel: parameters gathered in each forward and, once resharded, again in backward; gradients
    # reduce-scattered once per step when the sync is deferred, else after every backward
    if p.strategy == "ddp":
        out["dp"] = _ar(p.dp, (g.dense + g.experts) * store)
    else:
        shard = p.dp_shard * p.cp if p.strategy == "fsdp2" else p.dp * p.cp
        deferred = grad_sync_deferred(p, tr, mb_per_step)
        if deferred and p.pp > 1:  # backward leaves blocks gathered: a forward after it finds them, until the end
            gathers = grad_acc * (n_mb + 1 if p.blocks_reshard else 1)  # ~ one gather per backward, + the first
        else:  # gathered in each forward, and again in backward when the forward resharded them
            gathers = mb_per_step * (2 if p.blocks_reshard else 1)
        if p.strategy != "fsdp2":
            reduces = 1
        elif not deferred:
            reduces = mb_per_step
        elif p.pp > 1 and not holds_across_schedule_steps(p, tr):
            reduces = grad_acc  # torch's stage reduces at each schedule step's last backward
        else:
            reduces = 1  # one reduce-scatter at the optimizer step's last backward
        dense = g.dense
        key = "dp_shard_cp" if p.strategy == "fsdp2" else "dp_cp"
        out[key] = _ag(shard, dense * comp) * gathers + _ag(shard, dense * reduce) * reduces
        if p.strategy == "fsdp2" and p.dp_replicate > 1:
            out["dp_replicate"] = _ar(p.dp_replicate, dense / shard * reduce) * reduces
        if g.experts and p.ep_shard > 1:
            out["ep_shard"] = (
                _ag(p.ep_shard, g.experts * comp) * gathers + _ag(p.ep_shard, g.experts * reduce) * reduces
            )
        if tr.teacher is not None:  # the KD teacher's layers, gathered in each of its forwards (no backward)
            t = _rank_groups(tr.teacher, p, 0)
            out[key] += _ag(shard, t.dense_layers * comp) * mb_per_step
    per_mb_act = tok_mb * h * comp
    recompute = 1 if p.ac_applied is True else 0
    if p.tp > 1:  # two all-reduces per layer forward (attention, MLP) and two in backward
        out["tp"] = _ar(p.tp, per_mb_act) * (4 + 2 * recompute) * n_layers * mb_per_step
        if g.last and g.head_tp > 1:  # (a head TP keeps whole computes whole logits on every rank: no gather)
            out["tp"] += _ag(p.tp, tok_mb * m.vocab_size * comp) * 2 * mb_per_step  # replicated logits
    if p.cp > 1:  # ring passes of K and V: forward once, backward twice (K/V and their gradients)
        kv = 2 * tok_mb * m.num_key_value_heads * m.hd * comp / p.tp
        # Gated DeltaNet layers (Qwen3-Next / Qwen3.5) have no K/V ring: the stage's share of attention layers
        attn_layers = g.kinds.get("attention", 0) if m.is_hybrid else n_layers * m.attention_layers / m.num_layers
        out["cp"] = (p.cp - 1) * kv * (3 + recompute) * attn_layers * mb_per_step
        if g.kinds.get("mamba"):  # MambaContextParallel: all-to-all into head-parallel before the scan and back
            per_layer = _ag(p.cp, tok_mb * m.mamba_in_proj_width * comp) + _ag(p.cp, tok_mb * m.mamba_inner * comp)
            out["cp"] += per_layer * (2 + recompute) * g.kinds["mamba"] * mb_per_step
    if p.pp > 1:
        out["pp"] = 2 * per_mb_act * spr * mb_per_step
    if p.ep > 1 and m.is_moe:
        moe_layers = g.kinds.get("moe", 0)
        routed = tok_mb * max(m.experts_per_token, 1) * m.expert_dim * comp  # (a latent MoE routes latent rows)
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
        if axis == "ep" and cross[axis]:
            times[axis] = _ep_time(m, p, tr, cluster, nbytes)
            continue
        times[axis] = nbytes / (axis_gbps(axis, p, cluster, cross[axis]) * 1e9 * COLLECTIVE_EFFICIENCY)

    world = p.dp * p.cp * p.tp * p.pp
    flops_rank_base = step_flops(m, tr.seq_len, tokens_step, tr.lora) / world
    flops_rank = flops_rank_base
    if m.parallel_mamba and p.tp > 1:
        # every TP rank runs Falcon-H1's whole Mamba mixer (AutoModel's plan leaves it out): (tp - 1) / tp more of its
        # matmuls a rank than the model's FLOPs split evenly (its frozen weights' gradients skipped under LoRA)
        recompute = 2.0 if p.ac_applied is True else 0.0  # (its forward again under full checkpointing)
        per_token = ((6.0 if tr.lora is None else 4.0) + recompute) * m.num_layers * m.mamba_params()
        flops_rank += per_token * tokens_step / world * (p.tp - 1)
    ac = p.ac_applied
    if ac is True:
        flops_rank += forward_flops(m, tr.seq_len, tokens_step) / world  # one more forward
    elif ac == "selective":
        flops_rank *= 1.03  # pointwise ops and attention recomputed
    # the KD teacher's forward: a third of a training step's FLOPs at its size (model FLOPs too)
    teacher_flops = step_flops(tr.teacher, tr.seq_len, tokens_step) / 3 / world if tr.teacher is not None else 0.0
    flops_rank += teacher_flops
    compute = flops_rank / (cluster.gpu.bf16_tflops * 1e12 * MATMUL_EFFICIENCY)
    bubble = 0.0
    if p.pp > 1:
        v = spr
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


__all__ = ["STEP_TIME_ERROR", "Cluster", "CommEstimate", "axis_gbps", "estimate_comm", "forward_flops", "step_flops"]
