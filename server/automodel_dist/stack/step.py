"""AutoModel 0.7.0's model build and training step, as ``recipes/llm/train_ft.py`` runs them (its ``setup``,
``_run_train_optim_step`` and ``_forward_backward_step``): the same AutoModel functions in the same order. The recipe
module itself is not imported (it needs torchao, torchdata and the dataset stack at import).

The dry run calls these on fake tensors under a memory tracker, the smoke run on real tensors on N processes; both
hand in the patches their tensors need and a ``phases`` callable (a context manager per phase name) to time or
attribute the work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from ..workload import GEMMA4_TP_LINEAR_CE
from .recipe import StackRecipe

PhaseFn = Callable[[str], contextlib.AbstractContextManager[Any]]


@contextlib.contextmanager
def no_phases(name: str) -> Iterator[None]:
    yield


def flat_dp_mesh(mesh: Any, include_cp: bool = True) -> Any:
    """train_ft's data-parallel mesh (``_get_dp_group``): dp, or dp_cp with context parallelism; None without a mesh."""
    from nemo_automodel.components.distributed.mesh_utils import get_flat_mesh

    if mesh is None:
        return None
    if include_cp and "cp" in mesh.mesh_dim_names and mesh["cp"].size() > 1:
        return get_flat_mesh(mesh, "dp_cp")
    return get_flat_mesh(mesh, "dp")


def dp_group(mesh: Any, include_cp: bool = True) -> Any:
    """The group of ranks holding different data (train_ft's ``_get_dp_group``); None for one rank."""
    flat = flat_dp_mesh(mesh, include_cp)
    return None if flat is None or flat.size() == 1 else flat.get_group()


def dp_group_size(mesh: Any, include_cp: bool = True) -> int:
    """train_ft's ``_get_dp_group_size``."""
    flat = flat_dp_mesh(mesh, include_cp)
    return 1 if flat is None else flat.size()


@dataclass
class Built:
    """A model as AutoModel built it, with what its step needs."""

    model: Any
    parts: list[Any]
    setup: Any
    loss_fn: Any
    hf_config: Any
    pp_enabled: bool
    params: dict[str, Any] = field(default_factory=dict)

    vlm: bool = False  # built by the VLM recipe's build, trained by its step

    @property
    def mesh(self) -> Any:
        return self.setup.mesh_context.device_mesh

    @property
    def mc(self) -> Any:
        return self.setup.mesh_context


def setup(distributed: dict[str, Any], world_size: int) -> Any:
    """AutoModel's distributed setup (strategy, meshes, pipeline and MoE configs) of a ``distributed:`` block."""
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config

    return create_distributed_setup_from_config({"distributed": distributed}, world_size=world_size)


def _fused_linear_ce_stand_in(chunked: Any, materialize: Any = None) -> Any:
    """AutoModel's ChunkedCrossEntropy computing the loss of a FusedLinearCrossEntropy recipe (cut_cross_entropy needs
    CUDA), its head's weight prepared as FusedLinearCrossEntropy's is (loss/utils.prepare_lm_weight's other branch:
    materialize_lm_weight on the head's weight, with its check that a DTensor head's mesh matches the gradient
    reduction group), not with ChunkedCrossEntropy's own check of the head (a plain Linear, no softcapping), which
    the kernel does not make. (A head found only by its parameter's name, which FusedLinearCrossEntropy's lookup also
    accepts, is not: the stand-in raises there.)"""

    class FusedLinearCrossEntropyStandIn(type(chunked)):
        def prepare_lm_weight(self, lm_head: Any, *, model_config: Any = None, grad_reduce_group: Any = None) -> Any:
            weight = lm_head.weight if lm_head is not None else None
            if weight is None:
                raise ValueError("lm_head.weight not found in model")
            prepare = materialize or self.materialize_lm_weight
            return prepare(weight, grad_reduce_group=grad_reduce_group)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            # cut_cross_entropy's memory on fake tensors: its backward writes the head's gradient once in the weight's
            # dtype (stack/cce.py), where ChunkedCrossEntropy's accumulates it in fp32 chunk by chunk
            from nemo_automodel.components.loss import chunked_ce

            from . import cce, shims

            original = chunked_ce._ChunkedLinearCE
            chunked_ce._ChunkedLinearCE = cce.stand_in(original, shims.CUT_CROSS_ENTROPY.count)
            try:
                return super().forward(*args, **kwargs)
            finally:
                chunked_ce._ChunkedLinearCE = original

    chunked.__class__ = FusedLinearCrossEntropyStandIn
    return chunked


