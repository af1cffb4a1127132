"""Pydantic models of AutoModel 0.7.0's ``distributed:`` block, with AutoModel's defaults.

These are the YAML-facing shapes: dtypes are names ("bfloat16"), callables are dotted names.
Field sets and defaults mirror the dataclasses in ``components/distributed/config.py``,
``pipelining/config.py`` and ``cp_vision_frame_shard.py``; ``tests/oracle/test_schema.py`` checks
them against the installed AutoModel when it is present. The rules use these models for the
option names and value types of every strategy; ``references/config-reference.md`` lists
exactly these keys and defaults (a test keeps them in step).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

PositiveInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
DtypeName = Annotated[str, Field(description="torch dtype name, e.g. bfloat16, float32 (torch. prefix optional)")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MixedPrecisionPolicy(_Strict):
    """``mp_policy:`` -> torch.distributed.fsdp.MixedPrecisionPolicy.

    Defaults are those of a YAML ``mp_policy:`` dict (torch's defaults, with
    ``cast_forward_inputs`` defaulted to False by AutoModel). When ``mp_policy`` is absent or
    null, FSDP2 uses bf16 params / fp32 reduce instead (see ``FSDP2Options.mp_policy``).
    """

    param_dtype: DtypeName | None = Field(default=None, description="Dtype parameters are cast to for compute.")
    reduce_dtype: DtypeName | None = Field(default=None, description="Dtype of gradient reduction.")
    output_dtype: DtypeName | None = Field(default=None, description="Dtype forward outputs are cast to.")
    cast_forward_inputs: bool = Field(default=False, description="Cast forward inputs to param_dtype.")


# Fields newer torch releases added to these classes (field -> first torch version). AutoModel 0.7.0 passes the
# YAML mapping through, so on an older torch they raise TypeError; the reference here is torch 2.13.
TORCH_LATER_FIELDS: dict[str, dict[str, str]] = {
    "MixedPrecisionPolicy": {"param_dtype_override_fn": "2.15"},
}


class CPUOffloadPolicy(_Strict):
    """``offload_policy:`` -> torch.distributed.fsdp.CPUOffloadPolicy."""

    pin_memory: bool = Field(default=True, description="Pin the CPU copies of parameters.")


class FrameSharding(_Strict):
    """``multimodal.vision.frame_sharding:`` -> CpVisionFrameShardingConfig."""

    enabled: bool = Field(default=False, description="Shard VLM vision frames across CP ranks.")
    mesh_dims: list[Literal["cp"]] = Field(default=["cp"], description='Only ["cp"] is supported.')
    min_tokens: NonNegInt = Field(default=2048, description="Minimum merged visual tokens to shard.")
    min_frames: NonNegInt = Field(default=32, description="Minimum frames that select sharding.")
    min_local_patch_rows: NonNegInt = Field(default=96, description="Pad small local shards to this many rows.")
    cost_alpha: NonNegInt | Literal["auto"] | None = Field(default="auto", description="Partition cost term.")


class MultimodalVision(_Strict):
    frame_sharding: FrameSharding = Field(default_factory=FrameSharding)


class Multimodal(_Strict):
    """``multimodal:`` -> MultimodalDistributedConfig (FSDP2 only)."""

    frozen_sharding: Literal["root", "per_layer", "replicate"] = Field(
        default="root", description="FSDP policy for fully frozen towers/projectors."
    )
    vision: MultimodalVision = Field(default_factory=MultimodalVision)


ACMode = bool | Literal["selective"]


class FSDP2Options(_Strict):
    """Strategy options of ``strategy: fsdp2`` (FSDP2Config)."""

    sequence_parallel: bool = Field(
        default=False, description="Sequence parallelism in the TP plan (acts with tp>1; rejected with ep>1)."
    )
    tp_plan: dict[str, Any] | str | None = Field(default=None, description="Custom TP plan; None = auto per model.")
    patch_is_packed_sequence: bool = Field(default=False, description="Patch HF _is_packed_sequence to False.")
    mp_policy: MixedPrecisionPolicy | None = Field(
        default_factory=lambda: MixedPrecisionPolicy(
            param_dtype="bfloat16", reduce_dtype="float32", output_dtype=None, cast_forward_inputs=False
        ),
        description="FSDP2 mixed precision; absent/null = bf16 params, fp32 reduce.",
    )
    offload_policy: CPUOffloadPolicy | None = Field(default=None, description="CPU offload of params/grads/optim.")
    autocast_dtype: DtypeName | None = Field(default=None, description="torch.autocast dtype around forward.")
    activation_checkpointing_scope: str | list[str] = Field(
        default="all", description="all | language | vision | audio | multimodal (list or comma-separated)."
    )
    defer_fsdp_grad_sync: bool = Field(
        default=True,
        description=(
            "Defer FSDP grad sync to the step's last backward (also under PP): until then every gradient of the rank is "
            "held unsharded in fp32; false reduce-scatters after each backward."
        ),
    )
    reshard_after_forward: bool | None = Field(
        default=None,
        description=(
            "None = AutoModel's default: all but the last block reshard, PP included (its keep-gathered-under-PP branch "
            "never triggers); with ep_size > 1 every block follows moe.reshard_after_forward."
        ),
    )
    enable_async_tensor_parallel: bool = Field(
        default=False, description="Async TP (tp>1): needs sequence_parallel; rejected with ep>1."
    )
    enable_compile: bool = Field(default=False, description="Per-layer torch.compile.")
    enable_fsdp2_prefetch: bool = Field(default=False, description="Explicit FSDP2 prefetch chains.")
    fsdp2_backward_prefetch_depth: NonNegInt = Field(default=2, description="FSDP units prefetched in backward.")
    fsdp2_forward_prefetch_depth: NonNegInt = Field(default=1, description="FSDP units prefetched in forward.")
    multimodal: Multimodal = Field(default_factory=Multimodal, description="Multimodal FSDP policies.")


class MegatronFSDPOptions(_Strict):
    """Strategy options of ``strategy: megatron_fsdp`` (aliases megatron-fsdp, mfsdp)."""

    megatron_fsdp_unit_modules: list[str] | None = Field(
        default=None, description="Class paths wrapped as FSDP units; None = model's _no_split_modules."
    )
    zero_dp_strategy: Literal[0, 1, 2, 3] = Field(default=3, description="ZeRO stage: 0 DDP .. 3 full sharding.")
    init_fsdp_with_meta_device: bool = Field(default=False, description="Initialize on the meta device.")
    grad_reduce_in_fp32: bool = Field(default=False, description="Reduce gradients in fp32.")
    preserve_fp32_weights: bool = Field(default=False, description="Keep fp32 master weights.")
    overlap_grad_reduce: bool = Field(default=True, description="Overlap gradient reduce-scatter.")
    overlap_param_gather: bool = Field(default=True, description="Overlap parameter all-gather.")
    check_for_nan_in_grad: bool = Field(default=True, description="No-op with megatron-fsdp 0.5.0.")
    report_nan_in_param_grad: bool = Field(default=False, description="Per-parameter gradient NaN check.")
    average_in_collective: bool = Field(default=False, description="Average inside the collective.")
    disable_bucketing: bool = Field(default=False, description="Disable gradient bucketing.")
    calculate_per_token_loss: bool = Field(default=False, description="Per-token loss scaling.")
    keep_fp8_transpose_cache: bool = Field(default=False, description="Keep the fp8 transpose cache.")
    nccl_ub: bool = Field(default=False, description="NCCL user buffers.")
    fsdp_double_buffer: bool = Field(default=False, description="Double-buffer parameter gathers.")


class DDPOptions(_Strict):
    """Strategy options of ``strategy: ddp``."""

    activation_checkpointing_scope: str | list[str] = Field(default="all", description="As for fsdp2.")
    broadcast_buffers: bool = Field(default=False, description="Broadcast buffers before each forward.")
    find_unused_parameters: bool = Field(default=False, description="DDP find_unused_parameters.")
    static_graph: bool = Field(default=False, description="DDP static_graph.")
    bucket_cap_mb: Annotated[float, Field(gt=0)] | None = Field(default=None, description="Bucket size in MiB.")
    gradient_as_bucket_view: bool = Field(default=False, description="Gradients as bucket views.")
    autocast_dtype: DtypeName | None = Field(default=None, description="torch.autocast dtype around forward.")


STRATEGY_OPTIONS: dict[str, type[_Strict]] = {
    "fsdp2": FSDP2Options,
    "megatron_fsdp": MegatronFSDPOptions,
    "ddp": DDPOptions,
}


class PipelineConfig(_Strict):
    """``pipeline:`` -> PipelineConfig (required when pp_size > 1; ``{}`` selects defaults)."""

    pp_schedule: str | None = Field(default="1f1b", description="torch get_schedule_class name, case-insensitive.")
    pp_schedule_csv: str | None = Field(default=None, description="CSV schedule path; overrides pp_schedule.")
    pp_microbatch_size: PositiveInt = Field(default=1, description="Samples per pipeline microbatch.")
    pp_batch_size: PositiveInt = Field(default=1, description="Overwritten by step_scheduler.local_batch_size.")
    layers_per_stage: PositiveInt | None = Field(default=None, description="Layers per virtual stage.")
    round_virtual_stages_to_pp_multiple: Literal["up", "down"] | None = Field(
        default=None, description="Round virtual stages to a multiple of pp_size."
    )
    module_fqns_per_model_part: list[list[str]] | None = Field(default=None, description="Explicit stage FQNs.")
    patch_inner_model: bool = Field(default=True, description="Patch the inner model forward for PP.")
    patch_causal_lm_model: bool = Field(default=True, description="Patch the CausalLM forward for PP.")
    patch_stage_backward_maybe_with_nosync: bool = Field(
        default=False, description="Overwritten by model.backend.enable_fsdp_optimizations."
    )
    dtype: DtypeName | None = Field(default=None, description="Stage communication dtype; None = mp_policy's.")
    scale_grads_in_schedule: bool = Field(default=False, description="Scale grads by 1/n_microbatches.")
    loss_fn: str | None = Field(default=None, description="Overwritten by the recipe's loss_fn.")
    pp_seq_len: PositiveInt | None = Field(default=None, description="Sequence length for shape inference.")
    pp_recv_buffer_pool: bool = Field(default=False, description="Pool P2P recv buffers (1f1b only).")
    pp_recv_buffer_pool_slack: NonNegInt = Field(default=2, description="Extra pooled buffer sets (>= 0).")


class MoEConfig(_Strict):
    """``moe:`` -> MoEParallelizerConfig (used only when ep_size > 1)."""

    ignore_router_for_ac: bool = Field(default=True, description="Save router outputs under AC.")
    reshard_after_forward: bool = Field(
        default=False,
        description=(
            "With ep_size > 1: reshard every block and the experts after forward (unless distributed."
            "reshard_after_forward is set)."
        ),
    )
    lm_head_precision: DtypeName | None = Field(default=None, description="lm_head compute dtype.")
    wrap_outer_model: bool = Field(default=True, description="fully_shard the outer model too.")
    mp_policy: MixedPrecisionPolicy | None = Field(default=None, description="MoE mixed precision (_target_ form).")


class DistributedConfig(_Strict):
    """The whole ``distributed:`` block, resolved (strategy options in ``options``)."""

    strategy: Literal["fsdp2", "megatron_fsdp", "ddp"] = Field(
        default="fsdp2", description="fsdp2 | megatron_fsdp (megatron-fsdp, mfsdp) | ddp."
    )
    dp_size: PositiveInt | None = Field(default=None, description="None = world // (tp*cp*pp).")
    dp_replicate_size: PositiveInt | None = Field(default=None, description="HSDP replicas (fsdp2 only).")
    tp_size: PositiveInt = Field(default=1, description="Tensor parallel degree.")
    pp_size: PositiveInt = Field(default=1, description="Pipeline parallel degree.")
    cp_size: PositiveInt = Field(default=1, description="Context parallel degree.")
    ep_size: PositiveInt = Field(default=1, description="Expert parallel degree (fsdp2 only).")
    activation_checkpointing: ACMode = Field(default=False, description="false | true/full | selective (fsdp2, ddp).")
    pipeline: PipelineConfig | None = Field(default=None, description="Pipeline settings (pp_size > 1).")
    moe: MoEConfig | None = Field(default=None, description="MoE parallelizer settings (ep_size > 1).")
    options: FSDP2Options | MegatronFSDPOptions | DDPOptions = Field(
        default_factory=FSDP2Options, description="Strategy-specific options (top-level keys in YAML)."
    )


class CheckpointOptions(_Strict):
    """``checkpoint:`` -> CheckpointingConfig (components/checkpoint/config.py); ``restore_from`` is read apart."""

    AUTOMODEL_CLASS: ClassVar[str] = "CheckpointingConfig"  # the name messages give (it is AutoModel's TypeError)

    enabled: bool = Field(default=True, description="Save checkpoints at all.")
    checkpoint_dir: str = Field(default="checkpoints/", description="Saves go to <dir>/epoch_E_step_S.")
    model_save_format: Literal["safetensors", "torch_save"] = Field(
        default="safetensors", description="safetensors (Hugging Face shards) or torch_save (DCP .distcp)."
    )
    model_cache_dir: str | None = Field(
        default=None, description="Overwritten by the recipe from model.cache_dir (the Hugging Face cache if unset)."
    )
    model_repo_id: str | None = Field(default=None, description="Overwritten by the recipe from the model section.")
    save_consolidated: bool | Literal["false", "final", "every", "true"] = Field(
        default="final",
        description="Also write a consolidated Hugging Face checkpoint: final (the last step's save), every (every "
        "save, inline), false.",
    )
    is_peft: bool = Field(default=False, description="Overwritten by the recipe (whether peft: is given).")
    model_state_dict_keys: list[str] | None = Field(default=None, description="Kept for compatibility.")
    is_async: bool = Field(default=False, description="Asynchronous save (torch >= 2.9).")
    wait_for_staging: bool = Field(default=False, description="Drain async staging buffers after each save.")
    cpu_offload: bool = Field(default=False, description="State-dict tensors on the CPU before saving.")
    allow_legacy_pickle_restore: bool = Field(default=False, description="Allow pickled legacy checkpoints.")
    dequantize_base_checkpoint: bool | None = Field(
        default=None, description="Dequantize a quantized base checkpoint on load (null: when it is quantized)."
    )
    original_model_root_dir: str | None = Field(default=None, description="Set by AutoModel when it loads a base.")
    skip_task_head_prefixes_for_base_model: list[str] | None = Field(
        default=None, description="Prefixes skipped when loading the base model."
    )
    single_rank_consolidation: bool = Field(
        default=False, description="Rank 0 alone writes the consolidated checkpoint while the others wait."
    )
    staging_dir: str | None = Field(
        default=None, description="Consolidation writes here first, then copies (no truncated final shards)."
    )
    v4_compatible: bool = Field(default=False, description="Save the original transformers-v4 config.json.")
    legacy_paramwrapper_layout: bool = Field(default=False, description="PEFT fused-expert LoRA export for peft<=0.19.")
    diffusers_compatible: bool = Field(default=False, description="diffusers index file name.")
    best_metric_key: str = Field(default="default", description="Metric that names the best checkpoint.")
    consolidation_timeout_minutes: PositiveInt = Field(
        default=30, description="Timeout of the Gloo group the ranks consolidate on."
    )
    max_recent_checkpoints: PositiveInt | None = Field(
        default=None, description="Keep this many checkpoints (older ones are deleted by rank 0)."
    )


CHECKPOINT_READ_APART = ("restore_from",)  # popped by the recipe before CheckpointingConfig(**kwargs)
CHECKPOINT_FROM_MODEL = ("model_repo_id", "model_cache_dir", "is_peft")  # RecipeConfig.checkpoint overwrites them


@cache
def fields(model: type[BaseModel]) -> Mapping[str, FieldInfo]:
    """``model.model_fields``, looked up once (pydantic's class property costs ~0.5 us a call); read-only."""
    return MappingProxyType(dict(model.model_fields))


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default of a field (calling its factory), as JSON-able data."""
    info = fields(model)[name]
    value = info.get_default(call_default_factory=True)
    return value.model_dump() if isinstance(value, BaseModel) else value
