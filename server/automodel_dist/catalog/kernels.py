"""What the Hugging Face decoder layers AutoModel builds keep for backward around their norms and MLP, with and
without Liger Kernel (pure: the dry run's Liger stand-in and the estimate read this one table).

AutoModel patches a Hugging Face class with Liger Kernel by default (``use_liger_kernel: true`` in
``NeMoAutoModelForCausalLM.from_pretrained`` / ``from_config``; never its own classes) and turns it off itself under
TP or CP (``kernel_patches._apply_preload_overrides``). Liger's instance patch
(``liger_kernel.transformers._apply_liger_kernel_to_instance``, read at liger-kernel 0.8.5) replaces, per decoder
layer, the RMSNorm modules named here and, for most types, the gated MLP:

- Liger's RMSNorm keeps its bf16 input and one fp32 reciprocal RMS per row; the Hugging Face norm keeps an fp32 copy
  of its input and the normalised tensor (bf16 for Llama-style norms, fp32 for Gemma's, which scale in fp32);
- Liger's SwiGLU / GeGLU keeps gate and up and recomputes the activation in backward; the Hugging Face MLP also keeps
  the activation's output. Phi-3's fused ``gate_up_proj`` is chunked into gate and up (views of one tensor).

Mixtral and Qwen3-MoE's experts go through Liger's fused MoE kernel, which this table does not describe: only their
norms are listed (their experts are counted as the Hugging Face class computes them).
"""

from __future__ import annotations

from dataclasses import dataclass

LIGER_VERSION = "0.8.5"  # the liger-kernel release whose instance patch the table follows


@dataclass(frozen=True)
class HFLayer:
    """One Hugging Face model type's decoder layer as Liger patches it."""

    model_type: str
    norms: tuple[str, ...]  # the layer's RMSNorm modules Liger replaces (dotted paths from the layer)
    mlp: str | None  # "split": gate_proj/up_proj/down_proj; "fused": Phi-3's gate_up_proj; None: MLP not patched
    fp32_norm: bool = False  # the Hugging Face norm keeps its normalised tensor in fp32 (Gemma's (1 + w) scaling)
    mlp_module: str = "mlp"  # the layer's MLP attribute (Falcon-H1's feed_forward)
    final_norm: str = "norm"  # the backbone's final norm (Falcon-H1's final_layernorm), which Liger patches too


_PRE = ("input_layernorm", "post_attention_layernorm")
_GEMMA2 = _PRE + ("pre_feedforward_layernorm", "post_feedforward_layernorm")
_QK = ("self_attn.q_norm", "self_attn.k_norm")

LIGER_LAYERS: dict[str, HFLayer] = {
    layer.model_type: layer
    for layer in (
        HFLayer("llama", _PRE, "split"),
        HFLayer("mistral", _PRE, "split"),
        HFLayer("qwen2", _PRE, "split"),
        HFLayer("qwen3", _PRE + _QK, "split"),
        HFLayer("phi3", _PRE, "fused"),
        HFLayer("gemma", _PRE, "split", fp32_norm=True),
        HFLayer("gemma2", _GEMMA2, "split", fp32_norm=True),
        HFLayer("gemma3_text", _GEMMA2 + _QK, "split", fp32_norm=True),
        HFLayer("mixtral", _PRE, None),
        HFLayer("qwen3_moe", _PRE + _QK, None),
        # LigerFalconH1SwiGLUMLP applies the gate and down multipliers inside the SwiGLU function (which keeps gate and
        # up, as the others)
        HFLayer(
            "falcon_h1", ("input_layernorm", "pre_ff_layernorm"), "split", False, "feed_forward", "final_layernorm"
        ),
    )
}

# config.json "architectures"[0] -> model_type, for the classes above (what the estimate knows of a model)
ARCHITECTURE_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "FalconH1ForCausalLM": "falcon_h1",
}


# MoE token dispatchers that send each rank only the token rows its experts need (DeepEP, HybridEP, UCCL-EP); the
# others (torch, AutoModel's CPU default, and mok) all-gather the EP group's tokens inside every MoE layer
# (moe/experts.py GroupedExperts). An unset dispatcher is counted as torch: AutoModel's default is deepep only where
# DeepEP is installed on a GPU.
LOCAL_DISPATCHERS = frozenset({"deepep", "hybridep", "uccl_ep"})


