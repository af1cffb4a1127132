"""The recipe's workload as the memory and time model's ``Training``: what trains (LoRA, QLoRA), the loss, the
optimizer and its options, the parameters' dtype, the class AutoModel builds. Each choice comes with the sentence
that says what was read and what it costs, for the report. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog.implementations import builds_own_class, implementation
from ..catalog.kernels import EAGER_UNLESS_TE, EAGER_UNLESS_TILELANG, runs_eager_attention
from ..catalog.models import ModelSpec
from ..media import FAKE_IMAGE_PX, IMAGE_PX, IMAGES_PER_SAMPLE, KIMI_IN_TOKEN_LIMIT, ImageGeometry, vlm_image
from ..rules.fallbacks import megatron_root_hook_unfired
from ..vlm_packing import recipe_fill_note
from ..workload import GEMMA4_TP_LINEAR_CE, STATE_DTYPE_BYTES, Workload, te_fused_adam_states
from .memory import DTYPE_BYTES, LOSS_BYTES, Optimizer, Training
from .peft import describe, lora_of

PRECISIONS: dict[str, tuple[str, str]] = {
    # name: (storage dtype of params/grads/optimizer states, compute dtype)
    "bf16": ("bfloat16", "bfloat16"),  # AutoModel's default (model.torch_dtype auto -> bf16 weights)
    "bf16-mixed": ("float32", "bfloat16"),  # model.torch_dtype: float32 + default mp_policy (fp32 master)
    "fp32": ("float32", "float32"),
}
OPTIMIZER_NAMES = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "TEFusedAdam": "te_fused_adam", "Muon": "muon"}


@dataclass(frozen=True)
class WorkloadTerms:
    precision: str
    training: Training
    read: tuple[str, ...]  # what was read from the recipe and what it costs, one sentence each


def precision_of(w: Workload, precision: str | None) -> str:
    """The precision asked for, else the recipe's ``model.torch_dtype`` (float32 -> fp32 master weights)."""
    if precision is not None and precision != "auto":
        return precision
    return "bf16-mixed" if (w.torch_dtype or "").removeprefix("torch.") in ("float32", "float") else "bf16"


def optimizer_of(w: Workload, name: str | None = None, storage: str = "bfloat16") -> tuple[Optimizer, str]:
    """The optimizer the recipe builds and the sentence describing its states (``storage``: the parameters' dtype)."""
    if name is not None:
        opt = Optimizer(name=name)
        return opt, f"optimizer {name} (argument)"
    kw = w.optimizer_kwargs
    canonical = OPTIMIZER_NAMES.get(w.optimizer)
    if canonical == "te_fused_adam":
        # built through the factory path with the recipe's arguments, Transformer Engine's defaults elsewhere (no
        # master weights, fp32 moments): workload.te_fused_adam_states, which the dry run's stand-in makes too
        te = te_fused_adam_states(kw)
        states = STATE_DTYPE_BYTES[te.exp_avg] + STATE_DTYPE_BYTES[te.exp_avg_sq]
        kept = ", no master weights (its default)"
        master = 0.0
        if te.master == "remainders" and storage == "bfloat16":
            master, kept = 2.0, " and 2 of master weights (the 16 bits its bf16 parameters lack of an fp32 copy)"
        elif te.master is not None:
            dtype = "float32" if te.master == "remainders" else te.master
            master = float(STATE_DTYPE_BYTES[dtype])
            kept = f" and {master:g} of {dtype} master weights"
        opt = Optimizer("te_fused_adam", states=float(states), master=master)
        return opt, f"optimizer Transformer Engine FusedAdam: {states:g} bytes of moments per trainable parameter{kept}"
    if canonical == "sgd":
        momentum = kw.get("momentum", 0)
        on = isinstance(momentum, (int, float)) and not isinstance(momentum, bool) and momentum > 0
        return Optimizer("sgd_momentum" if on else "sgd"), (
            "optimizer SGD " + ("with a momentum buffer" if on else "without momentum (no state)")
        )
    if canonical == "muon":
        return Optimizer("muon"), "optimizer Muon: one momentum buffer per parameter in its dtype"
    if canonical is None:
        return Optimizer("adamw"), f"optimizer {w.optimizer} is not one whose states are known: sized as AdamW"
    label = "Adam" if canonical == "adam" else "AdamW"
    foreach = w.optimizer_kwargs.get("foreach") is not False
    given = w.optimizer_kwargs.get("foreach") is True
    return Optimizer(canonical, foreach=foreach, foreach_given=given), (
        f"optimizer torch {label}: two states in the parameters' dtype"
        + (" (and foreach temporaries)" if foreach else " (foreach: false, a tensor at a time)")
    )


