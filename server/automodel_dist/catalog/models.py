"""Architectures of well-known models, keyed by Hugging Face repo id, plus HF config.json parsing.

Nothing is downloaded: the catalog (``catalog.json``) holds each model's config.json trimmed to the values that matter
for parallelism (heads, kv heads, layers, experts, sizes; ``configs/``), read by the same parser as a config.json in
the Hugging Face cache, and its published parameter total where one was at hand, which ``tests/unit/test_catalog.py``
checks against ``ModelSpec.param_count()`` (within 2%); every entry's count is also checked, exactly, against the
transformers class built from the same file on the meta device.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.files import is_file
from ..config.values import clip
from ..media import moonvit_merge


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (dense or MoE), or of a hybrid Mamba model (Nemotron-H: one mixer
    per layer, named by ``layer_types``), as parallelism sees it."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int  # dense MLP width (dense layers)
    vocab_size: int
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    attn_softcap: bool = False  # attn_logit_softcapping (Gemma-2): eager attention keeps a tanh of the scores too
    final_softcap: bool = False  # final_logit_softcapping (Gemma-2): the tanh of the logits is kept for backward
    norms_per_layer: int = 2
    # MoE
    num_experts: int = 0  # routed experts (0 = dense)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # total width of shared experts
    first_dense_layers: int = 0  # leading dense layers in an MoE model (DeepSeek first_k_dense_replace)
    expert_bias: bool = False
    # MLA (DeepSeek)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Hybrid (Nemotron-H): each layer is one norm and one mixer, "mamba", "attention", "mlp" or "moe"
    layer_types: tuple[str, ...] = ()  # empty: every layer is attention + (dense or MoE) MLP
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 0
    ssm_state_size: int = 0
    conv_kernel: int = 4
    # Falcon-H1 (transformers' FalconH1DecoderLayer): every decoder layer runs a Mamba-2 mixer beside its attention,
    # both on the layer's normed input, their scaled outputs summed, then the gated MLP; ``mamba_norm``: the mixer's
    # gated RMSNorm (Falcon-H1's mamba_rms_norm; Nemotron-H's mixers always have it)
    parallel_mamba: bool = False
    mamba_norm: bool = True
    # a scale the model's forward applies to its logits after lm_head (Falcon-H1's muP lm_head_multiplier; 1: none)
    logits_multiplier: float = 1.0
    gated_mlp: bool = True  # SwiGLU-style gate/up/down; False: up/down only (Nemotron-H's relu2)
    # AutoModel's experts run a torch.compile'd activation (moe/experts.py get_expert_activation_for_deepep:
    # Nemotron-3's relu2, GPT-OSS's quick_geglu, DeepSeek-V4's clamped SwiGLU): one fused kernel, its output alone
    fused_expert_activation: bool = False
    # transformers' python GELU (NewGELUActivation, "gelu_new": Phi-2) keeps its input, tanh, 0.5x and 1+tanh for
    # backward where a fused activation keeps its input alone
    python_gelu: bool = False
    mlp_names: tuple[str, str] = ("up_proj", "down_proj")  # the dense MLP's up and down Linears (Phi-2: fc1, fc2)
    o_name: str = "o_proj"  # the attention output Linear (Phi-2: dense)
    mlp_bias: bool = False  # biases on the dense MLP's projections (Phi-2, StarCoder2)
    norm_bias: bool = False  # LayerNorm with a bias (Phi-2, StarCoder2) instead of RMSNorm
    lm_head_bias: bool = False  # Phi-2
    qk_norm_full: bool = False  # q/k norms over the whole projection (OLMo-2) instead of per head
    shared_expert_gate: bool = False  # a sigmoid gate (Linear(h, 1)) on the shared expert (Qwen2-MoE, Qwen3-Next)
    router_scale: bool = False  # a learned per-channel scale on the router's input (Gemma-4's Gemma4Gate.scale)
    attn_output_gate: bool = False  # q_proj also emits a per-element output gate (Qwen3-Next's full attention)
    index_heads: int = 0  # DeepSeek-V3.2's sparse-attention indexer: heads, head dim (0: none), keys kept per query
    index_head_dim: int = 0
    index_topk: int = 0
    # layers that reuse an earlier layer's indexer selection and hold no indexer of their own (GLM-5.2's IndexShare:
    # config.json's indexer_types "shared", which AutoModel's glm_moe_dsa class builds without an indexer)
    index_shared_layers: tuple[int, ...] = ()
    # per-layer attention where it varies: "full" (Gemma-4's global layers: full_head_dim, full_kv_heads), "sliding",
    # "linear" (Qwen3-Next / Qwen3.5 Gated DeltaNet layers, which hold no KV heads); empty: every layer the same
    layer_attention: tuple[str, ...] = ()
    full_head_dim: int | None = None
    full_kv_heads: int | None = None
    full_k_eq_v: bool = False  # Gemma-4's attention_k_eq_v: the full layers' values are their keys (no v_proj)
    sliding_window: int | None = None  # the sliding layers' window (where layer_attention has them)
    # transformers' classes that mask every layer with the config's sliding_window (SLIDING_MASK_TYPES): from a
    # sequence of this length on, their SDPA mask is built (masking_utils._ignore_causal_mask_sdpa) and, with a mask,
    # the SDPA path repeats the keys and values to every query head (integrations/sdpa_attention.py use_gqa_in_sdpa)
    mask_window: int | None = None
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 4
    # which linear-attention mixer the "linear" layers hold: "gdn" (Qwen3-Next / Qwen3.5's Gated DeltaNet) or "kda"
    # (Kimi-Linear's Kimi Delta Attention: separate q/k/v projections, each with its own short conv, a low-rank
    # per-channel decay and output gate; its linear_* heads and dims are linear_attn_config's num_heads and head_dim)
    linear_mixer: str = "gdn"
    vision_params: int = 0  # a VLM's vision tower and projector (freeze_config freezes it by default)
    projector_params: int = 0  # the part of vision_params freeze_vision_tower leaves trainable (a VLM's projector)
    # Gemma-4's E-series (transformers' Gemma4TextModel): per-layer embeddings, ``per_layer_input`` wide a layer, from a
    # table of ``per_layer_vocab`` rows holding every layer's, and per layer a gate from the hidden state and a
    # projection back; its last ``kv_shared_layers`` layers read the keys and values of the last earlier layer of their
    # attention kind (no k/v projections or key norm of their own), their MLP twice as wide with ``double_wide_mlp``
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    # multi-token-prediction depths AutoModel's class builds (Qwen3.5's mtp_num_hidden_layers): each a full-attention
    # decoder layer of the model's MLP kind, its input projection from [embedding, hidden] (2h x h) and three norms;
    # both recipes add their loss (a second pass through the shared lm_head)
    mtp_layers: int = 0
    # the depths the MTP runs where its layer is repeated: AutoModel's Nemotron-V3 class with the recipe's
    # mtp_use_repeated_layer runs one physical depth num_nextn_predict_layers times (0: one run a layer)
    mtp_iterations: int = 0
    # a hybrid model's MTP depth (Nemotron-3 Super's mtp_hybrid_override_pattern "*E"): its sublayers' kinds, each a
    # norm and a mixer as in the backbone, with the depth's input projection and three norms around them
    mtp_layer_types: tuple[str, ...] = ()
    # latent MoE (Nemotron-3 Super's moe_latent_size): the routed experts work at this width, between a projection
    # from the hidden state and one back (fc1_latent_proj / fc2_latent_proj); the shared expert at the hidden width
    moe_latent_size: int = 0
    # DeepSeek-V4: hc_mult copies of the hidden state (its hyper-connections: two fp32 maps a layer mixing them into
    # and out of the attention and the MLP, one more before the head; 0: an ordinary residual); each layer's KV
    # compression ratio (layer_attention "sliding": the window alone; "csa": ratio 4, overlapping windows and an
    # indexer keeping index_topk compressed keys; "hca": compressed alone, at hca_ratio); the grouped low-rank output
    # projection; the leading layers routed by token id
    hc_mult: int = 0
    hca_ratio: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0
    hash_layers: int = 0
    hc_iters: int = 20  # the hyper-connections' Sinkhorn iterations (hc_sinkhorn_iters)
    mtp_attention: str = "sliding"  # DeepSeek-V4's MTP layers' kind (its compress_ratios entry after the decoder's)
    audio_params: int = 0
    published_params: float | None = None  # total parameters from the model card
    # config.json "architectures"[0], or the class AutoModel resolves where that name is shared (_implementation_name):
    # picks AutoModel's implementation
    architecture: str | None = None
    source: str | None = None
    aliases: tuple[str, ...] = field(default=())
    # The config.json this spec was read from (None for a spec built by hand): what the dry run and the smoke run build.
    hf_config: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    # ------------------------------------------------------------------ derived
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def residual_width(self) -> int:
        """The residual stream's width: what a block takes and a pipeline stage passes on (the hidden size;
        DeepSeek-V4's hc_mult streams of it)."""
        return self.hidden_size * max(1, self.hc_mult)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_hybrid(self) -> bool:
        return bool(self.layer_types)

    @property
    def mixes_layers(self) -> bool:
        """Attention mixed with other mixers (Mamba, linear attention): what AutoModel's CP capability calls hybrid."""
        return bool(self.layer_types) or "linear" in self.layer_attention

    def kv_head_counts(self) -> tuple[int, ...]:
        """The KV head counts of the layers that have attention heads (Gemma-4's global layers have their own)."""
        counts = {self.num_key_value_heads}
        if "full" in self.layer_attention and self.full_kv_heads:
            counts.add(self.full_kv_heads)
        return tuple(sorted(counts))

    @property
    def attention_layers(self) -> int:
        """Layers that hold attention heads (not Gated DeltaNet, not Mamba)."""
        if self.layer_types:
            return self.count("attention")
        return self.num_layers - self.layer_attention.count("linear")

    def count(self, layer_type: str) -> int:
        """Layers of a hybrid model with this mixer (0 for a uniform transformer)."""
        return self.layer_types.count(layer_type)

    @property
    def layer_mix(self) -> dict[str, int] | None:
        """Layers per mixer of a hybrid model (None for a uniform transformer)."""
        return {t: self.count(t) for t in sorted(set(self.layer_types))} or None

    def attention_kind(self, layer: int) -> str:
        """A layer's attention kind ("full", "sliding", "linear", ...), "-" where the model names none."""
        return self.layer_attention[layer] if layer < len(self.layer_attention) else "-"

    def layer_kind(self, layer: int) -> str:
        """ "dense" or "moe" for a transformer layer; the mixer ("mamba", "attention", "mlp", "moe") of a hybrid."""
        if self.layer_types:
            return self.layer_types[layer]
        return "moe" if self.is_moe and layer >= self.first_dense_layers else "dense"

    @property
    def mamba_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of a Mamba-2 layer's depthwise conv: x plus the B and C groups."""
        return self.mamba_inner + 2 * self.mamba_n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_width(self) -> int:
        """Width of a Mamba-2 layer's in_proj output (z, x, B, C, dt: the fused kernel's ``zxbcdt``)."""
        return self.mamba_inner + self.mamba_conv_dim + self.mamba_num_heads

    @property
    def num_moe_layers(self) -> int:
        if self.layer_types:
            return self.count("moe")
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def linear_attention_params(self) -> int:
        """One Gated DeltaNet block: in_proj_qkvz, in_proj_ba, the depthwise conv, dt_bias / A_log, its norm and
        out_proj. One KDA block (AutoModel's KimiDeltaAttention): q/k/v projections, their three depthwise convs
        (no bias), A_log a head and dt_bias a channel, the decay's and the output gate's low-rank pairs (h -> d ->
        width), beta's projection (a head), the gated norm (d) and o_proj."""
        h = self.hidden_size
        k, v = self.linear_key_heads * self.linear_key_dim, self.linear_value_heads * self.linear_value_dim
        if self.linear_mixer == "kda":
            d, heads = self.linear_value_dim, self.linear_value_heads
            convs = (2 * k + v) * self.linear_conv_kernel
            low_rank = 2 * (h * d + d * v)
            return h * (2 * k + v) + convs + heads + v + low_rank + h * heads + d + v * h
        return (
            h * (2 * k + 2 * v)
            + h * 2 * self.linear_value_heads
            + (2 * k + v) * self.linear_conv_kernel
            + 2 * self.linear_value_heads
            + self.linear_value_dim
            + v * h
        )

    def mean_attention_params(self) -> float:
        """Attention parameters per layer, averaged over the layers (they differ where layer_attention varies, and
        on KV-shared layers)."""
        if not self.layer_attention and not self.kv_shared_layers and not self.index_shared_layers:
            return float(self.attention_params())
        return sum(self.layer_attention_params(i) for i in range(self.num_layers)) / self.num_layers

    def kv_shared(self, layer: int) -> bool:
        """Whether ``layer`` reads an earlier layer's keys and values (Gemma-4's E-series: the last
        ``kv_shared_layers``)."""
        return layer >= self.num_layers - self.kv_shared_layers

    def layer_attention_params(self, layer: int) -> int:
        """One layer's attention parameters: its kind's, less the key and value projections and the key norm on a
        KV-shared layer (transformers' Gemma4TextAttention builds none there)."""
        kind = self.attention_kind(layer)
        kind = "" if kind == "-" else kind
        params = self.attention_params(kind)
        if layer in self.index_shared_layers:
            params -= self.indexer_params()
        if not self.kv_shared(layer):
            return params
        heads = self._of_kind(kind)
        hd, kv = heads.hd, heads.num_key_value_heads
        width = kv * hd * (1 if heads is not self and self.full_k_eq_v else 2)
        return params - (self.hidden_size + int(self.qkv_bias)) * width - (hd if self.qk_norm else 0)

    def _of_kind(self, kind: str) -> ModelSpec:
        """The spec with the head width and KV heads of a layer of attention ``kind`` (Gemma-4's global layers have
        their own: ``full_head_dim``, ``full_kv_heads``); itself for every other kind."""
        if kind != "full" or not (self.full_head_dim or self.full_kv_heads):
            return self
        return replace(
            self,
            head_dim=self.full_head_dim or self.head_dim,
            num_key_value_heads=self.full_kv_heads or self.num_key_value_heads,
            layer_attention=(),
        )

    def layer_mlp_params(self, layer: int) -> int:
        """A dense layer's MLP: twice as wide on a KV-shared layer with ``double_wide_mlp``."""
        wide = self.double_wide_mlp and self.kv_shared(layer)
        return (
            replace(self, intermediate_size=2 * self.intermediate_size).dense_mlp_params()
            if wide
            else (self.dense_mlp_params())
        )

    def mean_dense_mlp_params(self) -> float:
        """A dense layer's MLP parameters averaged over the layers (the double-wide ones count twice)."""
        if not self.double_wide_mlp:
            return float(self.dense_mlp_params())
        return sum(self.layer_mlp_params(i) for i in range(self.num_layers)) / self.num_layers

    def mean_intermediate_size(self) -> float:
        """The dense MLP's width averaged over the layers (the double-wide ones count twice)."""
        wide = self.kv_shared_layers if self.double_wide_mlp else 0
        return self.intermediate_size * (1 + wide / self.num_layers)

    def ple_table_params(self) -> int:
        """The per-layer embedding table: every layer's input, a row a token of its vocabulary."""
        return self.per_layer_vocab * self.num_layers * self.per_layer_input

    def ple_params(self) -> int:
        """The per-layer embeddings' model-level parameters: the table, the projection of the token embedding to every
        layer's input and its norm (none without per-layer inputs)."""
        n = self.num_layers * self.per_layer_input
        return self.ple_table_params() + self.hidden_size * n + self.per_layer_input if n else 0

    def indexer_params(self) -> int:
        """One DSA indexer (DeepSeek-V3.2's, GLM-5's): wq_b from the query latent, wk and its LayerNorm,
        weights_proj; 0 without one."""
        ih, idim, h = self.index_heads, self.index_head_dim, self.hidden_size
        return (self.q_lora_rank or h) * ih * idim + h * idim + 2 * idim + h * ih if ih else 0

    def ple_layer_params(self) -> int:
        """One layer's per-layer-input gate and projection and the norm after them."""
        return 2 * self.hidden_size * self.per_layer_input + self.hidden_size if self.per_layer_input else 0

    def attention_params(self, kind: str = "") -> int:
        """Parameters of one attention block (projections, biases, norms inside attention); ``kind`` "full" for
        Gemma-4's global layers, "linear" for a Gated DeltaNet layer."""
        if kind == "linear":
            return self.linear_attention_params()
        if self.hc_mult:
            return self.dsv4_attention_params(kind)
        if (full := self._of_kind(kind)) is not self:
            shared_v = full.num_key_value_heads * full.hd * (self.hidden_size + int(self.qkv_bias))
            return full.attention_params() - (shared_v if self.full_k_eq_v else 0)
        h = self.hidden_size
        if self.kv_lora_rank:  # MLA
            nh = self.num_attention_heads
            qk = (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
            q = (
                (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk)
                if self.q_lora_rank
                else h * nh * qk
            )
            kv = h * (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) + self.kv_lora_rank
            kv += self.kv_lora_rank * nh * ((self.qk_nope_head_dim or 0) + (self.v_head_dim or 0))
            o = nh * (self.v_head_dim or 0) * h
            return q + kv + o + self.indexer_params()
        q = self.num_attention_heads * self.hd
        kv = self.num_key_value_heads * self.hd
        # values and the output projection at v_head_dim where it differs from the q/k head dim (MiMo-V2-Flash)
        v = self.num_key_value_heads * (self.v_head_dim or self.hd)
        o = self.num_attention_heads * (self.v_head_dim or self.hd)
        params = h * q * (2 if self.attn_output_gate else 1) + h * kv + h * v + o * h
        if self.qkv_bias:
            params += q + kv + v
        if self.o_bias:
            params += h
        params += self.qk_norm_params()
        if self.attention_sinks:
            params += self.num_attention_heads
        return params

    def dsv4_compression_ratio(self, kind: str) -> int:
        """A DeepSeek-V4 layer kind's KV compression ratio (0: the sliding window alone)."""
        return {"csa": 4, "hca": self.hca_ratio}.get(kind, 0)

    def dsv4_compressor_width(self, kind: str) -> int:
        """A DeepSeek-V4 compressor's kv and gate width: twice the head width where ratio-4 windows overlap (AutoModel's
        DeepseekV4Compressor: overlap = ratio == 4), the head width at another ratio, 0 without one."""
        ratio = self.dsv4_compression_ratio(kind)
        return (2 if ratio == 4 else 1) * self.hd if ratio else 0

    def dsv4_attention_params(self, kind: str) -> int:
        """One DeepSeek-V4 attention block (AutoModel's DeepseekV4Attention): the query's low-rank pair and its norm,
        one shared key-value head and its norm, the grouped low-rank output (o_groups blocks of heads * head_dim /
        o_groups -> o_lora_rank, then -> hidden), a sink logit a head; on a compressed layer its compressor (kv and
        gate projections, twice the head width where ratio-4 windows overlap, a position table of ratio rows, a
        norm); on a "csa" layer the indexer (its query from the query latent, a weight a head, its own overlapping
        compressor at index_head_dim)."""
        h, d, heads, q = self.hidden_size, self.hd, self.num_attention_heads, self.q_lora_rank or 0
        params = h * q + q + q * heads * d + h * d + d + heads * d * self.o_lora_rank
        params += self.o_groups * self.o_lora_rank * h + heads
        ratio, width = self.dsv4_compression_ratio(kind), self.dsv4_compressor_width(kind)
        if ratio:
            params += 2 * h * width + ratio * width + d
        if kind == "csa":
            ih, idim = self.index_heads, self.index_head_dim
            params += q * ih * idim + h * ih + 2 * h * 2 * idim + 4 * 2 * idim + idim
        return params

    def hc_params(self) -> int:
        """One DeepSeek-V4 hyper-connection (fp32): its map from the hc_mult streams to (2 + hc_mult) * hc_mult
        mixing weights, their bias and three scales."""
        m = self.hc_mult
        mix = (2 + m) * m
        return mix * m * self.hidden_size + mix + 3 if m else 0

    def hc_head_params(self) -> int:
        """DeepSeek-V4's hyper-connection head (fp32): the streams' weights before the final norm."""
        m = self.hc_mult
        return m * m * self.hidden_size + m + 1 if m else 0

    def fp32_layer_params(self, kind: str) -> int:
        """One DeepSeek-V4 layer's fp32 parameters (AutoModel builds them fp32 whatever the model's dtype): its sinks,
        its compressors' projections and position tables, its two hyper-connections; 0 for every other model."""
        if not self.hc_mult:
            return 0
        idim, h = self.index_head_dim, self.hidden_size
        ratio, width = self.dsv4_compression_ratio(kind), self.dsv4_compressor_width(kind)
        n = self.num_attention_heads + 2 * h * width + ratio * width
        if kind == "csa":
            n += 2 * h * 2 * idim + 4 * 2 * idim
        return n + 2 * self.hc_params()

    def fp32_head_params(self) -> int:
        """The fp32 parameters at the head (DeepSeek-V4's lm_head and hyper-connection head; 0 for other models)."""
        return self.lm_head_params() + self.hc_head_params() if self.hc_mult else 0

    def fp32_param_count(self) -> int:
        """Parameters the model keeps in fp32 whatever its dtype (DeepSeek-V4's lm_head, hyper-connections,
        compressors and attention sinks); 0 for every other model."""
        if not self.hc_mult:
            return 0
        layers = sum(self.fp32_layer_params(k) for k in self.layer_attention)
        mtp = self.mtp_layers * (self.fp32_layer_params(self.mtp_attention) + self.hc_head_params())
        return layers + mtp + self.fp32_head_params()

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def dense_mlp_params(self) -> int:
        bias = (self.mlp_matrices - 1) * self.intermediate_size + self.hidden_size if self.mlp_bias else 0
        return self.mlp_matrices * self.hidden_size * self.intermediate_size + bias

    @property
    def expert_dim(self) -> int:
        """The width the routed experts take and return (a routed token's width in dispatch): the latent width of a
        latent MoE, else the hidden size."""
        return self.moe_latent_size or self.hidden_size

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        h, i = self.expert_dim, self.moe_intermediate_size
        return self.mlp_matrices * h * i + ((2 * i + h) if self.expert_bias else 0)

    def moe_nonexpert_params(self) -> int:
        """Router, shared experts and latent projections of one MoE layer (not split by EP)."""
        router = self.num_experts * self.hidden_size + (self.num_experts if self.expert_bias else 0)
        gate = self.hidden_size if self.shared_expert_gate else 0
        scale = self.hidden_size if self.router_scale else 0
        latent = 0
        if self.moe_latent_size:
            latent = 2 * self.hidden_size * self.moe_latent_size
            latent += (self.moe_latent_size + self.hidden_size) if self.expert_bias else 0
        shared = self.mlp_matrices * self.hidden_size * self.shared_expert_intermediate_size
        return router + gate + scale + latent + shared

    def mamba_params(self) -> int:
        """One Mamba-2 mixer: in_proj (z, x, B, C, dt), depthwise conv1d with bias, dt_bias / A_log / D per head,
        the gated RMSNorm and out_proj."""
        h, inner, heads = self.hidden_size, self.mamba_inner, self.mamba_num_heads
        norm = inner if self.mamba_norm else 0
        return (
            h * self.mamba_in_proj_width + self.mamba_conv_dim * (self.conv_kernel + 1) + 3 * heads + norm + inner * h
        )

    def mixer_params(self, layer_type: str) -> int:
        """Parameters of one hybrid layer's mixer (its norm not included)."""
        if layer_type == "mamba":
            return self.mamba_params()
        if layer_type == "attention":
            return self.attention_params()
        if layer_type == "mlp":
            return self.dense_mlp_params()
        return self.num_experts * self.expert_params() + self.moe_nonexpert_params()

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        if self.tie_word_embeddings:
            return 0
        return self.vocab_size * self.hidden_size + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def norm_params(self) -> int:
        """One norm's parameters (a LayerNorm's bias included)."""
        return self.hidden_size * (2 if self.norm_bias else 1)

    def qk_norm_params(self) -> int:
        """The q and k norms of one attention block (replicated under TP): per head, or over the whole projections."""
        if not self.qk_norm:
            return 0
        return (self.num_attention_heads + self.num_key_value_heads) * self.hd if self.qk_norm_full else 2 * self.hd

    def layer_params(self, layer: int) -> int:
        """All parameters of decoder layer ``layer``."""
        norms = self.norms_per_layer * self.norm_params
        if self.layer_types:
            return self.mixer_params(self.layer_types[layer]) + norms
        if self.is_moe and layer >= self.first_dense_layers:
            mlp = self.num_experts * self.expert_params() + self.moe_nonexpert_params()
        else:
            mlp = self.layer_mlp_params(layer)
        mamba = self.mamba_params() if self.parallel_mamba else 0
        hc = 2 * self.hc_params()
        return self.layer_attention_params(layer) + mlp + norms + self.ple_layer_params() + mamba + hc

    def mtp_depths(self) -> int:
        """The MTP depths a forward runs, each with its own activations and loss (its layers', or its one repeated
        layer's iterations)."""
        return self.mtp_iterations or self.mtp_layers

    def mtp_params(self) -> int:
        """The multi-token-prediction layers' parameters (none where the model has none)."""
        if not self.mtp_layers:
            return 0
        last = self.num_layers - 1
        h = self.hidden_size
        if self.hc_mult:  # DeepSeek-V4's MTP block: its own hyper-connections and head, a final norm
            mlp = self.num_experts * self.expert_params() + self.moe_nonexpert_params()
            layer = self.attention_params(self.mtp_attention) + mlp + 2 * self.hc_params() + self.hc_head_params()
            return self.mtp_layers * (layer + 2 * h * h + 5 * self.norm_params)
        if self.mtp_layer_types:  # a hybrid's depth: its sublayers as the backbone's kinds
            sublayers = sum(
                self.mixer_params(t) + self.norms_per_layer * self.norm_params for t in self.mtp_layer_types
            )
            return self.mtp_layers * (sublayers + 2 * h * h + 3 * self.norm_params)
        mlp = self.layer_params(last) - self.attention_params(self.attention_kind(last))  # the MLP kind of a late layer
        layer = self.attention_params("full" if self.layer_attention else "") + mlp  # AutoModel makes it full attention
        return self.mtp_layers * (layer + 2 * h * h + 3 * self.norm_params)

    @property
    def mtp_moe_layers(self) -> int:
        """MoE layers among the MTP depths: a hybrid's MoE sublayers, else each depth where the model's last layer,
        whose MLP kind an MTP layer takes, is MoE (Qwen3.5-MoE's)."""
        if not self.mtp_layers or not self.is_moe:
            return 0
        if self.mtp_layer_types:
            return self.mtp_layers * self.mtp_layer_types.count("moe")
        return self.mtp_layers if self.layer_kind(self.num_layers - 1) == "moe" else 0

    def mtp_expert_params(self) -> int:
        """The routed experts of the MTP depths: split by EP as the backbone's are (AutoModel's MoE parallelizer walks
        the MTP blocks with the decoder's)."""
        return self.mtp_moe_layers * self.num_experts * self.expert_params()

    def param_count(self) -> int:
        """Total parameters (embedding + layers + final norm + untied lm_head + MTP layers)."""
        if self.layer_types:
            layers = sum(
                self.count(t) * (self.mixer_params(t) + self.norms_per_layer * self.hidden_size)
                for t in set(self.layer_types)
            )
            return self.embedding_params() + layers + self.hidden_size + self.lm_head_params() + self.mtp_params()
        towers = self.vision_params + self.audio_params
        if self.layer_attention or self.kv_shared_layers or self.index_shared_layers:
            layers = sum(self.layer_params(i) for i in range(self.num_layers))
        else:
            layers = self.num_dense_layers * self.layer_params(0)
            if self.is_moe:
                layers += self.num_moe_layers * self.layer_params(self.num_layers - 1)
        embeddings = self.embedding_params() + self.ple_params()
        head = self.norm_params + self.lm_head_params() + self.hc_head_params()
        return embeddings + layers + head + towers + self.mtp_params()

    def active_param_count(self) -> int:
        """Parameters touched per token (only ``experts_per_token`` routed experts; of Gemma-4's per-layer
        embedding table, one row a layer: a lookup, left out like an idle expert)."""
        table = self.ple_table_params()
        if not self.is_moe:
            return self.param_count() - table
        moe_layers = self.num_moe_layers + self.mtp_moe_layers
        idle = moe_layers * (self.num_experts - self.experts_per_token) * self.expert_params()
        return self.param_count() - idle - table


CATALOG_DIR = Path(__file__).resolve().parent  # catalog.json and configs/: package data


@functools.cache
def _catalog() -> tuple[tuple[ModelSpec, ...], dict[str, ModelSpec]]:
    """The entries of catalog.json, each read from its trimmed config.json by :func:`from_hf_config` (the parser the
    Hugging Face cache goes through), and every name and alias lowered -> its entry."""
    index = json.loads((CATALOG_DIR / "catalog.json").read_text(encoding="utf-8"))
    specs = []
    for entry in index["models"]:
        cfg = json.loads((CATALOG_DIR / entry["config"]).read_text(encoding="utf-8"))
        name = entry["name"]
        specs.append(
            replace(
                from_hf_config(cfg, name=name),
                published_params=entry["published_params"],
                source=f"https://huggingface.co/{name}",
                aliases=tuple(entry.get("aliases", ())),
            )
        )
    by_name = {n.lower(): spec for spec in specs for n in (spec.name, *spec.aliases)}
    return tuple(specs), by_name


def catalog() -> list[ModelSpec]:
    """Every catalog entry (aliases not repeated)."""
    return list(_catalog()[0])


def lookup(name: str) -> ModelSpec | None:
    """Case-insensitive lookup by Hugging Face repo id (or an alias such as an -Instruct variant)."""
    spec = _catalog()[1].get(name.strip().lower())
    return replace(spec, name=spec.name) if spec else None


def close_matches(name: str, n: int = 3) -> list[str]:
    if len(name) > 200:  # no catalog name is near it
        return []
    names = [s.name for s in _catalog()[0]]
    lowered = {x.lower(): x for x in names}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)
    return [lowered[h] for h in hits]