# AutoModel's own classes whose attention dispatches on config._attn_implementation as transformers' do, so that
# ``attn_implementation: eager`` runs transformers' eager_attention_forward on an unpacked batch
# (components/models/llama, qwen2 and qwen3/model.py, the Qwen3-VL class, a subclass of transformers', and Gemma-4's,
# whose dense checkpoints run transformers' own language model and whose MoE backend keeps transformers' attention);
# the classes checked here, not every one that may (AutoModel's Mistral3 FP8 VLM class, a subclass of transformers',
# is not checked)
EAGER_DISPATCH_CUSTOM = frozenset(
    {
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3VLForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
    }
)


# AutoModel's own classes whose attention on any backend but te is their own eager matmul and softmax, whatever
# model.attn_implementation says: MiMo-V2-Flash's (components/models/mimo_v2_flash/model.py, _eager_attention_forward:
# its sliding layers' sinks have no SDPA path). Unset, backend.attn is te on a GPU with Transformer Engine.
EAGER_UNLESS_TE = frozenset({"MiMoV2FlashForCausalLM"})
# AutoModel's own classes whose MLA layers run their own attention whatever model.backend.attn says (Kimi-Linear's:
# kimi_linear/model.py KimiMLAAttention): without context parallelism a matmul / fp32-softmax eager attention beside
# an additive [B, 1, S, S] mask; under it the compressed KV latent all-gathered and expanded to every head over the
# whole sequence, into a document-causal flex attention
OWN_MLA_ATTENTION = frozenset({"KimiLinear48BForCausalLM"})
# AutoModel's own classes whose attention is their own eager matmul and fp32 softmax over the sliding window's keys and
# the compressed ones, a sink column beside them, on every backend but tilelang (DeepSeek-V4's: deepseek_v4/layers.py,
# eager_attention_with_sink; tilelang runs its sparse-attention kernel instead)
EAGER_UNLESS_TILELANG = frozenset({"DeepseekV4ForCausalLM"})

# model.backend.attn values that run DSA (DeepSeek-V3.2 / GLM-5 / DeepSeek-V4 sparse attention) through its THD
# kernels (TileLang's, cuDNN's): no dense score tensor, a fixed index_topk width; every other backend takes the dense
# reference path
DSA_THD_BACKENDS = frozenset({"tilelang", "cudnn"})

# AutoModel's classes whose CP hook picks its block-diagonal CP path for a packed batch (prepare_model_inputs_for_cp
# with make_cp_blockdiag_batch_and_ctx); the dense Qwen3.5 VLM shards round-robin whatever the batch
BLOCKDIAG_CP_CLASSES = frozenset({"Qwen3_5MoeForConditionalGeneration"})


def takes_blockdiag_cp(architecture: str | None, *, hf_class: bool, cp: int, packed_vlm: bool) -> bool:
    """Whether a step runs AutoModel's block-diagonal CP (blockdiag_cp/): a packed VLM batch under CP on a class whose
    CP hook picks it, each rank a contiguous share of the pack, its softmax attention over the all-gathered keys and
    values through flash-attn's varlen kernel."""
    return packed_vlm and cp > 1 and not hf_class and architecture in BLOCKDIAG_CP_CLASSES


# AutoModel's Qwen3.5 VLM classes hand their MTP the decoder's own embeddings, rolled, under CP (the sequence is
# embedded whole before it is sharded), and the MoE one at CP 1 too when the batch carries media (so the MTP sees the
# spliced image features); elsewhere an MTP embeds its shifted tokens with the model's embedding, a call of its own
# (qwen3_5/model.py, qwen3_5_moe/model.py, nemotron_v3/model.py forward)
MTP_ROLLED_UNDER_CP = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
MTP_ROLLED_WITH_MEDIA = frozenset({"Qwen3_5MoeForConditionalGeneration"})


def mtp_calls_embedding(architecture: str | None, *, cp: int, media: bool) -> bool:
    """Whether the model's MTP calls its embedding itself (a second use of the table, with its own gradient)."""
    if cp > 1 and architecture in MTP_ROLLED_UNDER_CP:
        return False
    return not (media and architecture in MTP_ROLLED_WITH_MEDIA)