def loss_of(w: Workload) -> tuple[str, bool, str]:
    if w.loss == GEMMA4_TP_LINEAR_CE:
        return (
            "FusedLinearCrossEntropy",
            True,
            f"loss {GEMMA4_TP_LINEAR_CE}: FusedLinearCrossEntropy on the head gathered whole from its TP shards (no "
            "logits materialised)",
        )
    name = w.loss if any(name == w.loss for name, _ in LOSS_BYTES) else "MaskedCrossEntropy"
    upcast = w.loss_kwargs.get("fp32_upcast", True) is not False
    if name == "MaskedCrossEntropy":
        words = "fp32 log-probabilities of the full vocabulary" if upcast else "bf16 logits (fp32_upcast: false)"
    elif name == "FusedLinearCrossEntropy":
        words = "no logits materialised"
    elif name == "ChunkedCrossEntropy":
        words = "512-token chunks of logits"
    else:
        words = "vocabulary-sharded logits, the gradient in place"
    unknown = "" if name == w.loss else f" ({w.loss} is not a loss whose memory is known: sized as this)"
    return name, upcast, f"loss {name}: {words}{unknown}"


def training_for(
    spec: ModelSpec,
    w: Workload,
    *,
    precision: str | None,
    optimizer: str | None,
    seq_len: int,
    micro_batch_size: int,
    global_batch_size: int | None,
    pp_microbatches: int | None,
    compile_layers: bool = False,
    teacher: ModelSpec | None = None,
    masked_ce_instead: str | None = None,
    recipe: str | None = None,
) -> WorkloadTerms:
    """The ``Training`` of a recipe's workload (an empty workload: full fine-tuning with AutoModel's defaults).
    ``masked_ce_instead`` is why AutoModel trains MaskedCrossEntropy in place of the recipe's fused linear cross
    entropy (rules/fallbacks.py ``masked_ce_instead``), where it does; ``recipe`` the recipe's class (its step decides
    which loss runs on what)."""
    prec = precision_of(w, precision)
    if prec not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)} or auto, got {prec!r}")
    storage, compute = PRECISIONS[prec]
    read: list[str] = []
    lora = None
    if w.peft is not None:
        lora = lora_of(spec, w.peft, w.quantization)
        text = describe(lora, spec) + "; the base is frozen in the compute dtype (no gradients, no optimizer states)"
        if lora.quant_bits:
            text += f", its Linear weights quantized to {lora.quant_bits} bits (bitsandbytes, double quantization)"
        read.append(text)
    opt, opt_text = optimizer_of(w, optimizer, storage)
    read.append(opt_text)
    loss_name, upcast, loss_text = loss_of(w)
    if masked_ce_instead is not None:
        # AutoModel builds it with its defaults (fp32_upcast on): train_ft._maybe_downgrade_loss_fn
        loss_name, upcast = "MaskedCrossEntropy", True
        loss_text = (
            f"loss MaskedCrossEntropy in place of the recipe's {w.loss}: {masked_ce_instead}, so AutoModel falls "
            "back to it (fp32 log-probabilities of the full vocabulary)"
        )
    read.append(loss_text)
    hf_class = not builds_own_class(spec.architecture, w.force_hf)
    if runs_eager_attention(
        w.attn_implementation,
        hf_class=hf_class,
        architecture=spec.architecture,
        cp=1,
        packed=w.packed,
        backend_attn=w.attn_backend,
    ):
        if spec.architecture in EAGER_UNLESS_TE:
            said = (
                f"model.backend.attn {w.attn_backend}: AutoModel's {spec.architecture} runs its own eager attention on "
                "any backend but te, every head's seq x seq scores kept for backward (fp32 softmax and its bf16 copy)"
            )
        elif spec.architecture in EAGER_UNLESS_TILELANG:
            said = (
                f"model.backend.attn {w.attn_backend}: AutoModel's {spec.architecture} runs its own eager attention "
                "with a sink column on any backend but tilelang, every head's scores over the whole sequence (the "
                "sliding window is a mask) and the layer's compressed keys kept for backward (fp32 softmax and its "
                "bf16 copy)"
            )
        else:
            said = (
                "model.attn_implementation eager: every head's seq x seq scores kept for backward (fp32 softmax and "
                "its bf16 copy), where the layout has no CP (AutoModel runs SDPA under CP)"
            )
        read.append(said)
    if w.torch_dtype and precision in (None, "auto"):
        read.append(f"model.torch_dtype {w.torch_dtype}: {DTYPE_BYTES[storage]}-byte parameters")
    tr = Training(
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        storage_dtype=storage,
        compute_dtype=compute,
        optimizer=opt,
        pp_microbatches=pp_microbatches,
        teacher=teacher,
        lora=lora,
        loss=loss_name,
        fp32_upcast=upcast,
        loss_gathers_head=w.loss == GEMMA4_TP_LINEAR_CE and masked_ce_instead is None,
        megatron_root_unfired=masked_ce_instead is None and megatron_root_hook_unfired(w.loss, recipe, spec.mtp_layers),
        hf_class=hf_class,
        fsdp_sync_mixin=not hf_class and spec.is_moe and w.backend.get("enable_fsdp_optimizations") is True,
        moe_sync_class=not hf_class and (impl := implementation(spec.architecture)) is not None and impl.moe_sync_mixin,
        liger=w.use_liger_kernel,
        attn_implementation=w.attn_implementation,
        attn_backend=w.attn_backend,
        packed=w.packed,
        packed_vlm=w.vlm_packed and w.vlm_step,
        compile=compile_layers,
        experts=w.backend.get("experts") if isinstance(w.backend.get("experts"), str) else None,
        dispatcher=w.backend.get("dispatcher") if isinstance(w.backend.get("dispatcher"), str) else None,
        # a tower trains only where the step feeds it media: in a text step its parameters get no gradient, so
        # Adam keeps no state for them (trainable or not)
        train_towers=w.train_towers and w.vlm_step,
        train_audio=w.train_audio and w.vlm_step,
        # ... and a frozen tower's trainable projector (Mistral3's) gets gradients where the step feeds images
        train_projector=w.vlm_step and w.text_only_data is None,
        # (the VLM recipe's freeze_config, or LoRA, freezes the tower before AutoModel parallelizes the model)
        frozen_multimodal=w.frozen_multimodal_sharding if w.vlm_step else None,
        **_vlm_terms(spec, w, read),
    )
    if w.vlm_step and w.vlm_packing is not None and w.text_only_data is None:
        if note := recipe_fill_note(w.vlm_packing, spec.hf_config, w.processor_pixels, seq_len):
            read.append(note)
    return WorkloadTerms(prec, tr, tuple(read))


