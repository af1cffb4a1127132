"""What a recipe trains, read where AutoModel 0.7.0 reads it: sequence length and batch sizes, PEFT, the loss, the
optimizer, the model's dtype and kernel backends. Pure: the ``_target_`` strings are compared as names, never
imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config.kinds import VLM_STEP_RECIPES, recipe_class
from .config.values import is_nonneg_int, is_positive_int
from .vlm_packing import VlmPacking

# the LLM recipes' data sets and packing, then the VLM recipe's packing (pack_size) and its collate's padded length
SEQ_LEN_KEYS = (
    "dataset.seq_len",
    "dataset.seq_length",
    "packed_sequence.packed_sequence_size",
    "packed_sequence.pack_size",
    "dataloader.collate_fn.max_length",
)

# Loss classes AutoModel has typed configs for (components/loss/loss.py LOSS_CONFIG_REGISTRY); its default is the
# masked cross entropy.
LOSSES = ("MaskedCrossEntropy", "FusedLinearCrossEntropy", "ChunkedCrossEntropy", "TEParallelCrossEntropy")
# AutoModel's FusedLinearCrossEntropy for Gemma-4's TP vocabulary-sharded tied head (gemma4_moe/loss.py): it gathers
# the head whole from its TP shards (its gradient sliced back, not summed) before the fused kernel
GEMMA4_TP_LINEAR_CE = "Gemma4TensorParallelFusedLinearCrossEntropy"
DEFAULT_LOSS = "MaskedCrossEntropy"
# AutoModel's VLM data set builders whose conversations carry no image (their docstrings: "text-only"; the VLM collate
# then hands the model no pixels)
TEXT_ONLY_VLM_DATASETS = (
    "nemo_automodel.components.datasets.vlm.datasets.make_tulu3_dataset",
    "nemo_automodel.components.datasets.vlm.datasets.make_tulu3_magicoder_text_mix_dataset",
)
OPTIMIZERS = {  # _target_ -> a canonical name
    "torch.optim.AdamW": "AdamW",
    "torch.optim.Adam": "Adam",
    "torch.optim.SGD": "SGD",
    "transformer_engine.pytorch.optimizers.FusedAdam": "TEFusedAdam",
    "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam": "TEFusedAdam",
    "dion.Muon": "Muon",
}


# AutoModel's dtype_from_str (shared/utils.py), which its optimizer factory applies to FusedAdam's dtype arguments:
# lower-cased, "torch." optional, "bf16" and "half" accepted
_STATE_DTYPES = {
    "float": "float32",
    "float32": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "uint8": "uint8",
}
STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


@dataclass(frozen=True)
class FusedAdamStates:
    """What Transformer Engine's FusedAdam keeps per parameter, from the arguments AutoModel hands it: exp_avg and
    exp_avg_sq in their dtypes (fp32 by default; uint8 for its FP8 moments), and with master_weights a master copy in
    master_weight_dtype, or with store_param_remainders (an fp32 master) the 16 bits a bf16 parameter lacks of it
    (``remainders``; a parameter of another dtype keeps a full fp32 copy)."""

    exp_avg: str = "float32"
    exp_avg_sq: str = "float32"
    master: str | None = None  # a dtype, "remainders", or None (no master copy)


def te_fused_adam_states(kwargs: Mapping[str, Any]) -> FusedAdamStates:
    def dtype(key: str) -> str:
        value = kwargs.get(key)
        name = value.lower().removeprefix("torch.") if isinstance(value, str) else "float32"
        return _STATE_DTYPES.get(name, "float32")

    master = None
    if kwargs.get("master_weights") is True:
        master = dtype("master_weight_dtype")
        if kwargs.get("store_param_remainders") is True and master == "float32":
            master = "remainders"
    return FusedAdamStates(dtype("exp_avg_dtype"), dtype("exp_avg_sq_dtype"), master)


def _name(target: Any) -> str | None:
    return target.rsplit(".", 1)[-1] if isinstance(target, str) else None


# AutoModel's from_pretrained passes load_base_model=False for these (their encoders load their own weights)
_OWN_LOADERS = frozenset({"NeMoAutoModelBiEncoder", "NeMoAutoModelCrossEncoder"})


def _loads_base_model(model: Mapping[str, Any]) -> bool:
    """AutoModel's ``load_base_model`` for the recipe's model: from_pretrained passes True (but for the retrieval
    encoders), from_config takes it as a keyword (``model.load_base_model``, False unless given)."""
    target = model.get("_target_")
    if isinstance(model.get("load_base_model"), bool):
        return bool(model["load_base_model"])
    if not isinstance(target, str) or _name(target) != "from_pretrained":
        return False
    parts = target.split(".")
    return len(parts) < 2 or parts[-2] not in _OWN_LOADERS


def unsized_entry(w: Workload) -> str | None:
    """Why the recipe's model is not what AutoModel's NeMoAutoModel entry points build from its config (None: it is):
    an AutoModel class called directly, such as a composite of its own (Gemma4WithDrafter: a drafter model and its own
    checkpointing around the base)."""
    if w.model_entry is None or w.model_entry.startswith("NeMoAutoModel"):
        return None
    return (
        f"model._target_ builds AutoModel's {w.model_entry} directly, not through a NeMoAutoModel entry point (a "
        "composite such as the joint drafter adds modules, states and checkpointing of its own, which are not "
        "modelled): not sized"
    )


def _kwargs(section: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in section.items() if isinstance(k, str) and not k.startswith("_")}


@dataclass(frozen=True)
class Workload:
    """The training run a recipe describes (each value with the key it came from; None where it says nothing)."""

    seq_len: tuple[int, str] | None = None
    global_batch_size: tuple[int, str] | None = None
    local_batch_size: tuple[int, str] | None = None
    peft: dict[str, Any] | None = None  # the peft: section's PeftConfig fields
    quantization: dict[str, Any] | None = None
    loss: str = DEFAULT_LOSS  # a LOSSES name; an unknown target is kept by name
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "AdamW"  # an OPTIMIZERS value, or the target's last name when unknown
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    torch_dtype: str | None = None  # model.torch_dtype
    backend: dict[str, Any] = field(default_factory=dict)  # model.backend (BackendConfig fields)
    # the AutoModel class model._target_ names (NeMoAutoModelForCausalLM, ...; a model class of its own, such as the
    # Gemma4WithDrafter composite, otherwise); None for a target outside nemo_automodel
    model_entry: str | None = None
    # AutoModel builds transformers' class: model.force_hf, or a quantization: section that asks bitsandbytes for 4 or
    # 8 bits (its own classes do not load BnB weights: _transformers/model_init.py falls through to transformers')
    force_hf: bool = False
    load_base_model: bool = False  # AutoModel loads the checkpoint: from_pretrained, or from_config when asked
    use_liger_kernel: bool = True  # model.use_liger_kernel (AutoModel's default: Liger on a Hugging Face class)
    attn_implementation: str | None = None  # model.attn_implementation (None: AutoModel's default, flash or SDPA)
    packed: bool = False  # packed_sequence.packed_sequence_size > 0 (the LLM recipes' has_packed_sequence)
    # the LLM recipe's batches are packed THD (AutoModel's DataloaderConfig.emits_thd: THD packing, the default
    # packing_strategy, or packed_sequence_thd_collater named as the collate)
    thd_batches: bool = False
    # packed_sequence.pack_size > 0 in the VLM recipe (its packing collates): pack_size, packing_ratio and
    # collate_max_length
    vlm_packing: VlmPacking | None = None
    clip_grad_norm: float | None = 1.0
    # knowledge distillation (kd.py): the teacher_model: section's model, and where the recipe keeps it
    teacher: str | None = None
    teacher_offloaded: bool = False  # offload_teacher_model: on the CPU between its forwards
    teacher_separate_mesh: bool = False  # separate_meshes: on ranks of its own (teacher_distributed:)
    # a VLM's towers, trained unless freeze_config freezes them (AutoModel's FreezeConfig: with no section nothing is
    # frozen; a section freezes the vision tower unless it says freeze_vision_tower: false or names module selectors;
    # the audio tower only with freeze_audio_tower: true). PEFT freezes both whatever it says.
    train_towers: bool = True
    train_audio: bool = True
    freeze_config: dict[str, Any] | None = None  # the section as written: AutoModel's model build parses it
    # a VLM recipe's image processing: the processor's pixel bounds (min_pixels / max_pixels), and the collate
    # function's name (qwen2_5_collate_fn and kimi_vl_collate_fn hand the processor's fp32 pixels on; the default one
    # casts them to bf16)
    processor_pixels: tuple[int | None, int | None] = (None, None)
    collate: str | None = None
    vlm_step: bool = False  # the VLM finetune recipe's step (vlm/finetune.py): images in every sequence
    # a VLM recipe's data set builder that makes text-only conversations (TEXT_ONLY_VLM_DATASETS): no images at all,
    # or, where AutoModel pretokenizes them and injects its fake image (dataset.inject_fake_images, default true), a
    # 56 x 56 fake image in each sample
    text_only_data: str | None = None
    fake_images: str | None = None
    # distributed.multimodal.vision.frame_sharding when enabled: its (min_tokens, min_frames) thresholds
    frame_sharding: tuple[int, int] | None = None
    # distributed.multimodal.frozen_sharding: where FSDP keeps frozen multimodal modules (root: AutoModel's default,
    # the root unit, gathered with it through the step; per_layer; replicate)
    frozen_multimodal_sharding: str = "root"
    # the multi-token-prediction depth the recipe sets (model.num_nextn_predict_layers, an argument of AutoModel's
    # Qwen3.5 classes, else its text_config override's num_nextn_predict_layers or mtp_num_hidden_layers), with its key
    mtp_depth: tuple[int, str] | None = None
    # model.mtp_use_repeated_layer: AutoModel's Nemotron-V3 class builds one MTP depth and runs it mtp_depth times
    mtp_repeated: bool = False
    # model.output_hidden_states and model.text_config.output_hidden_states where set (AutoModel puts them in the
    # built config)
    output_hidden_states: tuple[bool | None, bool | None] = (None, None)
    # Gemma-4's CP attention kernels, model.text_config.cp_full_attn_backend and cp_sliding_attn_backend (lowercase)
    gemma4_cp_kernels: tuple[str | None, str | None] = (None, None)

    @property
    def vlm_packed(self) -> bool:
        """The VLM recipe packs its samples (packed_sequence.pack_size > 0)."""
        return self.vlm_packing is not None

    @property
    def attn_backend(self) -> str | None:
        """model.backend.attn as written (None: unset, te on a GPU with Transformer Engine)."""
        attn = self.backend.get("attn")
        return attn if isinstance(attn, str) else None


def _pretokenized(recipe: Mapping[str, Any]) -> bool:
    """Whether the VLM recipe's data is pretokenized, as AutoModel's typed config decides it
    (recipes/_typed_config.py): packed_sequence.pretokenize, default on where pack_size > 0; without a packed_sequence:
    dataset.pretokenize, default on where dataset.max_length is set."""
    packed = recipe.get("packed_sequence")
    if isinstance(packed, Mapping):
        size = packed.get("pack_size", 0)
        return bool(packed.get("pretokenize", is_positive_int(size)))
    flag = _get(recipe, "dataset.pretokenize")
    return bool(flag) if flag is not None else _get(recipe, "dataset.max_length") is not None


def _get(recipe: Mapping[str, Any] | None, dotted: str) -> Any:
    node: Any = recipe
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def read_workload(recipe: Mapping[str, Any] | None) -> Workload:
    """The workload of a recipe (an empty one for a bare ``distributed:`` block)."""
    if not recipe:
        return Workload()
    facts: dict[str, Any] = {}
    for key in SEQ_LEN_KEYS:
        if is_positive_int(v := _get(recipe, key)):
            facts["seq_len"] = (v, key)
            break
    for name in ("global_batch_size", "local_batch_size"):
        if is_positive_int(v := _get(recipe, f"step_scheduler.{name}")):
            facts[name] = (v, f"step_scheduler.{name}")
    peft = recipe.get("peft")
    if isinstance(peft, Mapping):
        facts["peft"] = _kwargs(peft)
    quant = recipe.get("quantization")
    if isinstance(quant, Mapping):
        facts["quantization"] = _kwargs(quant)
    loss = recipe.get("loss_fn")
    if isinstance(loss, Mapping) and _name(loss.get("_target_")):
        facts["loss"] = _name(loss["_target_"])
        facts["loss_kwargs"] = _kwargs(loss)
    opt = recipe.get("optimizer")
    if isinstance(opt, Mapping) and isinstance(opt.get("_target_"), str):
        facts["optimizer"] = OPTIMIZERS.get(opt["_target_"], _name(opt["_target_"]))
        facts["optimizer_kwargs"] = _kwargs(opt)
    model = recipe.get("model")
    if isinstance(model, Mapping):
        if isinstance(model.get("torch_dtype"), str):
            facts["torch_dtype"] = model["torch_dtype"]
        if isinstance(model.get("backend"), Mapping):
            facts["backend"] = _kwargs(model["backend"])
        bnb = isinstance(quant, Mapping) and (quant.get("load_in_4bit") is True or quant.get("load_in_8bit") is True)
        facts["force_hf"] = model.get("force_hf") is True or bnb
        facts["mtp_repeated"] = model.get("mtp_use_repeated_layer") is True
        target = model.get("_target_")
        if isinstance(target, str) and target.startswith("nemo_automodel.") and len(target.split(".")) >= 3:
            facts["model_entry"] = target.split(".")[-2]
        facts["load_base_model"] = _loads_base_model(model)
        facts["use_liger_kernel"] = model.get("use_liger_kernel") is not False
        if isinstance(model.get("attn_implementation"), str):
            facts["attn_implementation"] = model["attn_implementation"]
    teacher = recipe.get("teacher_model")
    if isinstance(teacher, Mapping) and isinstance(teacher.get("pretrained_model_name_or_path"), str):
        facts["teacher"] = teacher["pretrained_model_name_or_path"]
    facts["teacher_offloaded"] = recipe.get("offload_teacher_model") is True
    facts["teacher_separate_mesh"] = recipe.get("separate_meshes") is True
    freeze = recipe.get("freeze_config")
    if isinstance(freeze, Mapping):
        facts["freeze_config"] = dict(freeze)
        vision = freeze.get("freeze_vision_tower")
        if vision is None:  # model_utils.apply_parameter_freezing: selectors replace the implicit vision freeze
            vision = "freeze_modules" not in freeze and "unfreeze_modules" not in freeze
        facts["train_towers"] = vision is False
        facts["train_audio"] = freeze.get("freeze_audio_tower") is not True
    facts["vlm_step"] = recipe_class(recipe)[0] in VLM_STEP_RECIPES
    builder = _get(recipe, "dataset._target_")
    if facts["vlm_step"] and isinstance(builder, str) and builder in TEXT_ONLY_VLM_DATASETS:
        injects = _get(recipe, "dataset.inject_fake_images") is not False
        facts["fake_images" if injects and _pretokenized(recipe) else "text_only_data"] = builder.rsplit(".", 1)[-1]
    packed = _get(recipe, "packed_sequence.packed_sequence_size")
    # (the LLM recipes' key: the VLM recipe packs with pack_size and hands AutoModel's build no has_packed_sequence)
    facts["packed"] = is_positive_int(packed) and not facts["vlm_step"]
    if facts["vlm_step"] and is_positive_int(size := _get(recipe, "packed_sequence.pack_size")):
        ratio, longest = (
            _get(recipe, "packed_sequence.packing_ratio"),
            _get(recipe, "packed_sequence.collate_max_length"),
        )
        facts["vlm_packing"] = packing = VlmPacking(
            size,
            float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0 else 1.0,
            longest if is_positive_int(longest) else None,
        )
        if packing.collate_max_length is not None and packing.collate_max_length > size:
            # the collate pads every batch to it, past the longest pack
            facts["seq_len"] = (packing.collate_max_length, "packed_sequence.collate_max_length")
    frozen = _get(recipe, "distributed.multimodal.frozen_sharding")
    if isinstance(frozen, str):
        facts["frozen_multimodal_sharding"] = frozen.strip().lower().replace("-", "_")
    frames = _get(recipe, "distributed.multimodal.vision.frame_sharding")
    if isinstance(frames, Mapping) and frames.get("enabled") is True:
        # CpVisionFrameShardingConfig's defaults
        low = frames.get("min_tokens", 2048)
        few = frames.get("min_frames", 32)
        facts["frame_sharding"] = (low if isinstance(low, int) else 2048, few if isinstance(few, int) else 32)
    bounds = tuple(_get(recipe, f"processor.{k}") for k in ("min_pixels", "max_pixels"))
    facts["processor_pixels"] = tuple(v if is_positive_int(v) else None for v in bounds)
    if isinstance(collate := _get(recipe, "dataloader.collate_fn._target_"), str):
        facts["collate"] = _name(collate)
    named = _get(recipe, "dataloader.collate_fn")
    named = named if isinstance(named, str) else facts.get("collate")
    strategy = _get(recipe, "packed_sequence.packing_strategy")
    facts["thd_batches"] = (facts["packed"] and strategy != "neat") or (
        isinstance(named, str) and _name(named) == "packed_sequence_thd_collater"
    )
    for key in (
        "model.num_nextn_predict_layers",
        "model.text_config.num_nextn_predict_layers",
        "model.text_config.mtp_num_hidden_layers",
    ):
        if is_nonneg_int(v := _get(recipe, key)):
            facts["mtp_depth"] = (v, key)
            break
    flags = (_get(recipe, "model.output_hidden_states"), _get(recipe, "model.text_config.output_hidden_states"))
    facts["output_hidden_states"] = tuple(v if isinstance(v, bool) else None for v in flags)
    kernels = (_get(recipe, f"model.text_config.cp_{k}_attn_backend") for k in ("full", "sliding"))
    facts["gemma4_cp_kernels"] = tuple(str(v).lower() if v is not None else None for v in kernels)
    clip = recipe.get("clip_grad_norm")
    if isinstance(clip, Mapping):
        value = clip.get("max_norm")
        facts["clip_grad_norm"] = (
            float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        )
    return Workload(**facts)


__all__ = [
    "FusedAdamStates",
    "STATE_DTYPE_BYTES",
    "te_fused_adam_states",
    "Workload",
    "read_workload",
    "LOSSES",
    "GEMMA4_TP_LINEAR_CE",
    "OPTIMIZERS",
    "SEQ_LEN_KEYS",
]