def build(
    recipe: StackRecipe,
    hf_config_dict: dict[str, Any],
    dist_setup: Any,
    patches: contextlib.AbstractContextManager[Any],
    rewrites: list[str],
    *,
    local_batch_size: int,
    seq_len: int,
) -> Built:
    """NeMoAutoModelForCausalLM.from_config (the VLM recipe's NeMoAutoModelForImageTextToText, with its
    freeze_config) with the recipe's loss, PEFT, backend, dtype, ``force_hf`` and Liger choice, inside ``patches``.
    AutoModel's own fallbacks that change what trains are applied and added to ``rewrites``."""
    from nemo_automodel._transformers.auto_model import NeMoAutoModelForCausalLM, NeMoAutoModelForImageTextToText
    from nemo_automodel.components._peft.lora import PeftConfig
    from nemo_automodel.components.loss import build_loss_config
    from nemo_automodel.components.loss.linear_ce_base import LinearCrossEntropy
    from nemo_automodel.components.loss.masked_ce import MaskedCrossEntropy
    from nemo_automodel.components.utils.model_utils import count_model_parameters
    from transformers import AutoConfig

    cfg = dict(hf_config_dict)
    if recipe.attn_implementation:  # as from_pretrained's get_hf_config sets it (AutoModel's own classes read it)
        cfg["attn_implementation"] = recipe.attn_implementation
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    loss_fn = build_loss_config(recipe.loss["name"], **recipe.loss["kwargs"]).build()
    if recipe.loss.get("stands_for") == "FusedLinearCrossEntropy":
        loss_fn = _fused_linear_ce_stand_in(loss_fn)
    elif recipe.loss.get("stands_for") == GEMMA4_TP_LINEAR_CE:
        from nemo_automodel.components.models.gemma4_moe.loss import Gemma4TensorParallelFusedLinearCrossEntropy

        loss_fn = _fused_linear_ce_stand_in(loss_fn, Gemma4TensorParallelFusedLinearCrossEntropy.materialize_lm_weight)
    pp_enabled = dist_setup.mesh_context.pp_size > 1
    if pp_enabled:  # the fields train_ft's setup() fills in the pipeline config
        pc = dist_setup.pipeline_config
        pc.pp_batch_size = local_batch_size
        pc.loss_fn = loss_fn
        # AutoModel's patched stage backward (moe/fsdp_mixin.py patched_backward_maybe_with_nosync): its MoE classes'
        # units then skip the gradient sync and keep their blocks gathered until the last backward, where torch's own
        # stage runs a plain backward on a model part that is no FSDP module (moe.wrap_outer_model: false)
        pc.patch_stage_backward_maybe_with_nosync = bool((recipe.backend or {}).get("enable_fsdp_optimizations", False))
        if pc.pp_seq_len is None:
            pc.pp_seq_len = seq_len
    peft = None
    if recipe.peft is not None:
        peft = PeftConfig(**recipe.peft)
        if peft.use_triton and find_spec("triton") is None:
            peft.use_triton = False  # AutoModel's own choice under TP > 1 or PP; without triton it raises
            rewrites.append(
                "peft.use_triton: false (triton is not installed here; AutoModel raises ImportError in the "
                "first forward without it; it uses the same torch LoRA path itself under TP or PP)"
            )
    kwargs: dict[str, Any] = {"use_liger_kernel": recipe.liger}
    if recipe.backend is not None:
        from nemo_automodel.components.models.common import BackendConfig

        kwargs["backend"] = BackendConfig(**recipe.backend)
    if recipe.torch_dtype:
        kwargs["torch_dtype"] = recipe.torch_dtype
    if recipe.force_hf:
        kwargs["force_hf"] = True
    if recipe.mtp_use_repeated_layer:
        kwargs["mtp_use_repeated_layer"] = True
    if recipe.attn_implementation:
        kwargs["attn_implementation"] = recipe.attn_implementation
    # both recipes' build_model hand freeze_config over as a mapping; the VLM one builds the image-text class
    auto_class: Any = NeMoAutoModelForImageTextToText if recipe.vlm else NeMoAutoModelForCausalLM
    if recipe.freeze_config is not None:
        kwargs["freeze_config"] = recipe.freeze_config
    with patches:
        model = auto_class.from_config(hf_config, distributed_setup=dist_setup, peft_config=peft, **kwargs)
    parts = list(getattr(model, "parts", [model]))
    if hasattr(model, "total_params_before_pp"):
        trainable, total = model.trainable_params_before_pp, model.total_params_before_pp
    else:
        trainable, total = count_model_parameters(model)
    params = {"total": int(total), "trainable": int(trainable), "class": type(parts[0]).__name__}
    if pp_enabled:
        info = model.info
        params["pp_stages"] = [st.stage_index for st in info.stages]
        if (
            info.has_last_stage
            and isinstance(loss_fn, LinearCrossEntropy)
            and not any(getattr(p, "_pp_return_hidden_states_supported", False) for p in parts)
        ):
            # train_ft._maybe_downgrade_loss_fn: what AutoModel trains under PP on such a model
            loss_fn = MaskedCrossEntropy(ignore_index=getattr(loss_fn, "ignore_index", -100))
            rewrites.append(
                "FusedLinearCrossEntropy -> MaskedCrossEntropy: AutoModel's own fallback under pipeline "
                "parallelism for a model without hidden-state outputs (train_ft._maybe_downgrade_loss_fn)"
            )
    return Built(model, parts, dist_setup, loss_fn, hf_config, pp_enabled, params, vlm=recipe.vlm)