# --------------------------------------------------------------------------- HF config.json
class ModelConfigError(ValueError):
    """A model argument that cannot be turned into a :class:`ModelSpec`."""


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


MAX_DIM = 1 << 24  # far above any real hidden size, vocabulary, layer, head or expert count


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DIM:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}... ({len(repr(value)):,} characters)"
        raise ModelConfigError(f"config.json field {key!r} must be an integer in [0, {MAX_DIM:,}], got {shown}")
    return value


def _opt_int(cfg: dict[str, Any], key: str) -> int | None:
    return None if cfg.get(key) is None else _int(cfg[key], key)


def from_hf_config(cfg: dict[str, Any], *, name: str | None = None) -> ModelSpec:
    """Build a spec from a Hugging Face ``config.json`` dict (text_config is used for multimodal); the spec keeps
    the dict (``hf_config``)."""
    if not isinstance(cfg, dict):
        raise ModelConfigError("a model config must be a JSON object")
    return replace(_spec_of(cfg, name=name), hf_config=cfg)


def _tower_params(cfg: Any, text_hidden: int | None) -> int:
    """A ViT-style tower's parameters (attention, MLP, norms per layer, the patch embedding and a projector to
    the text width): approximate, for the memory of the tower AutoModel keeps (frozen by default)."""
    if not isinstance(cfg, dict):
        return 0
    h = _first(cfg, "hidden_size", "embed_dim", "width")
    layers = _first(cfg, "num_hidden_layers", "depth", "num_layers")
    if not (is_int(h) and is_int(layers)) or h <= 0 or layers <= 0:
        return 0
    h, layers = _int(h, "vision_config.hidden_size"), _int(layers, "vision_config.num_hidden_layers")
    inter = (
        _int(cfg["intermediate_size"], "vision_config.intermediate_size")
        if is_int(cfg.get("intermediate_size"))
        else 4 * h
    )
    patch = _int(cfg["patch_size"], "vision_config.patch_size") if is_int(cfg.get("patch_size")) else 14
    exact = _qwen_or_siglip_tower(cfg, h, layers, inter, patch, text_hidden)
    if exact is not None:
        return exact
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    projector = h * text_hidden if text_hidden else 0
    return layers * per_layer + 3 * patch * patch * h + projector


