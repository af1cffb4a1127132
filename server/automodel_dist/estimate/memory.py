"""Per-rank memory of a layout: model states, FSDP buffers, activations, the loss, overhead (pure).

Model states are exact arithmetic over the model's parameter groups as each strategy shards them
(FSDP2 over dp_shard*cp, HSDP replicas, MegatronFSDP by zero_dp_strategy, DDP replicated; TP splits
matrices, PP assigns layers to stages the way AutoModel splits them, EP splits routed experts with
FSDP over ep_shard), for what the recipe trains: every parameter, or LoRA adapters on a frozen base
(held in the compute dtype, or 4/8-bit under QLoRA), with the optimizer's own states (torch Adam/AdamW:
two states in the parameter dtype; Transformer Engine's FusedAdam: fp32 moments, optional fp32 master
weights; SGD and Muon: one buffer).

Activations are what AutoModel's own classes save, read from its code run on fake tensors (the dry run;
``tests/oracle/test_calibration.py`` compares the two per category on a matrix of layouts). Per token of one
decoder layer, bf16, with h the hidden size, q the query width (heads x head_dim), kv the key/value
width, I the MLP width, a the heads and t the TP size:

- no checkpointing: the norms' and residuals' ``8h`` (the layer input, both norm outputs, the
  residual; ``4h/t + 4h`` with sequence parallelism, whose norm outputs are gathered for the next
  matmul), the query and the attention output ``4q/t``, keys and values ``4kv/t``, SDPA's log-sum-exp
  ``4a/t`` and a gated MLP's ``8I/t`` (gate, up, their activation and product);
- a Hugging Face class (catalog/kernels.py): under Liger Kernel, AutoModel's default without TP or CP, the
  same norms and a ``6I`` MLP (Liger recomputes the activation); without it each norm keeps an fp32 copy
  of its input and the normalised tensor (``16h`` for a Llama-style layer's two, ``36h`` for Gemma-2's
  four with their fp32 scaling); Phi-3's fused qkv keeps the whole projection and a copy of the attention
  output (``+4q + 2kv``), and AutoModel's Phi-3 TP plan splits neither attention nor the MLP;
- MoE: per routed copy (k per token) the permuted input, gate and up and the down GEMM's input,
  ``6kI + 2kh``, the router's fp32 logits ``4E`` and the shared experts as a dense MLP; ``+2kh`` when the
  routing weights multiply after the down projection (GLM-4.5), ``+4kh`` for experts with a bias (gpt-oss) on
  at most 12,288 routed rows (more are chunked), ``+2*ep*h`` with ``backend.experts: torch`` under EP (one
  expert at a time on the EP group's all-gathered tokens, which each expert's gather keeps); frozen experts (LoRA
  elsewhere) keep only the activation's input, ``4kI``;
- eager attention (``model.attn_implementation: eager`` where AutoModel runs it): per head and key the fp32 softmax
  and its bf16 copy, ``6a*s/t`` (``8a*s/t`` with Gemma-2's softcap tanh), keys and values repeated to every query head
  in place of the kernel's own and its log-sum-exp; a Hugging Face norm keeps its normalised tensor only for a
  trained weight (not under LoRA), and Gemma-3's q/k norms scale in fp32 like its layer norms;
- MLA: queries and keys (nope + rope, each a cat), kv_b_proj's whole output (the values are its view),
  the attention output and log-sum-exp, and each latent norm's input and output;
- LoRA with dropout: a one-byte mask of each adapted Linear's output (``dropout_position: post``);
- ``activation_checkpointing: true`` on AutoModel's dense classes: each sub-module is checkpointed
  (attention, MLP, both norms), keeping their inputs, ``8h`` (``8h/t`` with SP); on a Hugging Face
  class the whole layer (its input, ``2h``); on the MoE path the whole block, which keeps its input and
  the router's top-k: ``2h + 2E + 12k`` for k experts per token of E (the token exchange is recomputed);
- ``selective``: TorchTitan's policy over the whole layer, every other matmul's output and SDPA's:
  ``2h + 2q/t + 2kv/t + 2q/t + 4a/t + 2I/t + 2h``;
- one checkpointed layer is recomputed at a time during backward.

The last stage adds the final norm's ``4h`` and the loss: masked cross entropy keeps fp32 log-
probabilities of the full vocabulary (4 bytes per logit, gathered under TP) and makes two fp32 copies
of that size at the start of backward; without ``fp32_upcast`` 2 and 4; the fused linear cross entropy
materialises no logits; the chunked one a 512-token chunk and fp32 and bf16 weight gradients. Gemma-2's
final logit softcap keeps one more copy of the logits (its tanh's output).

Hybrid Mamba models (Nemotron-H: one norm and one mixer per layer, no TP plan in AutoModel) count
each layer's own parameters, and per token the norm's input and output (``4h``) plus what its mixer
saves: Mamba-2 through AutoModel's fused ``mamba_split_conv1d_scan_combined`` keeps its ``zxbcdt``
input, the scan output and the gated norm's fp32 rstd (``2*(2*inner + 2*groups*state + heads) +
2*inner + 4*groups``, ``+8*inner`` under CP, where the gated norm and out_proj run outside the
kernel); attention ``4q + 4kv + 4a``; the relu2 MLP ``4I``; MoE ``2kh + 4kI`` with trained experts
(``2kI`` frozen), ``4S`` for the shared expert, ``4E`` and, where the fp32 gate trains, ``4h``
(``_hybrid_act_per_token``: AutoModel's step on fake tensors, layer kind by layer kind). Activation
checkpointing: with ep_size 1 the class's own FSDP2 policy wraps only its Mamba and MLP blocks (in
any mode); with ep_size > 1 the MoE path wraps every block (``selective`` is counted as not checkpointing).

Four moments compete for the peak: the start of backward (every activation, the gathered units and
the loss temporaries; gradients were freed by the last step's zero_grad, except an earlier accumulation
step's when FSDP does not defer their sync, and on one rank), inside a block's backward (with the torch
dispatcher's all-gathered tokens of the EP group, and routed experts' plain gradients where FSDP leaves
them out), its end (sharded gradients and the root's unsharded fp32 gradients) and the optimizer step
(every gradient, the states, torch's foreach temporaries). With deferred sync a single-stage pipeline rank adds
a fifth, the end of a stage's backward, when every block it resharded in forward is gathered again and kept
(torch's stage runs its backwards with reshard_after_backward off), and a multi-stage rank is counted with the
three stages whole its schedule's UNSHARD / RESHARD hold at most. Where the lm_head is its own FSDP unit, its
forward is one more (FSDP2 keeps its all-gather output to the root's post-forward, beside the logits); under the MoE
sync mixin, so is a microbatch's late backward beside every unit gathered again. Under PP every stage also keeps a
receive buffer per microbatch for its input and its output gradient from its first step on
(``tests/support/pp_defer_worker.py`` runs these facts on torch's own Schedule1F1B and ScheduleInterleaved1F1B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..catalog.implementations import implementation
from ..catalog.kernels import (
    DSA_THD_BACKENDS,
    EAGER_UNLESS_TE,
    FP32_NORM_CLASSES,
    FP32_NORM_DECODERS,
    HF_LAYER_CLASSES,
    LOCAL_DISPATCHERS,
    OUTPUT_GATE_PROJ,
    OWN_MLA_ATTENTION,
    TRANSFORMERS_DECODER_LAYERS,
    HFLayer,
    flash_attn_dq_accum_rows,
    flash_attn_head_dim_rounded,
    hf_layer,
    hf_text_layer,
    ignores_sequence_parallel,
    liger_applies,
    mtp_calls_embedding,
    runs_eager_attention,
    takes_blockdiag_cp,
    tp_splits_vocab,
)
from ..catalog.models import ModelSpec
from ..dims import ParallelDims
from ..layout import stage_ids, stage_layer_counts
from ..media import is_gemma4_tower
from .peft import QLORA_BYTES, Lora, down_adapted, lora_trains, quantized_linear_weights
from .report import MemoryBreakdown

GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FRAGMENTATION = 0.08  # allocator fragmentation margin, fraction of the tracked peak
CUDA_CONTEXT_GIB = 1.0  # CUDA context, NCCL/gloo workspaces, kernels (per GPU)
# moe/experts.py _BIAS_CHUNK_THRESHOLD: above this many routed rows the experts' bias is added in chunks, keeping
# no fp32 expanded bias for backward
EXPERT_BIAS_CHUNK_ROWS = 12288
CHUNKED_CE_TOKENS = 512  # ChunkedCrossEntropy's chunk_len default (components/loss/loss.py)
# The loss's bytes per logit (tokens x vocab): (kept from forward to backward, alive at the start of backward).
LOSS_BYTES = {
    ("MaskedCrossEntropy", True): (4.0, 8.0),
    ("MaskedCrossEntropy", False): (2.0, 4.0),
    ("TEParallelCrossEntropy", True): (2.0, 0.0),  # vocab-sharded logits, the gradient written in place
    ("FusedLinearCrossEntropy", True): (0.0, 0.0),
    ("ChunkedCrossEntropy", True): (0.0, 0.0),
}


@dataclass(frozen=True)
class Optimizer:
    """Bytes per trainable parameter an optimizer keeps (states, fp32 master copy) and makes in its step."""

    name: str = "adamw"  # adamw | adam | sgd | sgd_momentum | te_fused_adam | muon
    states: float | None = None  # None: the name's default in the parameters' dtype
    master: float = 0.0
    foreach: bool = True  # torch's multi-tensor step (AutoModel turns it off under TP, unless the recipe sets it)
    foreach_given: bool = False  # the recipe's own foreach: true, which AutoModel's factory path keeps under TP too

    def state_bytes(self, param_bytes: int) -> float:
        if self.states is not None:
            return self.states
        name = self.name
        if name == "sgd":
            return 0.0
        if name == "te_fused_adam":
            return 8.0
        return (1.0 if name in ("sgd_momentum", "muon") else 2.0) * param_bytes

    def step_bytes(self, param_bytes: int, tp: int) -> float:
        """torch Adam/AdamW's foreach step makes one copy of a state (its sqrt) for the whole group."""
        if self.name in ("adamw", "adam") and self.foreach and (tp == 1 or self.foreach_given):
            return float(param_bytes)
        return 0.0


@dataclass(frozen=True)
class Training:
    """What a step does: tokens, precision, what trains, the loss, the optimizer, microbatching."""

    seq_len: int = 4096
    micro_batch_size: int = 1  # sequences per rank per microbatch
    global_batch_size: int | None = None
    storage_dtype: str = "bfloat16"  # trainable parameters, their gradients (model.torch_dtype)
    compute_dtype: str = "bfloat16"  # FSDP mp_policy param_dtype (activations, gathered parameters)
    optimizer: Optimizer = Optimizer()
    pp_microbatches: int | None = None  # default: 2 * pp
    teacher: ModelSpec | None = None  # a knowledge-distillation teacher resident on the same GPUs
    lora: Lora | None = None  # adapters on a frozen base
    loss: str = "MaskedCrossEntropy"
    fp32_upcast: bool = True
    loss_gathers_head: bool = False  # the linear CE gathers a TP-split head whole first (Gemma-4's TP loss)
    # megatron-fsdp's root backward hook gets no gradient under this loss and step (rules/fallbacks.py
    # megatron_root_hook_unfired): its root post-backward never runs
    megatron_root_unfired: bool = False
    hf_class: bool = False  # AutoModel builds the Hugging Face class (force_hf, or no class of its own)
    # model.backend.enable_fsdp_optimizations on AutoModel's own MoE class (its MoEFSDPSyncMixin): without PP every
    # backward but a step's last leaves its FSDP units gathered (reshard_after_backward off, moe/fsdp_mixin.py)
    fsdp_sync_mixin: bool = False
    # AutoModel's class mixes in MoEFSDPSyncMixin (the capability table's moe_sync_mixin), enabled or not
    moe_sync_class: bool = False
    liger: bool = True  # model.use_liger_kernel: AutoModel patches a Hugging Face class with Liger (not under TP/CP)
    attn_implementation: str | None = None  # model.attn_implementation (catalog/kernels.runs_eager_attention)
    attn_backend: str | None = None  # model.backend.attn (AutoModel's own classes; catalog/kernels.EAGER_UNLESS_TE)
    packed: bool = False  # packed sequences (AutoModel then picks a flash kernel for a Hugging Face class)
    packed_vlm: bool = False  # the VLM step packs its samples (catalog/kernels.takes_blockdiag_cp under CP)
    compile: bool = False  # distributed.enable_compile (attention and MLP checkpointed apart from the norms)
    experts: str | None = None  # model.backend.experts: torch (one expert at a time) or a grouped GEMM
    dispatcher: str | None = None  # model.backend.dispatcher (catalog/kernels.LOCAL_DISPATCHERS, or the torch path)
    train_towers: bool = False  # a VLM's vision tower trains (freeze_config: workload.Workload.train_towers)
    train_audio: bool = False  # and its audio tower
    train_projector: bool = False  # and a frozen vision tower's projector where it is trainable (ModelSpec)
    # distributed.multimodal.frozen_sharding in a VLM step (distributed/multimodal_fsdp.py): "root" (AutoModel's
    # default) leaves a frozen tower to the root FSDP unit, gathered with it from the forward's start to the
    # backward's end; "replicate" keeps it out of FSDP, whole on every rank; "per_layer" shards it layer by layer;
    # None: not counted (a text step)
    frozen_multimodal: str | None = None
    # the VLM recipe's step: the model output (the logits) kept through backward, and each sequence's image patches
    # through the vision tower (media.py's assumed image): what a trained tower keeps per patch and block
    vlm_step: bool = False
    tower_images: int = 0  # images a sequence carries
    tower_patches: int = 0  # patches a sequence's images make
    tower_layers: int = 0
    tower_hidden: int = 0
    tower_block_elems: int = 0  # what one trained block keeps for backward per patch, in elements
    tower_frame_sharded: bool = False  # frame sharding active: whole images dealt out over the CP ranks


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
    towers: float = 0.0  # a VLM's vision tower (on the first stage)
    mtp: float = 0.0  # AutoModel's multi-token-prediction layers (on the last stage)
    audio: float = 0.0  # and its audio tower
    head_tp: int = 1  # the TP ranks the lm_head (and so the logits and their gradients) is split over
    fp32: float = 0.0  # of dense, the parameters kept in fp32 whatever the dtype (DeepSeek-V4's), before sharding
    fp32_head: float = 0.0  # of those, the lm_head's and the head's (gathered with the root)


def _attn_split(m: ModelSpec) -> tuple[float, float]:
    """(TP-sharded, replicated) attention parameters of one layer."""
    total = m.mean_attention_params()
    if m.kv_lora_rank:  # MLA: the low-rank down projections are replicated
        rep = m.hidden_size * (m.q_lora_rank or 0) + m.hidden_size * (m.kv_lora_rank + (m.qk_rope_head_dim or 0))
        return total - rep, rep
    norm = m.qk_norm_params()
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
    # (Gemma-4's per-layer input gate and projection are replicated under TP, its double-wide MLPs averaged in; so is
    # Falcon-H1's Mamba-2 mixer, which AutoModel's TP plan leaves out)
    base = attn_sh / p.tp + attn_rep + m.norms_per_layer * m.norm_params + m.ple_layer_params()
    base += m.mamba_params() if m.parallel_mamba else 0
    base += 2 * m.hc_params()  # DeepSeek-V4's two hyper-connections a layer (replicated under TP)
    dense = (base + m.mean_dense_mlp_params() / p.tp, 0.0)
    return {"dense": dense, "moe": moe(base + m.moe_nonexpert_params()) if m.is_moe else dense}


def _rank_groups(m: ModelSpec, p: ParallelDims, pp_rank: int) -> _Groups:
    """Parameter groups on one pipeline rank (they depend on tp, ep and the stage split only)."""
    return _groups_of(m, p.tp, p.ep, p.pp, p.stages_per_rank_of(m.num_layers), p.v_schedule, pp_rank)