@contextlib.contextmanager
def vision_frame_sharding(built: Built) -> Iterator[None]:
    """The VLM recipe's ``_cp_vision_frame_sharding_context``: with CP, publish the CP group (and the strategy's
    ``multimodal.vision.frame_sharding`` config) while a forward may run the vision tower."""
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.cp_vision_frame_shard import (
        reset_cp_vision_group,
        set_cp_vision_group,
    )

    strategy = built.setup.strategy_config
    mesh = built.mesh
    if mesh is None or not isinstance(strategy, FSDP2Config):
        yield
        return
    config = strategy.multimodal.vision.frame_sharding
    dim = config.mesh_dims[0]
    if dim not in mesh.mesh_dim_names or mesh[dim].size() <= 1:
        yield
        return
    token = set_cp_vision_group(mesh[dim].get_group(), config=config)
    try:
        yield
    finally:
        reset_cp_vision_group(token)


def optimizer(built: Built, target: str, kwargs: dict[str, Any]) -> list[Any]:
    """AutoModel's build_optimizer on the model (one optimizer per pipeline part)."""
    from nemo_automodel.components.optim.optimizer import build_optimizer

    kwargs = dict(kwargs)
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return build_optimizer(built.model, (target, kwargs), device_mesh=built.mesh)


def shard_optimizers(built: Built, optimizers: list[Any]) -> list[Any]:
    """train_ft's setup after build_optimizer: under MegatronFSDP each optimizer registered with its model part
    (megatron_fsdp's fully_shard_optimizer, which makes the states with a zero-gradient step of its own); a no-op
    under any other strategy. On fake tensors it runs in the step's fake mode, as the states it makes are the
    step's."""
    from nemo_automodel.recipes._dist_utils import shard_optimizers_for_megatron_fsdp

    return shard_optimizers_for_megatron_fsdp(built.model, optimizers, built.setup.strategy_config)


def configure_pipeline_loss(built: Built) -> None:
    """train_ft's ``_configure_pipeline_loss_fn``: the last stage's schedule computes the (MTP-aware) loss."""
    from nemo_automodel.components.loss.linear_ce_base import LinearCrossEntropy
    from nemo_automodel.components.loss.mtp import MTPLossConfig

    info = built.model.info
    if not info.has_last_stage:
        return
    last = next(m for m, st in zip(built.parts, info.stages) if st.is_last)
    if isinstance(built.loss_fn, LinearCrossEntropy) and not built.vlm:  # the VLM recipe's version does not flag it
        last._pp_return_hidden_states = True
    info.schedule._loss_fn = MTPLossConfig().build(built.loss_fn, last, grad_reduce_group=dp_group(built.mesh))


@dataclass
class StepResult:
    loss_buffer: list[Any]  # train_ft's per-microbatch detached losses (a rank without the last stage: zeros)
    grad_norm: Any = None


def train_step(
    built: Built,
    optimizers: list[Any],
    batches: list[dict[str, Any]],
    *,
    num_label_tokens: int,
    clip_grad_norm: float | None,
    phases: PhaseFn = no_phases,
    after_loss: Callable[[], None] | None = None,
    before_optimizer: Callable[[], None] | None = None,
    step_optimizer: bool = True,
    pad_token_id: int = 0,
) -> StepResult:
    """train_ft's ``_run_train_optim_step`` on ``batches`` (dicts with input_ids and labels; under PP one batch holds
    the rank's local batch). ``after_loss`` runs after the first microbatch's loss, before its backward;
    ``before_optimizer`` after the gradient clip, before the optimizer step. FSDP's gradient sync is deferred to the
    last microbatch as the strategy says (``defer_fsdp_grad_sync``, AutoModel's default true), as train_ft reads it."""
    import torch
    from nemo_automodel.components.moe.megatron.moe_utils import MoEAuxLossAutoScaler
    from nemo_automodel.components.training.utils import (
        prepare_after_first_microbatch,
        prepare_for_final_backward,
        prepare_for_grad_accumulation,
    )

    parts, mesh, mc = built.parts, built.mesh, built.mc
    pp = built.pp_enabled
    n_model_mb = len(batches)
    if pp:
        pc = built.setup.pipeline_config
        n_model_mb *= pc.pp_batch_size // max(pc.pp_microbatch_size, 1)
    scale = max(mc.cp_size, 1) / n_model_mb  # train_ft._set_moe_aux_loss_backward_scale
    if pp and num_label_tokens > 0:
        scale *= num_label_tokens / dp_group_size(mesh)
    MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(scale)

    out = StepResult(loss_buffer=[])
    prepare_for_grad_accumulation(parts, pp_enabled=pp)
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        if last:
            prepare_for_final_backward(parts, pp_enabled=pp)
        if pp and built.vlm:
            out.loss_buffer.append(_vlm_pipeline_microbatch(built, batch, phases, pad_token_id))
        elif pp:
            out.loss_buffer.append(_pipeline_microbatch(built, batch, phases, pad_token_id))
        else:
            out.loss_buffer.append(
                _microbatch(
                    built,
                    batch,
                    last=last,
                    num_label_tokens=num_label_tokens,
                    defer_fsdp_grad_sync=getattr(built.setup.strategy_config, "defer_fsdp_grad_sync", True),
                    phases=phases,
                    after_loss=after_loss if i == 0 else None,
                    pad_token_id=pad_token_id,
                )
            )
        if i == 0:
            prepare_after_first_microbatch()
    out.grad_norm = clip(built, clip_grad_norm, num_label_tokens, phases)
    if before_optimizer is not None:
        before_optimizer()
    with phases("optimizer"):
        for opt in optimizers:
            if step_optimizer:
                opt.step()
            opt.zero_grad()
        if not step_optimizer:
            # MegatronFSDP's optimizer step ends by copying its main weights into the model's (its wrapper's tail,
            # which the skipped step would have run)
            for part in filter(is_megatron_fsdp, parts):
                part.install_optimized_model_weights()
        if hasattr(parts[0], "update_moe_gate_bias"):
            for part in parts:
                part.update_moe_gate_bias()
    return out