def _qwen_or_siglip_tower(
    cfg: dict[str, Any], h: int, layers: int, inter: int, patch: int, text_hidden: int | None
) -> int | None:
    """The exact parameters of the towers transformers builds for Qwen2.5-VL (windowed blocks, gated MLP, RMSNorm),
    Qwen3-VL / Qwen3.5 (LayerNorm, learned position table, DeepStack mergers) and Gemma-3's SigLIP with its projector
    (the catalog test builds each in transformers); None for another tower."""
    channels = cfg.get("in_channels", cfg.get("in_chans", cfg.get("num_channels", 3)))
    out = cfg.get("out_hidden_size")
    merge, temporal = cfg.get("spatial_merge_size", 2), cfg.get("temporal_patch_size", 2)
    if not all(is_int(v) for v in (channels, merge, temporal)):
        return None
    if "fullatt_block_indexes" in cfg or "window_size" in cfg:  # Qwen2.5-VL
        if not is_int(out):
            return None
        block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 3 * h * inter + 2 * inter + h
        hm = h * merge * merge
        return channels * temporal * patch * patch * h + layers * block + h + (hm * hm + hm) + (out * hm + out)
    if "num_position_embeddings" in cfg:  # Qwen3-VL, Qwen3.5
        positions, deepstack = cfg["num_position_embeddings"], cfg.get("deepstack_visual_indexes") or []
        if not (is_int(out) and is_int(positions) and isinstance(deepstack, list)):
            return None
        block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h * inter + inter + h
        hm = h * merge * merge
        merger = (hm * hm + hm) + (out * hm + out)
        tower = (channels * temporal * patch * patch * h + h) + positions * h + layers * block
        return tower + (2 * h + merger) + len(deepstack) * (2 * hm + merger)
    if cfg.get("model_type") == "pixtral" and text_hidden and is_int(cfg.get("spatial_merge_size")):
        # Pixtral's tower (a bias-free patch convolution, RMSNorms, a gated MLP, q/k/v/o without bias) and Mistral3's
        # projector (an RMSNorm, the patch merger's linear over merge x merge patches, then two linears to the text
        # width, with the config's multimodal_projector_bias): the outer config's keys, handed in by _spec_of
        block = 2 * h + 4 * h * h + 3 * h * inter
        return channels * patch * patch * h + h + layers * block + _mistral3_projector(cfg, text_hidden)
    if cfg.get("model_type") == "muse_glimmer_vision" and text_hidden and is_int(cfg.get("projector_hidden_size")):
        # AutoModel's native Muse-Glimmer tower (muse_glimmer/vision.py): a bias-free linear patch embedding over
        # patch_temporal x channels x patch^2 pixels, a learned pos_emb_height x pos_emb_width table, LayerNorms
        # around biased q/k/v/o and a GELU MLP, then its adapter over merge x merge patches (two bias-free linears
        # to projector_hidden_size) and the projection to the text width; the outer config's projector width is
        # handed in by _spec_of
        temporal, merge = cfg.get("patch_temporal", 2), cfg.get("merge_size", 2)
        table = cfg.get("pos_emb_height", 32), cfg.get("pos_emb_width", 32)
        if not all(is_int(v) for v in (temporal, merge, *table)):
            return None
        block = 4 * h + 4 * (h * h + h) + 2 * h * inter + inter + h
        embed = temporal * channels * patch * patch * h + table[0] * table[1] * h + 2 * h
        adapter = cfg["projector_hidden_size"]
        return embed + layers * block + 2 * h + (h * merge * merge + adapter) * adapter + adapter * text_hidden
    if cfg.get("model_type") == "moonvit" and text_hidden:
        # Kimi-VL's MoonViT (kimivl/model.py): a biased patch convolution and a learned position table of
        # init_pos_emb_height x width, LayerNorm blocks with a biased fused qkv, output projection and GELU MLP, a
        # final LayerNorm; then its projector over merged patches
        table = cfg.get("init_pos_emb_height", 64), cfg.get("init_pos_emb_width", 64)  # MoonViTConfig's defaults
        if not all(is_int(v) for v in table):
            return None
        block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h * inter + inter + h
        embed = channels * patch * patch * h + h + table[0] * table[1] * h
        return embed + layers * block + 2 * h + _kimi_vl_projector(cfg, text_hidden)
    if cfg.get("model_type") == "gemma4_vision" and text_hidden:
        # Gemma-4's tower: a learned 2-axis position table, the patches' input projection, q/k-normed attention and
        # a gated MLP with four norms a block, then the projection to the text width (embed_vision)
        heads, d = cfg.get("num_attention_heads"), cfg.get("head_dim")
        kv, table = cfg.get("num_key_value_heads", heads), cfg.get("position_embedding_size")
        if not all(is_int(v) for v in (heads, d, kv, table)):
            return None
        block = 2 * h * heads * d + 2 * h * kv * d + 2 * d + 3 * h * inter + 4 * h
        return 2 * table * h + channels * patch * patch * h + layers * block + text_hidden * h
    if cfg.get("model_type") == "gemma4_audio" and text_hidden:
        # Gemma-4's audio tower (transformers' Gemma4AudioModel, a conformer): two 3 x 3 convolutions with their norms
        # and a projection subsample the mel features; each layer has two 4x feed-forward blocks, q/k/v/output and a
        # relative-position key projection with a per-dimension scale, a light convolution (a GLU in, a depthwise
        # conv, a projection out) and nine norms; an output projection with a bias, then embed_audio to the text width
        heads, kernel = cfg.get("num_attention_heads", 8), cfg.get("conv_kernel_size", 5)
        conv, out = cfg.get("subsampling_conv_channels", [128, 32]), cfg.get("output_proj_dims", 1536)
        if not (all(is_int(v) for v in (heads, kernel, out)) and isinstance(conv, list) and len(conv) == 2):
            return None
        c0, c1 = conv
        if not (is_int(c0) and is_int(c1)):
            return None
        subsample = 10 * c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * h
        layer = 24 * h * h + 9 * h + kernel * h + h // heads
        return subsample + layers * layer + (h * out + out) + out * text_hidden
    if str(cfg.get("model_type", "")).startswith("siglip") and is_int(cfg.get("image_size")) and text_hidden:
        block = 4 * h + 4 * (h * h + h) + 2 * h * inter + inter + h
        embeddings = channels * patch * patch * h + h + (cfg["image_size"] // patch) ** 2 * h
        head = cfg.get("vision_use_head", True)
        if head:  # SigLIP's attention-pooling head (Gemma-3 turns it off)
            return None
        return embeddings + layers * block + 2 * h + (h * text_hidden + h)  # + Gemma-3's projector and its norm
    return None


def _moonvit_merge(cfg: dict[str, Any]) -> tuple[int, int]:
    """MoonViT's merge kernel as media.moonvit_merge reads it, a malformed one refused as a config error."""
    try:
        return moonvit_merge(cfg)
    except ValueError as exc:
        raise ModelConfigError(str(exc)) from None


def _kimi_vl_projector(vision: dict[str, Any], text_hidden: int) -> int:
    """Kimi-VL's multi_modal_projector: a LayerNorm over each patch, then two biased linears over the merged patches,
    the second to the text width (``vision`` the MoonViT config)."""
    h = int(vision["hidden_size"])
    kh, kw = _moonvit_merge(vision)
    hm = h * kh * kw
    return 2 * h + (hm * hm + hm) + (hm * text_hidden + text_hidden)


def _mistral3_projector(vision: dict[str, Any], text_hidden: int) -> int:
    """Mistral3's multi_modal_projector: an RMSNorm, the patch merger's linear over merge x merge patches, then two
    linears to the text width, with the config's multimodal_projector_bias (``vision`` the Pixtral config with the
    outer config's spatial_merge_size and bias, as _spec_of hands them in)."""
    h = int(vision["hidden_size"])
    merge = int(vision["spatial_merge_size"])
    hm = h * merge * merge
    bias = bool(vision.get("multimodal_projector_bias", False))
    return h + hm * h + (h * text_hidden + text_hidden * text_hidden) + (2 * text_hidden if bias else 0)


def _layer_attention(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    """Per-layer attention kinds where they change the rules or the size: Gemma-4's sliding and full (global)
    layers, Qwen3-Next / Qwen3.5's Gated DeltaNet ("linear_attention") and full layers."""
    kinds = cfg.get("layer_types")
    names = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}
    pattern = cfg.get("hybrid_layer_pattern")  # MiMo-V2-Flash's hub spelling: 0 full, 1 sliding window
    if kinds is None and isinstance(pattern, list):
        if len(pattern) != layers or any(v not in (0, 1) or isinstance(v, bool) for v in pattern):
            raise ModelConfigError(
                f"hybrid_layer_pattern must list 0 (full) or 1 (sliding window) for each of the {layers} layers"
            )
        return tuple("sliding" if v else "full" for v in pattern)
    if isinstance(kinds, list) and len(kinds) == layers and all(isinstance(k, str) and k in names for k in kinds):
        out = tuple(names[k] for k in kinds)
        return out if len(set(out)) > 1 or "linear" in out else ()  # a cut to linear layers alone stays linear
    kda = _kda_layers(cfg, layers)
    if kda is not None:
        return tuple("linear" if i in kda else "full" for i in range(layers))
    interval = cfg.get("full_attention_interval")
    if cfg.get("linear_num_key_heads") and isinstance(interval, int) and interval > 0:
        return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(layers))
    return ()