def flash_attn_head_dim_rounded(head_dim: int) -> int:
    """flash-attn 2's head_size_rounded: its backward's fp32 dq accumulator width (flash_api.cpp)."""
    return -(-head_dim // 32) * 32 if head_dim <= 192 else 256


def flash_attn_dq_accum_rows(queries: int, sequences: int, *, varlen: bool) -> int:
    """Rows of flash-attn 2's backward's fp32 dq accumulator for ``queries`` query tokens over ``sequences``
    sequences: a varlen call's queries plus 128 a sequence (mha_varlen_bwd), a fixed-length call's each sequence's
    rounded up to 128 (mha_bwd's seqlen_q_rounded)."""
    if varlen:
        return queries + 128 * sequences
    return sequences * (-(-(queries // sequences) // 128) * 128)


def runs_eager_attention(
    attn_implementation: str | None,
    *,
    hf_class: bool,
    architecture: str | None,
    cp: int,
    packed: bool,
    backend_attn: str | None = None,
) -> bool:
    """Whether the step runs transformers' eager attention, which materialises every head's seq x seq scores (its
    fp32 softmax and their bf16 copy stay for backward) where a flash or SDPA kernel keeps none: the recipe asks for
    ``eager`` on a class that honours it, and nothing overrides it. On a Hugging Face class AutoModel's pre-load
    overrides do (``kernel_patches._apply_preload_overrides``: SDPA under CP, a flash kernel for packed sequences);
    its own classes run CP and packed (THD) batches on their TE path. Not covered: ``packing_strategy: neat`` on
    its own classes, whose block-causal mask takes the unpacked path (eager there). A class of ``EAGER_UNLESS_TE``
    runs its own eager attention wherever ``backend_attn`` (model.backend.attn) is not te, one of
    ``EAGER_UNLESS_TILELANG`` wherever it is not tilelang."""
    if not hf_class and architecture in EAGER_UNLESS_TE:
        return (backend_attn or "te") != "te"
    if not hf_class and architecture in EAGER_UNLESS_TILELANG:
        return backend_attn != "tilelang"
    if not hf_class and architecture in OWN_MLA_ATTENTION:
        return cp <= 1
    if attn_implementation != "eager" or cp > 1 or packed:
        return False
    return hf_class or architecture in EAGER_DISPATCH_CUSTOM


def hf_layer(architecture: str | None) -> HFLayer | None:
    """The table's row for a Hugging Face class (None: a type Liger's stand-in does not cover)."""
    model_type = ARCHITECTURE_TYPES.get(architecture or "")
    return LIGER_LAYERS.get(model_type) if model_type else None


# AutoModel's own classes whose decoder layers and norms are transformers' (components/models/qwen3_vl/model.py
# subclasses transformers' model, qwen3/model.py its decoder layer, gemma4_moe/model.py keeps transformers' model for a
# dense checkpoint, mistral3_vlm/model.py subclasses transformers' Mistral3 and keeps its Ministral3 layers: each norm
# an fp32 copy of its input and the normalised tensor, measured per layer on the dry run); AutoModel applies Liger to
# Hugging Face classes only, never to these
HF_LAYER_CLASSES = frozenset(
    {
        "Qwen3VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Mistral3FP8VLMForConditionalGeneration",
    }
)

# AutoModel's own classes whose decoder layers are transformers' own GradientCheckpointingLayer modules when dense
# (Gemma-4's dense checkpoints run transformers' language model): AutoModel checkpoints them whole, as it does a
# Hugging Face class's (distributed/parallelizer.py, _should_use_hf_native_gradient_checkpointing), not submodule by
# submodule as its own layers
TRANSFORMERS_DECODER_LAYERS = frozenset({"Gemma4ForConditionalGeneration"})


# AutoModel's own classes whose decoder norms compute in fp32 ((1 + w) or w times the fp32 normalised input): each norm
# keeps an fp32 copy of its input and, where its weight trains, the fp32 normalised input (every norm of the layer: the
# spec's norms_per_layer). Per class, how many of a layer's norms AutoModel's sub-module checkpointing
# (activation_checkpointing.apply_submodule_checkpointing) leaves outside every wrapper, keeping what they save even
# under activation checkpointing: it wraps the attention, the MLP and the norms it finds by name (input_layernorm /
# attention_norm / layer_norm1 / norm1, post_attention_layernorm / ffn_norm / layer_norm2 / norm2). Qwen3.5's dense
# class (Qwen3-Next's block and its (1 + w) norm; its MoE sibling and Qwen3-Next share the norm but are measured here
# only under activation checkpointing, where the norms' intermediates are not kept, so they are not listed untested);
# Muse-Glimmer's four norms a layer, whose post_attn_norm and post_ffn_norm the wrappers leave out
# (muse_glimmer/model.py). tests/oracle/test_kernel_facts.py counts both norm classes and Muse-Glimmer's wrapped layer.
FP32_NORM_DECODERS: dict[str, int] = {
    "Qwen3_5ForConditionalGeneration": 0,
    "Qwen3_5ForCausalLM": 0,
    "MuseGlimmerForConditionalGeneration": 2,
}

# AutoModel's own classes whose attention output gate is a projection of its own (output_gate_proj, q_proj's shape, on
# the hidden state), not a half of q_proj's output (Qwen3-Next's, Qwen3.5's): nothing keeps its pre-sigmoid output, so
# it keeps the sigmoid's output and the gated product, 4 bytes a query element where Qwen3-Next's keeps 6; a LoRA that
# matches every *_proj adapts it. tests/oracle/test_kernel_facts.py counts Muse-Glimmer's attention with and without it.
OUTPUT_GATE_PROJ = frozenset({"MuseGlimmerForConditionalGeneration"})

# AutoModel's TP plans that accept sequence_parallel and ignore it (optimized_tp_plans: Falcon-H1's, whose Mamba branch's
# whole-sequence output is summed with the attention's, and Muse-Glimmer's, which warns "not yet supported"); a spec's
# parallel_mamba names Falcon-H1's block, whose class transformers builds
SEQUENCE_PARALLEL_IGNORED = frozenset({"MuseGlimmerForConditionalGeneration"})


def ignores_sequence_parallel(architecture: str | None, parallel_mamba: bool) -> bool:
    """Whether AutoModel's TP plan for this model ignores ``sequence_parallel`` (activations stay whole on every TP
    rank)."""
    return parallel_mamba or architecture in SEQUENCE_PARALLEL_IGNORED


# AutoModel's TP plan for Qwen3.5's dense VLM class (optimized_tp_plans._parallelize_qwen3_5_vlm: transformers'
# base_model_tp_plan through parallelizer.get_hf_tp_shard_plan) splits attention, the MLP and the Gated DeltaNet
# projections but no vocabulary: the plan has no lm_head entry, and the embed_tokens entry it adds names the
# wrapper's property on AutoModel's own class (no module: nothing matches), the language model's module on
# transformers' class (split there). tests/oracle/test_kernel_facts.py parallelizes both on a fake process group.
TP_WHOLE_VOCAB = frozenset({"Qwen3_5ForConditionalGeneration"})


# Classes whose TP plan has no lm_head entry but splits a tied embedding, so the head is a plain Linear whose weight
# is the embedding's vocab-split DTensor (gemma4_moe/parallelization.py pops lm_head from its plan; transformers'
# Qwen2.5-VL plan has none): read from the plans, not run end to end
TP_HEAD_VIA_EMBEDDING = frozenset({"Gemma4ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"})


def tp_splits_vocab(architecture: str | None, hf_class: bool) -> tuple[bool, bool]:
    """(embedding, lm_head): whether AutoModel's TP plan for the class it builds splits each over the TP ranks."""
    if architecture in TP_WHOLE_VOCAB:
        return hf_class, False
    return True, True


# AutoModel's own classes running transformers' Gemma norms, which keep the normalised tensor in fp32 (Gemma-4's dense
# checkpoints: transformers' Gemma4RMSNorm scales in fp32), where no Liger row names their layer type
FP32_NORM_CLASSES = frozenset({"Gemma4ForConditionalGeneration"})

# multimodal classes -> their language model's layer type, for what its Hugging Face norms keep without Liger (Liger's
# stand-in patches by the root model's type, and no row here is a multimodal type)
TEXT_LAYER_TYPES = {"Gemma3ForConditionalGeneration": "gemma3_text", "Qwen3VLForConditionalGeneration": "qwen3"}


def hf_text_layer(architecture: str | None) -> HFLayer | None:
    """The row of a class's decoder layer: its own (hf_layer), or its language model's for a multimodal class."""
    return hf_layer(architecture) or LIGER_LAYERS.get(TEXT_LAYER_TYPES.get(architecture or "", ""))


def liger_applies(use_liger_kernel: bool, tp: int, cp: int) -> bool:
    """Whether AutoModel applies Liger to a Hugging Face class: asked for (its default) and neither TP nor CP."""
    return use_liger_kernel and tp == 1 and cp == 1


__all__ = [
    "ARCHITECTURE_TYPES",
    "EAGER_DISPATCH_CUSTOM",
    "EAGER_UNLESS_TE",
    "FP32_NORM_CLASSES",
    "HF_LAYER_CLASSES",
    "TRANSFORMERS_DECODER_LAYERS",
    "HFLayer",
    "LIGER_LAYERS",
    "LIGER_VERSION",
    "LOCAL_DISPATCHERS",
    "OWN_MLA_ATTENTION",
    "hf_layer",
    "hf_text_layer",
    "liger_applies",
    "runs_eager_attention",
]