def clip(built: Built, max_norm: float | None, num_label_tokens: int, phases: PhaseFn = no_phases) -> Any:
    """train_ft's TP-replica gradient sync, gradient scaling and clip: returns AutoModel's grad norm."""
    from nemo_automodel.components.distributed.tp_replicas import synchronize_tp_replica_gradients
    from nemo_automodel.components.training.utils import (
        get_expert_tp_replication_factor,
        scale_grads_and_clip_grad_norm,
    )

    parts, mesh, mc = built.parts, built.mesh, built.mc
    with phases("clip_grad_norm"):
        synchronize_tp_replica_gradients(parts, mesh)
        moe_mesh = mc.moe_mesh
        return scale_grads_and_clip_grad_norm(
            max_norm,
            parts,
            norm_type=2.0,
            pp_enabled=built.pp_enabled,
            device_mesh=mesh,
            moe_mesh=moe_mesh,
            ep_axis_name="ep" if moe_mesh is not None and "ep" in moe_mesh.mesh_dim_names else None,
            pp_axis_name="pp" if built.pp_enabled else None,
            foreach=True,
            num_label_tokens=num_label_tokens,
            dp_group_size=dp_group_size(mesh),
            expert_tp_replication_factor=get_expert_tp_replication_factor(parts, mesh),
            grad_norm_backend="triton",
        )