# A 4,096-GPU search asks for the same few splits thousands of times: the memo halves its time (bench_suggest).
@lru_cache(maxsize=4096)
def _groups_of(
    m: ModelSpec,
    tp: int,
    ep: int,
    pp: int,
    stages_per_rank: int,
    v_style: bool,
    pp_rank: int,
    vocab_split: tuple[bool, bool] = (True, True),
) -> _Groups:
    """``vocab_split``: whether TP splits the embedding and the lm_head (catalog.kernels.tp_splits_vocab)."""
    p = ParallelDims(tp=tp, ep=ep, pp=pp)  # only what the split depends on
    embed_tp, head_tp = (tp if split else 1 for split in vocab_split)
    g = _Groups(head_tp=head_tp)
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
            g.fp32 += m.fp32_layer_params(m.attention_kind(layer))
    g.first, g.last = 0 in my, (n_stages - 1) in my
    g.dense_layers = sum(n * per[k][0] for k, n in g.kinds.items())
    g.dense = g.dense_layers
    g.experts = sum(n * per[k][1] for k, n in g.kinds.items())
    g.layer_dense = max((per[k][0] for k in g.kinds), default=0.0)
    g.layer_experts = max((per[k][1] for k in g.kinds), default=0.0)
    if g.first:
        g.embed = m.embedding_params() / embed_tp
        g.towers, g.audio = float(m.vision_params), float(m.audio_params)
        if m.per_layer_input:
            # Gemma-4's per-layer embeddings sit in the FSDP root with the embedding (gathered from the forward's start
            # to the backward's end): the table split by vocabulary under TP, its projection and norm replicated
            table = m.ple_table_params()
            g.root += table / p.tp + (m.ple_params() - table)
    if g.last:
        g.lm_head = (m.embedding_params() if m.tie_word_embeddings and p.pp > 1 else m.lm_head_params()) / head_tp
        g.root += m.hidden_size
        # the multi-token-prediction layers after the last decoder layer (not TP-split); a hybrid's MTP MoE sublayers'
        # routed experts go with the backbone's (EP-split, outside the blocks' FSDP units under EP)
        mtp_experts = float(m.mtp_expert_params())
        g.mtp = float(m.mtp_params())
        if p.ep > 1 and mtp_experts:
            g.mtp -= mtp_experts
            g.experts += mtp_experts / p.ep
        g.dense += g.mtp
        g.fp32_head = m.fp32_head_params() / head_tp
        g.fp32 += g.fp32_head
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


def _routed_expert_bytes(m: ModelSpec, trained: bool) -> float:
    """Bytes per token AutoModel's grouped experts keep for the token's k routed copies: where the experts train, the
    permuted input the first GEMM keeps, the activation's input (gate and up; up alone for an ungated MLP such as
    Nemotron-H's relu2) and its output (the down GEMM's input); frozen under LoRA elsewhere, their GEMMs keep no input
    (no weight gradient) and only the activation's input stays (AutoModel's step on fake tensors: GPT-OSS's single-GPU
    LoRA recipe, Nemotron-3-Nano's)."""
    k = max(m.experts_per_token, 1)
    ki = k * m.moe_intermediate_size
    act_in = (4 if m.gated_mlp else 2) * ki
    return 2 * k * m.expert_dim + act_in + 2 * ki if trained else act_in


LINEAR_CE = ("FusedLinearCrossEntropy", "ChunkedCrossEntropy")


def head_gathers_in_forward(
    m: ModelSpec, p: ParallelDims, tr: Training, g: _Groups, lora: Lora | None, sharded: bool
) -> bool:
    """Whether this rank's lm_head is an FSDP2 unit of its own, gathered at its forward (with everything a microbatch
    keeps already made), rather than in the root unit gathered at the forward's start. With ep_size > 1 AutoModel
    takes its MoE parallelizer (distributed/model_parallelizer.py), whose apply_fsdp shards any untied head on its own;
    else the dense one, which shards only a trainable untied head so (parallelizer.py
    _fully_shard_untied_input_output_embeddings: a frozen head stays in the root). A pipeline's last stage holds no
    embedding, so its head is untied; there the stage returns hidden states to a linear cross entropy, which takes the
    head's weight outside its forward (without PP the model still runs the head, on each sequence's last token). FSDP
    gathers nothing over a shard group of one rank."""
    if not (sharded and p.strategy == "fsdp2" and g.last and g.lm_head):
        return False
    if _state_shards(p)[0] < 2 or (p.pp > 1 and tr.loss in LINEAR_CE):  # (FSDP2's shard group: dp_shard x cp)
        return False
    if m.tie_word_embeddings and p.pp == 1:
        return False
    return p.ep > 1 or lora is None or "lm_head" in lora.adapted


def moe_forward_bytes(m: ModelSpec, tr: Training) -> float:
    """Bytes per local token one MoE layer's routed experts hold at once in forward, beyond what they save: per routed
    copy (k a token) the permuted input and the down projection's output (the experts' width), the up projection's
    output and the activation's two outputs (ReLU and its square, or the gate's activation and the product); where
    AutoModel's experts run a torch.compile'd activation (``fused_expert_activation``) its one fused kernel writes its
    output alone (AutoModel's Nemotron-3 Super MoE layer on fake tensors, the activation eager: 3.5 GiB at 8,192
    tokens, within 5%)."""
    if not m.is_moe:
        return 0.0
    k, i = max(m.experts_per_token, 1), m.moe_intermediate_size
    up = 2 * i if m.gated_mlp else i
    act = 2 * i if m.fused_expert_activation and not tr.hf_class else 4 * i
    return k * (4 * m.expert_dim + 2 * up + act)


def _torch_loop_bytes(m: ModelSpec, p: ParallelDims, tr: Training) -> float:
    """Bytes a local token one MoE layer of AutoModel's keeps beside its grouped path under ``backend.experts: torch``
    with EP: the per-expert loop (moe/experts.py _forward_loop) runs on the whole EP group's tokens, all-gathered
    (_gather_ep_inputs), and each expert's x.gather keeps that gathered input for its backward: 2 bytes a hidden
    element of ep tokens, whatever the top-k. The dry run, experts torch against torch_mm: the corpus's Moonlight
    recipe (EP 8) 6.51 GiB more at k 6 and k 3 alike, 9.76 at hidden 3072 in place of 2048, on 8,192 tokens and 26 MoE
    layers (16h a token a layer); tests/integration/test_dry_run.py holds a Qwen3-MoE's, a toy DeepSeek-V4's and
    Nemotron-3-Nano's MoE layers to it within 1%. A Hugging Face class's experts run transformers' own code."""
    return 2.0 * p.ep * m.hidden_size if not tr.hf_class and tr.experts == "torch" and p.ep > 1 else 0.0


def _hybrid_act_per_token(
    m: ModelSpec, p: ParallelDims, tr: Training, kind: str, comp_bytes: int
) -> tuple[float, float]:
    """(saved, not-checkpointed) bytes per local token of one hybrid layer (see the module docstring). AutoModel's
    Nemotron-H step on fake tensors (the dry run, with its mamba_ssm stand-in), layer by layer: Nemotron-3-Nano's
    Mamba, MoE and attention layers (full fine-tuning at 2,048 tokens, LoRA at 4,096) and Nemotron-H-8B's Mamba and MLP
    layers (full fine-tuning at 4,096; its first four layers match to the byte): every kind keeps its norm's input and
    output (``4h``) and
    - Mamba-2: what the fused kernel keeps (in_proj's output, the scan's output, the gated norm's fp32 rstd per
      group), ``+8*inner`` under CP, where the gated norm and out_proj run outside the kernel;
    - attention: q, k, v, the output and its fp32 log-sum-exp (``4q + 4kv + 4a``);
    - relu2 MLP: the up projection's and the activation's outputs;
    - MoE: per routed copy (k a token) the permuted input and the activation's input and output where the experts
      train, only the activation's input where they are frozen; the shared expert's up and activation outputs; the
      router's fp32 logits, and its fp32 input where the gate trains (Nemotron-H's gate runs in fp32)."""
    h, scale = m.hidden_size, comp_bytes / 2.0
    act_in = 4 if m.gated_mlp else 2  # bytes a token of intermediate width the activation keeps (gate and up: 4)
    trained = tr.lora is None
    # transformers' class (force_hf): its python RMSNorm keeps an fp32 copy of the block's input (and, where its
    # weight trains, the fp32 normalised input: NemotronHRMSNorm multiplies by the weight in fp32) (AutoModel's step
    # on fake tensors, Nemotron-Nano-9B-v2 layer by layer, under LoRA)
    norm = 4 * h + ((2 * h + (4 * h if trained else 0)) if tr.hf_class else 0)
    if kind == "mamba" and tr.hf_class:
        # transformers' mixer trains with its cache on: causal_conv1d, mamba_ssm's chunk scan and its own gated norm
        # apart (stack/mamba_ssd.py): in_proj's whole output (the conv's input and dt are views of it), the conv's
        # output (the scan's x, B and C), the scan's output and fp32 dA cumsum, and the gated norm's fp32 input, gate,
        # SiLU(gate) and
        # their product; the normalised output where the norm's weight trains, out_proj's input where it trains
        inner = m.mamba_inner
        mixer = 2 * m.mamba_in_proj_width + 2 * m.mamba_conv_dim + 2 * inner + 16 * inner + 4 * m.mamba_num_heads
        mixer += (2 * inner if trained else 0) + (2 * inner if lora_trains(tr.lora, "out_proj") else 0)
    elif kind == "mamba":
        inner = m.mamba_inner
        mixer = 2 * m.mamba_in_proj_width + 2 * inner + 4 * m.mamba_n_groups + (8 * inner if p.cp > 1 else 0)
    elif kind == "attention":
        q, kv = m.num_attention_heads * m.hd, m.num_key_value_heads * m.hd
        mixer = 4 * q + 4 * kv + 4 * m.num_attention_heads
    elif kind == "mlp":
        mixer = (act_in + 2) * m.intermediate_size
    else:
        routed = _routed_expert_bytes(m, tr.lora is None or bool(tr.lora.experts(kind)))
        gate = 4 * m.num_experts + (4 * h if tr.lora is None else 0)
        mixer = routed + (act_in + 2) * m.shared_expert_intermediate_size + gate
        mixer += _torch_loop_bytes(m, p, tr)
    plain = (norm + mixer) * scale
    if not p.ac_applied:
        return plain, plain
    wrapped = kind in ("mamba", "mlp") if p.ep <= 1 else p.ac_applied is True
    return (2 * h * scale if wrapped else plain), plain


# AutoModel's classes built with apply_router_weight_after_down=True (their MoEConfig): the fp32 product of the
# routing weights and the experts' k outputs per token keeps those outputs for backward (moe/experts.py)
_ROUTER_AFTER_DOWN = frozenset(
    {
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm5NextForConditionalGeneration",
        "KimiK3ForCausalLM",
        "KimiK3ForConditionalGeneration",
        "KimiLinear48BForCausalLM",
    }
)
# Phi-3 (Hugging Face's class, AutoModel's TP plan):
# - AutoModel's TP plan (optimized_tp_plans._parallelize_phi3: "fused attention cannot be sharded") makes the fused
#   qkv_proj row-parallel with a replicated output, so every rank computes every head, and chunks the column-parallel
#   gate_up_proj's sharded output, which DTensor gathers first: attention and the MLP keep what they keep at tp 1, and
#   the plan has no sequence-parallel entries (AutoModel's step on fake tensors: Phi-4 keeps more per layer at tp 2
#   than at tp 1);
# - its fused qkv_proj: keys and values are views of the one projection, so its whole output stays alive for
#   backward, and the attention output is copied for o_proj (Phi3Attention, measured as above).
_PHI3 = frozenset({"Phi3ForCausalLM"})


def _liger(m: ModelSpec, p: ParallelDims, tr: Training) -> HFLayer | None:
    """The layer as Liger Kernel patches it, where AutoModel runs it through Liger (catalog/kernels.py), else None."""
    row = hf_layer(m.architecture) if tr.hf_class else None
    return row if row is not None and liger_applies(tr.liger, p.tp, p.cp) else None


def hf_norms(m: ModelSpec, tr: Training) -> bool:
    """Whether the layers' norms are transformers' (a Hugging Face class, or AutoModel's subclass of one), not
    AutoModel's own."""
    return (tr.hf_class or m.architecture in HF_LAYER_CLASSES) and not m.kv_lora_rank


def _norm_bytes(m: ModelSpec, p: ParallelDims, tr: Training, liger: HFLayer | None, sp: bool) -> float:
    """Bf16-equivalent bytes per token a layer's norms keep, with the two norm outputs the attention and MLP
    projections keep (gathered under SP).

    AutoModel's own classes keep each norm's bf16 input: with the outputs, ``8h`` (``4h/t + 4h`` under SP). A Hugging
    Face class keeps the same under Liger; without it each norm keeps an fp32 copy of its input and the normalised
    tensor (bf16, or fp32 for Gemma's norms): ``6h`` or ``8h`` per norm, and Gemma-2/3 have four norms a layer."""
    h, t = m.hidden_size, p.tp
    if not hf_norms(m, tr):
        return 4 * h / t + 4 * h if sp else 8 * h
    row = hf_text_layer(m.architecture)
    fp32 = (row is not None and row.fp32_norm) or m.architecture in FP32_NORM_CLASSES
    # the normalised tensor is kept for the norm weight's gradient: not where the weight is frozen (LoRA), except by
    # a LayerNorm, whose kernel keeps its input and statistics either way
    normalised = (4 * h if fp32 else 2 * h) if tr.lora is None or m.norm_bias else 0.0
    per_norm = 2 * h if liger is not None else 4 * h + normalised
    return m.norms_per_layer * per_norm / (t if sp else 1) + 4 * h


def output_gate_bytes(m: ModelSpec) -> float:
    """Bytes per token an attention output gate keeps (whole, before TP): Qwen3-Next's and Qwen3.5's q_proj gate half,
    its sigmoid and the gated output (6 a query element); a gate of its own projection (OUTPUT_GATE_PROJ) the sigmoid's
    output and the gated product (4)."""
    if not m.attn_output_gate:
        return 0.0
    return (4 if m.architecture in OUTPUT_GATE_PROJ else 6) * m.num_attention_heads * m.hd


def fp32_norm_bytes(m: ModelSpec, tr: Training) -> float:
    """Bytes per token one fp32 RMSNorm of AutoModel's own classes keeps for backward (FP32_NORM_DECODERS): its fp32
    copy of the input, and its fp32 normalised input where its weight trains (not under LoRA, which freezes it)."""
    return (4 + (4 if tr.lora is None else 0)) * m.hidden_size


def unwrapped_norm_bytes(m: ModelSpec, tr: Training) -> float:
    """Bytes per token a layer's fp32 norms outside AutoModel's sub-module checkpoint wrappers keep."""
    return FP32_NORM_DECODERS.get(m.architecture or "", 0) * fp32_norm_bytes(m, tr)


def _gated_deltanet_act(m: ModelSpec) -> float:
    """Bytes per token a Gated DeltaNet mixer keeps for backward without checkpointing (AutoModel's Qwen3.5 layer
    with fla's chunked kernel, stack/fla_gdn.py): in_proj's input; the mixed q/k/v (conv dim ``C = 2K + V``) out of
    in_proj, into and out of the causal conv and its SiLU; q and k l2-normalised at the value heads and v (kernel);
    its WY matrix (64 a head); the kernel's output; the gated norm's fp32 input and fp32 normalised input (two
    elements each), z and SiLU(z); out_proj's input."""
    k = m.linear_key_heads * m.linear_key_dim
    v = m.linear_value_heads * m.linear_value_dim
    conv = 2 * k + v
    kernel = 2 * v + v + 64 * m.linear_value_heads + v  # q and k at the value heads, v, A, the output
    norm = 2 * v + 2 * v + v + v  # fp32 input, fp32 normalised, z, SiLU(z)
    elements = m.hidden_size + 4 * conv + kernel + norm + v
    return 2.0 * elements


def _kda_act(m: ModelSpec) -> float:
    """Bytes per token a KDA mixer keeps for backward without checkpointing (AutoModel's KimiDeltaAttention with
    fla's kernels, stack/fla_kda.py; H heads of K, width W = H K, low rank d = K): its input (the six projections'
    one input); q, k and v out of their projections (each short conv's input); the kernel's l2-normalised q and k, v,
    two fp32 rstd a head, g's fp32 chunk cumsum and the fp32 gate itself (the gate function's output, the kernel's
    input), beta's fp32 sigmoid and the two [64 a head] bf16 intra-chunk matrices; the gate's bf16 input (f_b_proj's
    output) and the output gate (g_b_proj's); both low-rank pairs' middle (d each); the kernel's output, the gated
    norm's fp32 rstd a head and o_proj's input."""
    heads, w, d = m.linear_value_heads, m.linear_value_heads * m.linear_value_dim, m.linear_value_dim
    k = m.linear_key_heads * m.linear_key_dim
    projections = 2 * (2 * k + w)
    kernel = 2 * (2 * k + w) + 8 * heads + 4 * w + 4 * w + 4 * heads + 2 * 2 * 64 * heads
    gates = 2 * w + 2 * w + 2 * 2 * d
    out = 2 * w + 4 * heads + 2 * w
    return 2.0 * m.hidden_size + projections + kernel + gates + out