def _kda_layers(cfg: dict[str, Any], layers: int) -> frozenset[int] | None:
    """Kimi-Linear's KDA layers, 0-based, from linear_attn_config's 1-based kda_layers (AutoModel's
    KimiLinear48BConfig.is_kda_layer: layer i is KDA where i + 1 is listed; the rest are MLA); None without one."""
    linear = cfg.get("linear_attn_config")
    if not isinstance(linear, dict):
        return None
    kda, full = linear.get("kda_layers"), linear.get("full_attn_layers")
    if not (isinstance(kda, list) and isinstance(full, list)) or not all(is_int(i) for i in (*kda, *full)):
        raise ModelConfigError("linear_attn_config must list kda_layers and full_attn_layers (1-based layer numbers)")
    return frozenset(i - 1 for i in kda if 1 <= i <= layers)


def _linear_heads(cfg: dict[str, Any]) -> dict[str, Any]:
    """The linear-attention sizes: Qwen3-Next's / Qwen3.5's top-level linear_* fields, or Kimi-Linear's
    linear_attn_config (one head count and head dim for q, k and v, and the short conv's kernel)."""
    linear = cfg.get("linear_attn_config")
    if isinstance(linear, dict):
        if linear.get("use_full_rank_gate") or linear.get("gate_lower_bound") is not None:
            # Kimi K3's KDA (a full-rank output gate, a lower-bounded decay, fp32 convs and norm) is not Kimi-Linear's
            raise ModelConfigError(
                "linear_attn_config with use_full_rank_gate or gate_lower_bound (Kimi K3's KDA) is not sized: only "
                "Kimi-Linear's low-rank-gated KDA is"
            )
        heads = _int(linear.get("num_heads"), "linear_attn_config.num_heads")
        dim = _int(linear.get("head_dim"), "linear_attn_config.head_dim")
        conv = _int(linear.get("short_conv_kernel_size", 4), "linear_attn_config.short_conv_kernel_size")
        return dict(
            linear_key_heads=heads,
            linear_value_heads=heads,
            linear_key_dim=dim,
            linear_value_dim=dim,
            linear_conv_kernel=conv,
            linear_mixer="kda",
        )
    return dict(
        linear_key_heads=_int(cfg.get("linear_num_key_heads") or 0, "linear_num_key_heads"),
        linear_value_heads=_int(cfg.get("linear_num_value_heads") or 0, "linear_num_value_heads"),
        linear_key_dim=_int(cfg.get("linear_key_head_dim") or 0, "linear_key_head_dim"),
        linear_value_dim=_int(cfg.get("linear_value_head_dim") or 0, "linear_value_head_dim"),
        linear_conv_kernel=_int(cfg.get("linear_conv_kernel_dim") or 4, "linear_conv_kernel_dim"),
    )


