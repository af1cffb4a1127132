"""Per-rank memory of a layout: model states, FSDP buffers, activations, logits, overhead (pure).

Model states are exact arithmetic over the model's parameter groups as each strategy shards them
(FSDP2 over dp_shard*cp, HSDP replicas, MegatronFSDP by zero_dp_strategy, DDP replicated; TP splits
matrices, PP assigns layers to stages the way AutoModel splits them, EP splits routed experts with
FSDP over ep_shard). Activations start from Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", per layer ``sbh(34 + 5as/h)`` bytes, /t with SP) and
are fitted to torch's own tracker on our Llama-style block (SDPA flash attention, so no ``s^2``
term; fp32 RMSNorm internals; no dropout), bytes per token per layer:

- no checkpointing: ``c_rep*h + 8h/t + 8I/t + 8d + 4a/t + 8`` with ``c_rep = 16``, or
  ``4 + 12/t`` with sequence parallelism (norms and residuals split, gathered inputs not);
- selective (matmul outputs saved): ``2h(/t with SP) + 2h/t + 4*kv*d/t + 4h + 4I/t``;
- full: the block input, ``2h`` (``/t`` with SP), plus one block recomputed during backward.

Tokens per microbatch are ``b*s/cp``. ``tests/test_estimate.py`` compares the result with
``FSDPMemTracker`` on fake tensors over a matrix of layouts and real model sizes.

Hybrid Mamba models (Nemotron-H: one norm and one mixer per layer, no TP plan in AutoModel) count
each layer's own parameters, and per token half a transformer layer's norm/residual share (``8h``)
plus what its mixer saves: Mamba-2 through AutoModel's fused ``mamba_split_conv1d_scan_combined``
keeps its ``zxbcdt`` input and the scan output (``2*(2*inner + 2*groups*state + heads) + 2*inner``,
``+8*inner`` under CP, where the gated norm and out_proj run outside the kernel); attention
``8h + 8d + 4a + 8``; the relu2 MLP ``6I``; MoE ``6kI + 6kh + 4E + 6S``. These follow the saved
tensors of the kernels AutoModel calls; unlike the transformer terms they are not fitted to the
tracker (the smoke runner's tiny model has no Mamba layer). Activation checkpointing: with
ep_size 1 the class's own FSDP2 policy wraps only its Mamba and MLP blocks (in any mode); with
ep_size > 1 the MoE path wraps every block (``selective`` is counted as not checkpointing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..catalog.models import ModelSpec
from ..dims import ParallelDims
from ..estimation import MemoryBreakdown
from ..layout import stage_ids, stage_layer_counts

GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FRAGMENTATION = 0.08  # allocator fragmentation margin, fraction of the tracked peak
CUDA_CONTEXT_GIB = 1.0  # CUDA context, NCCL/gloo workspaces, kernels (per GPU)


@dataclass(frozen=True)
class Training:
    """What a step does: tokens, precision, optimizer, microbatching."""

    seq_len: int = 4096
    micro_batch_size: int = 1  # sequences per rank per microbatch
    global_batch_size: int | None = None
    storage_dtype: str = "float32"  # parameters, gradients and optimizer states
    compute_dtype: str = "bfloat16"  # FSDP mp_policy param_dtype (activations)
    optimizer: str = "adamw"
    pp_microbatches: int | None = None  # default: 2 * pp
    teacher: ModelSpec | None = None  # a knowledge-distillation teacher resident on the same GPUs

    @property
    def optimizer_states(self) -> int:
        return {"adamw": 2, "adam": 2, "sgd": 1}.get(self.optimizer, 2)


@dataclass
class _Groups:
    """Parameter element counts on one rank, before data-parallel sharding."""

    dense: float = 0.0  # sharded by FSDP over dp_shard*cp
    experts: float = 0.0  # sharded by FSDP over ep_shard
    root: float = 0.0  # embedding / lm_head / final norm (the FSDP root unit)
    embed: float = 0.0
    lm_head: float = 0.0
    n_layers: int = 0  # layers on this rank
    first: bool = False
    last: bool = False
    layer_dense: float = 0.0  # largest layer's non-expert params on this rank
    layer_experts: float = 0.0
    dense_layers: float = 0.0  # all layers' non-expert params on this rank
    kinds: dict[str, int] = field(default_factory=dict)  # layers on this rank per ModelSpec.layer_kind


def _attn_split(m: ModelSpec) -> tuple[float, float]:
    """(TP-sharded, replicated) attention parameters of one layer."""
    total = m.attention_params()
    if m.kv_lora_rank:  # MLA: the low-rank down projections are replicated
        rep = m.hidden_size * (m.q_lora_rank or 0) + m.hidden_size * (m.kv_lora_rank + (m.qk_rope_head_dim or 0))
        return total - rep, rep
    norm = 2 * m.hd if m.qk_norm else 0
    return total - norm, norm


def _kind_params(m: ModelSpec, p: ParallelDims) -> dict[str, tuple[float, float]]:
    """(non-expert, expert) parameters on a rank of one layer of each kind (``ModelSpec.layer_kind``). Without
    EP the routed experts are ordinary block parameters (FSDP shards them with the rest of the block)."""
    experts = (m.num_experts / p.ep) * m.expert_params()

    def moe(base: float) -> tuple[float, float]:
        return (base + experts, 0.0) if p.ep <= 1 else (base, experts)

    if m.is_hybrid:  # one norm + one mixer; AutoModel's class has no TP plan, so nothing is split by tp
        h = m.hidden_size
        return {
            k: (moe(m.moe_nonexpert_params() + h) if k == "moe" else (m.mixer_params(k) + h, 0.0))
            for k in set(m.layer_types)
        }
    attn_sh, attn_rep = _attn_split(m)
    base = attn_sh / p.tp + attn_rep + m.norms_per_layer * m.hidden_size
    dense = (base + m.dense_mlp_params() / p.tp, 0.0)
    return {"dense": dense, "moe": moe(base + m.moe_nonexpert_params()) if m.is_moe else dense}


def _rank_groups(m: ModelSpec, p: ParallelDims, pp_rank: int) -> _Groups:
    """Parameter groups on one pipeline rank (they depend on tp, ep and the stage split only)."""
    return _groups_of(m, p.tp, p.ep, p.pp, p.stages_per_rank, p.v_schedule, pp_rank)


# A 4,096-GPU search asks for the same few splits thousands of times: the memo halves its time (bench_suggest).
@lru_cache(maxsize=4096)
def _groups_of(m: ModelSpec, tp: int, ep: int, pp: int, stages_per_rank: int, v_style: bool, pp_rank: int) -> _Groups:
    p = ParallelDims(tp=tp, ep=ep, pp=pp)  # only what the split depends on
    g = _Groups()
    n_stages = pp * stages_per_rank
    counts = stage_layer_counts(m.num_layers, n_stages) if pp > 1 else [m.num_layers]
    my = stage_ids(pp_rank, p.pp, n_stages, v_style=v_style) if p.pp > 1 else (0,)
    per = _kind_params(m, p)
    for sid in my:
        start = sum(counts[:sid])
        g.n_layers += counts[sid]
        for layer in range(start, start + counts[sid]):
            kind = m.layer_kind(layer)
            g.kinds[kind] = g.kinds.get(kind, 0) + 1
    g.first, g.last = 0 in my, (n_stages - 1) in my
    g.dense_layers = sum(n * per[k][0] for k, n in g.kinds.items())
    g.dense = g.dense_layers
    g.experts = sum(n * per[k][1] for k, n in g.kinds.items())
    g.layer_dense = max((per[k][0] for k in g.kinds), default=0.0)
    g.layer_experts = max((per[k][1] for k in g.kinds), default=0.0)
    if g.first:
        g.embed = m.embedding_params() / p.tp
    if g.last:
        g.lm_head = (m.embedding_params() if m.tie_word_embeddings and p.pp > 1 else m.lm_head_params()) / p.tp
        g.root += m.hidden_size
    g.root += g.embed + g.lm_head
    g.dense += g.root
    return g


def _state_shards(p: ParallelDims) -> tuple[float, float, float, float]:
    """Divisors for (params, grads, optimizer) of dense params, and of expert params."""
    if p.strategy == "ddp":
        return 1.0, 1.0, 1.0, 1.0
    if p.strategy == "megatron_fsdp":
        n = float(p.dp * p.cp)
        z = p.zero_dp_strategy
        return (n if z >= 3 else 1.0), (n if z >= 2 else 1.0), (n if z >= 1 else 1.0), 1.0
    n = float(p.dp_shard * p.cp)
    return n, n, n, float(p.ep_shard)


def _hybrid_act_per_token(m: ModelSpec, p: ParallelDims, kind: str, comp_bytes: int) -> tuple[float, float]:
    """(saved, not-checkpointed) bytes per local token of one hybrid layer (see the module docstring)."""
    h, scale = m.hidden_size, comp_bytes / 2.0
    if kind == "mamba":
        inner = m.mamba_inner
        mixer = 2 * m.mamba_in_proj_width + 2 * inner + 4 * m.mamba_n_groups + (8 * inner if p.cp > 1 else 0)
    elif kind == "attention":
        mixer = _attention_act(m, 1)
    elif kind == "mlp":
        mixer = 6 * m.intermediate_size
    else:
        k = max(m.experts_per_token, 1)
        mixer = 6 * k * m.moe_intermediate_size + 6 * k * h + 4 * m.num_experts + 6 * m.shared_expert_intermediate_size
    plain = (8 * h + mixer) * scale
    if not p.ac_applied:
        return plain, plain
    wrapped = kind in ("mamba", "mlp") if p.ep <= 1 else p.ac_applied is True
    return (2 * h * scale if wrapped else plain), plain


def _attention_act(m: ModelSpec, t: int) -> float:
    """Bytes per token an attention block saves besides its norms and residuals (q/k/v/o inputs and outputs,
    RoPE, the SDPA output and its statistics), fitted with bf16 compute: ``8h/t + 8d + 4a/t + 8``."""
    return 8 * m.hidden_size / t + 8 * m.hd + 4 * m.num_attention_heads / t + 8


def _act_per_token(m: ModelSpec, p: ParallelDims, kind: str, comp_bytes: int) -> tuple[float, float]:
    """(saved bytes per local token of one layer under the AC mode, bytes if not checkpointed)."""
    if m.is_hybrid:
        return _hybrid_act_per_token(m, p, kind, comp_bytes)
    moe = kind == "moe"
    h, t = m.hidden_size, p.tp
    kvd = m.num_key_value_heads * m.hd
    scale = comp_bytes / 2.0  # coefficients were fitted with bf16 compute
    if moe:  # routed tokens: k copies in and out, each expert saves gate/up/act/product
        k = max(m.experts_per_token, 1)
        mlp_plain = (
            8 * k * m.moe_intermediate_size + 6 * k * h + 4 * m.num_experts + 8 * m.shared_expert_intermediate_size
        )
        mlp_sel = (
            4 * k * m.moe_intermediate_size + 4 * k * h + 4 * m.num_experts + 4 * m.shared_expert_intermediate_size
        )
    else:
        mlp_plain, mlp_sel = 8 * m.intermediate_size / t, 4 * m.intermediate_size / t
    rep = (4 + 12 / t) if p.sequence_parallel else 16.0
    plain = (rep * h + _attention_act(m, t) + mlp_plain) * scale
    inp = 2 * h / (t if p.sequence_parallel else 1)
    if p.ac_applied == "selective":
        saved = (inp + 2 * h / t + 4 * kvd / t + 4 * h + mlp_sel) * scale
    elif p.ac_applied:
        saved = inp * scale
    else:
        saved = plain
    return saved, plain


def in_flight_microbatches(p: ParallelDims, n_mb: int, pp_rank: int = 0) -> float:
    """Microbatches whose activations a pipeline rank holds at once, in units of its whole stage set."""
    if p.pp <= 1:
        return 1.0
    sched = p.pp_schedule or "1F1B"
    v = p.stages_per_rank
    if sched in ("GPipe", "LoopedBFS"):
        return float(n_mb)
    if sched == "1F1B":
        return float(min(n_mb, p.pp - pp_rank))
    if sched in ("ZBVZeroBubble", "DualPipeV"):
        return float(min(n_mb, p.pp + (1 if sched == "DualPipeV" else 0)))
    warm = 2 * (p.pp - pp_rank - 1) + (v - 1) * p.pp + 1  # interleaved (Megatron): chunk-microbatches
    return min(n_mb * v, warm) / v


def overhead_bytes(tracked: float) -> float:
    """CUDA context, NCCL workspaces and allocator fragmentation on top of ``tracked`` bytes."""
    return CUDA_CONTEXT_GIB * GIB + FRAGMENTATION * tracked


def microbatches(p: ParallelDims, tr: Training) -> tuple[int, int]:
    """(pipeline microbatches per batch, gradient-accumulation steps) of one optimizer step on a rank; their product
    is the number of backward passes."""
    gbs = tr.global_batch_size or tr.micro_batch_size * p.dp
    if p.pp > 1:
        n_mb = tr.pp_microbatches or 2 * p.pp
        return n_mb, max(1, gbs // (p.dp * tr.micro_batch_size * n_mb))
    return 1, max(1, gbs // (p.dp * tr.micro_batch_size))


def memory_per_rank(m: ModelSpec, p: ParallelDims, tr: Training) -> MemoryBreakdown:
    """Peak memory of the worst rank (over pipeline ranks) for one layout."""
    # The first ranks hold the most in-flight microbatches and the embedding, the last the lm_head and
    # the loss; with V schedules rank 0 holds both ends.
    ranks = sorted({r for r in (0, 1, p.pp - 2, p.pp - 1) if 0 <= r < p.pp})
    worst = max((_memory_of_pp_rank(m, p, tr, r) for r in ranks), key=lambda x: x["total"])
    return MemoryBreakdown(**{k: (v / GIB if isinstance(v, float) else v) for k, v in worst.items()})


def _memory_of_pp_rank(m: ModelSpec, p: ParallelDims, tr: Training, pp_rank: int) -> dict:
    store = DTYPE_BYTES[tr.storage_dtype]
    comp = DTYPE_BYTES[tr.compute_dtype]
    g = _rank_groups(m, p, pp_rank)
    sp_, sg, so, se = _state_shards(p)
    dense, experts = g.dense, g.experts
    params = dense / sp_ * store + experts / se * store
    grads = dense / sg * store + experts / se * store
    optimizer = tr.optimizer_states * (dense / so + experts / se) * store
    tokens = tr.micro_batch_size * tr.seq_len / p.cp
    n_mb, grad_acc = microbatches(p, tr)
    inflight = in_flight_microbatches(p, n_mb, pp_rank)
    saved = 0.0
    recompute = 0.0
    last_block = 0.0  # the largest one block saves (freed by the time its gradients are reduce-scattered)
    for kind, count in g.kinds.items():
        s, plain = _act_per_token(m, p, kind, comp)
        saved += s * count
        last_block = max(last_block, s)
        if p.ac_applied and s < plain:
            recompute = max(recompute, plain)  # one block is re-materialized during backward
    vocab = m.vocab_size
    extra = 0.0
    loss_saved = loss_temp = 0.0
    if g.last:
        extra += 6 * m.hidden_size * comp / 2  # final norm
        loss_saved = 4.0 * vocab * tokens  # fp32 log-softmax kept for backward (lm_head output replicated)
        loss_temp = 2 * 4.0 * vocab * tokens  # its gradient and the upcast's
    acts = (saved + extra) * tokens * inflight + loss_saved
    # FSDP: the root unit (embedding, lm_head, norm) and the last block stay unsharded through forward;
    # blocks that do not reshard after forward (all of them under PP, by AutoModel's default) stay too,
    # and so do the experts with moe.reshard_after_forward false (AutoModel's default).
    sharded = p.strategy != "ddp" and not (p.strategy == "megatron_fsdp" and p.zero_dp_strategy < 3)
    deferred = sharded and p.deferred_sync(n_mb * grad_acc)
    # Under PP a deferred backward leaves its blocks gathered (reshard_after_backward false) until their next forward.
    keep_blocks = not p.blocks_reshard or (deferred and p.pp > 1)
    unsharded = (g.root + (g.dense_layers if keep_blocks else g.layer_dense)) * comp if sharded else 0.0
    if sharded and g.experts and p.ep_shard > 1:
        unsharded += (g.experts if keep_blocks else g.layer_experts) * comp
    # Deferred sync: every FSDP-managed gradient on this rank, unsharded and fp32 (the reduce dtype), held from the
    # first backward of a step to the last one's reduce-scatter.
    held_grads = (g.dense + (g.experts if p.ep_shard > 1 else 0.0)) * 4.0 if deferred else 0.0
    p2p = 2 * tokens * m.hidden_size * comp * 2 if p.pp > 1 else 0.0
    start_bw = unsharded + acts + loss_temp + recompute * tokens + p2p + held_grads
    # At the end of the last block's backward (the loss temporaries and that block's activations are gone):
    # its unsharded gradients in the compute dtype and their fp32 copy for the reduce-scatter, plus the next
    # block's prefetched all-gather (experts stay gathered unless moe.reshard_after_forward), while every
    # other activation is still saved. It dominates when one block holds many parameters (MoE without EP:
    # FSDP gathers all of a layer's experts).
    mid_bw = 0.0
    if sharded:
        gather = 0.0 if keep_blocks else comp
        exp = g.layer_experts if p.ep_shard > 1 else 0.0
        grads_now = (g.layer_dense + exp) * (comp + 4.0 + gather)
        mid_bw = unsharded + acts - last_block * tokens + recompute * tokens + p2p + grads_now + held_grads
    # End of backward: layer grads are sharded, the root's unsharded grads (reduce dtype, fp32) and the
    # embedding backward's temporaries are alive before the root's reduce-scatter.
    if sharded:
        layer_grads = (dense - g.root) / sg * store + experts / se * store
        end_bw = layer_grads + g.lm_head * 4.0 + 2 * g.embed * 4.0 + held_grads
    else:
        end_bw = grads
    teacher = _teacher_bytes(tr, p, pp_rank, tokens, sp_, se)
    tracked_states = params + optimizer + teacher
    phase, transient = "start-of-backward", start_bw
    if mid_bw > transient:
        phase, transient = "in-backward", mid_bw
    if end_bw > transient:
        phase, transient = "end-of-backward", end_bw
    tracked = tracked_states + transient
    overhead = overhead_bytes(tracked)
    buffers = transient - grads if phase == "end-of-backward" else transient - acts
    activations = 0.0 if phase == "end-of-backward" else acts
    total = tracked + overhead
    return dict(
        params=float(params),
        grads=float(grads),
        optimizer=float(optimizer),
        activations=float(activations),
        buffers=float(max(buffers, 0.0)),
        overhead=float(overhead),
        total=float(total),
        model_states=float(params + grads + optimizer),
        tracked_peak=float(tracked),
        worst_pp_rank=pp_rank,
        peak_phase=phase,
        deferred_grads=float(held_grads),
        teacher=float(teacher),
    )


def _teacher_bytes(tr: Training, p: ParallelDims, pp_rank: int, tokens: float, sp_: float, se: float) -> float:
    """The KD teacher on a student rank. AutoModel builds it with the student's distributed setup (kd.py), so its
    weights are sharded (and pipeline-split) as the student's, in the compute dtype, with no gradients or
    optimizer states. Its forward runs without gradients and FSDP2 reshards a unit after forward only when told
    to: the layers reshard, but the root unit (AutoModel: reshard_after_forward False) and the output embedding
    (its own unit, kept gathered) stay gathered from the teacher's first forward on, since no backward ever
    reshards them (``tests/test_estimate.py`` checks this on torch). The last stage also keeps the teacher's fp32
    probabilities for the KD loss's backward."""
    t = tr.teacher
    if t is None:
        return 0.0
    g = _rank_groups(t, p, pp_rank)
    comp = DTYPE_BYTES[tr.compute_dtype]
    weights = (g.dense / sp_ + g.experts / se) * comp
    sharded = p.strategy != "ddp" and not (p.strategy == "megatron_fsdp" and p.zero_dp_strategy < 3)
    # the input embedding is its own unit that reshards after forward (without PP) unless it shares the head
    gathered = (g.root - (g.embed if p.pp == 1 and not t.tie_word_embeddings else 0.0)) * comp if sharded else 0.0
    probabilities = 4.0 * t.vocab_size * tokens if g.last else 0.0
    return weights + gathered + probabilities


def activation_formula_korthikanti(
    s: int, b: int, h: int, a: int, t: int = 1, *, sp: bool = False, recompute: str = "none"
) -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes of one transformer layer (16-bit)."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    attn = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return s * b * h / t * (34 + attn)
    if t > 1:
        return s * b * h * (10 + 24 / t + attn / t)
    return s * b * h * (34 + attn)


__all__ = [
    "Training",
    "MemoryBreakdown",
    "memory_per_rank",
    "in_flight_microbatches",
    "activation_formula_korthikanti",
    "GIB",
]