def _linear_act(m: ModelSpec) -> float:
    """Bytes per token one linear-attention mixer keeps: Kimi's KDA or a Gated DeltaNet."""
    return _kda_act(m) if m.linear_mixer == "kda" else _gated_deltanet_act(m)


def _parallel_mamba_act(m: ModelSpec, tr: Training, cached: bool = True) -> float:
    """Bf16-equivalent bytes per token Falcon-H1's Mamba-2 mixer keeps for backward beside the attention (transformers'
    FalconH1Mixer; whole on every TP rank, as AutoModel's plan leaves it): its input scaled by ssm_in_multiplier (a
    copy of the norm's output, kept where in_proj trains) and in_proj's output scaled by the muP vector (the conv's
    input; the gate and dt are views of it). ``cached``: trained with its cache on (the config's use_cache, as
    AutoModel runs it without activation checkpointing), the unfused path through causal_conv1d and mamba_ssm's chunk
    scan: the conv's output (the scan's x, B and C), the scan's output and fp32 dA cumsum; without the gated norm
    SiLU(gate) and the gated output (out_proj's input, where it trains); with it (applied after the gate) the gate's
    fp32 copy, its fp32 SiLU and their fp32 product (the norm's input), the fp32 normalised output where the norm's
    weight trains and out_proj's input where out_proj trains. Without the cache (activation checkpointing turns it
    off) the fused kernel: the scan's ungated output and, with the norm, its fp32 rstd per group. Saved-tensor hooks
    on transformers' layer with the dry run's stand-ins: the same bytes to 0.1% (0.5B, 7B; full fine-tuning and
    LoRA).

    With fp32 storage and bf16 compute the muP vector, a buffer FSDP2's mixed precision does not cast, stays fp32 and
    makes in_proj's scaled output fp32, and with it the conv's and the scan's outputs and the ungated SiLU (the gated
    norm's fp32 copy of the gate is then the gate itself): saved-tensor hooks, 0.5B and 7B."""
    i, w, conv = m.mamba_inner, m.mamba_in_proj_width, m.mamba_conv_dim
    fp32 = tr.storage_dtype == "float32" and tr.compute_dtype in ("bfloat16", "float16")
    wide = 4 if fp32 else 2  # bytes an element after the muP multiply
    kept = (2 * m.hidden_size if lora_trains(tr.lora, "in_proj") else 0) + wide * w
    if not cached:
        return kept + wide * i + (4 * m.mamba_n_groups if m.mamba_norm else 0)
    kept += wide * conv + wide * i + 4 * m.mamba_num_heads
    out_proj = 2 * i if lora_trains(tr.lora, "out_proj") else 0
    if not m.mamba_norm:
        return kept + wide * i + out_proj
    return kept + (8 if fp32 else 12) * i + (4 * i if tr.lora is None else 0) + out_proj


def _attention_act(m: ModelSpec, t: int) -> float:
    """Bytes per token an attention block saves besides its norms and residuals (q/k/v/o inputs and outputs,
    RoPE, the SDPA output and its statistics), fitted with bf16 compute: ``8h/t + 8d + 4a/t + 8``."""
    return 8 * m.hidden_size / t + 8 * m.hd + 4 * m.num_attention_heads / t + 8


def eager_attention(m: ModelSpec, p: ParallelDims, tr: Training) -> bool:
    """Whether this layout's step runs transformers' eager attention (the recipe's choice, AutoModel's overrides)."""
    return runs_eager_attention(
        tr.attn_implementation,
        hf_class=tr.hf_class,
        architecture=m.architecture,
        cp=p.cp,
        packed=tr.packed,
        backend_attn=tr.attn_backend,
    )


def sdpa_repeats_kv(m: ModelSpec, p: ParallelDims, tr: Training) -> bool:
    """Whether transformers' SDPA path repeats the keys and values to every query head (integrations/sdpa_attention.py
    use_gqa_in_sdpa: with a mask), so the kernel saves them so for backward: a class that masks every layer with the
    config's sliding window builds the mask once a sequence reaches the window (masking_utils._ignore_causal_mask_sdpa;
    ``mask_window``). The dry run of mistral_7b_squad_peft (Mistral-7B-v0.1, window 4,096, at 4,096 tokens): two
    [batch, heads, seq, head_dim] copies a layer. Not counted under CP or packing, where AutoModel's overrides choose
    the kernel."""
    return (
        tr.hf_class
        and m.mask_window is not None
        and tr.seq_len >= m.mask_window
        and m.num_key_value_heads < m.num_attention_heads
        and tr.attn_implementation in (None, "sdpa")
        and p.cp == 1
        and not tr.packed
    )


def eager_backward_bytes(m: ModelSpec, p: ParallelDims, tr: Training, comp_bytes: int) -> float:
    """Bytes per local token one eager attention's backward makes on top of what it saved (one layer's at a time): the
    scores' gradients. Measured on fake tensors (tests/oracle/test_kernel_facts.py): transformers' eager attention
    adds 8 bytes a score at bf16 or fp32 compute; AutoModel's MiMo-V2-Flash function, which also subtracts each row's
    maximum in the compute dtype, 8 at bf16 and 12 at fp32; Kimi-Linear's MLA (its own matmul, additive mask and fp32
    softmax, no row maximum) 6 at bf16, its score's bf16 copy freed by the peak."""
    if not eager_attention(m, p, tr):
        return 0.0
    if m.architecture in EAGER_UNLESS_TE:
        per_score = 4 + 2 * comp_bytes
    else:
        per_score = 6 if m.architecture in OWN_MLA_ATTENTION else 8
    return m.num_attention_heads / p.tp * tr.seq_len / p.cp * per_score  # (one scored layer's, whatever the mix)


def _scored_share(m: ModelSpec) -> float:
    """The share of layers whose attention has seq x seq scores (a hybrid's linear-attention layers have none)."""
    if "linear" not in m.layer_attention:
        return 1.0
    return (m.num_layers - m.layer_attention.count("linear")) / m.num_layers


def ac_style(m: ModelSpec, p: ParallelDims, tr: Training) -> str:
    """How AutoModel checkpoints this model's layers: none | submodule | submodule-no-attention | layer | block |
    selective."""
    return _ac_style(m.architecture, m.is_moe, tr.hf_class, p.ac_applied, p.ep > 1, m.kv_shared_layers > 0)


@lru_cache(maxsize=256)
def _ac_style(
    architecture: str | None, moe: bool, hf_class: bool, applied: bool | str, ep: bool, kv_shared: bool = False
) -> str:
    if not applied:
        return "none"
    if applied == "selective":
        # a model whose layers share keys and values (Gemma-4's E-series) cannot replay its attention: AutoModel falls
        # back to sub-module checkpointing without the attention (activation_checkpointing.py,
        # apply_selective_checkpointing_to_layers -> apply_submodule_checkpointing(has_kv_sharing))
        return "submodule-no-attention" if kv_shared else "selective"
    impl = implementation(architecture)
    custom = impl is not None and impl.custom and not hf_class
    if custom and not moe and architecture in TRANSFORMERS_DECODER_LAYERS:
        custom = False  # transformers' decoder layers, checkpointed whole
    if moe and (ep or custom):
        return "block"  # the MoE parallelizer wraps every block
    return "submodule" if custom else "layer"


def dsv4_keys(m: ModelSpec, kind: str, seq: float) -> float:
    """Keys a DeepSeek-V4 query scores in its eager attention: every position of the sequence (the sliding window is
    a mask over them) and the layer's compressed ones (one per ratio positions)."""
    ratio = m.dsv4_compression_ratio(kind)
    return seq + (seq / ratio if ratio else 0.0)


def _dsv4_attention_bytes(m: ModelSpec, p: ParallelDims, tr: Training, kind: str) -> float:
    """Bf16-compute bytes per local token one DeepSeek-V4 layer of attention ``kind`` keeps beside its MoE, from
    AutoModel's DeepseekV4Block (model.py) and DeepseekV4Attention (layers.py), each tensor identified by saved-tensor
    hooks on its code at the Flash config's dims on fake tensors, at two lengths and with the base frozen:
    - the query: wq_a's and q_norm's outputs (q_lora_rank), the heads' bf16 query before its per-head norm (what
      torch's fused RMSNorm keeps on a GPU: stack/rms_norm.py stands in for it) and after it;
      the key-value head and its repeat over the heads (a view: one copy); wo_a's input where the base trains,
      wo_b's where it or its adapter trains;
    - each of the two hyper-connections (attention and MLP sites): the hc_mult streams (the collapse's input), their
      flat fp32 copy (the norm's input) and, where its map trains, the normalised copy (the map's input), Sinkhorn's
      fp32 [m, m] ratios and row sums each iteration (torch's reference; under backend.attn tilelang, TileKernels'
      kernel, whose Function keeps only its fp32 [m, m] input: tests/oracle/test_dsv4_sinkhorn.py), the mixing
      weights; five hidden-wide tensors (norms' inputs and outputs, the collapsed and expanded outputs);
    - eager attention (any backend but tilelang): an fp32 softmax over every key and a sink column, its bf16 copy
      for the value matmul, the row maximum's value and index;
    - a compressed layer: its compressor's fp32 input where it trains, its kv and gate outputs over the windows
      (fp32, twice as wide where ratio-4 windows overlap); a "csa" layer's indexer: its fp32 query and its own
      compressor's input and outputs (its scores over the compressed keys are a transient: only indices come out).
    tilelang's sparse attention keeps what its autograd Function saves (its output and log-sum-exp, the selected
    keys' indices; under CP the gathered keys and values): the dry run runs it with stand-ins for its kernels
    (stack/dsv4_tilelang.py). The sums are held to the dry run by tests/integration/test_dry_run.py's DeepSeek-V4
    tests and the corpus sweep."""
    t, seq = p.tp, tr.seq_len / p.cp
    h, d, heads, q, mm = m.hidden_size, m.hd, m.num_attention_heads, m.q_lora_rank or 0, m.hc_mult
    trains = tr.lora is None
    kept = 4 * heads * d / t + (2 * heads * d / t if trains else 0.0) + 4 * q + 4 * d
    if lora_trains(tr.lora, "wo_b"):
        kept += 2 * m.o_groups * m.o_lora_rank / t
    hc_site = 4 * mm * h + (4 * mm * h if trains else 0.0) + 2 * mm * h
    # Sinkhorn's backend is auto under tilelang: TileKernels' kernel where AutoModel's cuda extra installed it
    sinkhorn = 4 * mm * mm if tr.attn_backend == "tilelang" else 8 * (mm * mm + mm) * m.hc_iters
    hc_site += sinkhorn + 4 * (2 + mm) * mm
    kept += 2 * hc_site + 10 * h
    if eager_attention(m, p, tr):
        kept += heads / t * (6 * dsv4_keys(m, kind, seq) + 4) + 12 * heads / t
    else:
        # tilelang's sparse attention (its autograd Function, kernels/sparse_attention.py DeepSeekV4SparseAttention):
        # its contiguous query copy, output and log-sum-exp, the keys each query reads (int32: the window, and the
        # indexer's picks or every compressed key), and under CP the keys and values gathered over the sequence
        ratio = m.dsv4_compression_ratio(kind)
        picked = min(m.index_topk, tr.seq_len / 4) if kind == "csa" else (tr.seq_len / ratio if ratio else 0.0)
        kept += 4 * heads * d / t + 4 * heads / t + 4 * ((m.sliding_window or 128) + picked)
        kept += 2 * d * dsv4_keys(m, kind, tr.seq_len) / seq if p.cp > 1 else 0.0
    if m.dsv4_compression_ratio(kind):
        kept += (4 * h if trains else 0.0) + 8 * m.dsv4_compressor_width(kind)
    if kind == "csa":  # (the indexer's scores over the compressed keys are a transient: only indices come out)
        ih, idim = m.index_heads, m.index_head_dim
        kept += (4 * h if trains else 0.0) + 4 * ih * idim + 16 * idim + 2 * d / 4 + 4 * ih
    return kept


def _dsv4_moe_bytes(m: ModelSpec, frozen: bool) -> float:
    """Bf16-compute bytes per token a DeepSeek-V4 MoE layer keeps (AutoModel's MoE with DeepSeek-V4's clamped
    SwiGLU, moe/layers.py): the routed experts as AutoModel's grouped experts keep them, the shared expert's clamped
    fp32 SwiGLU (its gate and up in fp32 before and after the clamp, the activation, and the bf16 product: 22 bytes
    of its width), the router's fp32 scores and their sqrt-softplus, the layer's input (the router's and the shared
    expert's; half of it where the experts are frozen). AutoModel's layer on fake tensors at the Flash dims keeps
    this within 0.1% trained and 0.3% frozen (LoRA on the attention): layer by layer, at two depths."""
    h = m.hidden_size
    routed = _routed_expert_bytes(m, not frozen)
    return routed + 22 * m.shared_expert_intermediate_size + 8 * m.num_experts + (h if frozen else 2 * h)


def _dsv4_act_per_token(
    m: ModelSpec, p: ParallelDims, tr: Training, kind: str, comp_bytes: int, style: str
) -> tuple[float, float]:
    """:func:`_act_per_token` for DeepSeek-V4: its attention kinds' mean (a stage holds whole periods of them) and
    the heaviest kind (the layer running or recomputed), with its MoE as AutoModel's other MoE layers keep it; under
    block checkpointing a block keeps its input, the hc_mult streams, and what the policy saves of the router."""
    scale = comp_bytes / 2.0
    k = max(m.experts_per_token, 1)
    frozen = tr.lora is not None and not tr.lora.experts(kind)
    moe = _dsv4_moe_bytes(m, frozen)
    moe += _torch_loop_bytes(m, p, tr)
    per_kind = {a: _dsv4_attention_bytes(m, p, tr, a) for a in set(m.layer_attention)}
    mean = sum(per_kind[a] for a in m.layer_attention) / m.num_layers
    plain = (mean + moe) * scale
    heaviest = (max(per_kind.values()) + moe) * scale
    if style in ("none", "selective"):  # (selective checkpointing leaves an MoE block whole, as for every MoE layer)
        return plain, heaviest
    return (2 * m.residual_width + 2 * m.num_experts + 12 * k) * scale, heaviest