def _unnamed(cfg: dict[str, Any], default: str) -> str:
    """What a config passed without a name is called: its _name_or_path, else its architecture (a VLM's text
    model_type would name the wrong model)."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return clip(str(cfg.get("_name_or_path") or arch or default), 120)


def nested_text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A multimodal config.json's language model (``text_config``) where its fields are not at the top (Qwen2.5-VL
    keeps them there); None for a config whose language model is the config itself."""
    text = cfg.get("text_config")
    return text if isinstance(text, Mapping) and "num_attention_heads" not in cfg else None


def text_layers(cfg: Mapping[str, Any]) -> int:
    """The decoder layers a config.json builds (its language model's)."""
    return int((nested_text_config(cfg) or cfg)["num_hidden_layers"])


def _spec_of(cfg: dict[str, Any], *, name: str | None) -> ModelSpec:
    # a multimodal config's towers, whether its language model's fields sit in text_config or at the top (Qwen2.5-VL)
    nested = nested_text_config(cfg) is not None
    text_hidden = (cfg["text_config"] if nested else cfg).get("hidden_size")
    text_hidden = text_hidden if isinstance(text_hidden, int) else None
    vision_cfg = cfg.get("vision_config")
    if isinstance(vision_cfg, dict) and vision_cfg.get("model_type") in ("pixtral", "muse_glimmer_vision"):
        # Mistral3's projector is sized by the outer config's merge size and bias, Muse-Glimmer's adapter by its width
        outer_keys = ("spatial_merge_size", "multimodal_projector_bias", "projector_hidden_size")
        vision_cfg = {**vision_cfg, **{k: cfg[k] for k in outer_keys if k in cfg}}
    vision = _tower_params(vision_cfg, text_hidden)
    audio = _tower_params(cfg.get("audio_config"), text_hidden)
    # the part of the vision parameters AutoModel's freeze_vision_tower leaves trainable (it freezes modules named for
    # the tower: vision_tower, *vision*, *visual*): Mistral3's and Kimi-VL's multi_modal_projector
    projector = 0
    if vision and vision_cfg.get("model_type") == "pixtral" and text_hidden:
        projector = _mistral3_projector(vision_cfg, text_hidden)
    elif vision and vision_cfg.get("model_type") == "moonvit" and text_hidden:
        projector = _kimi_vl_projector(vision_cfg, text_hidden)
    outer = cfg
    if nested:
        cfg = {
            **cfg["text_config"],
            "_name_or_path": cfg.get("_name_or_path"),
            "architectures": cfg.get("architectures"),
        }
        if "tie_word_embeddings" not in cfg and "tie_word_embeddings" in outer:  # said once, for the whole model
            cfg["tie_word_embeddings"] = outer["tie_word_embeddings"]
    cfg = {**TEXT_CONFIG_DEFAULTS.get(str(cfg.get("model_type", "")), {}), **cfg}
    blocks = cfg.get("layers_block_type")
    if (
        _is_nemotron_h(cfg, str(cfg.get("model_type", "")))
        and _first(cfg, "num_hidden_layers", "num_layers", "n_layer") is None
        and isinstance(blocks, list)
    ):
        # a Nemotron-H config.json may list its layers without counting them (Nemotron-3 Ultra's): transformers'
        # NemotronHConfig takes the list's length
        cfg = {**cfg, "num_hidden_layers": len(blocks)}
    missing = [k for k in ("hidden_size", "num_attention_heads") if k not in cfg]
    if missing or _first(cfg, "num_hidden_layers", "num_layers", "n_layer") is None:
        raise ModelConfigError(
            f"config.json lacks {', '.join(missing) or 'num_hidden_layers'}; give a Hugging Face causal-LM config"
        )
    mtype = str(cfg.get("model_type", ""))
    mtp_type = mtype
    if _is_nemotron_h(cfg, mtype):
        return _from_nemotron_h(cfg, name=name)
    if mtype == "falcon_h1":
        return _from_falcon_h1(cfg, name=name)
    if mtype == "deepseek_v4":
        return _from_deepseek_v4(cfg, name=name)
    h = _int(cfg["hidden_size"], "hidden_size")
    heads = _int(cfg["num_attention_heads"], "num_attention_heads")
    layers = _int(_first(cfg, "num_hidden_layers", "num_layers", "n_layer"), "num_hidden_layers")
    kv = _int(_first(cfg, "num_key_value_heads", default=heads), "num_key_value_heads")
    experts = _int(_first(cfg, *EXPERT_COUNT_KEYS, default=0) or 0, "num_experts")
    inter = _int(_first(cfg, "intermediate_size", "ffn_dim", default=4 * h), "intermediate_size")
    moe_inter = _int(_first(cfg, "moe_intermediate_size", default=inter if experts else 0), "moe_intermediate_size")
    shared = _first(cfg, "shared_expert_intermediate_size", default=None)
    count_key = next((k for k in SHARED_EXPERT_COUNT_KEYS if cfg.get(k)), None)
    if shared is None and count_key is not None:
        shared = _int(cfg[count_key], count_key) * moe_inter
    # transformers' Phi keeps a bias on every projection; StarCoder2 where use_bias (its default) says so
    biased = mtype == "phi" or (mtype == "starcoder2" and bool(cfg.get("use_bias", True)))
    first_dense = _int(cfg.get("first_k_dense_replace", 0) or 0, "first_k_dense_replace")
    if mtype == "ernie4_5_moe":
        first_dense = _ernie_dense_prefix(cfg, layers)
    gemma4_moe = mtype == "gemma4_text" and bool(cfg.get("enable_moe_block"))
    # (AutoModel's own MoE backend, which it builds for enable_moe_block, has no per-layer inputs or KV sharing:
    # transformers' defaults for them, 256 and 262,144, would otherwise add ~2B parameters it never builds)
    e_series = _gemma4_e_series(cfg, layers) if mtype == "gemma4_text" and not gemma4_moe else (0, 0, 0, False)
    if mtype == "gemma4_text":
        if not gemma4_moe:  # num_experts is a class default there, not experts the dense checkpoint has
            experts = 0
        else:  # its dense MLP (intermediate_size) runs beside the routed experts on every layer: a shared expert
            shared = inter
    if isinstance(cfg.get("moe_layer_freq"), list):  # MiMo-V2-Flash: 0 dense, 1 MoE, per layer
        first_dense = _freq_dense_prefix(cfg["moe_layer_freq"], layers)
    head_dim = _first(cfg, "head_dim", default=None)
    if cfg.get("kv_lora_rank"):
        head_dim = _int(cfg.get("qk_nope_head_dim") or 0, "qk_nope_head_dim") + _int(
            cfg.get("qk_rope_head_dim") or 0, "qk_rope_head_dim"
        )
    _check_head_dim(h, heads, head_dim)
    spec = ModelSpec(
        name=name or _unnamed(cfg, mtype or "config.json"),
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=_int(_first(cfg, "vocab_size", default=32000), "vocab_size"),
        head_dim=_int(head_dim, "head_dim") if head_dim else None,
        tie_word_embeddings=_tied(cfg, mtype),
        qkv_bias=bool(cfg.get("attention_bias", mtype in ("qwen2", "qwen2_moe", "gpt_oss", *QWEN2_VL_TEXT))) or biased,
        o_bias=mtype == "gpt_oss" or biased,
        qk_norm=bool(cfg.get("use_qk_norm"))
        or mtype in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "gemma4_text", "olmo2", "hy_v3", *GATED_DELTANET)
        or mtype in QWEN3_VL_TEXT,
        qk_norm_full=mtype in ("olmo2", "minimax_m2"),  # transformers' Olmo2Attention, MiniMaxM2Attention
        # (Muse-Glimmer's separate output_gate_proj has q_proj's shape: the same parameters)
        attn_output_gate=mtype in GATED_DELTANET or mtype == "muse_glimmer_text",
        index_heads=_int(cfg.get("index_n_heads") or 0, "index_n_heads"),
        index_head_dim=_int(cfg.get("index_head_dim") or 0, "index_head_dim"),
        index_topk=_int(cfg.get("index_topk") or 0, "index_topk"),
        index_shared_layers=_index_shared_layers(cfg, layers) if cfg.get("index_n_heads") else (),
        norms_per_layer=_norms_per_layer(mtype, gemma4_moe),
        router_scale=gemma4_moe,
        mlp_bias=bool(cfg.get("mlp_bias")) or biased,
        mlp_names=UNGATED_MLP.get(mtype, ("up_proj", "down_proj")),
        o_name="dense" if mtype == "phi" else "o_proj",
        python_gelu=_first(cfg, "hidden_activation", "hidden_act") == "gelu_new",
        norm_bias=mtype in UNGATED_MLP,
        lm_head_bias=mtype == "phi",
        shared_expert_gate=mtype in ("qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"),
        num_experts=experts,
        experts_per_token=_int(
            _first(
                cfg,
                "num_experts_per_tok",
                "num_experts_per_token",
                "experts_per_token",
                "top_k_experts",
                "moe_k",
                default=0,
            )
            or 0,
            "num_experts_per_tok",
        )
        if experts
        else 0,
        moe_intermediate_size=moe_inter if experts else 0,
        shared_expert_intermediate_size=_int(shared or 0, "shared_expert_intermediate_size"),
        first_dense_layers=first_dense,
        expert_bias=mtype == "gpt_oss",
        fused_expert_activation=mtype == "gpt_oss" and bool(experts),
        mask_window=_opt_int(cfg, "sliding_window") if mtype in SLIDING_MASK_TYPES else None,
        gated_mlp=mtype not in UNGATED_MLP,
        attention_sinks=mtype == "gpt_oss",
        attn_softcap=cfg.get("attn_logit_softcapping") is not None,
        final_softcap=cfg.get("final_logit_softcapping") is not None,
        q_lora_rank=_opt_int(cfg, "q_lora_rank"),
        kv_lora_rank=_opt_int(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_opt_int(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_opt_int(cfg, "qk_rope_head_dim"),
        v_head_dim=_opt_int(cfg, "v_head_dim"),
        architecture=_implementation_name(_architecture(cfg), str(cfg.get("model_type", "")), outer),
        vision_params=vision,
        projector_params=projector,
        audio_params=audio,
        per_layer_input=e_series[0],
        per_layer_vocab=e_series[1],
        kv_shared_layers=e_series[2],
        double_wide_mlp=e_series[3],
        # (AutoModel's _resolve_mtp_num_layers reads num_nextn_predict_layers first)
        mtp_layers=_int(_first(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0, "mtp_layers")
        if mtp_type in MTP_BUILT
        else 0,
    )
    kinds = _layer_attention(cfg, layers)
    if kinds:
        full_kv = None
        if cfg.get("attention_k_eq_v") and is_int(cfg.get("num_global_key_value_heads")):
            full_kv = _int(cfg["num_global_key_value_heads"], "num_global_key_value_heads")
        if "swa_num_key_value_heads" in cfg:  # MiMo-V2-Flash: the sliding layers' own KV heads, the spec's base
            spec = replace(spec, num_key_value_heads=_mimo_swa_kv(cfg, spec))
            full_kv = kv
        spec = replace(
            spec,
            layer_attention=kinds,
            full_head_dim=_opt_int(cfg, "global_head_dim") if "sliding" in kinds else None,
            full_kv_heads=full_kv,
            full_k_eq_v=bool(cfg.get("attention_k_eq_v")) and full_kv is not None,
            sliding_window=_opt_int(cfg, "sliding_window") if "sliding" in kinds else None,
            **_linear_heads(cfg),
        )
    return spec


# The language models of Qwen's VLMs by their config's model_type (the outer one where the text fields sit at the top):
# Qwen2-VL's and Qwen2.5-VL's keep Qwen2's q/k/v biases, Qwen3-VL's Qwen3's q/k norms
QWEN2_VL_TEXT = ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text")
QWEN3_VL_TEXT = ("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text")
# The model types whose AutoModel class builds the config's multi-token-prediction layers (and whose output carries
# mtp_per_depth_h, which both recipes' steps add a loss for)
MTP_BUILT = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# Fields a model type's config.json may leave to its transformers config class's defaults (transformers 5.18; the
# catalog test recomputes them): gemma-3-4b-it's text_config names no heads and no vocabulary size; Gemma-2's class
# softcaps the attention scores and the logits unless the config says null
TEXT_CONFIG_DEFAULTS: dict[str, dict[str, int | float]] = {
    "gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208},
    "gemma4_text": {"hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144},
    "gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "vaultgemma": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
}


# The causal-LM model types whose transformers config class ties the output projection to the embeddings when
# config.json leaves tie_word_embeddings out (transformers 5.18: AutoConfig.for_model(t).tie_word_embeddings; the
# oracle test recomputes it): Gemma's, StarCoder2's and others' published configs rely on it.
TIED_BY_DEFAULT = frozenset(
    """bart bert bert-generation big_bird bigbird_pegasus biogpt blenderbot blenderbot-small bloom camembert cohere
    cohere2 cohere2_moe cohere_compass_text cpmant ctrl data2vec-text electra ernie ernie4_5 ernie4_5_moe falcon
    falcon_mamba gemma gemma2 gemma3 gemma3_text gemma3n gemma3n_text gemma4 gemma4_assistant gemma4_text gemma4_unified
    gemma4_unified_assistant gemma4_unified_text got_ocr2 gpt-sw3 gpt2 gpt_bigcode gpt_neo gpt_neox_japanese granite_swa
    jetmoe lfm2 lfm2_moe mamba marian mbart megatron-bert minicpm3 modernbert-decoder mpt mvp openai-gpt opt pegasus
    plbart prophetnet recurrent_gemma roberta roberta-prelayernorm roc_bert roformer smollm3 starcoder2 trocr vaultgemma
    whisper xglm xlm xlm-roberta xlm-roberta-xl xlnet xmod youtu zamba zamba2 zaya""".split()
)
# transformers' GPT-style blocks, by model type: an up/down MLP without a gate (its Linears' names: PhiMLP fc1/fc2,
# Starcoder2MLP c_fc/c_proj) and LayerNorms with a bias (Phi's one norm a layer, shared by its parallel attention and MLP)
UNGATED_MLP = {"phi": ("fc1", "fc2"), "starcoder2": ("c_fc", "c_proj")}
# transformers' classes whose every layer takes create_sliding_window_causal_mask where config.sliding_window is set
SLIDING_MASK_TYPES = ("mistral", "mixtral", "phi3", "phimoe", "starcoder2", "ministral3", "qwen3_moe", "minimax")
# where a config.json gives its routed-expert count, in the order the parser reads them (DeepSeek's and others',
# Mixtral's, Qwen-MoE's, ERNIE-4.5's)
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
# the count of shared experts, each moe_intermediate_size wide: DeepSeek's and others' name, Ling's (bailing_moe),
# ERNIE-4.5's
SHARED_EXPERT_COUNT_KEYS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
# transformers' parallel blocks, one norm a layer whose output feeds both the attention and the MLP (PhiDecoderLayer,
# CohereDecoderLayer, Cohere2DecoderLayer, CohereCompassDecoderLayer)
PARALLEL_BLOCK = ("phi", "cohere", "cohere2", "cohere_compass_text")
# Qwen3-Next's and Qwen3.5's decoders: per-head q/k norms and a gated output on their full-attention layers
GATED_DELTANET = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def _ernie_dense_prefix(cfg: dict[str, Any], layers: int) -> int:
    """ERNIE-4.5 MoE's dense layers, which must lead: transformers' and AutoModel's classes route the layers from
    moe_layer_start_index to moe_layer_end_index (-1 or absent: the last) every moe_layer_interval-th; the spec holds a
    dense prefix, so another pattern, or use_bias (a bias on every projection, experts and lm_head included), is refused
    rather than miscounted."""
    start = _int(_first(cfg, "moe_layer_start_index", default=1), "moe_layer_start_index")
    end = cfg.get("moe_layer_end_index", -1)
    if end is None:  # transformers maps only -1 to the last layer; both classes compare each layer with it
        raise ModelConfigError("ERNIE-4.5's moe_layer_end_index is null: give -1 (the last layer) or a layer index")
    end = layers - 1 if end == -1 else _int(end, "moe_layer_end_index")
    interval = _int(_first(cfg, "moe_layer_interval", default=1), "moe_layer_interval")
    if interval != 1 or end < layers - 1 or start > layers:
        raise ModelConfigError(
            f"ERNIE-4.5's MoE layers {start}..{end} every {interval} of {layers}: only a dense prefix is sized "
            "(moe_layer_interval 1, moe_layer_end_index the last layer), as its published checkpoints have"
        )
    if cfg.get("use_bias"):
        raise ModelConfigError("ERNIE-4.5 with use_bias: true (a bias on every projection) is not sized")
    return start


def _index_shared_layers(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """The layers whose DSA indexer is shared (GLM-5.2's IndexShare), as AutoModel's GlmMoeDsaConfig reads them:
    config.json's indexer_types ("full" / "shared" a layer), else index_topk_pattern (a string of F and S, or the
    list), else every index_topk_freq-th layer after the first full (default 1: every layer has its own)."""
    kinds = cfg.get("indexer_types")
    if kinds is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
            kinds = ["full" if c == "F" else "shared" for c in pattern]
        else:
            kinds = pattern
    if kinds is None:
        freq = _int(_first(cfg, "index_topk_freq", default=1), "index_topk_freq") or 1
        kinds = ["full" if max(i - 1, 0) % freq == 0 else "shared" for i in range(layers)]
    # (AutoModel reads the entry of each layer it builds: a longer list, one for an MTP layer, is taken as far as that)
    if not (isinstance(kinds, list) and len(kinds) >= layers and all(k in ("full", "shared") for k in kinds)):
        raise ModelConfigError(f"indexer_types must list 'full' or 'shared' for each of the {layers} layers")
    kinds = kinds[:layers]
    if kinds and kinds[0] != "full":
        raise ModelConfigError(
            "indexer_types: the first layer must have its own indexer ('full'): a shared layer "
            "reuses an earlier full layer's selection"
        )
    return tuple(i for i, k in enumerate(kinds) if k == "shared")


def _norms_per_layer(mtype: str, gemma4_moe: bool) -> int:
    """Norms a decoder layer holds: Gemma-2/3/4 and Muse-Glimmer four; Gemma-4's MoE layer three more, before and
    after each of its two feed-forward branches (AutoModel's Gemma4MoEDecoderLayer: pre_feedforward_layernorm_2,
    post_feedforward_layernorm_1 and _2); a parallel block one; else two."""
    if gemma4_moe:
        return 7
    if mtype.startswith(("gemma2", "gemma3", "gemma4")) or mtype == "muse_glimmer_text":  # pre and post norms
        return 4
    return 1 if mtype in PARALLEL_BLOCK else 2


def with_mtp_depth(spec: ModelSpec, depth: int, *, repeated: bool = False) -> ModelSpec | None:
    """``spec`` with ``depth`` multi-token-prediction layers, as AutoModel's Qwen3.5 classes build them when a recipe
    sets the depth (their ``num_nextn_predict_layers`` argument, or the text config's field, which they read before
    ``mtp_num_hidden_layers``), and its Nemotron-V3 class (its ``num_nextn_predict_layers`` argument; with
    ``mtp_use_repeated_layer``, ``repeated``, one physical depth run ``depth`` times: nemotron_v3/mtp.py
    build_mtp_config_from_hf); its config.json says so too, for the dry run's build. None for a model whose class
    builds no MTP layers from its config (MTP_BUILT, and Nemotron-H with an MTP pattern)."""
    cfg = spec.hf_config
    if cfg is None:
        return None
    nested = nested_text_config(cfg) is not None
    text = cfg["text_config"] if nested else cfg
    mtype = str(text.get("model_type", cfg.get("model_type", "")))
    if mtype == "nemotron_h" and spec.mtp_layer_types and not nested:
        physical = min(depth, 1) if repeated else depth
        iterations = depth if repeated else 0
        return replace(
            spec, mtp_layers=physical, mtp_iterations=iterations, hf_config={**cfg, "num_nextn_predict_layers": depth}
        )
    if mtype not in MTP_BUILT:
        return None
    text = {**text, "num_nextn_predict_layers": depth, "mtp_num_hidden_layers": depth}
    return replace(spec, mtp_layers=depth, hf_config={**cfg, "text_config": text} if nested else text)


def _gemma4_e_series(cfg: dict[str, Any], layers: int) -> tuple[int, int, int, bool]:
    """Gemma-4's E-series fields as transformers' Gemma4TextConfig reads them (its defaults where the file says
    nothing: TEXT_CONFIG_DEFAULTS): the per-layer input width and its table's rows, the KV-shared layers and whether
    their MLP is double-wide."""
    ple = _int(cfg.get("hidden_size_per_layer_input") or 0, "hidden_size_per_layer_input")
    rows = _int(cfg.get("vocab_size_per_layer_input") or 0, "vocab_size_per_layer_input") if ple else 0
    if ple and not rows:
        raise ModelConfigError("hidden_size_per_layer_input without vocab_size_per_layer_input: give the table's rows")
    shared = _int(cfg.get("num_kv_shared_layers") or 0, "num_kv_shared_layers")
    if shared >= layers:
        raise ModelConfigError(
            f"num_kv_shared_layers={shared} leaves no layer of the {layers} to compute the keys and values they share"
        )
    return ple, rows, shared, bool(cfg.get("use_double_wide_mlp")) and shared > 0


def _freq_dense_prefix(freq: list[Any], layers: int) -> int:
    """The dense layers of a per-layer MoE list (MiMo-V2-Flash's moe_layer_freq: 0 dense, 1 MoE), which must lead:
    the spec holds a dense prefix, so another pattern is refused rather than miscounted."""
    if len(freq) != layers or any(v not in (0, 1) or isinstance(v, bool) for v in freq):
        raise ModelConfigError(f"moe_layer_freq must list 0 (dense) or 1 (MoE) for each of the {layers} layers")
    dense = freq.index(1) if 1 in freq else layers
    if any(v == 0 for v in freq[dense:]):
        raise ModelConfigError("moe_layer_freq interleaves dense and MoE layers: only a dense prefix is sized")
    return dense


def _mimo_swa_kv(cfg: dict[str, Any], spec: ModelSpec) -> int:
    """MiMo-V2-Flash's sliding-window layers' KV heads. Their query heads and head dims must be the full layers'
    (as the published checkpoint has them): the spec varies only the KV heads by layer kind."""
    for swa, full in (("swa_num_attention_heads", spec.num_attention_heads), ("swa_head_dim", spec.hd)):
        if cfg.get(swa, full) != full:
            raise ModelConfigError(f"{swa}={cfg[swa]} differs from the full layers' {full}: not sized")
    if cfg.get("swa_v_head_dim", spec.v_head_dim) != spec.v_head_dim:
        raise ModelConfigError(f"swa_v_head_dim={cfg['swa_v_head_dim']} differs from v_head_dim: not sized")
    return _int(cfg["swa_num_key_value_heads"], "swa_num_key_value_heads")


def _tied(cfg: dict[str, Any], mtype: str) -> bool:
    return bool(cfg.get("tie_word_embeddings", mtype in TIED_BY_DEFAULT))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_LAYER_CODES = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}  # Nemotron-H hybrid_override_pattern
_LAYER_NAMES = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "attention",
    "full_attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}  # layers_block_type, legacy and current Hugging Face names


def _is_nemotron_h(cfg: dict[str, Any], mtype: str) -> bool:
    return mtype == "nemotron_h" or "hybrid_override_pattern" in cfg or _architecture(cfg) == "NemotronHForCausalLM"


def _hybrid_layer_types(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    pattern = cfg.get("hybrid_override_pattern")
    names = cfg.get("layers_block_type", cfg.get("layer_types"))
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(_LAYER_CODES))
        if bad:
            raise ModelConfigError(f"hybrid_override_pattern has unknown layer codes {bad}; expected M, *, - or E")
        types = tuple(_LAYER_CODES[c] for c in pattern)
    elif isinstance(names, list) and all(isinstance(n, str) for n in names):
        bad = sorted({n for n in names if n not in _LAYER_NAMES})
        if bad:
            raise ModelConfigError(
                f"layers_block_type has unknown layer types {bad[:5]}; expected mamba, attention, mlp or moe"
            )
        types = tuple(_LAYER_NAMES[n] for n in names)
    else:
        raise ModelConfigError(
            "a Nemotron-H config.json needs hybrid_override_pattern (e.g. 'M-M*-ME') or layers_block_type"
        )
    if len(types) != layers:
        raise ModelConfigError(f"the hybrid layer pattern has {len(types)} layers but num_hidden_layers={layers}")
    return types


def _from_deepseek_v4(cfg: dict[str, Any], *, name: str | None) -> ModelSpec:
    """A DeepSeek-V4 config.json (AutoModel's DeepseekV4Config): every layer MoE, one key-value head, the query and
    output low-rank, hc_mult hyper-connection streams, each layer's KV compression from compress_ratios (one entry a
    layer, then the MTP layers'; an empty list is every layer 0, and AutoModel reads an MTP layer's missing entry as
    0, but a decoder layer's raises)."""
    h = _int(cfg["hidden_size"], "hidden_size")
    heads = _int(cfg["num_attention_heads"], "num_attention_heads")
    layers = _int(cfg["num_hidden_layers"], "num_hidden_layers")
    mtp = _int(cfg.get("num_nextn_predict_layers", 1) or 0, "num_nextn_predict_layers")
    if cfg.get("vision_n_layers"):
        raise ModelConfigError("vision_n_layers > 0 (DeepSeek-V4's vision tower and its image routing) is not sized")
    ratios = cfg.get("compress_ratios") or []
    if not isinstance(ratios, list) or not all(is_int(r) and r >= 0 for r in ratios):
        raise ModelConfigError("compress_ratios must list a non-negative KV compression ratio a layer")
    if ratios and len(ratios) < layers:
        raise ModelConfigError(
            f"compress_ratios lists {len(ratios)} ratios for {layers} layers: AutoModel's attention reads one a layer "
            "(an IndexError in its build)"
        )
    ratios = [int(r) for r in ratios] + [0] * max(0, layers + max(mtp, 1) - len(ratios))
    heavy = sorted({r for r in ratios[: layers + max(mtp, 1)] if r not in (0, 4)})
    if len(heavy) > 1:
        raise ModelConfigError(f"compress_ratios mixes compression ratios {heavy}: one besides 0 and 4 is sized")
    kinds = {0: "sliding", 4: "csa"}
    if len({kinds.get(r, "hca") for r in ratios[layers : layers + mtp]}) > 1:
        raise ModelConfigError("compress_ratios gives the MTP layers different kinds: one kind for them is sized")
    experts = _int(cfg.get("n_routed_experts", 256), "n_routed_experts")
    moe_inter = _int(cfg.get("moe_intermediate_size", 2048), "moe_intermediate_size")
    return ModelSpec(
        name=name or _unnamed(cfg, "deepseek_v4"),
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_int(cfg.get("num_key_value_heads", 1), "num_key_value_heads"),
        intermediate_size=moe_inter,
        vocab_size=_int(cfg.get("vocab_size", 129280), "vocab_size"),
        head_dim=_int(cfg.get("head_dim", 512), "head_dim"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=experts,
        experts_per_token=_int(cfg.get("num_experts_per_tok", 6), "num_experts_per_tok"),
        moe_intermediate_size=moe_inter,
        fused_expert_activation=float(cfg.get("swiglu_limit", 0.0) or 0.0) > 0.0,  # (swiglu_clamped_deepep)
        shared_expert_intermediate_size=_int(cfg.get("n_shared_experts", 1) or 0, "n_shared_experts") * moe_inter,
        q_lora_rank=_int(cfg.get("q_lora_rank", 1024), "q_lora_rank"),
        qk_rope_head_dim=_int(cfg.get("qk_rope_head_dim", 64), "qk_rope_head_dim"),
        index_heads=_int(cfg.get("index_n_heads", 64), "index_n_heads"),
        index_head_dim=_int(cfg.get("index_head_dim", 128), "index_head_dim"),
        index_topk=_int(cfg.get("index_topk", 512), "index_topk"),
        attention_sinks=True,
        layer_attention=tuple(kinds.get(r, "hca") for r in ratios[:layers]),
        sliding_window=_int(cfg.get("sliding_window", 128) or 128, "sliding_window"),
        hc_mult=_int(cfg.get("hc_mult", 4), "hc_mult"),
        hca_ratio=heavy[0] if heavy else 0,
        o_groups=_int(cfg.get("o_groups", 8), "o_groups"),
        o_lora_rank=_int(cfg.get("o_lora_rank", 1024), "o_lora_rank"),
        hash_layers=min(layers, _int(cfg.get("num_hash_layers", 3) or 0, "num_hash_layers")),
        hc_iters=_int(cfg.get("hc_sinkhorn_iters", 20) or 20, "hc_sinkhorn_iters"),
        mtp_layers=mtp,
        mtp_attention=kinds.get(ratios[layers], "hca"),
        architecture=_architecture(cfg) or "DeepseekV4ForCausalLM",
    )


def _from_nemotron_h(cfg: dict[str, Any], *, name: str | None) -> ModelSpec:
    """A Nemotron-H (hybrid Mamba-2 / attention / MLP / MoE) config.json: one norm and one mixer per layer."""
    h = _int(cfg["hidden_size"], "hidden_size")
    heads = _int(cfg["num_attention_heads"], "num_attention_heads")
    layers = _int(_first(cfg, "num_hidden_layers", "num_layers", "n_layer"), "num_hidden_layers")
    types = _hybrid_layer_types(cfg, layers)
    moe = "moe" in types
    head_dim = _first(cfg, "head_dim", default=None)
    _check_head_dim(h, heads, head_dim)
    experts = _int(_first(cfg, "n_routed_experts", "num_local_experts", default=0) or 0, "n_routed_experts")
    if moe and not experts:
        raise ModelConfigError("the hybrid layer pattern has MoE layers but n_routed_experts is missing or 0")
    # AutoModel's class builds num_nextn_predict_layers MTP depths of mtp_hybrid_override_pattern's sublayers
    # (nemotron_v3/mtp.py build_mtp_config_from_hf); without a pattern it builds none
    mtp_depth = _int(_first(cfg, "num_nextn_predict_layers", default=0) or 0, "num_nextn_predict_layers")
    mtp_pattern = cfg.get("mtp_hybrid_override_pattern")
    mtp_types: tuple[str, ...] = ()
    if mtp_depth and isinstance(mtp_pattern, str) and mtp_pattern:
        mtp_types = _hybrid_layer_types({"hybrid_override_pattern": mtp_pattern}, len(mtp_pattern))
    elif mtp_depth and isinstance(cfg.get("mtp_layers_block_type"), list):
        names = cfg["mtp_layers_block_type"]
        mtp_types = _hybrid_layer_types({"layers_block_type": names}, len(names))
    mtp_depth = mtp_depth if mtp_types else 0
    spec = ModelSpec(
        name=name or _unnamed(cfg, "nemotron_h"),
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_int(_first(cfg, "num_key_value_heads", default=heads), "num_key_value_heads"),
        intermediate_size=_int(_first(cfg, "intermediate_size", default=4 * h), "intermediate_size"),
        vocab_size=_int(_first(cfg, "vocab_size", default=131072), "vocab_size"),
        head_dim=_int(head_dim, "head_dim") if head_dim else None,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", False)),
        norms_per_layer=1,
        num_experts=experts if moe else 0,
        experts_per_token=_int(_first(cfg, "num_experts_per_tok", default=0) or 0, "num_experts_per_tok") if moe else 0,
        moe_intermediate_size=_int(_first(cfg, "moe_intermediate_size", default=0), "moe_intermediate_size")
        if moe
        else 0,
        fused_expert_activation=moe,  # AutoModel's Nemotron-V3 experts: relu2 (relu2_deepep)
        shared_expert_intermediate_size=_int(
            _first(cfg, "moe_shared_expert_intermediate_size", default=0), "moe_shared_expert_intermediate_size"
        )
        if moe
        else 0,
        layer_types=types,
        mtp_layers=mtp_depth,
        mtp_layer_types=mtp_types,
        moe_latent_size=_int(_first(cfg, "moe_latent_size", default=0) or 0, "moe_latent_size") if moe else 0,
        mamba_num_heads=_int(_first(cfg, "mamba_num_heads", default=128), "mamba_num_heads"),
        mamba_head_dim=_int(_first(cfg, "mamba_head_dim", default=64), "mamba_head_dim"),
        mamba_n_groups=_int(_first(cfg, "n_groups", "mamba_n_groups", default=8), "n_groups"),
        ssm_state_size=_int(_first(cfg, "ssm_state_size", default=128), "ssm_state_size"),
        conv_kernel=_int(_first(cfg, "conv_kernel", "mamba_d_conv", default=4), "conv_kernel"),
        gated_mlp=False,
        architecture=_architecture(cfg) or "NemotronHForCausalLM",
    )
    if "mamba" in types and (spec.mamba_num_heads == 0 or spec.mamba_n_groups == 0):
        raise ModelConfigError("mamba_num_heads and n_groups must be positive for a model with Mamba layers")
    return spec


# transformers 5.18's FalconH1Config defaults for what a Falcon-H1 config.json may leave out (its published configs
# give them all; mamba_d_ssm null means mamba_expand x hidden_size, mamba_d_head "auto" the width over the heads)
FALCON_H1_DEFAULTS: dict[str, Any] = {
    "mamba_d_ssm": 1024,
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_rms_norm": False,
    "mamba_norm_before_gate": True,
    "projectors_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128000,
    "tie_word_embeddings": False,
}


def _from_falcon_h1(cfg: dict[str, Any], *, name: str | None) -> ModelSpec:
    """A Falcon-H1 config.json (transformers' FalconH1ForCausalLM, which AutoModel builds: its registry has no own
    class): per layer an attention block and a Mamba-2 mixer in parallel on the normed input, then a gated MLP; two
    norms a layer. Biases other than the conv's (all off in the published checkpoints) are refused, not miscounted."""
    cfg = {**FALCON_H1_DEFAULTS, **cfg}
    h = _int(cfg["hidden_size"], "hidden_size")
    heads = _int(cfg["num_attention_heads"], "num_attention_heads")
    layers = _int(cfg["num_hidden_layers"], "num_hidden_layers")
    biased = [k for k in ("mamba_proj_bias", "projectors_bias", "attention_bias", "mlp_bias") if cfg.get(k)]
    if biased or not cfg.get("mamba_conv_bias"):
        what = ", ".join(biased) if biased else "mamba_conv_bias false"
        raise ModelConfigError(f"Falcon-H1 with {what} is not sized (the published checkpoints have none of them)")
    if cfg.get("mamba_rms_norm") and cfg.get("mamba_norm_before_gate"):
        # (the published checkpoints gate first: the estimate counts what that norm keeps; transformers' class
        # defaults mamba_norm_before_gate to true, so a config must say false)
        raise ModelConfigError(
            "Falcon-H1 with mamba_rms_norm and mamba_norm_before_gate true (transformers' default where the config "
            "leaves it out) is not sized: the published checkpoints set mamba_norm_before_gate false"
        )
    width = cfg["mamba_d_ssm"]
    width = _int(cfg["mamba_expand"], "mamba_expand") * h if width is None else _int(width, "mamba_d_ssm")
    mamba_heads = _int(cfg["mamba_n_heads"], "mamba_n_heads")
    if mamba_heads <= 0 or width % mamba_heads:
        raise ModelConfigError(f"mamba_n_heads={mamba_heads} must divide the Mamba width {width} (mamba_d_ssm)")
    head = cfg["mamba_d_head"]
    head = width // mamba_heads if head == "auto" else _int(head, "mamba_d_head")
    if head * mamba_heads != width:  # (FalconH1Config.validate_architecture refuses it too)
        raise ModelConfigError(f"mamba_d_head={head} x mamba_n_heads={mamba_heads} is not the Mamba width {width}")
    head_dim = _first(cfg, "head_dim", default=None)
    _check_head_dim(h, heads, head_dim)
    scale = cfg.get("lm_head_multiplier", 1.0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ModelConfigError(f"lm_head_multiplier must be a number, not {clip(repr(scale), 40)}")
    return ModelSpec(
        name=name or _unnamed(cfg, "falcon_h1"),
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_int(cfg["num_key_value_heads"] or heads, "num_key_value_heads"),
        intermediate_size=_int(cfg["intermediate_size"], "intermediate_size"),
        vocab_size=_int(cfg["vocab_size"], "vocab_size"),
        head_dim=_int(head_dim, "head_dim") if head_dim else None,
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        parallel_mamba=True,
        mamba_norm=bool(cfg["mamba_rms_norm"]),
        logits_multiplier=float(scale),
        mamba_num_heads=mamba_heads,
        mamba_head_dim=head,
        mamba_n_groups=_int(cfg["mamba_n_groups"], "mamba_n_groups"),
        ssm_state_size=_int(cfg["mamba_d_state"], "mamba_d_state"),
        conv_kernel=_int(cfg["mamba_d_conv"], "mamba_d_conv"),
        architecture=_architecture(cfg) or "FalconH1ForCausalLM",
    )


def _check_head_dim(h: int, heads: int, head_dim: Any) -> None:
    """Refuse a config whose attention width cannot be read: no heads, or no head_dim where the heads do not divide
    the hidden size."""
    if heads == 0 or (head_dim is None and h % heads):
        raise ModelConfigError(f"hidden_size={h} is not divisible by num_attention_heads={heads}; give head_dim")


def _implementation_name(architecture: str | None, text_type: str, outer: dict[str, Any]) -> str | None:
    """The name AutoModel 0.7.0 resolves the class by, where it is not the config's architecture: its
    _resolve_custom_model_cls_for_config (model_init.py) hands a Mistral3ForConditionalGeneration whose text model is
    ministral3, unquantized or FP8 (Ministral-3, Devstral-Small-2, Mistral-Medium-3.5), to its own
    Mistral3FP8VLMForConditionalGeneration (mistral3_vlm/model.py, supports_config) before the registry's Mistral4
    class of the same architecture name."""
    if architecture == "Mistral3ForConditionalGeneration" and text_type == "ministral3":
        quant = outer.get("quantization_config")
        if quant is None or (isinstance(quant, dict) and quant.get("quant_method") == "fp8"):
            return "Mistral3FP8VLMForConditionalGeneration"
    return architecture


def _architecture(cfg: dict[str, Any]) -> str | None:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0].isidentifier():
        return archs[0]
    return None


MAX_CONFIG_BYTES = 1 << 20


def names_a_file(model: Any) -> bool:
    """Whether a model argument is a config.json path (else a catalog name, a dict or a spec)."""
    if isinstance(model, Path):
        return True
    if not isinstance(model, str):
        return False
    return model.endswith(".json") or is_file(model) or is_file(Path(model) / "config.json")  # or a model folder


MAX_PERIOD = 8  # the longest repeating unit of layer kinds looked for (Qwen3-Next's is 4)


def period_of(kinds: Sequence[Any], max_period: int = MAX_PERIOD) -> int | None:
    """The smallest p <= max_period with kinds[i] == kinds[i % p] for every i, else None."""
    for p in range(1, min(max_period, len(kinds)) + 1):
        if all(kinds[i] == kinds[i % p] for i in range(len(kinds))):
            return p
    return None