def _microbatch(
    built: Built,
    batch: dict[str, Any],
    *,
    last: bool,
    num_label_tokens: int,
    defer_fsdp_grad_sync: bool,
    phases: PhaseFn,
    after_loss: Callable[[], None] | None,
    pad_token_id: int,
) -> Any:
    """The non-pipeline branch of train_ft's ``_forward_backward_step``; returns the detached loss."""
    from nemo_automodel.components.distributed.context_parallel import ContextParallelSharder
    from nemo_automodel.components.distributed.utils import get_sync_ctx
    from nemo_automodel.components.loss.chunked_ce import ChunkedCrossEntropy
    from nemo_automodel.components.loss.linear_ce_base import LinearCrossEntropy
    from nemo_automodel.components.loss.utils import calculate_loss, prepare_lm_weight
    from nemo_automodel.components.training.model_output_utils import get_final_hidden_states
    from nemo_automodel.components.utils.model_utils import filter_forward_kwargs

    part, mesh, loss_fn = built.parts[0], built.mesh, built.loss_fn
    vlm = built.vlm
    with phases("forward"):
        # (the model's CP pre-embed hook runs in both recipes: the sharder's default)
        sharder = ContextParallelSharder(part, mesh, batch, padding_token_id=pad_token_id, num_chunks=1)
        ignore_index = getattr(loss_fn, "ignore_index", -100)
        mtp_cp = None  # the MTP heads' targets under CP, prepared on the whole sequence as both recipes do
        cp = mesh is not None and "cp" in mesh.mesh_dim_names and mesh["cp"].size() > 1
        if cp and getattr(getattr(part, "supports", None), "mtp_enabled", False):
            if not part.supports.supports_mtp_cp:  # both recipes refuse it
                raise NotImplementedError(
                    f"{type(part).__name__} declares supports_mtp_cp=False; "
                    "MTP target preparation for context parallelism is unavailable"
                )
            mtp_cp = part.prepare_mtp_inputs_for_cp(batch, ignore_index=ignore_index)
        train_ctx, mb = sharder.shard(dict(batch))
        mtp_targets = None
        if mtp_cp is not None:
            mb["mtp_per_depth_input_ids"] = tuple(
                sharder.shard_token_tensor(ids, seq_dim=1, fill=0) for ids in mtp_cp.input_ids
            )
            # train_ft shards the positions on dim 1 and hands no valid masks; the VLM step follows the model's layout
            seq_dim = mtp_cp.position_ids_seq_dim if vlm else 1
            mb["mtp_per_depth_position_ids"] = tuple(
                sharder.shard_token_tensor(ids, seq_dim=seq_dim, fill=0) for ids in mtp_cp.position_ids
            )
            if vlm:
                mb["mtp_per_depth_valid_masks"] = tuple(
                    sharder.shard_token_tensor(m, seq_dim=1, fill=False) for m in mtp_cp.valid_masks
                )
            mtp_targets = tuple(sharder.shard_token_tensor(t, seq_dim=1, fill=ignore_index) for t in mtp_cp.targets)
    labels = mb.pop("labels")
    sync = get_sync_ctx(part, last, defer_fsdp_grad_sync=defer_fsdp_grad_sync)
    # train_ft enters the CP context, then the sync; the VLM step the sync, the frame-sharding group, then CP
    steps = (sync, vision_frame_sharding(built), train_ctx()) if vlm else (train_ctx(), sync)
    with contextlib.ExitStack() as stack:
        for ctx in steps:
            stack.enter_context(ctx)
        linear_ce = isinstance(loss_fn, LinearCrossEntropy)
        with phases("forward"):
            forward = filter_forward_kwargs(part, mb)
            if linear_ce:
                forward = {**forward, "logits_to_keep": 1, "output_hidden_states": True}
            out = part(**forward)
        with phases("loss"):
            extra: dict[str, Any] = {}
            lm_weight = None
            if linear_ce:
                group = dp_group(mesh)
                lm_weight = prepare_lm_weight(loss_fn, part, grad_reduce_group=group)
                extra["grad_reduce_group"] = group
                if isinstance(loss_fn, ChunkedCrossEntropy):
                    extra["logits_dtype"] = out.logits.dtype
            loss = calculate_loss(
                loss_fn,
                logits=getattr(out, "logits", out),
                labels=labels,
                model=part,
                hidden_states=get_final_hidden_states(out),
                lm_weight=lm_weight,
                num_label_tokens=num_label_tokens,
                **extra,
            )
            mtp_h, mtp_logits = getattr(out, "mtp_per_depth_h", None), getattr(out, "mtp_per_depth_logits", None)
            if mtp_h is not None or mtp_logits is not None:  # the multi-token-prediction heads' loss, as both steps
                from nemo_automodel.components.loss.mtp import calculate_mtp_loss

                loss = loss + calculate_mtp_loss(
                    loss_fn,
                    mtp_per_depth_h=mtp_h,
                    mtp_per_depth_logits=mtp_logits,
                    mtp_per_depth_targets=mtp_targets,
                    labels=labels,
                    model=part,
                    scaling_factor=getattr(out, "mtp_loss_scaling_factor", None) or 0.1,
                    num_label_tokens=num_label_tokens,
                    ignore_index=ignore_index,
                    lm_weight=lm_weight,
                    **extra,
                )
            del mtp_h, mtp_logits
        if not vlm:  # train_ft frees the output before backward; the VLM recipe's step keeps it to the end
            del out
        if after_loss is not None:
            after_loss()
        detached = loss.clone().detach()
        with phases("backward"):
            (loss * dp_group_size(mesh)).backward()
    return detached


def _pipeline_microbatch(built: Built, batch: dict[str, Any], phases: PhaseFn, pad_token_id: int) -> Any:
    """The pipeline branch of train_ft's ``_forward_backward_step``: this rank's stages run the schedule on the
    local batch; returns the sum of the last stage's microbatch losses (0 on other ranks)."""
    from nemo_automodel.components.distributed.context_parallel import ContextParallelSharder

    info = built.model.info
    pc = built.setup.pipeline_config
    sharder = ContextParallelSharder(
        built.parts[0],
        built.mesh,
        batch,
        padding_token_id=pad_token_id,
        num_chunks=pc.pp_batch_size // max(pc.pp_microbatch_size, 1),
    )
    train_ctx, mb = sharder.shard(dict(batch))
    labels = mb.pop("labels")
    with train_ctx():
        losses: list[Any] | None = [] if info.has_last_stage else None
        targets = labels.clone() if info.has_last_stage else None
        input_ids = mb.pop("input_ids")
        built.model.update_seq_len(input_ids.shape[1])
        rest = {k: v for k, v in mb.items() if v is not None and not (isinstance(v, dict) and not v)}
        with phases("pipeline_schedule"):
            if info.has_first_stage:
                info.schedule.step(input_ids, target=targets, losses=losses, **rest)
            else:
                info.schedule.step(target=targets, losses=losses, **rest)
    return _stage_loss(info, losses)