def _act_per_token(
    m: ModelSpec, p: ParallelDims, tr: Training, kind: str, comp_bytes: int, style: str | None = None
) -> tuple[float, float]:
    """(saved bytes per local token of one layer under the AC mode, bytes if not checkpointed)."""
    if m.is_hybrid:
        return _hybrid_act_per_token(m, p, tr, kind, comp_bytes)
    if m.hc_mult:
        return _dsv4_act_per_token(m, p, tr, kind, comp_bytes, style or ac_style(m, p, tr))
    h, t, sp = m.hidden_size, p.tp, p.sequence_parallel
    a = m.num_attention_heads
    scale = comp_bytes / 2.0  # the terms are bf16 bytes
    liger = _liger(m, p, tr)
    unsharded = tr.hf_class and m.architecture in _PHI3
    if unsharded:
        t, sp = 1, False  # its plan splits neither attention nor the MLP and ignores SP (see _PHI3)
    if ignores_sequence_parallel(m.architecture, m.parallel_mamba):
        sp = False  # (Falcon-H1's and Muse-Glimmer's TP plans ignore it: catalog/kernels)
    rep = _norm_bytes(m, p, tr, liger, sp)
    if m.kv_lora_rank:  # MLA: per head, queries and keys of nope+rope, values and outputs of v_head_dim
        q = a * ((m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0))
        kv = a * (m.v_head_dim or m.hd)
        # queries and keys (each a cat of nope and rope parts), kv_b_proj's whole output (the values are a view of
        # it), the attention output and its log-sum-exp; each latent norm keeps its input and output (not split by
        # TP). AutoModel's DeepSeek-V3 step on fake tensors, per layer at depth N and N+1.
        nope_v = a * ((m.qk_nope_head_dim or 0) + (m.v_head_dim or m.hd))
        latents = 4 * m.kv_lora_rank + 4 * (m.q_lora_rank or 0)
        attn = (2 * q + 2 * q + 2 * nope_v + 2 * kv + 4 * a) / t + latents
    else:
        q, kv = a * m.hd, m.num_key_value_heads * m.hd
        # a KV-shared layer (Gemma-4's E-series) makes no keys or values of its own: the layers' mean keeps fewer
        own_kv = kv * (1 - m.kv_shared_layers / m.num_layers)
        attn = 4 * q / t + 4 * own_kv / t + 4 * a / t + (2 * q / t + 2 * own_kv / t if m.qk_norm else 0.0)
        if m.qk_norm and liger is None and hf_norms(m, tr):
            # transformers' q/k norms keep an fp32 copy of q and k and, for a trained weight, the normalised values
            # (fp32 where the norm scales in fp32, as Gemma-3's): saved-tensor hooks on transformers' Qwen3 and
            # Gemma-3 layers; counted above as the bf16 input alone
            row = hf_text_layer(m.architecture)
            fp32 = (row is not None and row.fp32_norm) or m.architecture in FP32_NORM_CLASSES
            normalised = (4 if fp32 else 2) if tr.lora is None else 0
            attn += (4 + normalised - 2) * (q + own_kv) / t
        if unsharded:  # the fused qkv (see _PHI3)
            attn += (4 * q + 2 * kv) / t
        if m.attn_output_gate:
            attn += output_gate_bytes(m) / t
        if sdpa_repeats_kv(m, p, tr):
            attn += 4 * (q - kv) / t  # the keys and values repeated to every query head, saved in place of their own
    # what a scored (attention) layer and a linear-attention layer each keep: the layers' mean sizes what a stage of
    # whole periods keeps, the heavier one what a single layer holds (the one recomputed, the one running)
    attn_scored, attn_linear = attn, 0.0
    if "linear" in m.layer_attention:  # a stage of whole periods: the layers' mean
        n_linear = m.layer_attention.count("linear")
        attn_linear = _linear_act(m) / t
        attn = (n_linear * attn_linear + (m.num_layers - n_linear) * attn) / m.num_layers
    eager = eager_scored = 0.0
    if eager_attention(m, p, tr):
        # transformers' eager_attention_forward: per head and key, the fp32 softmax (its backward's input) and its
        # copy in the compute dtype (the value matmul's; none in fp32), a softcapped model's tanh of the scores too;
        # keys and values expanded to every query head (repeat_kv copies them for the matmuls) in place of the
        # kernel's own k, v and log-sum-exp (MLA's keys already have every head). AutoModel's step on fake tensors:
        # 6 bytes a score (Gemma-3 270M, at two lengths). A hybrid's linear-attention layers have no scores.
        share = _scored_share(m)
        if not m.kv_lora_rank:
            attn += share * (4 * q / t - 4 * kv / t - 4 * a / t)
            attn_scored += 4 * q / t - 4 * kv / t - 4 * a / t
        copy = comp_bytes if comp_bytes != 4 else 0
        eager_scored = a / t * tr.seq_len / p.cp * (4 + copy + (comp_bytes if m.attn_softcap else 0))
        eager = share * eager_scored
    if m.architecture in FP32_NORM_DECODERS and not tr.hf_class:  # (transformers' own class: _norm_bytes counts)
        # each of its norms keeps what an fp32 norm keeps, where _norm_bytes counted two norms' bf16 inputs
        rep += (m.norms_per_layer * fp32_norm_bytes(m, tr) - 4 * h) / (t if sp else 1)
    moe = kind == "moe"
    k = max(m.experts_per_token, 1)
    if moe:
        # per routed copy (k a token): the permuted input the first grouped GEMM keeps, the weighted SwiGLU's input
        # (gate and up) and its output (the down GEMM's input); the router's fp32 logits; the shared experts as a
        # dense MLP. AutoModel's GroupedExperts keep the same with LoRA or without (_peft/lora_experts.py,
        # moe/megatron/moe_utils.py); experts with a bias applied with the routing weights (gpt-oss) keep an fp32
        # copy of the routed output. A Hugging Face class's frozen experts keep no input (transformers'
        # integrations/moe.py) but the routed output for the weights' product: the same 2kh.
        kh = k * h
        frozen = not tr.hf_class and tr.lora is not None and not tr.lora.experts(kind)
        mlp = _routed_expert_bytes(m, not frozen) + 4 * m.num_experts + 8 * m.shared_expert_intermediate_size
        mlp += _torch_loop_bytes(m, p, tr)
        if not tr.hf_class and m.architecture in _ROUTER_AFTER_DOWN:
            mlp += 2 * kh  # the experts' outputs, kept for the routing weights' product after the down projection
        mlp += scaled_router_bytes(m, tr, comp_bytes) / scale
        grouped = tr.hf_class or tr.experts != "torch"  # the per-expert loop adds each expert's bias itself
        if m.expert_bias and grouped and k * tr.micro_batch_size * tr.seq_len / p.cp <= EXPERT_BIAS_CHUNK_ROWS:
            mlp += 4 * kh  # the unchunked bias path keeps the fp32 expanded bias; above the threshold it is chunked
        if tr.hf_class and tr.lora is None:
            mlp += 2 * kh  # trainable Hugging Face experts also keep their input for the weight gradients
        gate = 2 * k * m.moe_intermediate_size + 2 * m.shared_expert_intermediate_size
    else:
        # gate, up, the activation's output and the product; Liger keeps no activation output (it recomputes it)
        liger_mlp = liger is not None and liger.mlp is not None
        inter = m.mean_intermediate_size()  # (Gemma-4's double-wide MLP on its KV-shared layers)
        mlp, gate = (6 if liger_mlp else 8) * inter / t, 2 * inter / t
        if not m.gated_mlp:
            # up/down without a gate (Phi-2, StarCoder2): the activation keeps the up projection's output (a python
            # GELU also its tanh, 0.5x and 1+tanh: transformers' NewGELUActivation, counted by saved-tensor hooks),
            # and the down projection its input where it trains (a frozen Linear keeps no input)
            act = 8 if m.python_gelu else 2
            mlp = (act + (2 if down_adapted(m, tr.lora) else 0)) * m.intermediate_size / t
        if unsharded and p.tp > 1:
            mlp += 4 * m.intermediate_size / p.tp  # the column-parallel gate/up output's local shard stays alive
        if tr.lora is not None and m.gated_mlp and not unsharded:
            # LoRA that leaves Linears frozen: a frozen Linear keeps no input (no weight gradient): the product
            # (down_proj's input) and the MLP's input (the norm's output) where neither gate nor up trains
            # (saved-tensor hooks on transformers' Falcon-H1 layer, LoRA on q_proj alone)
            if not down_adapted(m, tr.lora):
                mlp -= 2 * inter / t
            if not (lora_trains(tr.lora, "gate_proj") or lora_trains(tr.lora, m.mlp_names[0])):
                rep -= 2 * h
    if tr.lora is not None and not m.kv_lora_rank and not unsharded:
        if not any(lora_trains(tr.lora, name) for name in ("q_proj", "k_proj", "v_proj")):
            rep -= 2 * h  # nor the attention's input where none of q, k, v trains
    dropout = tr.lora.dropout_bytes(kind, t) if tr.lora is not None else 0.0  # one byte a mask element
    # (activation checkpointing turns the model's cache off: AutoModel's checkpointing setup sets use_cache false)
    mamba = _parallel_mamba_act(m, tr, cached=not p.ac_applied) if m.parallel_mamba else 0.0
    plain = (rep + attn + mlp + mamba + _per_layer_input_bytes(m, tr)) * scale + dropout + eager
    base = plain - attn * scale - eager
    heaviest = base + max(attn_scored * scale + eager_scored, attn_linear * scale)
    style = style or ac_style(m, p, tr)
    edge = 2 * h / (t if sp else 1)
    if style == "none" or (style == "selective" and moe):
        # (checkpointed, a recomputed MLA layer's gathered sequence is gathered_mla_backward_bytes' transient)
        gathered = gathered_mla_kept_bytes(m, p, tr, comp_bytes)
        gathered_scored = gathered / _scored_share(m) if gathered else 0.0
        return plain + gathered, base + max(attn_scored * scale + eager_scored + gathered_scored, attn_linear * scale)
    if style == "selective":
        saved = edge + 2 * q / t + 2 * kv / t + 2 * q / t + 4 * a / t + gate + edge
        if m.parallel_mamba:
            # Falcon-H1's mixer runs first: in_proj is the layer's first matmul, which the policy saves (its output
            # whole on every TP rank), out_proj its second; the attention's and the MLP's keep Llama's parity
            saved += 2 * m.mamba_in_proj_width
    elif style == "submodule-no-attention":
        # the MLP keeps its input alone, the attention (unwrapped) its input and all it saves, the norms and the
        # per-layer input path what they save (counted whole)
        kept = rep + attn + _per_layer_input_bytes(m, tr) + 2 * h / (t if sp else 1)
        return kept * scale + dropout + eager, heaviest
    elif style == "submodule":
        saved = (8 * h + unwrapped_norm_bytes(m, tr)) / (t if sp else 1)
        if tr.compile and sp:
            # enable_compile with sequence parallelism keeps two more sequence-sharded hidden states per layer
            # (AutoModel's step on fake tensors: the corpus's 70B LoRA recipe, TP 2 + SP; without SP, as its 70B CP 2
            # pretraining recipe, nothing more)
            saved += 4 * h / t
    elif style == "block":
        # the block's input and what the policy saves (the router's projection and top-k); the token exchange is
        # recomputed with the rest (AutoModel's step on fake tensors keeps no dispatcher output, full checkpoint
        # or the router-saving policy alike: per layer the block's input and the router's tensors, LoRA or not)
        saved = 2 * h + (2 * m.num_experts + 12 * k if moe else 0.0)
    else:  # the whole layer (Hugging Face's gradient checkpointing)
        saved = edge
    topk = 0.0
    if style == "block":
        # AutoModel's block policy must-saves every aten.topk in the block (moe/parallelizer.py apply_ac), the DSA
        # indexer's too, kept to the block's backward though no backward reads them (indexer_topk_bytes; the dry run
        # of glm_5_te_deepep's last pipeline rank: 96 MiB a layer and microbatch at 4,096 tokens)
        topk = indexer_topk_bytes(m, tr)
    return saved * scale + topk, heaviest


def _per_layer_input_bytes(m: ModelSpec, tr: Training) -> float:
    """Bf16 bytes per token one layer's per-layer input keeps (Gemma-4's E-series, after the MLP's residual: a gate
    from the hidden state, GELU, the product with the layer's slice of the per-layer inputs, a projection back and an
    RMSNorm): the gate's input and the projection's where they train (or carry an adapter), the GELU's input, its
    output the product keeps, and the norm's fp32 copy of its input and, for a trained weight, its fp32 normalised
    input, with its statistics. Transformers' layer (tests/oracle/test_kernel_facts.py): 10h + 6p + 8 trained whole,
    4h + 4p + 8 frozen."""
    if not m.per_layer_input:
        return 0.0
    h, p = m.hidden_size, m.per_layer_input
    gate, proj = lora_trains(tr.lora, "per_layer_input_gate"), lora_trains(tr.lora, "per_layer_projection")
    return (2 * h if gate else 0) + 4 * p + (2 * p if proj else 0) + 4 * h + (4 * h if tr.lora is None else 0) + 8


def per_layer_inputs_bytes(m: ModelSpec, tr: Training) -> float:
    """Bf16 bytes per token the model keeps, once, for its per-layer inputs (Gemma-4's E-series, before its first
    layer; not inside any checkpointed layer): where its weights train, the projection's input (the scaled token
    embedding); its RMSNorm's fp32 copy and, for a trained weight, fp32 normalised values, every layer's width at once,
    with their statistics; and the bf16 sum with the table's rows, which every layer's product keeps a slice of.
    Transformers' model (tests/oracle/test_kernel_facts.py): 2h + 10Lp + 8L trained whole, 6Lp + 8L frozen (an
    adapter on the projection, which an exclude-only peft: section adds, would keep its input too: not counted)."""
    if not m.per_layer_input:
        return 0.0
    lp = m.num_layers * m.per_layer_input
    return (2 * m.hidden_size + 10 * lp if tr.lora is None else 6 * lp) + 8 * m.num_layers


def scaled_router_bytes(m: ModelSpec, tr: Training, comp_bytes: int) -> float:
    """Bytes per token Gemma-4's router (AutoModel's Gemma4Gate, ``ModelSpec.router_scale``) keeps beyond the 4 a
    logit every router keeps. It runs in fp32 on the residual: its unscaled norm keeps an fp32 copy of its input (the
    residual itself at fp32), and where the router trains the normalised tensor cast back to fp32 is kept for the
    learned scale's gradient and the scaled one for the fp32 projection's. Under LoRA it is frozen (PEFT freezes
    scale and proj; the gate calls F.linear on proj.weight, so no adapter applies). Transformers' own router (under
    force_hf) is not measured: nothing is counted there."""
    if not m.router_scale or tr.hf_class:
        return 0.0
    return ((8 if tr.lora is None else 0) + (4 if comp_bytes != 4 else 0)) * m.hidden_size


MEGATRON_MIN_COMMUNICATION_UNIT = 1_000_000_000
"""megatron_fsdp 0.5.0's communication unit in elements where it sizes one (``MegatronFSDP.__init__``): under
zero_dp_strategy 3 twice the mean FSDP unit's parameters, at least this; below it the DDP config's bucket_size,
which AutoModel leaves unset, so this."""


def megatron_communication_unit(unit_params: float, zero_dp_strategy: int) -> float:
    """MegatronFSDP's communication unit in elements, for FSDP units of ``unit_params`` parameters each, counted
    whole (``p.numel()`` of a tensor-parallel DTensor is its global size) (see MEGATRON_MIN_COMMUNICATION_UNIT)."""
    if zero_dp_strategy >= 3:
        return max(MEGATRON_MIN_COMMUNICATION_UNIT, 2 * unit_params)
    return MEGATRON_MIN_COMMUNICATION_UNIT


def megatron_prefetch_layers(unit_elements: float, unit_params: float, units: int, zero_dp_strategy: int = 3) -> int:
    """How many of a rank's ``units`` FSDP units of ``unit_elements`` local elements each (``unit_params`` whole)
    MegatronFSDP's all-gather pipeline gathers beyond the one it needs: units are added until what they add reaches
    half the communication unit (``suggested_AG_prefetch_size``; ``AllGatherPipeline.all_gather_params``), so the one
    that reaches it is taken."""
    if units <= 0 or unit_elements <= 0:
        return 0
    threshold = megatron_communication_unit(unit_params, zero_dp_strategy) // 2
    return min(units, math.ceil(threshold / unit_elements))


def megatron_queued_layers(unit_elements: float, unit_params: float, units: int, zero_dp_strategy: int) -> int:
    """How many of a rank's ``units`` FSDP units' unsharded gradient buckets (``unit_elements`` each) MegatronFSDP
    holds at once in backward: before each new bucket joins its reduce-scatter queue, the queue is trimmed to the
    communication unit (``GradReducePipeline.wait_for_previous_grad_reduce``: while what it holds exceeds it), so it
    holds what fits and the new one; its buckets are padded past the parameters the unit is sized from, so a unit an
    exact multiple of a bucket fits one fewer."""
    if units <= 0 or unit_elements <= 0:
        return 0
    return min(units, math.ceil(megatron_communication_unit(unit_params, zero_dp_strategy) / unit_elements))


def grad_sync_deferred(p: ParallelDims, tr: Training, backward_passes: int) -> bool:
    """Whether FSDP2 skips the gradient reduce-scatter on all but the last backward of a step, keeping the unsharded
    gradients to the step's last backward. Where an FSDP module wraps the whole model part, AutoModel's
    ``defer_fsdp_grad_sync`` decides (:meth:`ParallelDims.deferred_sync`). Where none does (the MoE parallelizer with
    ``moe.wrap_outer_model: false``), train_ft's ``get_sync_ctx`` and torch's pipeline stage (a plain backward for a
    module that is no FSDP module) leave every inner unit to reduce after each backward, and only the class's
    MoEFSDPSyncMixin turns the sync off on them, whatever ``defer_fsdp_grad_sync`` says: without PP where
    ``backend.enable_fsdp_optimizations`` asks (prepare_for_grad_accumulation), under PP wherever AutoModel patches
    the stage's backward (enable_fsdp_optimizations, or defer_fsdp_grad_sync false: pipelining/functional.py,
    moe/fsdp_mixin.py patched_backward_maybe_with_nosync). The dry run of nemotron_ultra_v3_squad (PP 4, neither
    set) holds no unsharded gradient at its last rank's peak, in its last stage's fourth backward."""
    if not p.model_part_unwrapped:
        return p.deferred_sync(backward_passes)
    if not (p.pp > 1 or backward_passes > 1) or not tr.moe_sync_class or tr.vlm_step:
        # (a VLM class's decoder units hang under its text module, the FSDP root there, which the mixin's walk does
        # not reach: moe/fsdp_mixin.py _iter_fsdp_module_candidates looks at the model part's .model only)
        return False
    if p.pp > 1:
        return tr.fsdp_sync_mixin or not p.defer_fsdp_grad_sync
    return tr.fsdp_sync_mixin and prepares_accumulation(tr)