def _tower_state(w: Workload) -> str:
    """How the VLM step line ends for a tower whose activations the estimate does not size."""
    if w.train_towers and w.peft is None:
        return ", its tower trained: its activations not sized"
    return ", its tower frozen (no activations kept)"


def _resized(image: ImageGeometry, px: tuple[int, int]) -> str:
    """The VLM step line's account of one image as a Gemma-3, Pixtral, Kimi-VL or Muse-Glimmer processor resizes it."""
    if image.processor == "gemma3":
        return (
            f"{IMAGES_PER_SAMPLE} image a sequence resized to {image.pixels[0]} x {image.pixels[1]} "
            f"({image.tokens} of the sequence's tokens)"
        )
    if image.processor == "pixtral":
        return (
            f"{IMAGES_PER_SAMPLE} {px[0]} x {px[1]} image a sequence resized by Mistral3's Pixtral processor to "
            f"{image.pixels[0]} x {image.pixels[1]} ({image.sequence_tokens} of the sequence's tokens, row breaks "
            "included)"
        )
    if image.processor == "muse_glimmer":
        return (
            f"{IMAGES_PER_SAMPLE} {px[0]} x {px[1]} image a sequence resized by Muse-Glimmer's processor to "
            f"{image.pixels[0]} x {image.pixels[1]} ({image.grid[1]} x {image.grid[2]} patches, {image.tokens} of the "
            "sequence's tokens)"
        )
    return (
        f"{IMAGES_PER_SAMPLE} {px[0]} x {px[1]} image a sequence scaled by Kimi-VL's processor within "
        f"{KIMI_IN_TOKEN_LIMIT:,} patches and padded to {image.pixels[0]} x {image.pixels[1]} ({image.tokens} of the "
        "sequence's tokens)"
    )