def _pp_media() -> Any:
    """AutoModel's ``components/datasets/vlm/pp_media.py`` (torch alone). Its package's ``__init__`` imports the data
    set stack (Hugging Face ``datasets``), which the step does not need: where that is not installed the file is
    loaded by itself."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    name = "nemo_automodel.components.datasets.vlm.pp_media"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("nemo_automodel"):
            raise  # AutoModel moved the file: the dry run's shim checks say so
        if name in sys.modules:
            return sys.modules[name]
        import nemo_automodel

        path = Path(nemo_automodel.__file__).parent / "components" / "datasets" / "vlm" / "pp_media.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
        return module


def _vlm_pipeline_microbatch(built: Built, batch: dict[str, Any], phases: PhaseFn, pad_token_id: int) -> Any:
    """The pipeline branch of the VLM recipe's ``_forward_backward_step``. Its loader has already split the batch's
    images per microbatch (``wrap_vlm_collate_for_pp``: AutoModel's ``prepare_vlm_media_for_pp`` here); the step
    stages them on the first stage's model for the schedule's call (``stage_vlm_media_for_pp``), whose forward takes
    each microbatch's images in turn, and runs the schedule through the pipeline's own ``step`` (the model's chunk
    dims for its multimodal position ids)."""
    import torch
    from nemo_automodel.components.distributed.context_parallel import ContextParallelSharder
    from nemo_automodel.components.utils.model_utils import VLM_INPUT_KEYS

    from .media import check_staged_images

    pp_media = _pp_media()
    prepare_vlm_media_for_pp, stage_vlm_media_for_pp = (
        pp_media.prepare_vlm_media_for_pp,
        pp_media.stage_vlm_media_for_pp,
    )
    pipeline, info, mesh = built.model, built.model.info, built.mesh
    n_microbatches = pipeline.pp_batch_size // max(pipeline.pp_microbatch_size, 1)
    batch = prepare_vlm_media_for_pp(dict(batch), batch_size=batch["input_ids"].shape[0], n_microbatches=n_microbatches)
    staged_media = batch.get(pp_media.VLM_PP_MEDIA_KEY)
    if staged_media and "image_grid_hws" in staged_media:
        check_staged_images(built.hf_config, batch["input_ids"], staged_media["image_grid_hws"])
    chunk_dims = getattr(built.parts[0], "get_pipeline_kwargs_chunk_dims", None)
    if "position_ids" in batch and not (callable(chunk_dims) and "position_ids" in chunk_dims(batch)):
        # the multimodal positions were computed ahead (stack/media.py); the dry run's VLM batch is unpacked, and the
        # default collate hands an unpacked batch no positions: the model computes them per microbatch (a [3, batch,
        # seq] tensor the model does not split by batch would be split on its first axis by the schedule)
        del batch["position_ids"]
    cp = mesh is not None and "cp" in mesh.mesh_dim_names and mesh["cp"].size() > 1
    if cp and not info.has_first_stage and hasattr(built.parts[0], "prepare_model_inputs_for_cp"):
        for key in VLM_INPUT_KEYS:  # stages that do not embed see the text alone
            if key != "input_ids":
                batch.pop(key, None)
    sharder = ContextParallelSharder(
        built.parts[0], mesh, batch, padding_token_id=pad_token_id, num_chunks=n_microbatches, invoke_pre_embed=True
    )
    train_ctx, mb = sharder.shard(batch)
    labels = mb.pop("labels")
    with vision_frame_sharding(built), train_ctx():
        losses: list[Any] | None = [] if info.has_last_stage else None
        targets = labels.clone() if info.has_last_stage else None
        model_input = mb.pop("inputs_embeds" if "inputs_embeds" in mb else "input_ids")
        pipeline.update_seq_len(model_input.shape[1])
        if info.has_first_stage and model_input.dtype.is_floating_point and model_input.ndim == 3:
            for stage in info.stages:  # the recipe's _maybe_set_pp_first_stage_embed_input_meta
                if stage.is_first:
                    shape = (pipeline.pp_microbatch_size, *model_input.shape[1:])
                    stage.inputs_meta = (torch.empty(shape, device="meta", dtype=model_input.dtype),)
        staged = info.has_first_stage and pp_media.VLM_PP_MEDIA_KEY in mb
        with phases("pipeline_schedule"), stage_vlm_media_for_pp(pipeline, built.parts, mb):
            pipeline.step(model_input, target=targets, losses=losses, **mb)
            taken = getattr(built.parts[0], "_vlm_chunk_idx", None) if staged else None
    if staged and taken != n_microbatches:
        # a class whose forward does not read the staged chunks trains its first stage on the text alone
        raise NotImplementedError(
            f"{type(built.parts[0]).__name__} took {taken or 0} of the {n_microbatches} microbatches' staged images "
            "under pipeline parallelism (AutoModel's pp_media staging): its images would not reach the vision tower"
        )
    return _stage_loss(info, losses)


def _stage_loss(info: Any, losses: list[Any] | None) -> Any:
    """The rank's loss for the loss buffer: the sum of its last stage's microbatch losses (0 on other ranks)."""
    import torch

    if info.has_last_stage and losses:
        return torch.sum(torch.stack(losses)).detach()
    return torch.tensor(0.0)


def reported_loss(built: Built, loss_buffer: list[Any], num_label_tokens: int) -> float:
    """The loss train_ft logs for the step: the microbatch losses summed over the data-parallel ranks (under PP
    divided by the label tokens and broadcast from the last stage)."""
    import torch
    import torch.distributed as dist

    total = torch.sum(torch.stack([t.float() for t in loss_buffer]))
    group = dp_group(built.mesh)
    if group is not None:
        dist.all_reduce(total, group=group)
    if built.pp_enabled:
        total = total / num_label_tokens
        pp_group = built.mesh["pp"].get_group()
        src = dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1)
        dist.broadcast(total, src=src, group=pp_group)
    return float(total.item())


def states_to(optimizers: list[Any], dtypes: dict[str, str], master: str | None = None) -> None:
    """A replaced optimizer's states as the one it stands for keeps them: each moment in its dtype (per state key),
    and with ``master`` a master copy of each parameter in that dtype (``remainders``: the 16 bits a bf16 parameter
    lacks of its fp32 value, TE's store_param_remainders; a full fp32 copy for another dtype)."""
    import torch

    for opt in optimizers:
        for param, state in opt.state.items():
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                    if name := dtypes.get(key):
                        state[key] = value.to(getattr(torch, name))
            if master and isinstance(param, torch.Tensor) and state:
                remainder = master == "remainders" and param.dtype == torch.bfloat16
                dtype = torch.int16 if remainder else getattr(torch, "float32" if master == "remainders" else master)
                state["master_param"] = torch.empty_like(param, dtype=dtype)


def stepped_params(parts: list[Any], *, media: bool) -> list[Any]:
    """The parameters the first step gave a gradient (so Adam holds states for them): every trainable one, but in a
    step that feeds no media a multimodal tower's and projector's (AutoModel's own list of those modules), which
    the forward never reaches."""
    from nemo_automodel.components.distributed.multimodal_fsdp import MULTIMODAL_MODULE_NAMES

    out = []
    for part in parts:
        for name, p in part.named_parameters():
            if not p.requires_grad:
                continue
            if not media and any(n in MULTIMODAL_MODULE_NAMES for n in name.split(".")):
                continue
            out.append(p)
    return out


MEGATRON_FSDP_BUFFERS = {  # ParameterGroup's persistent buffers -> the tracker's category (AutoModel's MegatronFSDP
    # has a one-dimensional data-parallel mesh: none of its hybrid-sharding buffers)
    "model_weight_buffer": "params",
    "transpose_weight_buffer": "params",
    "main_weight_buffer": "params",  # (preserve_fp32_weights: the fp32 copy of the optimizer's shard)
    "main_grad_buffer": "grads",
}


def is_megatron_fsdp(part: Any) -> bool:
    """Whether a model part is wrapped by MegatronFSDP (its buffers and pipelines hang off the wrapper)."""
    return hasattr(part, "param_and_grad_buffer") and hasattr(part, "all_gather_pipeline")


def megatron_fsdp_buffers(parts: list[Any]) -> list[tuple[Any, str]]:
    """MegatronFSDP's own memory outside the module's parameters, with its category: each parameter group's
    persistent buffers (weights, fp32 main weights, gradients: made at wrapping, before the measured step, and
    touched by no operator until a collective writes them) and the temporary buckets its allocators hold allocated
    at the step's start. A tracker sees a tensor first when an operator makes or uses it; these are registered at its
    start instead. Nothing for another strategy."""
    from torch.distributed.tensor import DTensor

    from . import shims

    out: list[tuple[Any, str]] = []
    for part in filter(is_megatron_fsdp, parts):
        shims.MEGATRON_FSDP_HELD.count()
        allocators: dict[int, Any] = {}
        for group in part.param_and_grad_buffer.parameter_groups:
            if group.model_weight_buffer is None:  # (zero_dp_strategy 0: the module keeps its own weights)
                out += [(p.to_local() if isinstance(p, DTensor) else p, "params") for p in group.params]
            for name, category in MEGATRON_FSDP_BUFFERS.items():
                dp_buffer = getattr(group, name)
                if dp_buffer is None:
                    continue
                data = getattr(dp_buffer, "data", None)  # (set by its init_data: absent on a buffer never filled)
                if data is not None:
                    out.append((data, category))
                allocators[id(dp_buffer.temporary_bucket_allocator)] = dp_buffer.temporary_bucket_allocator
        for allocator in allocators.values():
            for bucket in allocator.buckets.values():
                if bucket.data.untyped_storage().nbytes():
                    out.append((bucket.data, "temporaries"))
    return out


@dataclass
class GradSyncs:
    """MegatronFSDP's finish_grad_sync calls in a step, and where its root pre-backward hook sits."""

    calls: int = 0
    root_hook_on: list[str] = field(default_factory=list)


@contextlib.contextmanager
def megatron_grad_syncs(parts: list[Any]) -> Iterator[GradSyncs]:
    """Count MegatronFSDP.finish_grad_sync while the step runs. megatron-fsdp 0.5.0 calls it from its root
    post-backward, which its root pre-backward hook queues; that hook is attached to the output of the module its
    hook registration left in a loop variable (MegatronFSDP._register_fsdp_hooks), named in ``root_hook_on``."""
    from megatron_fsdp.megatron_fsdp import MegatronFSDP

    out = GradSyncs()
    for part in filter(is_megatron_fsdp, parts):
        handle = getattr(part, "_root_pre_backward_hook_handle", None)
        for name, module in part.module.named_modules():
            if handle is not None and handle.id in module._forward_hooks:
                out.root_hook_on.append(name or type(module).__name__)
    original = MegatronFSDP.finish_grad_sync

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        out.calls += 1
        return original(self, *args, **kwargs)

    MegatronFSDP.finish_grad_sync = counted
    try:
        yield out
    finally:
        MegatronFSDP.finish_grad_sync = original


def first_optimizer_step(
    parts: list[Any],
    optimizers: list[Any],
    *,
    media: bool,
    state_dtype: dict[str, str] | None,
    master: str | None = None,
) -> None:
    """The step before the measured one, so the optimizer's states exist: a zero gradient on every parameter the
    first step reaches (:func:`stepped_params`), one optimizer step, the gradients freed; a replaced optimizer's
    states then as the one it stands for keeps them (:func:`states_to`)."""
    import torch

    if any(is_megatron_fsdp(p) for p in parts):
        # MegatronFSDP's fully_shard_optimizer made the states with a zero-gradient step of its own, and its
        # gradients live in its buffers, not in .grad: the dry run runs a whole step of one microbatch before the
        # measured one instead (dry_run/worker.py); a replaced optimizer's states still take their dtype
        if state_dtype:
            states_to(optimizers, state_dtype, master)
        return
    for p in stepped_params(parts, media=media):
        # in the parameter's own dtype, as FSDP's reduce-scatter hands it back (its orig_dtype): a DTensor whose local
        # shard disagrees (a strict-fp32 parameter cast after sharding) fails where AutoModel's own step fails, in the
        # optimizer, not here
        p.grad = torch.zeros_like(p, dtype=p.dtype)
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    if state_dtype:
        states_to(optimizers, state_dtype, master)


def batch_shapes(
    pp: bool, micro_batch_size: int, local_batch_size: int, microbatches: int, seq_len: int, schedule_steps: int = 1
) -> list[Any]:
    """The measured step's batches: under PP ``schedule_steps`` batches of the rank's local batch (the schedule splits
    each), else ``microbatches`` micro batches."""
    if pp:
        return [(local_batch_size, seq_len)] * schedule_steps
    return [(micro_batch_size, seq_len)] * microbatches


def every_token_labelled(built: Built, batches: list[dict[str, Any]]) -> int:
    """train_ft's ``num_label_tokens`` where every token is supervised: this rank's tokens times the data-parallel
    ranks (CP ranks hold the same sequences). Counted from the shapes, where :func:`label_tokens`' all-reduce could
    not sum (a fake group) or the values are not there (fake tensors)."""
    dp = dp_group_size(built.mesh)
    return sum(b["input_ids"].numel() for b in batches) * (dp // max(built.mc.cp_size, 1))


def label_tokens(built: Built, batches: list[dict[str, Any]], ignore_index: int = -100) -> int:
    """train_ft's ``num_label_tokens``: the supervised tokens of the step, summed over the data-parallel ranks (not
    over context-parallel ones, which hold the same sequences)."""
    import torch
    import torch.distributed as dist

    count = torch.tensor(sum(int((b["labels"] != ignore_index).sum()) for b in batches), dtype=torch.long)
    group = dp_group(built.mesh, include_cp=False)
    if group is not None:
        dist.all_reduce(count, group=group)
    return int(count.item())


__all__ = [
    "Built",
    "batch_shapes",
    "every_token_labelled",
    "first_optimizer_step",
    "megatron_fsdp_buffers",
    "megatron_grad_syncs",
    "is_megatron_fsdp",
    "shard_optimizers",
    "states_to",
    "stepped_params",
    "StepResult",
    "build",
    "clip",
    "configure_pipeline_loss",
    "dp_group",
    "dp_group_size",
    "label_tokens",
    "no_phases",
    "optimizer",
    "reported_loss",
    "setup",
    "train_step",
]