def holds_across_schedule_steps(p: ParallelDims, tr: Training) -> bool:
    """Whether a pipeline rank's FSDP units keep their unsharded gradients, and stay gathered, from one schedule step
    to the next until the optimizer step's last: AutoModel's patched stage backward on its MoE class under a model
    part that is no FSDP module reduces and reshards only where ``get_is_optim_step()`` (set by
    ``prepare_for_final_backward`` before the step's last batch, training/utils.py); torch's own stage does so at
    each schedule step's last backward."""
    return p.pp > 1 and p.model_part_unwrapped and grad_sync_deferred(p, tr, 2)


def carries_across_schedule_steps(p: ParallelDims, tr: Training) -> bool:
    """Whether a pipeline rank's second schedule step of an optimizer step starts with gradients the first left: the
    units the MoE sync mixin holds (:func:`holds_across_schedule_steps`), or routed experts outside FSDP (a one-rank
    ``ep_shard`` mesh), whose plain ``.grad`` lives to the optimizer step."""
    return p.pp > 1 and (holds_across_schedule_steps(p, tr) or p.experts_outside_fsdp)


def prepares_accumulation(tr: Training) -> bool:
    """Whether the recipe's step without PP calls the MoE sync mixin's ``prepare_for_grad_accumulation`` (train_ft,
    the benchmark, the VLM recipes, the dLLM recipe): the LLM knowledge-distillation recipe does only under PP
    (kd.py), and the retrieval recipes never."""
    return tr.teacher is None or tr.vlm_step


def grad_reduce_bytes(p: ParallelDims, store: int) -> float:
    """Bytes of a gradient element in FSDP2's reduction: its mp_policy's reduce_dtype (AutoModel's default fp32; torch
    reduces in the parameter dtype where it is null, and in the parameters' own dtype without a policy). Deferred, the
    unsharded gradients accumulate in it (the corpus's Qwen3.6-27B TP 4 recipe, bf16: half the fp32 default's bytes
    on fake tensors); a block's gradients are copied into it for the reduce-scatter. MegatronFSDP: the parameters'
    dtype, or fp32 with its grad_reduce_in_fp32 (off by default in AutoModel's config). Other strategies: fp32."""
    if p.strategy == "megatron_fsdp":
        return 4.0 if p.megatron_fp32_grads else float(store)
    if p.strategy != "fsdp2":
        return 4.0
    mp = p.mp_policy
    if mp is None:
        return float(store)
    name = mp.reduce_dtype or mp.param_dtype
    return float(DTYPE_BYTES.get(name, store)) if name else float(store)


def optimizer_states_per_param(tr: Training, param_bytes: int | None = None) -> float:
    """Optimizer bytes per parameter, for parameters of ``param_bytes`` (default: the storage dtype's)."""
    return tr.optimizer.state_bytes(param_bytes or DTYPE_BYTES[tr.storage_dtype]) + tr.optimizer.master


MAX_ACTIVE_STAGES = 3  # torch.distributed.pipelining.schedules._add_unshard_reshard's default


def stage_carry_bytes(m: ModelSpec, tr: Training, cp: int = 1) -> float:
    """Bytes a token of the top-k carry that crosses every pipeline stage boundary beside the residual stream, in each
    direction (0: none). AutoModel's GLM-5.2 class with IndexShare layers (get_pipeline_stage_metas) sends the running
    DSA selection on as an fp32 tensor of index_topk a token under the THD kernels (backend.attn tilelang or cudnn),
    min(index_topk, seq) under the dense ones, seq a CP rank's share (train_ft sizes the stage metas after the CP
    split); torch's pipeline treats it as an activation: a receive buffer for it and one for its (zero) gradient, as
    for the hidden states."""
    if not m.index_shared_layers or m.architecture != "GlmMoeDsaForCausalLM":
        return 0.0
    return 4.0 * dsa_kept_keys(m, tr, cp)