def _vlm_terms(spec: ModelSpec, w: Workload, read: list[str]) -> dict[str, Any]:
    """The VLM step's terms: its kept logits, and a Qwen-VL tower's patches for the assumed image (media.py)."""
    if not w.vlm_step:
        return {}
    out: dict[str, Any] = {"vlm_step": True}
    if w.text_only_data is not None:
        read.append(
            f"VLM step: the model's logits kept through backward; dataset._target_ {w.text_only_data} makes text-only "
            "conversations: no images"
        )
        return out
    if w.fake_images is not None:
        read.append(
            f"VLM step: dataset._target_ {w.fake_images} makes text-only conversations, and AutoModel injects its "
            f"{FAKE_IMAGE_PX[0]} x {FAKE_IMAGE_PX[1]} fake image into each sample it pretokenizes "
            "(dataset.inject_fake_images, default true): one a sequence assumed"
        )
    px = FAKE_IMAGE_PX if w.fake_images is not None else IMAGE_PX
    vision = (spec.hf_config or {}).get("vision_config")
    image = vlm_image(spec.hf_config or {}, px, w.processor_pixels)
    # a frozen tower's image, sized
    if image is not None and image.processor in ("gemma3", "pixtral", "kimi", "muse_glimmer"):
        read.append(f"VLM step: the model's logits kept through backward; {_resized(image, px)}" + _tower_state(w))
        return out
    if image is None or image.processor != "qwen":
        read.append("VLM step: the model's logits kept through backward; its images' tower activations not sized")
        return out
    h, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    gated = "fullatt_block_indexes" in vision  # Qwen2.5-VL's SwiGLU keeps one more intermediate tensor
    sharding = w.frame_sharding
    out.update(
        tower_images=IMAGES_PER_SAMPLE,
        tower_patches=IMAGES_PER_SAMPLE * image.patches,
        tower_layers=int(vision.get("depth") or vision.get("num_hidden_layers") or 0),
        tower_hidden=h,
        # per patch and block: the two norms' and the projections' inputs, q, k, v (and rotary's q, k), the
        # attention output and the MLP's hidden activations
        tower_block_elems=11 * h + (3 if gated else 2) * inter,
        # AutoModel splits whole frames (an image is one) over CP only past its thresholds (cp_vision_frame_shard.py)
        tower_frame_sharded=sharding is not None
        and (IMAGES_PER_SAMPLE * image.tokens >= sharding[0] or IMAGES_PER_SAMPLE >= sharding[1]),
    )
    read.append(
        f"VLM step: the model's logits kept through backward; {IMAGES_PER_SAMPLE} {px[0]} x {px[1]} "
        f"image a sequence ({image.grid[1]} x {image.grid[2]} patches, {image.tokens} of the sequence's tokens)"
        + (", its tower trained" if w.train_towers and w.peft is None else ", its tower frozen (no activations kept)")
    )
    return out


def workload_facts(terms: WorkloadTerms) -> dict[str, Any]:
    """The workload choices as JSON (for the report)."""
    tr = terms.training
    return {
        "precision": terms.precision,
        "optimizer": tr.optimizer.name,
        "loss": tr.loss,
        "fp32_upcast": tr.fp32_upcast,
        "lora_dim": tr.lora.dim if tr.lora else None,
    }


__all__ = ["PRECISIONS", "WorkloadTerms", "loss_of", "optimizer_of", "precision_of", "training_for"]