def dsa_kept_keys(m: ModelSpec, tr: Training, cp: int = 1) -> int:
    """Keys a query's DSA top-k keeps: index_topk under the THD kernels (their width is fixed), min(index_topk, seq)
    on the dense path, seq a CP rank's share."""
    return m.index_topk if tr.attn_backend in DSA_THD_BACKENDS else min(m.index_topk, tr.seq_len // cp)


def indexer_topk_bytes(m: ModelSpec, tr: Training) -> float:
    """Bytes a token of one layer's DSA top-k as aten.topk leaves it, averaged over the layers (a layer reusing an
    earlier one's selection runs no indexer: GLM-5.2's IndexShare): its fp32 values and int64 indices, min(index_topk,
    seq) a query on the dense path, index_topk under GLM's TileLang indexer (IndexerFunction takes torch.topk over
    logits padded to it, in row chunks); 0 under cuDNN's, whose top-k is its own kernel, and for DeepSeek-V4."""
    if not m.index_heads or m.hc_mult or tr.attn_backend == "cudnn":
        return 0.0
    if tr.attn_backend == "tilelang" and m.architecture != "GlmMoeDsaForCausalLM":
        return 0.0
    return 12.0 * dsa_kept_keys(m, tr) * (1 - len(m.index_shared_layers) / m.num_layers)


def indexer_scores_bytes(m: ModelSpec, tr: Training, cp: int = 1) -> tuple[float, float]:
    """(bytes a microbatch, bytes a token) one layer's DSA indexer holds at once in forward beyond its inputs, on
    AutoModel's dense path (every backend.attn but tilelang and cudnn: a score over every query-key pair of every index
    head, in fp32); 0 under the THD kernels (tilelang, cudnn), whose head-summed [T, T] scores are not counted, and for
    other classes (DeepSeek-V4's indexer is in its own terms). Only its top-k indices leave the indexer, and they take
    no gradient, so all of it is freed as the layer goes on; a checkpointed layer makes it again in its recompute
    (there, under the block policy, the measured peak is 4-8% lower: the formula is the unchecked forward's).

    - DeepSeek-V3.2 (deepseek_v32/layers.py): the scores, their ReLU and the head-weighted product are new tensors, the
      ReLU's and the product alive at once (8 bytes a score), beside an [S, S] fp32 one; a token's queries in fp32 and
      bf16 copies and the keys expanded to every head in fp32 (13 bytes an index head-dim element).
    - GLM-5 (glm_moe_dsa/layers.py): the scores are scaled and ReLU'd in place (4 bytes a score), kept by the head
      reduction's matmul while its [S, S] result is masked and its top-k taken (fp32 values and int64 indices of
      min(index_topk, S) a query); a token's queries in fp32 and bf16 copies (9.5 bytes an element).

    Held to AutoModel's two indexers in forward on fake tensors (tests/oracle/test_kernel_facts.py: within 2% at 1,024
    and 2,048 tokens, top-k 2,048 and 512, trained or not: their inputs take a gradient in training, so their graph
    is made either way). Not counted: a packed batch of several sequences, whose keys are every packed token."""
    if not m.index_heads or tr.attn_backend in DSA_THD_BACKENDS:
        return 0.0, 0.0
    heads, dim = m.index_heads, m.index_head_dim
    queries = tr.micro_batch_size * tr.seq_len / cp
    if m.architecture == "GlmMoeDsaForCausalLM":  # (its dense path refuses CP: the whole sequence's keys)
        return queries * ((4.0 * heads + 5.0) * tr.seq_len + 12.0 * dsa_kept_keys(m, tr)), 9.5 * heads * dim
    if m.architecture == "DeepseekV32ForCausalLM":  # (under CP its keys are the rank's own share)
        return queries * (8.0 * heads + 4.0) * tr.seq_len / cp, 13.0 * heads * dim
    return 0.0, 0.0


def in_flight_microbatches(p: ParallelDims, n_mb: int, pp_rank: int = 0, stages_per_rank: int | None = None) -> float:
    """Microbatches whose activations a pipeline rank holds at once, in units of its whole stage set."""
    if p.pp <= 1:
        return 1.0
    sched = p.pp_schedule or "1F1B"
    v = stages_per_rank or p.stages_per_rank
    if sched in ("GPipe", "LoopedBFS"):
        return float(n_mb)
    if sched == "1F1B":
        return float(min(n_mb, p.pp - pp_rank))
    if sched in ("ZBVZeroBubble", "DualPipeV"):
        return float(min(n_mb, p.pp + (1 if sched == "DualPipeV" else 0)))
    if sched == "InterleavedZeroBubble":
        # torch's warm-up grows by one a rank (multiply_factor 1), and rank r keeps r more microbatches' graphs
        # (retain_graph) until their delayed weight-gradient steps (num_1f1b_microbatches = rank)
        warm = (p.pp - pp_rank - 1) + (v - 1) * p.pp + 1 + pp_rank
    else:
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


def peak_candidate_pp_ranks(m: ModelSpec, p: ParallelDims, teacher: ModelSpec | None = None) -> list[int]:
    """The pipeline ranks whose memory can peak, lowest first (the estimate searches them, the dry run measures them).

    Outside V schedules and InterleavedZeroBubble a higher pipeline rank runs no more forwards before its first
    backward (torch's warm-up shrinks along the pipeline: 1F1B ``pp-1-r``, Interleaved1F1B ``2*(pp-1-r)`` more than
    the last rank; GPipe and LoopedBFS run every forward first on every rank), in the same order over its local
    stages. Every rank but 0 also holds the same receive buffers (torch preallocates one per microbatch for each
    non-first stage), which rank 0's first stage does not. So a rank from 1 on is dominated by a lower one from 1 on
    whose every local stage holds at least as many layers of each kind (mixer, attention, dense or MoE MLP; the
    distillation teacher's layers too, split as the student's): it holds no more of anything at any point of the
    schedule. The candidates: rank 0 (the embedding, no receive buffers), rank 1, each later rank no lower candidate
    from 1 on dominates, and the last (the lm_head and the loss) -- {0, 1, last} for a uniform model, more with a
    dense prefix (DeepSeek's first layers) or a hybrid pattern. V schedules (a rank holds a stage from each end) and
    InterleavedZeroBubble (its warm-up shrinks by one a rank while each rank r holds r more microbatches awaiting
    their weight gradients) keep every rank."""
    if p.pp <= 1:
        return [0]
    if p.v_schedule or p.pp_schedule == "InterleavedZeroBubble":
        return list(range(p.pp))
    models = (m,) if teacher is None else (m, teacher)
    return list(_candidates(models, p.pp, tuple(p.stages_per_rank_of(x.num_layers) for x in models)))


@lru_cache(maxsize=1024)  # suggest asks for the same few splits thousands of times
def _candidates(models: tuple[ModelSpec, ...], pp: int, stages_per_rank: tuple[int, ...]) -> tuple[int, ...]:
    def kinds(x: ModelSpec, counts: list[int], stage: int) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        start = sum(counts[:stage])
        for layer in range(start, start + counts[stage]):
            key = (x.layer_kind(layer), x.attention_kind(layer))
            out[key] = out.get(key, 0) + 1
        return out

    held: list[list[dict[tuple[str, str], int]]] = [[] for _ in range(pp)]
    for x, spr in zip(models, stages_per_rank):  # the teacher's stages follow the student's
        counts = stage_layer_counts(x.num_layers, pp * spr)
        for r in range(pp):
            held[r] += [kinds(x, counts, s) for s in stage_ids(r, pp, pp * spr)]

    def covers(a: int, b: int) -> bool:
        return all(all(ka.get(k, 0) >= n for k, n in kb.items()) for ka, kb in zip(held[a], held[b]))

    out = [0]
    for r in range(1, pp):
        if r in (1, pp - 1) or not any(covers(a, r) for a in out if a >= 1):
            out.append(r)
    return tuple(out)


def memory_per_rank(m: ModelSpec, p: ParallelDims, tr: Training) -> MemoryBreakdown:
    """Peak memory of the worst rank (over pipeline ranks) for one layout."""
    ranks = peak_candidate_pp_ranks(m, p, tr.teacher)
    worst = max((_memory_of_pp_rank(m, p, tr, r) for r in ranks), key=lambda x: x["total"])
    return MemoryBreakdown(**{k: (v / GIB if isinstance(v, float) else v) for k, v in worst.items() if k != "phases"})


@lru_cache(maxsize=256)
def _linear_share(m: ModelSpec, experts: bool = True, apart: bool = False) -> float:
    """The fraction of the layers' parameters held by the Linear weights QLoRA quantizes (the routed experts' with
    ``experts``); ``apart``: of the layers' parameters but the routed experts' (held apart from the blocks, under EP)."""
    layers = sum(m.layer_params(i) for i in range(m.num_layers))
    linear = quantized_linear_weights(m, experts=experts)
    if apart:
        layers -= quantized_linear_weights(m) - quantized_linear_weights(m, experts=False)
    return min(1.0, linear / layers) if layers > 0 else 0.0


def _memory_of_pp_rank(m: ModelSpec, p: ParallelDims, tr: Training, pp_rank: int) -> dict:
    comp = DTYPE_BYTES[tr.compute_dtype]
    store = DTYPE_BYTES[tr.storage_dtype]
    spr = p.stages_per_rank_of(m.num_layers)
    g = _groups_of(m, p.tp, p.ep, p.pp, spr, p.v_schedule, pp_rank, tp_splits_vocab(m.architecture, tr.hf_class))
    head_tp = g.head_tp  # the logits and the head's gradient are whole where TP keeps the head whole
    if tr.hf_class and g.mtp:  # transformers' class drops the MTP layers (AutoModel's own builds them)
        g = replace(g, dense=g.dense - g.mtp, mtp=0.0)
    sp_, sg, so, se = _state_shards(p)
    ac = p.ac_applied
    style = ac_style(m, p, tr)
    lora = tr.lora
    # what trains on this rank: every parameter, or the adapters (split by TP like their base, the experts' by EP)
    if lora is None:
        train_dense, train_experts = g.dense, g.experts
        frozen_bytes = 0.0
    else:
        adapters = sum(n * lora.layer(k) for k, n in g.kinds.items())
        # the routed experts' adapters go with their experts: split over EP (without EP they are block parameters,
        # sharded by FSDP with the rest), never over TP (moe/parallelizer.py keeps routed experts EP-owned)
        expert_adapters = sum(n * lora.experts(k) for k, n in g.kinds.items())
        train_experts = expert_adapters / p.ep if p.ep > 1 else 0.0
        whole = sum(n * lora.whole(k) for k, n in g.kinds.items())  # (on modules the TP plan leaves whole)
        train_dense = (
            (adapters - expert_adapters - whole) / p.tp
            + whole
            + (expert_adapters if p.ep <= 1 else 0.0)
            + (lora.lm_head / head_tp if g.last else 0.0)
        )
        layer_bytes = expert_bytes = comp
        if lora.quant_bits:
            # (transformers' MoE classes hold the routed experts as 3D parameters, which bitsandbytes, replacing
            # Linear modules, leaves in the compute dtype: tests/unit/test_catalog.py builds each one)
            quantized_experts = not (tr.hf_class and m.is_moe)
            # (without EP the routed experts are block parameters: the blocks' share is over them too)
            share = _linear_share(m, quantized_experts, apart=not quantized_experts and p.ep > 1)
            layer_bytes = share * QLORA_BYTES[lora.quant_bits] + (1 - share) * comp
            expert_bytes = layer_bytes if quantized_experts else comp
        # (the multi-token-prediction layers, frozen with the rest, in the compute dtype)
        frozen_bytes = (
            g.dense_layers / sp_ * layer_bytes + g.experts / se * expert_bytes + (g.root + g.mtp) / sp_ * comp
        )
    # a VLM's towers: frozen in the compute dtype unless freeze_config leaves them trained (no LoRA on them); a frozen
    # vision tower's projector trains where freeze_vision_tower leaves it (Mistral3's multi_modal_projector; whole on
    # every TP rank, which AutoModel's plan leaves it)
    # (LoRA freezes every base parameter, the towers' too; a trained tower's projector trains with it)
    vision_trains, audio_trains = tr.train_towers and lora is None, tr.train_audio and lora is None
    projector = float(m.projector_params) if g.towers and lora is None and tr.train_projector else 0.0
    projector = 0.0 if vision_trains else projector
    train_dense += projector
    for tower, trains in ((g.towers - projector, vision_trains), (g.audio, audio_trains)):
        if tower and trains:
            train_dense += tower
        elif tower:  # frozen: FSDP-sharded, or whole on every rank where the recipe replicates frozen towers
            frozen_bytes += tower / (1.0 if tr.frozen_multimodal == "replicate" else sp_) * comp
    params = frozen_bytes + (train_dense / sp_ + train_experts / se) * store
    # parameters kept in fp32 (DeepSeek-V4's lm_head, hyper-connections, compressors, sinks): 4 bytes where the rest
    # take the storage (or, frozen, the compute) dtype, and AdamW's states in their dtype
    fp32_extra = g.fp32 / sp_ * (4 - (store if lora is None else comp))
    params += fp32_extra
    # MegatronFSDP's gradient buffer takes the reduce dtype (grad_reduce_in_fp32: fp32); with preserve_fp32_weights
    # and low-precision parameters it keeps an fp32 main copy of its optimizer shard, the optimizer's states follow
    # that copy, and fp32 copies of the gradient shards are made for the optimizer at the end of each backward
    # (finish_grad_sync, after the root's backward and its reduce-scatters) and dropped by the optimizer's zero_grad:
    # a step of several microbatches carries them through every later one (megatron_fsdp 0.5.0 run by the dry run:
    # Llama-3.2-1B within 0.1%)
    mfsdp = p.megatron_wraps
    grad_bytes = 4 if mfsdp and p.megatron_fp32_grads else store
    # (the copy is made whatever the parameters' dtype: AutoModel asks for fp32 main parameters)
    main_copy = mfsdp and p.megatron_fp32_main_weights and lora is None
    grads_sharded = (train_dense / sg + train_experts / se) * grad_bytes
    grads_sharded += g.fp32 / sg * (4 - grad_bytes) if lora is None else 0.0  # (fp32 units' gradients are fp32)
    opt_per = optimizer_states_per_param(tr, 4 if main_copy else None)
    optimizer = (train_dense / so + train_experts / se) * opt_per
    main_grads = (train_dense / so + train_experts / se) * 4 if main_copy else 0.0
    params += main_grads  # (the fp32 copy: as many bytes as its gradients)
    if lora is None and g.fp32:
        optimizer += g.fp32 / so * (tr.optimizer.state_bytes(4) - tr.optimizer.state_bytes(store))
    tokens = tr.micro_batch_size * tr.seq_len / p.cp
    n_mb, grad_acc = microbatches(p, tr)
    carried_main_grads = main_grads if n_mb * grad_acc > 1 else 0.0  # (see main_copy)
    inflight = in_flight_microbatches(p, n_mb, pp_rank, spr)
    saved = 0.0
    recompute = 0.0
    last_block = 0.0  # the largest one block saves (freed by the time its gradients are reduce-scattered)
    # the depths the MTP runs, each a decoder layer of the last layer's kind (a hybrid's: its sublayers' kinds), each
    # with its own activations and loss (one repeated layer runs at every depth: AutoModel's Nemotron-V3 class)
    mtp_layers = m.mtp_depths() if g.mtp else 0
    mtp_saved = 0.0  # what the MTP depths keep a token (their backward, a microbatch's first, frees it)
    mtp_kinds = list(m.mtp_layer_types) if m.mtp_layer_types else [m.layer_kind(m.num_layers - 1)]
    layer_plain = 0.0  # the largest one layer keeps while its forward runs (checkpointed or not)
    # A checkpointed MoE layer's recompute runs its routed experts' forward again while autograd keeps the rest of
    # what the layer saves: that working set (moe_forward_bytes) in place of what the experts keep, a token
    moe_recompute = 0.0
    for kind in set(g.kinds) | (set(mtp_kinds) if mtp_layers else set()):
        count = g.kinds.get(kind, 0)
        s, plain = _act_per_token(m, p, tr, kind, comp, style)
        # AutoModel's MoE parallelizer checkpoints the MTP blocks as the decoder's, but for a repeated depth's MoE
        # sublayers (FSDP cannot gather their experts again for a second recompute: apply_ac)
        mtp_s = plain if m.mtp_iterations and kind == "moe" else s
        saved += s * count + mtp_s * mtp_layers * mtp_kinds.count(kind)
        mtp_saved += mtp_s * mtp_layers * mtp_kinds.count(kind)
        last_block = max(last_block, s)
        layer_plain = max(layer_plain, plain)
        if ac and s < plain:
            recompute = max(recompute, plain)  # one block is re-materialized during backward
            if kind == "moe":
                routed = _routed_expert_bytes(m, tr.lora is None or bool(tr.lora.experts(kind))) * comp / 2
                moe_recompute = max(moe_recompute, plain - routed + moe_forward_bytes(m, tr) * comp / 2)
    vocab = m.vocab_size
    extra = per_layer_inputs_bytes(m, tr) * comp / 2 if g.first else 0.0
    loss_saved = loss_temp = 0.0
    if g.last:
        extra += 4 * m.hidden_size * comp / 2  # the final norm's input and output (the lm_head's input)
        per_saved, per_temp = LOSS_BYTES.get((tr.loss, tr.fp32_upcast), LOSS_BYTES.get((tr.loss, True), (4.0, 8.0)))
        if tr.loss == "TEParallelCrossEntropy":
            per_saved /= head_tp
        # each multi-token-prediction depth adds its own loss over the vocabulary (through the shared lm_head) and
        # keeps its input projection's input ([embedding, hidden]: 2h) and its final norm's input (h)
        loss_saved = per_saved * vocab * tokens * (1 + mtp_layers)
        if m.final_softcap and tr.loss not in LINEAR_CE:
            # Gemma-2's final_logit_softcapping: the tanh of the logits keeps its output (the logits' dtype) for
            # backward, on the logits as the loss takes them (transformers' Gemma2ForCausalLM; the dry run: one bf16
            # vocabulary row a token)
            loss_saved += comp * vocab * tokens
        loss_temp = per_temp * vocab * tokens
        extra += mtp_layers * 3 * m.hidden_size * comp
        mtp_saved += mtp_layers * 3 * m.hidden_size * comp
        # a linear cross entropy takes the head's own weight (prepare_lm_weight: lm_head.weight), which LoRA leaves
        # frozen: no gradient of it is made there (chunked_ce.py's backward: grad_weight only if needs_input_grad)
        head_grad = 1.0 if lora is None else 0.0
        if tr.loss == "ChunkedCrossEntropy":  # one chunk's logits and the fp32 + bf16 weight gradients
            loss_temp = (
                10.0 * vocab * min(tokens, CHUNKED_CE_TOKENS) + 6.0 * vocab * m.hidden_size / head_tp * head_grad
            )
        elif tr.loss == "FusedLinearCrossEntropy":
            # cut_cross_entropy's backward, as AutoModel calls it (accum_e_fp32 on, accum_c_fp32 left off): the head's
            # gradient in the weight's dtype and the hidden states' in fp32 (the dry run's stand-in, ChunkedCE, keeps
            # the head's in fp32 and bf16: 4 bytes an element more than this kernel)
            loss_temp = comp * vocab * m.hidden_size / head_tp * head_grad + 4.0 * tokens * m.hidden_size
            if tr.loss_gathers_head and head_tp > 1:
                # the whole head gathered from its TP shards, and the kernel's gradient of it (sliced back after)
                loss_temp += 2 * comp * vocab * m.hidden_size * (1 - 1 / head_tp)
    # torch's pipeline schedule keeps every microbatch's output on the last stage until the step ends (to return
    # them from step(); AutoModel does not pass return_outputs=False): the logits, or the hidden states a linear
    # cross entropy takes
    # DeepSeek-V4's fp32 head under FSDP: AutoModel shards its hyper-connection head in an fp32 unit whose policy
    # casts the unit's output to fp32 (deepseek_v4/fsdp.py, output_dtype), so the final norm's output and the logits,
    # which AutoModel casts back to that dtype, are fp32. Its MoE parallelizer shards only where the data-parallel mesh
    # (dp x cp) has more than one rank; without it they are in the compute dtype.
    fp32_logits = bool(g.fp32_head) and p.data_parallel_mesh_size > 1
    outputs = 0.0
    if p.pp > 1 and g.last:
        width = m.hidden_size if tr.loss in LINEAR_CE else vocab / head_tp
        # (the dry run of DeepSeek-V4 Pro's recipe: its last rank holds all 8 microbatches' fp32 logits at the peak)
        outputs = (4.0 if fp32_logits else comp) * width * tokens * n_mb
    acts = (saved + extra) * tokens * inflight + loss_saved + outputs
    acts += additive_mask_bytes(m, p, tr, comp) * inflight if g.n_layers else 0.0
    # the VLM step holds the model's logits until its backward is done
    vlm_logits = 0.0
    if tr.vlm_step and g.last and tr.loss not in LINEAR_CE:
        vlm_logits = comp * vocab / head_tp * tokens
        acts += vlm_logits
    if g.first and tr.tower_patches and vision_trains:
        # a trained vision tower keeps its blocks' inputs (checkpointed) or everything its backward needs; each CP
        # rank runs every patch unless frame sharding splits them
        images = tr.micro_batch_size * tr.tower_images
        per_rank = math.ceil(images / p.cp) if tr.tower_frame_sharded else images  # whole images, never split
        patches = per_rank * tr.tower_patches / max(tr.tower_images, 1)
        per_block = tr.tower_hidden if ac else tr.tower_block_elems
        acts += patches * tr.tower_layers * per_block * comp * inflight
    # FSDP: the lm_head (its own unit, kept gathered for the loss) and the root (final norm; with a tied,
    # frozen or pipeline-split embedding, the embedding too) stay unsharded through forward; a trainable
    # untied embedding is its own unit, resharded after forward without PP where the blocks are (embed_resharded). The last block stays too, and
    # the blocks that do not reshard after forward, and the experts with moe.reshard_after_forward false
    # (AutoModel's default).
    # on one rank AutoModel skips parallelization altogether: plain parameters, nothing gathered
    sharded = (
        p.strategy != "ddp"
        and not (p.strategy == "megatron_fsdp" and p.zero_dp_strategy < 3)
        and (p.world_size or 2) > 1
    )
    deferred = sharded and grad_sync_deferred(p, tr, n_mb * grad_acc)
    keep_blocks = not p.blocks_reshard or (deferred and p.pp > 1)
    # (MegatronFSDP's units are the decoder blocks alone: the embedding stays in its root's one bucket group)
    own_embed_unit = p.pp == 1 and not m.tie_word_embeddings and lora is None and p.strategy != "megatron_fsdp"
    # (it reshards after forward as the blocks do: AutoModel wraps it with the same reshard_after_forward, under EP
    # moe.reshard_after_forward, false by default, which keeps it gathered from its forward to its post-backward at
    # the step's end: the dry run of moonlight_16b_te_deepep and customizer_gpt_oss_full_sft_chat after the loss)
    embed_resharded = own_embed_unit and p.blocks_reshard
    root_held = g.root - (g.embed if embed_resharded else 0.0)
    if tr.frozen_multimodal == "root":
        # a frozen tower (by freeze_config, or by LoRA, which freezes every base parameter) and its projector held
        # gathered in the root unit (whole on every TP rank, which AutoModel's plans leave it): AutoModel's step on
        # fake tensors, Mistral3's and Gemma-3's VLM steps
        root_held += (0.0 if vision_trains else g.towers) + (0.0 if audio_trains else g.audio)
    # torch lowers a multi-stage pipeline schedule (interleaved, V) with explicit UNSHARD / RESHARD of whole stages,
    # keeping at most MAX_ACTIVE_STAGES of a rank's stages gathered (schedules._add_unshard_reshard)
    # (with a model part that is no FSDP module those actions do nothing: torch's runtime issues them only for an
    # FSDPModule stage, schedules.py _PipelineScheduleRuntime, so every stage that has run keeps what FSDP's own
    # hooks leave gathered: the dry run of glm_5_hellaswag_pp, 9 stages a rank, 80.4 GiB, 78 counted so, 73 with 3)
    active = (spr if p.model_part_unwrapped else min(spr, MAX_ACTIVE_STAGES)) if p.pp > 1 else 1
    kept = active / spr if p.pp > 1 else 1.0
    # Under PP with deferred sync torch's stage runs its backwards with reshard_after_backward off, so a stage's blocks
    # stay gathered from its backward on. A multi-stage schedule's UNSHARD gathers a stage whole before it runs and
    # keeps it until its RESHARD: up to MAX_ACTIVE_STAGES of them whole, the step's maximum (with 2 or 3 stages a
    # rank reached after the activation peak, where one stage fewer less a block is held: an overcount there). A
    # single-stage rank has no UNSHARD: blocks that reshard after forward (AutoModel's dense default: its "keep them
    # under PP" branch looks for pp on the data-parallel mesh and never engages) are freed again by the stage's next
    # forward, all but its last, so it holds that last block at the start of a backward and every block at the end
    # of one (the "end-of-stage-backward" phase below). Without deferral every backward reshards: a rank holds each
    # stage's last block (it never reshards after forward), and whole stages again only where it has more stages
    # than the schedule keeps active, so that its UNSHARD gathers evicted stages anew.
    multi_stage = p.pp > 1 and spr > 1
    forward_reshards = keep_blocks and p.blocks_reshard and p.pp > 1 and not multi_stage
    whole_stages = (keep_blocks and not forward_reshards) or (
        multi_stage and spr > MAX_ACTIVE_STAGES and not p.model_part_unwrapped
    )
    megatron = sharded and mfsdp
    # MegatronFSDP sizes its prefetch and its reduce-scatter queue from a block's parameters counted whole and fills
    # them with its local buckets (TP splits a block's matrices; its norms, replicated, are a rounding error here)
    mf_block = g.dense_layers / g.n_layers if g.n_layers else 0.0
    mf_whole = mf_block * p.tp
    # the blocks a backward holds gathered with sharded parameters: the block and those prefetched behind it
    mf_window = min(1 + megatron_prefetch_layers(mf_block, mf_whole, g.n_layers), g.n_layers) if megatron else 0
    # megatron-fsdp 0.5.0 hangs its root pre-backward hook on the model's last submodule's output (lm_head), which a
    # linear cross entropy never uses: the root's post-backward and finish_grad_sync never run, so nothing the
    # backward gathered is released and the tied head's gradient stays on its raw parameter, from one step to the
    # next (rules/fallbacks.py megatron-fsdp-linear-ce; megatron_fsdp 0.5.0 run by the dry run on Llama-3.2-1B):
    # every block's gathered bucket and the root's (beside the root's raw parameters, gathered as ever), held in every
    # phase (the backward gathers its window into buckets of its own all the same)
    unsynced = megatron and tr.megatron_root_unfired
    unsynced_held = (
        (g.dense_layers + g.experts + g.root) * comp + (g.embed * comp if lora is None and m.tie_word_embeddings else 0)
        if unsynced
        else 0.0
    )
    if whole_stages:
        blocks, experts_held = g.dense_layers * kept, g.experts * kept
    elif megatron:
        # MegatronFSDP releases each block after its forward and, in a step after the first, gathers nothing ahead
        # from the modules outside its units (the final norm's pre-forward prefetches only on the very first
        # forward): the root alone is gathered as backward starts. Its backward gathers a block with the window its
        # all-gather pipeline prefetches by size (megatron_prefetch_layers; megatron_fsdp 0.5.0 run by the dry run:
        # Llama-3.2-1B's last block's backward holds 10 of its 16 blocks: itself and the 9 prefetched behind it),
        # counted in the in-backward phase below.
        blocks = experts_held = 0.0
    elif multi_stage:
        blocks, experts_held = g.layer_dense * spr, g.layer_experts * spr
    else:
        blocks, experts_held = g.layer_dense, g.layer_experts
    unsharded = (root_held + blocks) * comp if sharded else 0.0
    if sharded and g.fp32_head:
        unsharded += g.fp32_head * (4 - comp)  # the fp32 head gathered whole in its own dtype
    if sharded and g.experts and p.ep_shard > 1:
        unsharded += experts_held * comp
    # every block of a single-stage rank at the end of its backward
    stage_gathered = 0.0
    if sharded and forward_reshards:
        stage_gathered = (root_held + g.dense_layers + (g.experts if g.experts and p.ep_shard > 1 else 0.0)) * comp
    # Deferred sync: every FSDP-managed trainable gradient on this rank, unsharded in the reduce dtype (fp32 by
    # AutoModel's default policy: grad_reduce_bytes), held from the first backward of a step to the last one's
    # reduce-scatter.
    held = train_dense + (train_experts if p.ep_shard > 1 else 0.0)
    last_stage_head = 0.0
    # (with several schedule steps a step, unless each step reduces, every stage holds them from the first step on)
    if p.pp > 1 and spr > 1 and n_mb <= p.pp and not (grad_acc > 1 and holds_across_schedule_steps(p, tr)):
        # torch's schedule reduces each stage's gradients right after that stage's last microbatch's backward; with
        # every microbatch in one round of the interleaved schedule, the stages finish one after another, so about
        # one stage's gradients are held at a time (with more rounds every stage holds them to the last round). While
        # the last rank's last stage runs its microbatches (its loss, its backward), that stage's held gradients
        # include the head's, whole (the dry run of glm_5.2_tulu3_4k_cudnn_100k's last rank: the head's fp32
        # gradient, 3.5 GiB, beside that stage's blocks' at its last microbatch's loss); reduced with that stage, it
        # is gone by the end of backward
        head = (g.lm_head if lora is None else lora.lm_head / head_tp) if g.last else 0.0
        held = (held - head) / spr
        last_stage_head = head
    reduce = grad_reduce_bytes(p, store)
    # MegatronFSDP's root bucket of unsharded gradients with sharded gradients, made at the final norm's backward
    mf_root_bucket = g.root * reduce if mfsdp and lora is None and p.zero_dp_strategy >= 2 else 0.0
    held_grads = held * reduce if deferred else 0.0
    # (the head's share where it is held with the last stage's: added to the moments of that stage's microbatches)
    head_held = last_stage_head * reduce if deferred else 0.0
    # torch's pipeline stage allocates, at its first step, a receive buffer for every microbatch's input (a stage
    # that is not the first) and for every microbatch's output gradient (one that is not the last) and never frees
    # them (stage._setup_forward_recv_info, _create_grad_recv_info), so they are there in every phase. AutoModel sizes
    # them from the stage's full hidden states (pipelining.functional._precompute_stage_shapes: no SP split). A
    # stage's input is its buffer, so the first layer's saved input is counted there; the schedule keeps each
    # in-flight stage output until its backward instead (only the first stage's input, the embedding's output, and
    # the last stage's output, the logits, differ from that one-for-one exchange)
    p2p = edge = 0.0
    if p.pp > 1:
        per_direction = n_mb
        if p.recv_pool_slack is not None and spr == 1:
            # pipeline.pp_recv_buffer_pool: AutoModel's ring of the stage's in-flight depth plus slack, at least two
            # (pipelining/recv_buffer_pool._ring_size), the other microbatches' buffers aliases of it
            per_direction = max(2, min(n_mb, p.pp - pp_rank + p.recv_pool_slack))
        buffers = (spr - (1 if g.first else 0)) + (spr - (1 if g.last else 0))
        # what crosses a stage boundary is the residual stream (DeepSeek-V4's get_pipeline_stage_metas: its hc_mult
        # streams; the dry run of its Pro recipe's last rank: 39 receive buffers [1, 4096, 4, 7168])
        carry = stage_carry_bytes(m, tr, p.cp)  # a token's IndexShare top-k carry (GLM-5.2), beside the residual stream
        p2p = buffers * per_direction * tokens * (m.residual_width * comp + carry)
        edge = (int(g.first) - int(g.last)) * tokens * m.residual_width * comp  # per in-flight microbatch
        acts += edge * inflight
        # the carry a stage sends is made by its forward (the fp32 cast of its running top-k) and kept with the
        # stage's output until its backward: one a stage-microbatch in flight, on every stage but the last
        acts += carry * tokens * inflight * (spr - (1 if g.last else 0))
    teacher = _teacher_bytes(tr, p, pp_rank, tokens, sp_, se) if tr.teacher is not None else 0.0
    resident = params + optimizer + teacher
    phases: list[tuple[str, float, float, float]] = []  # (phase, gradients, activations, other temporaries)
    # Accumulating without deferred sync, the gradients of the step's earlier microbatches (sharded, or in .grad on
    # one rank, where AutoModel does not parallelize) stay through the next one's backward: zero_grad runs after the
    # optimizer step (recipes/llm/train_ft.py)
    # Routed experts outside FSDP (ParallelDims.experts_outside_fsdp) keep plain .grad in the storage dtype from their
    # layer's backward to the optimizer step, deferral or not.
    # Under PP a schedule step's peak comes before most stages' backward, so within one step they are not counted
    # there, but from a step's second schedule step on every one of them is (gradient accumulation)...
    plain = p.experts_outside_fsdp
    plain_expert_grads = train_experts * store if plain and (p.pp == 1 or grad_acc > 1) else 0.0
    # ... and on the last stage, whose forwards and backwards alternate, from its second backward on, where the
    # activations in flight are as at its first: its own experts' (the dry run of nemotron_ultra_v3_squad's last
    # rank: its last stage's 14 expert gradients at the peak, in its fourth backward; minimax_m2.1_hellaswag_pp's
    # last rank, all 6.6 GiB of its one stage's)
    last_stage_expert_grads = 0.0
    if plain and p.pp > 1 and g.last and n_mb > 1:
        last_stage_expert_grads = train_experts / spr * store
    # (a pipeline schedule's own microbatches peak before their first backward: only its repeated steps count)
    accumulated = grads_sharded if grad_acc > 1 and not deferred else 0.0
    if grad_acc > 1:
        accumulated = max(accumulated, plain_expert_grads)
    # (within one backward they are made layer by layer: at the last layer's backward that layer's alone, all of them
    # by the first layer's, the late-backward moment, where the activations are gone: the dry run of
    # customizer_nemotron_nano_full_sft, one microbatch, peaks at its optimizer step, not beside every expert gradient)
    this_layer_plain = plain_expert_grads * g.layer_experts / g.experts if g.experts else 0.0
    # an fp32 lm_head (DeepSeek-V4's) runs its backward in fp32: the head's own unsharded fp32 gradient beside the
    # loss's temporaries and, where the logits are in the compute dtype, their gradient cast up (fp32 logits take the
    # loss's fp32 gradient as it is) (the dry run of AutoModel's class: the last stage peaks in the head)
    head_backward = 0.0
    if g.fp32_head and tr.loss not in LINEAR_CE:  # (theirs: loss_temp)
        upcast = 0.0 if fp32_logits else 4.0 * vocab / head_tp * tokens
        head_backward = upcast + (4.0 * g.lm_head if lora is None else 0.0)
    # a checkpointed layer is recomputed only when its backward runs, after the loss's temporaries are gone
    phases.append(
        (
            "start-of-backward",
            max(accumulated, last_stage_expert_grads),
            acts,
            unsharded + loss_temp + head_backward + p2p + held_grads + head_held,
        )
    )
    # a DSA layer's forward (and the recompute of a checkpointed one): its indexer's fp32 scores over every query-key
    # pair, at the layer's start (its normed input made, the rest of it not yet): beside everything in flight, the
    # running layer's own share of it and the microbatch's loss not yet made (indexer_scores_bytes)
    idx_mb, idx_tok = indexer_scores_bytes(m, tr, p.cp) if g.n_layers else (0.0, 0.0)
    indexer_scores = idx_mb + (idx_tok + comp * m.hidden_size) * tokens if idx_mb else 0.0
    if indexer_scores:
        running = acts - last_block * tokens - loss_saved
        phases.append(
            (
                "indexer-forward",
                max(accumulated, last_stage_expert_grads),
                max(running, 0.0),
                unsharded + indexer_scores + p2p + held_grads + head_held,
            )
        )
    if p.pp > 1 and not g.last and g.kinds.get("moe"):
        # a pipeline rank before the last peaks in a forward, beside everything in flight: its MoE layers' routed
        # experts' working set at the running layer's end (moe_forward_bytes)
        moe_fwd = moe_forward_bytes(m, tr) * comp / 2 * tokens
        phases.append(
            ("moe-forward", max(accumulated, last_stage_expert_grads), acts, unsharded + moe_fwd + p2p + held_grads)
        )
    # AutoModel's MoE sync mixin, where a step accumulates: every backward but the step's last leaves the units it
    # gathers gathered (reshard_after_backward off)
    mixin_accumulates = tr.fsdp_sync_mixin and prepares_accumulation(tr) and n_mb * grad_acc > 1
    head_forward_held = 0.0  # (the deferred gradients held at the head's forward)
    if head_gathers_in_forward(m, p, tr, g, lora, sharded):
        # The lm_head's own FSDP unit is gathered at its forward, the microbatch's last. FSDP2 keeps a forward
        # all-gather's output (the unit whole, in its parameter dtype) until the next unit's copy-out or, for the
        # last, the root's post-forward (_fsdp_param_group.py wait_for_unshard, _fsdp_state.py _post_forward): the
        # head's buffer beside its unsharded copy and its output, the logits (twice where LoRA adapts the head: its
        # base output and the LoRA branch's; each sequence's last token alone under a linear cross entropy), with
        # everything in flight but the microbatch's loss and output, not yet made. The dry run of
        # qwen3_moe_2layer_proxy_lora peaks there: the head's 0.59 GiB buffer and two bf16 logits over the gathered
        # embedding and head. The head does not reshard after forward; where its backward does not reshard it either
        # (AutoModel's MoE sync mixin when it accumulates, and torch's pipeline stage but in a step's last backward)
        # only a step's first microbatch gathers it, before any gradient is made or output kept.
        stays = p.pp > 1 or mixin_accumulates
        head_bytes = 4.0 if g.fp32_head else comp
        rows = tr.micro_batch_size if tr.loss in LINEAR_CE else tokens
        copies = 2 if lora is not None and "lm_head" in lora.adapted else 1
        head_out = copies * head_bytes * vocab / head_tp * rows
        earlier = 0.0 if stays else max(accumulated, last_stage_expert_grads)
        head_forward_held = 0.0 if stays else held_grads + head_held
        kept = outputs if stays else (outputs / n_mb if outputs else 0.0)
        phases.append(
            (
                "head-forward",
                earlier,
                max(acts - loss_saved - kept - vlm_logits, 0.0) + head_out,
                unsharded + g.lm_head * head_bytes + p2p + head_forward_held,
            )
        )
    # (without PP, on the rank's FSDP2 units, where blocks reshard after forward at all)
    mixin_keeps_gathered = (
        sharded
        and p.strategy == "fsdp2"
        and mixin_accumulates
        and p.pp == 1
        and not keep_blocks
        # (a VLM class's decoder units under its text module, which the mixin's walk does not reach with
        # wrap_outer_model false: grad_sync_deferred)
        and not (p.model_part_unwrapped and tr.vlm_step)
    )
    every = (root_held + g.dense_layers + g.mtp + (g.experts if g.experts and p.ep_shard > 1 else 0.0)) * comp
    if mixin_keeps_gathered:
        # so the next microbatch's forward starts with all of them gathered and reshards each after its own forward:
        # its first layers run beside every other unit still gathered (AutoModel's step on fake tensors, Nemotron-3
        # Super's LoRA benchmark)
        forward = max(layer_plain, moe_forward_bytes(m, tr) * comp / 2 if g.kinds.get("moe") else 0.0) * tokens
        phases.append(("next-microbatch-forward", accumulated, forward, every + p2p + held_grads))
    # eager attention's backward: one layer's scores' gradients, beside its saved scores
    eager_grads = eager_backward_bytes(m, p, tr, comp) * tokens if g.n_layers else 0.0
    # a block's backward, at the moment its gradients are made: its fresh gradient in the compute dtype and, without
    # deferral, its copy in the reduce dtype for the reduce-scatter (deferred, FSDP2 adds it into the accumulator
    # counted as held), its re-materialized activations, eager attention's score gradients, the torch dispatcher's tokens
    exp = g.layer_experts if p.ep_shard > 1 else 0.0
    layer_train = (g.layer_dense + exp) if lora is None else 0.0
    fresh_grads = layer_train * (comp + (0.0 if deferred else reduce))
    dispatch = _torch_dispatch_bytes(m, p, tr, g, tokens)
    blockdiag = blockdiag_attention_backward_bytes(m, p, tr, g, comp)
    ring = gemma4_ring_backward_bytes(m, p, tr, g, comp) + gathered_mla_backward_bytes(m, p, tr, g, comp) + blockdiag
    # (a recomputed DSA layer makes its indexer's scores again, before the rest of it)
    # (a recomputed MoE layer runs its routed experts' forward again: moe_recompute)
    remade = max(recompute * tokens, moe_recompute * tokens, indexer_scores) if recompute else 0.0
    block_transients = fresh_grads + remade + eager_grads + dispatch + ring
    if stage_gathered:
        # at the stage's first block's backward: every other block gathered again, that microbatch's saved tensors
        # and its loss's gone but that block's (its largest, at most), the others in flight and the kept outputs stay
        gone = (saved + extra) * tokens + edge + loss_saved + vlm_logits
        rest = max(acts - gone + last_block * tokens, 0.0)
        phases.append(
            ("end-of-stage-backward", accumulated, rest, stage_gathered + block_transients + p2p + held_grads)
        )
    # a tied head (one FSDP unit with the embedding, the root) gets its unsharded gradient in the loss's backward and
    # keeps it until the root's reduce-scatter, after the embedding's backward at the step's end
    tied_head_grad = (
        (g.embed + g.lm_head) * comp if sharded and lora is None and p.pp == 1 and m.tie_word_embeddings else 0.0
    )
    # the embedding's and head's sharded gradients (trained whole; under LoRA the adapters hold none of them)
    root_sharded = (g.embed + g.lm_head) / sg * store if lora is None else 0.0
    # Where the MTP embeds its shifted tokens with the model's embedding (each depth a call: mtp_calls_embedding), its
    # backward runs before the decoder's: the embedding's own unit is gathered there (FSDP's pre-backward; its
    # post-backward waits for the step's end, its inputs taking no gradient), and autograd holds the MTP's gradient
    # of the table until the decoder's embedding call adds its own, the step's last backward (the dry run of
    # nemotron_ultra_v3_te_deepep: both 2 GiB tables there at its first layer's backward)
    mtp_embeds = mtp_layers and mtp_calls_embedding(m.architecture, cp=p.cp, media=tr.tower_images > 0)
    # (the gathered table is counted in root_held where the embedding does not reshard after forward)
    mtp_embed = (2 if embed_resharded else 1) * g.embed * comp if sharded and mtp_embeds and own_embed_unit else 0.0
    if sharded:
        # the last block's backward: its unsharded gradients (compute dtype) and their fp32 copy for the
        # reduce-scatter, the next block's prefetched gather, every other activation still saved
        gather = 0.0 if whole_stages else comp
        grads_now = fresh_grads + (g.layer_dense + exp) * gather
        if megatron:
            # the block, those its backward prefetched behind it (in place of one block ahead), the block's unsharded
            # gradient bucket (each parameter's gradient is moved into it as it arrives: no block of them at once),
            # and the root's bucket, made when the final norm's gradient arrived (its group's first)
            grads_now = layer_train * reduce + (g.layer_dense + exp) * mf_window * comp + mf_root_bucket
        # (that microbatch's MTP depths are through their backward: the others in flight keep theirs)
        mid_acts = max(acts - (last_block + mtp_saved) * tokens, 0.0)
        phases.append(
            (
                "in-backward",
                max(accumulated, this_layer_plain, last_stage_expert_grads),
                mid_acts,
                unsharded
                + remade
                + eager_grads
                + p2p
                + grads_now
                + held_grads
                + head_held
                + dispatch
                + ring
                + tied_head_grad
                + mtp_embed,
            )
        )
        if g.n_layers > 1 and p.pp == 1 and not megatron:  # (MegatronFSDP's late backward: its own phases)
            # the first block's backward, the last of the step: every other block's gradients made and sharded, the
            # tied head's unsharded gradient held (see tied_head_grad), the VLM step's logits and (a linear cross
            # entropy asks for them) every layer's output still kept, the per-layer inputs made before the first
            # block, and that block's transients (nothing left to prefetch)
            layer_grads_late = max(grads_sharded - root_sharded - g.layer_dense / sg * store, 0)
            kept_outputs = (
                (g.n_layers + 1) * m.hidden_size * comp * tokens if tr.vlm_step and tr.loss in LINEAR_CE else 0.0
            )
            late_acts = vlm_logits + kept_outputs + (per_layer_inputs_bytes(m, tr) * comp / 2 + last_block) * tokens
            # (a hybrid's first block: no full-attention transient where it is a linear-attention layer)
            first_linear = bool(m.layer_attention) and m.layer_attention[0] != "full"
            first_block = block_transients - (blockdiag if first_linear else 0.0)
            # (FSDP's default backward prefetch gathers the unit before the first block in forward order, the
            # embedding, during that block's backward: counted where it resharded after forward and no MTP's use of
            # it has it gathered already)
            prefetched = g.embed * comp if embed_resharded and not mtp_embed else 0.0
            late_rest = tied_head_grad + first_block + p2p + held_grads + mtp_embed + prefetched
            phases.append(("late-backward", max(layer_grads_late, accumulated), late_acts, unsharded + late_rest))
            if mixin_keeps_gathered:
                # where the MoE sync mixin keeps units gathered after their backward, a microbatch's backward before
                # the step's last reaches its first blocks with every unit gathered again, each re-gathered by its own
                # backward (the dry run of nemotron_super_v3_lora peaks there: all 88 layers' units, the head's and the
                # MTP's live at its first MoE layer's recompute)
                phases.append(
                    (
                        "gathered-late-backward",
                        max(layer_grads_late, accumulated),
                        late_acts,
                        max(unsharded, every) + late_rest,
                    )
                )
        # the end: the layers' sharded gradients and, before its reduce-scatter, the last unit's unsharded
        # gradient in the compute dtype and its copy in the reduce dtype (the embedding, its own unit when untied and trainable;
        # else the root with the head)
        if lora is None:
            last_unit = g.embed if own_embed_unit else g.root
        else:
            last_unit = lora.lm_head / head_tp if g.last else 0.0
        layer_grads = max(grads_sharded - root_sharded, 0.0)
        if not megatron:
            # (an embedding of its own is gathered for its backward too, by FSDP's pre-backward, whether or not it
            # resharded after forward; an MTP's gradient of the table is summed into its own by then)
            end = last_unit * (comp + reduce) + held_grads + p2p + (g.embed * comp if own_embed_unit else 0.0)
            phases.append(("end-of-backward", layer_grads, 0.0, end))
    else:
        if eager_grads or (indexer_scores and recompute):
            phases.append(("in-backward", accumulated, acts, eager_grads + remade + p2p))
        if not mfsdp:
            phases.append(("end-of-backward", grads_sharded, 0.0, p2p))
    if mfsdp:
        # MegatronFSDP moves each parameter's gradient into its buffers as it arrives (a post-accumulate hook), but
        # a tied head's shared weight only in the root's post-backward, at the step's end: that gradient is held
        # through backward. With sharded gradients (zero_dp_strategy 2, 3) each block's gradients gather in an
        # unsharded bucket that its reduce-scatter queue keeps (megatron_queued_layers), and the root's bucket is
        # made at the final norm's backward; with sharded parameters (3) the root stays gathered. (megatron_fsdp 0.5.0
        # run by the dry run on Llama-3.2-1B, tied and untied, and on a 470M-element-block model whose queue fills,
        # at levels 0 to 3 and with preserve_fp32_weights, MaskedCrossEntropy.)
        tied = lora is None and m.tie_word_embeddings
        held_head = g.embed * comp if tied else 0.0
        gathered_root = g.root * comp if sharded else 0.0
        queued = 0
        if p.zero_dp_strategy >= 2:
            queued = megatron_queued_layers(mf_block, mf_whole, g.n_layers, p.zero_dp_strategy)
        if 0 < queued < g.n_layers:
            # the backward of the block after those that fill the queue: the blocks before it still hold what they
            # saved, the queue its buckets, this block its own bucket filling (each gradient moved in as it
            # arrives), the window gathered
            rest = max(acts - queued * last_block * tokens, 0.0)
            held = gathered_root + mf_window * mf_block * comp + (queued + 1) * layer_train * reduce
            phases.append(
                ("queue-full-backward", grads_sharded, rest, held + mf_root_bucket + held_head + recompute * tokens)
            )
        # the root's backward (the embedding's), the step's last: the shared weight's gradient, the embedding's and
        # their sum where the head is tied (the embedding's alone where it is not: the head's went into the root's
        # bucket as it arrived), the queue's buckets
        root_grads = 3 * g.embed * comp if tied else (g.embed * comp if lora is None else 0.0)
        buckets = queued * layer_train * reduce + mf_root_bucket
        phases.append(("end-of-backward", grads_sharded, 0.0, gathered_root + buckets + root_grads))
    # (the optimizer steps the fp32 copy where MegatronFSDP keeps one)
    step_temp = (train_dense / so + train_experts / se) * tr.optimizer.step_bytes(4 if main_copy else store, p.tp)
    # (MegatronFSDP keeps the root's bucket gathered from step to step under zero_dp_strategy 3: it preserves the
    # units outside its blocks when it resets its pipelines)
    kept_root = g.root * comp if megatron else 0.0
    phases.append(("optimizer-step", grads_sharded + main_grads - carried_main_grads, 0.0, step_temp + p2p + kept_root))
    if unsynced:
        phases = [(name, grads, acts_, rest + unsynced_held) for name, grads, acts_, rest in phases]
    if mfsdp:
        # MegatronFSDP's gradient buffer is made when it wraps the model and lives through the step
        phases = [
            (name, max(grads, grads_sharded) + carried_main_grads, acts_, rest) for name, grads, acts_, rest in phases
        ]
    phase, grads, activations, buffers = phases[0]
    for candidate in phases[1:]:
        if candidate[1] + candidate[2] + candidate[3] > grads + activations + buffers:
            phase, grads, activations, buffers = candidate
    tracked = resident + grads + activations + buffers
    overhead = overhead_bytes(tracked)
    return dict(
        params=float(params),
        grads=float(grads),
        optimizer=float(optimizer),
        activations=float(activations),
        buffers=float(buffers),
        overhead=float(overhead),
        total=float(tracked + overhead),
        model_states=float(params + grads_sharded + optimizer),
        tracked_peak=float(tracked),
        worst_pp_rank=pp_rank,
        peak_phase=phase,
        deferred_grads=float(
            held_grads
            if phase
            in (
                "start-of-backward",
                "indexer-forward",
                "moe-forward",
                "next-microbatch-forward",
                "gathered-late-backward",
                "in-backward",
                "end-of-stage-backward",
                "late-backward",
                "end-of-backward",
            )
            else 0.0
        )
        + (head_held if phase in ("start-of-backward", "indexer-forward", "in-backward") else 0.0)
        + (head_forward_held if phase == "head-forward" else 0.0),
        teacher=float(teacher),
        # every phase's (gradients, activations, other temporaries) in bytes, the peak's among them (tests read a
        # term where it is not the peak)
        phases={name: (float(gr), float(ac), float(rest)) for name, gr, ac, rest in phases},
    )


def gemma4_ring_backward_bytes(m: ModelSpec, p: ParallelDims, tr: Training, g: _Groups, comp: float) -> float:
    """The largest backward transient of Gemma-4's context-parallel ring attention (AutoModel's own class under CP:
    gemma4_moe/cp_attention.py, _Gemma4FlexRingAttention) among the rank's layer kinds. Its backward collects every
    ring chunk's keys and values again and recomputes the layer's attention chunk by chunk under autograd (flex
    attention per chunk on a contiguous copy of the query, merged online in fp32), then differentiates that graph (see
    ring_chunks_backward_bytes). A global (full) layer takes all ``cp`` chunks, a sliding one its own and the
    ``ceil(window / local length)`` before it (every sliding layer all of them with bidirectional vision attention on an
    image batch: not counted, the global layers' transient is the larger)."""
    if p.cp <= 1 or tr.hf_class or not is_gemma4_tower(m.hf_config) or not g.n_layers:
        return 0.0
    local = tr.seq_len / p.cp
    heads = m.num_attention_heads / p.tp
    out = 0.0
    for kind in set(m.layer_attention) & {"full", "sliding"} or {"full"}:  # (every kind: a stage holds whole periods)
        if kind == "sliding":
            head_dim, kv_heads = m.hd, m.num_key_value_heads
            chunks = 1 + min(p.cp - 1, math.ceil((m.sliding_window or tr.seq_len) / local))
        else:
            head_dim, kv_heads = m.full_head_dim or m.hd, m.full_kv_heads or m.num_key_value_heads
            chunks = p.cp
        tokens = tr.micro_batch_size * local
        out = max(out, ring_chunks_backward_bytes(tokens, heads, kv_heads / p.tp, head_dim, chunks, comp))
    return out


def _gathered_mla_per_token(m: ModelSpec, p: ParallelDims, tr: Training, comp: float) -> float:
    """Bytes per gathered token one MLA layer keeps for its backward under Kimi-Linear's CP: its flex attention's keys
    and values, each head's padded to a power of two (FlexAttention needs one: 192 -> 256 for the keys), and the latent
    norm's fp32 input and bf16 normalised output and product (kv_b_proj's input); 0 where that path is not taken."""
    if p.cp <= 1 or tr.hf_class or m.architecture not in OWN_MLA_ATTENTION or not m.kv_lora_rank:
        return 0.0
    if "full" not in m.layer_attention:
        return 0.0
    heads = m.num_attention_heads / p.tp
    qk = 1 << ((m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0) - 1).bit_length()
    v = 1 << ((m.v_head_dim or m.hd) - 1).bit_length()
    return heads * (qk + v) * comp + (4 + 2 + 2) * m.kv_lora_rank


def gathered_mla_kept_bytes(m: ModelSpec, p: ParallelDims, tr: Training, comp: float) -> float:
    """What Kimi-Linear's MLA layers keep of the gathered sequence, per local token and averaged over the layers (a
    stage holds whole periods): ``cp`` gathered tokens a local one, on the MLA share of the layers."""
    per_token = _gathered_mla_per_token(m, p, tr, comp)
    return per_token * p.cp * m.layer_attention.count("full") / m.num_layers if per_token else 0.0


def additive_mask_bytes(m: ModelSpec, p: ParallelDims, tr: Training, comp: float) -> float:
    """Kimi-Linear's additive [B, 1, S, S] causal mask (kimi_linear/model.py _make_causal_mask, from the batch's
    document map: build_document_causal_mask), one a microbatch in the compute dtype, held while its layers run
    (checkpointed blocks keep it as an input); none under CP, whose MLA layers mask by blocks."""
    if tr.hf_class or m.architecture not in OWN_MLA_ATTENTION or p.cp > 1 or "full" not in m.layer_attention:
        return 0.0
    return comp * tr.micro_batch_size * tr.seq_len * tr.seq_len


def gathered_mla_backward_bytes(m: ModelSpec, p: ParallelDims, tr: Training, g: _Groups, comp: float) -> float:
    """The backward transient of one MLA layer under Kimi-Linear's own context parallelism, over the gathered
    sequence (micro batch x seq_len tokens, not the rank's share): at its flex attention's backward the kernel's kept
    keys and values, each head's padded to a power of two (FlexAttention needs one: 192 -> 256 for the keys), and their
    gradients, beside the latent norm's fp32 input and its bf16 normalised output and product (kv_b_proj's input).
    Read from AutoModel's code (the gather, the expansion and the padding run as written under the dry run)."""
    kept = _gathered_mla_per_token(m, p, tr, comp) if g.n_layers else 0.0
    if not kept:
        return 0.0
    grads = kept - 8 * m.kv_lora_rank  # the keys' and values' gradients beside them
    return tr.micro_batch_size * tr.seq_len * (kept + grads)


def blockdiag_attention_backward_bytes(m: ModelSpec, p: ParallelDims, tr: Training, g: _Groups, comp: float) -> float:
    """The backward transient of one full-attention layer under AutoModel's block-diagonal CP
    (catalog/kernels.takes_blockdiag_cp) on the last rank of a CP group, whose documents reach back over the whole pack
    (one document filling it, as the dry run measures a pack): at flash-attn's varlen backward, the packed copies of
    the keys and values it reaches past its own share (kept for that backward) and their gradients, flash-attn 2's
    GQA buffers, dk and dv at the query's head count over every key (flash_api.cpp mha_varlen_bwd), and its fp32 dq
    accumulator for the rank's queries. Held to AutoModel's varlen attention around the dry run's stand-in
    (tests/oracle/test_flash_varlen.py) and to the dry run of the corpus's 122B recipe."""
    if not g.n_layers or not takes_blockdiag_cp(
        m.architecture, hf_class=tr.hf_class, cp=p.cp, packed_vlm=tr.packed_vlm
    ):
        return 0.0
    if m.layer_attention and "full" not in m.layer_attention:
        return 0.0
    keys = tr.micro_batch_size * tr.seq_len
    kv_heads = (m.full_kv_heads or m.num_key_value_heads) / p.tp
    return blockdiag_flash_backward_bytes(
        keys, keys / p.cp, tr.micro_batch_size, m.num_attention_heads / p.tp, kv_heads, m.full_head_dim or m.hd, comp
    )


def blockdiag_flash_backward_bytes(
    keys: float, local: float, sequences: int, heads: float, kv_heads: float, head_dim: int, comp: float
) -> float:
    """``blockdiag_attention_backward_bytes`` for a rank whose ``local`` queries reach ``keys`` keys: the packed key
    and value copies past its own share and their gradients, dk and dv expanded to the query's heads under GQA, and
    the fp32 dq accumulator. A document reaching back past the rank's share takes AutoModel's long-prefix guard, whose
    fixed-length flash call rounds each sequence's queries up to 128 rows (flash-attn 2's mha_bwd), the head dim as
    flash-attn 2 rounds it."""
    reach = 4 * (keys - local) * kv_heads * head_dim * comp
    expanded = 2 * keys * heads * head_dim * comp if kv_heads != heads else 0.0
    rows = flash_attn_dq_accum_rows(int(local), sequences, varlen=False)
    return reach + expanded + 4.0 * rows * heads * flash_attn_head_dim_rounded(head_dim)


def ring_chunks_backward_bytes(
    tokens: float, heads: float, kv_heads: float, head_dim: int, chunks: int, comp: float
) -> float:
    """Gemma-4's ring backward over ``chunks`` ring chunks of ``tokens`` local tokens (batch x local length), with U
    the query-shaped output: per chunk a bf16 output, an fp32 running output and the query's contiguous copy stay until
    the graph is differentiated (``4U``), with the chunk's keys and values (``2 KV``); the gradients' working set adds
    ``9U`` (the fp32 cast of the incoming gradient, the merge's fp32 gradients, the query's). Past 256 wide
    transformers' SDPA hands over keys and values repeated to every query head (GQA only up to 256: KV = U); narrower,
    the ring's contiguous copies of the rank's own keys and values add ``2 KV``. ``9U + 4nU + 2n KV (+ 2 KV)``,
    measured on AutoModel's ring on fake tensors with q, k, v as Gemma-4's attention hands them over
    (tests/oracle/test_gemma4_ring.py)."""
    u = tokens * heads * head_dim * comp
    repeated = head_dim > 256
    kv = u if repeated else tokens * kv_heads * head_dim * comp
    return (9 + 4 * chunks) * u + 2 * chunks * kv + (0.0 if repeated else 2 * kv)


def _torch_dispatch_bytes(m: ModelSpec, p: ParallelDims, tr: Training, g: _Groups, tokens: float) -> float:
    """The torch dispatcher's transient inside one MoE layer: GroupedExperts all-gathers every token of the EP group
    and builds an fp32 output of that size (k of them with the routing weights applied after the down projection)
    before its all-reduce (moe/experts.py); its backward mirrors it. Nothing of it is saved; DeepEP and HybridEP move
    only the rows this rank's experts need."""
    if p.ep <= 1 or not g.kinds.get("moe") or tr.dispatcher in LOCAL_DISPATCHERS:
        return 0.0
    out = 4.0 * (max(m.experts_per_token, 1) if not tr.hf_class and m.architecture in _ROUTER_AFTER_DOWN else 1)
    return p.ep * tokens * m.expert_dim * (DTYPE_BYTES[tr.compute_dtype] + out)


def _teacher_bytes(tr: Training, p: ParallelDims, pp_rank: int, tokens: float, sp_: float, se: float) -> float:
    """The KD teacher on a student rank. AutoModel builds it with the student's distributed setup (kd.py), so its
    weights are sharded (and pipeline-split) as the student's, in the compute dtype, with no gradients or
    optimizer states. Its forward runs without gradients and FSDP2 reshards a unit after forward only when told
    to: the layers reshard, but the root unit (AutoModel: reshard_after_forward False) and the output embedding
    (its own unit, kept gathered) stay gathered from the teacher's first forward on, since no backward ever
    reshards them (``tests/unit/test_estimate.py`` checks this on torch). The last stage also keeps the teacher's fp32
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
    "Optimizer",
    "ac_style",
    "MemoryBreakdown",
    "memory_per_rank",
    "in_flight_microbatches",
    "activation_formula_korthikanti",
    "GIB",
]
