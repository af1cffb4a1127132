"""One measured rank of a dry run: AutoModel 0.7.0's own setup, model build, parallelizer and training step, on a fake
process group under FakeTensorMode, with torch's memory tracker. One process per rank (the fake process group and
AutoModel's module state are per process): :func:`serve` in a rank forked by dry_run/launcher.py, or on its own
``python -m automodel_dist.dry_run.worker SPEC.json RESULT.json``. Progress goes to stdout as ``PHASE <name>`` lines;
the result is always written, an AutoModel exception included.

The step follows ``recipes/llm/train_ft.py`` (``_run_train_optim_step`` and ``_forward_backward_step``), calling the
same AutoModel functions in the same order; the recipe module itself is not imported (it needs torchao, torchdata and
the dataset stack at import).
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from ..catalog.kernels import LIGER_LAYERS, LIGER_VERSION
from ..catalog.models import EXPERT_COUNT_KEYS, text_layers
from ..media import vlm_image
from ..stack import media, shims, step
from ..stack.known_values import UnknownValues
from .depth import Depth, by_phase, extrapolate_splits, line, peak_phase, phase_moments
from .spec import Build, DryRunSpec
from .tracker import categories, make_tracker, module_views, pipeline_moments, repeated_calls

GIB = float(1 << 30)
_CATEGORIES = {  # torch's tracker categories -> the report's split
    "Sharded Param": "params",
    "Parameter": "params",
    "Buffer": "params",
    "Sharded Grad": "grads",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Inputs": "activations",
    "Input": "activations",
    "Unsharded Param": "temporaries",
    "Unsharded Grad": "temporaries",
    "Temp": "temporaries",
    "All Gather": "temporaries",
    "Reduce Scatter": "temporaries",
}


class Phases:
    """Wall time per phase; the phase a failure happened in; progress lines for the parent."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.current = "start"
        self.moment: str | None = None  # the pipeline action running within the phase (tracker.pipeline_moments)
        self.failed: str | None = None

    @property
    def key(self) -> str:
        """The moment whose peak the tracker records: the phase, or ``phase@action`` within a pipeline schedule."""
        return self.current if self.moment is None else f"{self.current}@{self.moment}"

    @contextlib.contextmanager
    def __call__(self, name: str) -> Any:
        previous, self.current = self.current, name
        moment, self.moment = self.moment, None
        print(f"PHASE {name}", flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)
            self.current, self.moment = previous, moment


@contextlib.contextmanager
def _garbage_collection_held_off() -> Any:
    """Python's cyclic garbage collector off for the measured step, after one full collection, as AutoModel's recipes
    run it where they set ``step_scheduler.gc_every_steps`` (``GarbageCollection``: a collection, then ``gc.disable()``
    until every N-th step). Elsewhere a collection can run at any allocation, and one that frees a cycle's tensors
    before the peak lowers it: when depends on how many Python objects the process made before, which the fake run's
    own bookkeeping changes (importing one module earlier moved a peak by 33 MiB). Held off, the figure does not
    depend on it: no collection frees anything mid-step, the most such tensors could hold."""
    import gc

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _split(categories: dict[str, int], param_bytes: int | None = None) -> dict[str, float]:
    """The tracker's categories as the report's split, with ``params`` the local parameter shards
    (``param_bytes``): MemTracker (several FSDP roots: pipeline stages) counts the gathered copies as parameters, and
    the difference belongs to the temporaries, as the estimate splits them. (FSDPMemTracker's parameters outside
    FSDP's groups are registered as shards by dry_run/tracker.py.)"""
    out = dict.fromkeys(("params", "grads", "optimizer", "activations", "temporaries"), 0.0)
    for name, value in categories.items():
        if name in _CATEGORIES:
            out[_CATEGORIES[name]] += value / GIB
    if param_bytes is not None:
        moved = max(min(param_bytes / GIB - out["params"], out["temporaries"]), -out["params"])
        out["params"] += moved
        out["temporaries"] -= moved
    out["total"] = categories.get("Total", 0) / GIB
    return out


def _local_bytes(parts: list[Any], optimizers: list[Any]) -> dict[str, int]:
    import torch
    from torch.distributed.tensor import DTensor

    def local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    seen: set[int] = set()
    params = trainable = states = 0
    for part in parts:
        for p in part.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            size = local(p).numel() * local(p).element_size()
            params += size
            trainable += size if p.requires_grad else 0
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    states += local(value).numel() * local(value).element_size()
    return {"params": params, "trainable_params": trainable, "optimizer_states": states}


def _grad_bytes(parts: list[Any]) -> int:
    """Local bytes of the gradients the step's backward left (before the optimizer step frees them)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for part in parts:
        for p in part.parameters():
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                total += g.numel() * g.element_size()
    return total


def _measure(spec: DryRunSpec, build: Build, phases: Phases, rewrites: list[str]) -> dict[str, Any]:
    """Build the model of ``build`` (its config.json and distributed: block) with AutoModel's own code on a fresh fake
    process group and run one training step under the memory tracker; its figures, per phase."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    res: dict[str, Any] = {}
    if dist.is_initialized():
        dist.destroy_process_group()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    seq = spec.seq_len
    items: dict[str, Any] = {
        # transformers' check that the image placeholders match the image features, where the placeholders are found
        # by comparing embeddings (a VLM pipeline's first stage): made on the known values before the schedule runs
        # (stack/media.check_staged_images); first, as the model forwards below enclose it
        ":get_placeholder_mask": lambda t: True if t.dtype == torch.bool else None,
        "model_utils.py:_get_model_param_stats": 0.0,  # a parameter norm, only logged
        # GLM-5.2's TileLang indexer asserts every query's key window is non-empty (it is: windows end past the query)
        "glm_moe_dsa/kernels/indexer.py:generate_varlen_mask_params": lambda t: True if t.dtype == torch.bool else None,
        "rope_utils.py:forward": seq - 1,  # RoPE sizes its cos/sin cache from position_ids.max()
        "torch/nn/init.py:_no_grad_trunc_normal_": lambda t: False if t.dtype == torch.bool else 0.0,
        # a multimodal class looks for image / video tokens in the ids (a bool) before it takes a pipeline stage's
        # staged media: a text batch (a VLM class run as a causal LM, a benchmark's mock ids) has none, an image
        # batch has them (asked for videos too: with no staged videos that answer takes nothing); any other read
        # there is refused
        **dict.fromkeys(
            (
                "models/qwen3_5_moe/model.py:forward",
                "models/qwen3_5/model.py:forward",
                "models/qwen3_vl_moe/model.py:forward",
            ),
            lambda t: (spec.media is not None) if t.dtype == torch.bool else None,
        ),
        # Gemma-4's CP ring asks whether any query row of its shard is empty (padding, or outside every packed
        # document) before zeroing those rows: answered yes, as on the rank holding a padded pack's tail (packs
        # fill to packing_ratio and are padded; a copy of each chunk's output, the most that answer can cost)
        **dict.fromkeys(
            (
                "gemma4_moe/cp_attention.py:_run_gemma4_flex_chunk",
                "gemma4_moe/cp_attention.py:_run_gemma4_cp_ring_attention_forward",
                "gemma4_moe/cp_attention.py:backward",
            ),
            lambda t: True if t.dtype == torch.bool else None,
        ),
    }
    # Kimi-Linear chooses its KDA layers' mask by whether its cache positions start past 0 (a decode step) or else its
    # attention mask is all ones; a training step starts at 0 and the dry run's batch has no padding (under CP its
    # sharder has taken the mask off the batch): either way no KDA mask, which answering the first read yes gives
    # (the two reads cannot be told apart here)
    items["kimi_linear/model.py:_update_linear_attn_mask"] = True
    # DeepSeek-V4's decoder asks whether the ids hold image tokens (ids past the vocabulary) and whether any id is
    # negative: a text batch has neither
    items["deepseek_v4/model.py:forward"] = lambda t: False if t.dtype == torch.bool else None
    if spec.recipe.ffpa:
        # Gemma-4's FFPA ring reads each shard's document map (_packed_seq_ids) on the host to route every ring chunk:
        # answered as one document filling every row, no pad (the pack measured as its unpacked equivalent, as the
        # dry run measures packed batches: each chunk on FFPA's dense path, none through its varlen gather/scatter)
        items["gemma4_moe/cp_attention.py:_build_packed_ring_segments"] = 1
    equal = {  # torch.equal
        # AutoModel's Qwen3.5 CP linear attention checks that the gathered token positions cover the sequence and
        # come back in place: the CP sharder hands every rank its share, as on a GPU (shims.FLA_CP)
        "cp_linear_attn.py:_undo_attention_load_balancing": True,
        "cp_linear_attn.py:_redo_attention_load_balancing": True,
    }
    with phases("setup"):
        dist.init_process_group("fake", rank=spec.rank, world_size=spec.world_size, store=FakeStore())
        dist_setup = step.setup(build.distributed, spec.world_size)

    megatron = spec.megatron_fsdp  # (the layout's; whether it wrapped the model is read from the parts below)
    with phases("build"):
        with shims.liger_stand_in() as liger:
            patches = contextlib.ExitStack()
            patches.enter_context(
                shims.build_patches(
                    fake_mode,
                    pretrained_pp=spec.recipe.load_base_model and dist_setup.mesh_context.pp_size > 1,
                )
            )
            patches.enter_context(shims.value_oracles(items, {}))
            if spec.builds is not None and dist_setup.mesh_context.pp_size == 1:
                # a shallow build's decoder list ranked at the model's depth where AutoModel finds layers by structure
                # (not under PP: a shallow pipeline build keeps the stage count and builds fewer layers a stage, whose
                # list is not ranked at its full count, a gap docs/dry-run.md states)
                patches.enter_context(
                    shims.full_depth_layer_groups(text_layers(build.hf_config), text_layers(spec.build.hf_config))
                )
            if megatron:
                patches.enter_context(shims.megatron_fsdp_build(fake_mode))
            built = step.build(
                spec.recipe,
                build.hf_config,
                dist_setup,
                patches,
                rewrites,
                local_batch_size=spec.local_batch_size,
                seq_len=seq,
            )
        if liger.applied:
            rewrites.append(
                "Liger Kernel (AutoModel's default for a Hugging Face class without TP or CP) runs as a stand-in with "
                f"its kernels' saved tensors (RMSNorm, SwiGLU/GeGLU; liger-kernel {LIGER_VERSION}'s instance patch; "
                "stack/liger.py)"
            )
        elif liger.skipped:
            rewrites.append(
                f"Liger Kernel is not stood in for model type {liger.skipped[0]} (the stand-in covers "
                f"{', '.join(LIGER_LAYERS)}): measured as the Hugging Face class computes without it"
            )
        parts, mc, hf_config = built.parts, built.mc, built.hf_config
        pp_enabled = built.pp_enabled
        res["params"] = {k: v for k, v in built.params.items() if k != "pp_stages"}
        if "pp_stages" in built.params:
            res["pp_stages"] = built.params["pp_stages"]

    with phases("optimizer"):
        optimizers = step.optimizer(built, spec.recipe.optimizer["target"], spec.recipe.optimizer["kwargs"])

    items["tp_replicas.py:synchronize_tp_replica_gradients"] = mc.tp_size  # every replica reports its gradient
    ep = max(mc.ep_size, 1)
    text_config = hf_config.get_text_config()  # a multimodal config's language model (the config itself otherwise)
    n_experts = next(
        (getattr(text_config, k) for k in EXPERT_COUNT_KEYS if getattr(text_config, k, None)),
        1,
    )
    # balanced routing: this rank's experts receive 1/ep of the EP group's token assignments (the torch dispatcher's
    # mask covers the gathered group's tokens; the local stand-in's only this rank's, as many as it receives)
    local = spec.recipe.local_dispatch and ep > 1

    def per_expert(mask: Any) -> int:
        return mask.numel() * (ep if local else 1) // n_experts

    nonzero = {
        "moe/experts.py:_permute_tokens_for_grouped_mm": lambda mask: mask.numel() // (1 if local else ep),
        "moe/experts.py:_forward_loop": per_expert,
        # the LoRA experts' own per-expert loop (experts: torch with LoRA on the experts): the same mask per expert
        "_peft/lora_experts.py:_forward_loop": per_expert,
        # Kimi-Linear's KDA layers find the document boundaries in each row's document map (for fla's CP context):
        # none, one document filling the row (a pack measured as its unpacked equivalent)
        "kimi_linear/cp.py:segment_cu_seqlens": 0,
    }
    image = None
    if spec.media is not None:
        m = spec.media
        image = vlm_image(hf_config.to_dict(), m.image_px, (m.min_pixels, m.max_pixels))
        if image is None:
            raise ValueError(f"no known image processor for model type {hf_config.model_type}")
    if image is not None and image.processor == "gemma4":
        # Gemma-4's tower strips its padded patches' pooled cells ([images, budget] mask of valid cells): each image
        # keeps its soft tokens
        tokens = image.tokens

        def valid_cells(mask: Any) -> int | None:
            return mask.shape[0] * tokens if mask.dim() == 2 else None

        nonzero["gemma4/modeling_gemma4.py:get_image_features"] = valid_cells
        # ... and the model checks that the image features fill its [batch, seq, hidden] placeholder mask
        per_sequence, width = tokens * spec.media.images_per_sample, text_config.hidden_size

        def placeholder_cells(mask: Any) -> int | None:
            return mask.shape[0] * per_sequence * width if mask.dim() == 3 and mask.shape[2] == width else None

        nonzero["gemma4/modeling_gemma4.py:forward"] = placeholder_cells
    if image is not None and image.processor == "kimi":
        # MoonViT's SDPA path (which AutoModel's class takes on a GPU too: its vision config names no attention
        # implementation, the composite config not handing one down) marks each image's block of its [1, patches,
        # patches] mask, slicing at the cumulative patch counts it computes from the grids: the i-th is i images'
        # patches (the images alike), read off the element's offset in that count's tensor
        patches = image.patches
        items["kimivl/model.py:vision_attention_sdpa"] = lambda t: (
            t.storage_offset() * patches if t.dim() == 0 else None
        )
    if image is not None and image.processor == "qwen":
        # Qwen3-VL under CP: the DeepStack features of this rank's share of the image tokens (the round-robin split
        # gives each CP rank an equal share of every sequence)
        m = spec.media
        visual = image.tokens * m.images_per_sample
        local_seq = seq // max(mc.cp_size, 1)

        def local_visual(mask: Any) -> int | None:
            # only a [batch, local sequence] mask of image positions; any other refused as before
            if mask.dim() != 2 or mask.shape[1] != local_seq:
                return None
            return mask.shape[0] * visual // max(mc.cp_size, 1)

        nonzero["models/qwen3_vl/model.py:_shard_multimodal_inputs_for_cp"] = local_visual
        nonzero["qwen3_vl/modeling_qwen3_vl.py:_deepstack_process"] = local_visual  # each text layer adds them
        nonzero["torch/autograd/graph.py:_engine_run_backward"] = local_visual  # and their backward selects them again
    with (
        shims.step_patches(),
        shims.megatron_fsdp_runtime() if megatron else contextlib.nullcontext(),
        shims.local_dispatch(local),
        shims.te_cross_entropy() if spec.recipe.loss["name"] == "TEParallelCrossEntropy" else contextlib.nullcontext(),
        shims.value_oracles(items, nonzero, equal),
        fake_mode,
    ):
        with phases("optimizer"):  # the step after the first: the optimizer's states exist already
            optimizers = step.shard_optimizers(built, optimizers)
            step.first_optimizer_step(
                parts,
                optimizers,
                media=spec.media is not None,
                state_dtype=spec.recipe.optimizer["state_dtype"],
                master=spec.recipe.optimizer.get("master_weights"),
            )
        vocab = text_config.vocab_size
        shapes = step.batch_shapes(
            pp_enabled, spec.micro_batch_size, spec.local_batch_size, spec.microbatches, seq, spec.schedule_steps
        )
        if spec.recipe.thd_dsa_batches:
            # a THD batch's packs fill the stream (one document each): AutoModel's padding mask reads the stream's
            # end, its packs' total length
            tokens = {rows * length for rows, length in shapes}
            if len(tokens) == 1:
                items["thd_utils.py:_thd_padding_mask"] = tokens.pop()
        batches = []
        for shape in shapes:
            if image is not None and image.processor in ("gemma3", "gemma4", "pixtral", "kimi"):
                m = spec.media
                build = {"pixtral": media.pixtral_batch, "kimi": media.kimi_vl_batch}.get(
                    image.processor, media.gemma_batch
                )
                batches.append(
                    build(
                        hf_config,
                        image,
                        batch=shape[0],
                        seq=shape[1],
                        images_per_sample=m.images_per_sample,
                        pixel_dtype=m.pixel_dtype,
                        fake_mode=fake_mode,
                    )
                )
                continue
            if spec.media is not None:  # a VLM step: images in every sequence (stack/media.py)
                m = spec.media
                batches.append(
                    media.qwen_batch(
                        parts[0],
                        hf_config,
                        batch=shape[0],
                        seq=shape[1],
                        image=image,
                        images_per_sample=m.images_per_sample,
                        pixel_dtype=m.pixel_dtype,
                        fake_mode=fake_mode,
                        packed=spec.recipe.blockdiag_cp,
                    )
                )
                continue
            ids = torch.randint(0, vocab, shape)
            batch = {"input_ids": ids, "labels": ids.clone()}
            if spec.recipe.thd_dsa_batches:
                batch |= thd_pack_fields(shape, fake_mode)
            batches.append(batch)
        if image is not None and spec.media.images_per_sample == 0:
            rewrites.append("images: none (the recipe's data set is text-only): text batches through the VLM step")
        elif image is not None:
            m = spec.media
            source = "any size" if image.processor == "gemma3" else f"{m.image_px[0]} x {m.image_px[1]}"
            rewrites.append(
                f"images: {m.images_per_sample} a sequence, {source} resized to {image.pixels[0]} x {image.pixels[1]}, "
                f"a {image.grid[1]} x {image.grid[2]} patch grid ({image.patches} patches of {image.patch_size} px, "
                f"{image.tokens} placeholder tokens), pixel_values in {m.pixel_dtype}"
                + (f", padded to {image.padded_patches} patches" if image.padded_patches else "")
            )
        snapshots: dict[str, Any] = {}
        num_label_tokens = step.every_token_labelled(built, batches)
        if pp_enabled:
            step.configure_pipeline_loss(built)
        known = contextlib.ExitStack()
        if spec.media is not None or spec.recipe.thd_dsa_batches:  # (THD lengths too)
            known.enter_context(media.known_inputs(fake_mode))
            if pp_enabled:  # a stage computes its microbatch's positions itself (stack/step._vlm_pipeline_microbatch)
                known.enter_context(media.known_rope_index(parts, fake_mode))
        # AutoModel leaves the model unwrapped where the data-parallel mesh has one rank (TP alone) or on one rank
        megatron = megatron and any(step.is_megatron_fsdp(p) for p in parts)
        with known:
            if megatron:
                # MegatronFSDP carries state from one step to the next (its hooks' states, which decide what prefetches;
                # its preserved root buckets; what finish_grad_sync attaches): a step of one microbatch runs first,
                # untracked, so the measured step starts as a later one does
                with _garbage_collection_held_off():
                    step.train_step(
                        built,
                        optimizers,
                        batches[:1],
                        num_label_tokens=step.every_token_labelled(built, batches[:1]),
                        clip_grad_norm=spec.recipe.clip_grad_norm,
                        step_optimizer=spec.recipe.steps_optimizer,
                    )
                rewrites.append(
                    "MegatronFSDP: a step of one microbatch runs untracked before the measured one (megatron-fsdp's hooks "
                    "and buffers carry state from step to step: on a first forward the modules outside its units "
                    "prefetch blocks that a later step's do not)"
                )
            held = step.megatron_fsdp_buffers(parts) if megatron else []
            tracker = make_tracker(parts, optimizers, phases, held)
            moments = pipeline_moments(tracker, phases) if pp_enabled else contextlib.nullcontext()
            syncs = step.megatron_grad_syncs(parts) if megatron else contextlib.nullcontext()
            with tracker, repeated_calls(tracker), _garbage_collection_held_off(), moments, syncs as synced:
                step.train_step(
                    built,
                    optimizers,
                    batches,
                    num_label_tokens=num_label_tokens,
                    clip_grad_norm=spec.recipe.clip_grad_norm,
                    phases=phases,
                    after_loss=lambda: snapshots.setdefault(
                        "after_forward", categories(tracker.get_tracker_snapshot("current"))
                    ),
                    before_optimizer=lambda: snapshots.setdefault("grad_bytes", _grad_bytes(parts)),
                    step_optimizer=spec.recipe.steps_optimizer,
                )
        if synced is not None and synced.calls == 0:
            where = " and ".join(synced.root_hook_on) or "the wrapped model's last submodule"
            rewrites.append(
                f"MegatronFSDP: finish_grad_sync never ran in the measured step. megatron-fsdp's root pre-backward "
                f"hook sits on the output of {where}, which got no gradient, so the root's post-backward did not "
                "run, and with it finish_grad_sync, the one call in AutoModel's step that attaches the reduced "
                "gradients to the optimizer's parameters; what the backward gathered can stay gathered into the next "
                "step (every block's bucket on Llama-3.2-1B; validate: megatron-fsdp-linear-ce)"
            )
        peak = categories(tracker.get_tracker_snapshot("peak"))
        largest, retained = module_views(tracker)
    local = _local_bytes(parts, optimizers)
    if megatron:
        # MegatronFSDP's parameters: its weight buffers (a shard under zero_dp_strategy 3, the whole model below it;
        # the module's own tensors where it keeps none) and, with preserve_fp32_weights, its fp32 main copy
        local["params"] = sum(t.numel() * t.element_size() for t, category in held if category == "params")
    after_forward = snapshots.get("after_forward")
    res.update(
        tracker=type(tracker).__mro__[1].__name__,
        peak_categories={k: v / GIB for k, v in peak.items()},
        peak=_split(peak, local["params"]),
        peak_phase=tracker.peak_phase,
        # per moment (a phase, or a pipeline action within one), which a depth's line is drawn through; per phase
        # the largest of its moments
        moment_splits={ph: _split(c, local["params"]) for ph, c in tracker.moment_categories.items()},
        moment_categories={ph: {k: v / GIB for k, v in c.items()} for ph, c in tracker.moment_categories.items()},
        largest_modules=largest,
        forward_retained=retained,
        local_bytes={**local, "grads": snapshots.get("grad_bytes", 0)},
        after_forward=_split(after_forward, local["params"]) if after_forward else None,
    )
    _by_moment(res)
    ring = (
        f"Gemma-4's context-parallel ring (AutoModel's cp_attention.py) runs as written, its compiled flex attention "
        f"a stand-in with the kernel's shapes ({shims.FLEX_ATTENTION.hits} chunk calls; stack/flex_attention.py: "
        "output, fp32 log-sum-exp and max scores kept with q, k and v; the block mask's tables are not counted); its "
        "check for empty query rows is answered 'some', as on the CP rank that holds a padded pack's tail (their "
        "zeroed copies counted on every rank)"
    )
    if shims.FLEX_ATTENTION.hits and not any(r.startswith(ring[:40]) for r in rewrites):
        rewrites.append(ring)
    return res


def _by_moment(res: dict[str, Any], *, peak_from_phases: bool = False) -> None:
    """A result's per-phase figures and peak moment from its per-moment ones (dry_run/depth.py by_phase); with
    ``peak_from_phases`` the peak's phase is the largest phase (extrapolated figures), else the tracker's."""
    moments = res["moment_splits"]
    res["phase_splits"], res["phase_categories"] = by_phase(moments, res["moment_categories"])
    res["phase_peaks"] = {ph: v["total"] for ph, v in res["phase_splits"].items()}
    res["moment_peaks"] = {k: v["total"] for k, v in moments.items()}
    if peak_from_phases:
        res["peak_phase"] = peak_phase(res["phase_splits"])
    res["peak_moment"] = phase_moments(moments).get(res["peak_phase"], res["peak_phase"])


def _at_depth(depth: Depth, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The full depth's figures on the line through two shallow builds (see :mod:`.depth`)."""
    (u1, u2), target = depth.units, depth.target_units
    whole = depth.model_units if depth.model_units is not None else target  # the model's count, not the rank's

    def at(a: float, b: float) -> float:
        return line(u1, a, u2, b, target)

    # each moment on its own line, the maximum taken after (a phase's peak moment can change with the depth); builds
    # of different stage counts run different pipeline actions, so there (and wherever the two builds' moments differ)
    # each phase has one line
    same = depth.same_actions and set(first["moment_splits"]) == set(second["moment_splits"])
    key = "moment" if same else "phase"
    out = dict(second)
    out.update(
        moment_splits=extrapolate_splits(depth, first[f"{key}_splits"], second[f"{key}_splits"]),
        moment_categories=extrapolate_splits(depth, first[f"{key}_categories"], second[f"{key}_categories"]),
    )
    _by_moment(out, peak_from_phases=True)
    phase = out["peak_phase"]
    if phase is None:
        raise RuntimeError("the two shallow builds share no phase: the depth cannot be extrapolated")
    out.update(
        peak=out["phase_splits"][phase],
        peak_categories=out["phase_categories"][phase],
        local_bytes={k: int(at(first["local_bytes"][k], v)) for k, v in second["local_bytes"].items()},
        params={
            **second["params"],
            "total": int(line(u1, first["params"]["total"], u2, second["params"]["total"], whole)),
            "trainable": int(line(u1, first["params"]["trainable"], u2, second["params"]["trainable"], whole)),
        },
        builds=[
            {"layers": n, "peak_gib": b["peak"]["total"], "peak_phase": b["peak_phase"]}
            for n, b in zip(depth.layers, (first, second))
        ],
    )
    if first.get("after_forward") and second.get("after_forward"):
        out["after_forward"] = {k: at(first["after_forward"][k], v) for k, v in second["after_forward"].items()}
    return out


def thd_pack_fields(shape: tuple[int, int], fake_mode: Any) -> dict[str, Any]:
    """The packing collate's THD fields for ``shape`` (packs x pack length), one document filling each pack, as known
    values (AutoModel's sharder flattens them and reads the lengths; GLM-5.2's TileLang and cuDNN DSA run on THD
    only, and the cuDNN path's metadata reads the layout on the host)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    rows, length = shape
    known = fake_mode.fake_tensor_converter
    with unset_fake_temporarily():
        fields = {
            "position_ids": torch.arange(length).expand(rows, length).clone(),
            "seq_lens": torch.full((rows, 1), length),
            "seq_lens_padded": torch.full((rows, 1), length),
        }
    return {k: known.from_real_tensor(fake_mode, v, make_constant=True) for k, v in fields.items()} | {
        "qkv_format": "thd"
    }


def run(spec: DryRunSpec) -> dict[str, Any]:
    phases = Phases()
    result: dict[str, Any] = {"rank": spec.rank, "status": "failed", "rewrites": []}
    preloaded = sys.modules.get("automodel_dist.stack.preload")
    try:
        with phases("import"):
            warnings.filterwarnings("ignore")
            from ..stack import preload
        if preloaded is not None:  # by the fork server this rank was forked from (dry_run/launcher.py)
            # its time is this rank's too as far as the run waited for it (run.py: a fork server kept from an earlier
            # run may have imported before this run began)
            result["preload_s"], result["preload_done"] = preload.SECONDS, preload.DONE
            result["import_shared"] = True
        broken = shims.broken()
        if broken:
            result["status"] = "not_measured"
            result["reason"] = "the installed AutoModel or torch moved what the dry run hooks: " + "; ".join(broken)
            return result
        if spec.recipe.te_stand_in:
            shims.install_te_attention()
        if spec.recipe.fla_gdn:
            shims.install_fla_gdn()  # AutoModel's Gated DeltaNet layers bind fla's kernel when they are built
        if spec.recipe.ffpa:
            shims.install_ffpa()  # Gemma-4's CP ring imports FFPA's package and looks its operators up per call
        if spec.recipe.blockdiag_cp:
            shims.install_flash_varlen()  # AutoModel's block-diagonal CP imports flash-attn's kernels at each call
        if spec.recipe.glm_dsa_kernels:
            shims.install_glm_dsa()  # GLM-5.2's DSA Functions look their TileLang kernels up at each call
        if spec.recipe.glm_cudnn_kernels:
            shims.install_glm_cudnn_dsa()  # GLM-5.2's cuDNN DSA adapters look their kernels up at each call
        if spec.recipe.dsv4_kernels:
            shims.install_dsv4_tilelang()  # DeepSeek-V4's interfaces build their TileLang kernels at each call
        if spec.recipe.mamba_ssm:
            # AutoModel's Mamba-2 mixers import mamba_ssm's kernel in forward; transformers' bound theirs on import
            shims.install_mamba_ssd(transformers_class=spec.recipe.mamba_hf)
        shims.install_compiled_activations()
        builds = spec.measured_builds()
        if spec.side_by_side and len(builds) == 2:
            measured = _side_by_side(spec, builds, phases, result["rewrites"])
            result["side_by_side"] = True
        else:
            measured = [_measure(spec, build, phases, result["rewrites"]) for build in builds]
        if spec.depth is not None and len(measured) == 2:
            result.update(_at_depth(spec.depth, measured[0], measured[1]))
        else:
            result.update(measured[0])
        result["status"] = "measured"
    except Exception as exc:  # noqa: BLE001 - AutoModel's own exception is the result
        result.update(exc.failure if isinstance(exc, _BuildFailed) else _failure(exc, phases))
    finally:
        result["phases_s"] = phases.seconds
        # (RUSAGE_CHILDREN: a side-by-side build's process, once waited for)
        rss = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        result["host_peak_rss_mib"] = round(rss / 1024, 1)
        result["shim_hits"] = {name: s.hits for name, s in shims.SHIMS.items() if s.hits}
        result["value_calls"] = shims.CALLS
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    return result


def _failure(exc: BaseException, phases: Phases) -> dict[str, Any]:
    """A failed rank's result fields: AutoModel's own exception (a pipeline stage's error unwrapped, a re-raise with
    its cause) and the phase it was raised in."""
    cause = exc.__cause__ or exc.__context__
    out: dict[str, Any] = {
        "status": "failed",
        "error": f"{type(exc).__name__}: {exc}"[:4000],
        "error_phase": phases.failed or phases.current,
        "traceback": _short_traceback(exc),
    }
    unknown = _in_chain(exc, UnknownValues)
    if unknown is not None:  # the dry run cannot know a value the GPU would have: not AutoModel's error
        return {"status": "not_measured", "reason": str(unknown)[:4000], "error_phase": out["error_phase"]}
    if cause is not None and "[Stage" in str(exc):  # the pipeline wraps a stage's error
        out["error"] = f"{type(cause).__name__}: {cause}"[:4000]
        out["traceback"] = _short_traceback(cause)
    elif exc.__cause__ is not None:  # AutoModel re-raised it with its own words (raise ... from): both are said
        cause = exc.__cause__
        out["error"] = f"{type(exc).__name__}: {exc} (caused by {type(cause).__name__}: {cause})"[:4000]
        out["traceback"] = _short_traceback(exc)[-6:] + _short_traceback(cause)[-6:]
    return out


def _in_chain(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first of its causes and contexts (a pipeline stage's wrapper, a re-raise) that is a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class _BuildFailed(RuntimeError):
    """The side-by-side build's process failed: its result fields, as :func:`_failure` made them there."""

    def __init__(self, failure: dict[str, Any]) -> None:
        super().__init__(failure.get("error") or failure.get("reason"))
        self.failure = failure


def _side_by_side(spec: DryRunSpec, builds: list[Build], phases: Phases, rewrites: list[str]) -> list[dict[str, Any]]:
    """Both shallow builds at once: the shallower in a child forked here (the stack imported and the stand-ins
    installed once), the deeper in this process; each on its own fake process group and tracker, as one after the
    other would be. The child's phase times, stand-in counts and answered calls are added to this process's (so the
    phase times are the two processes' work together, not the wall time). Where both fail, the shallower build's
    failure is the rank's, as one after the other it would have been."""
    import gc
    import os

    from ..child_process import set_pdeathsig

    hits_before = {name: s.hits for name, s in shims.SHIMS.items()}  # both processes' counts at the fork
    calls_before = {key: record["calls"] for key, record in shims.CALLS.items()}
    gc.freeze()  # the imported heap stays shared: the child's collections would otherwise copy it
    parent = os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one build, its figures (or its failure) back as JSON, then out without cleanup
        code = 0
        try:
            set_pdeathsig()  # (a fork clears the rank's own: the child dies with the rank)
            if os.getppid() != parent:
                os._exit(1)
            os.close(read)
            own = Phases()
            payload: dict[str, Any]
            try:
                own_rewrites: list[str] = []
                payload = {"measured": _measure(spec, builds[0], own, own_rewrites), "rewrites": own_rewrites}
            except Exception as exc:  # noqa: BLE001 - AutoModel's own exception is the result
                payload = {"failure": _failure(exc, own)}
            payload |= {
                "phases": own.seconds,
                "shim_hits": {name: s.hits for name, s in shims.SHIMS.items()},
                "calls": shims.CALLS,
            }
            with os.fdopen(write, "w", encoding="utf-8") as out:
                json.dump(payload, out, default=str)
        except BaseException:  # noqa: BLE001 - the parent reads a missing payload as the failure
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    gc.unfreeze()
    failed: BaseException | None = None
    try:
        second = _measure(spec, builds[1], phases, rewrites)
    except Exception as exc:  # noqa: BLE001 - re-raised below, unless the shallower build failed too
        failed = exc  # (the child is waited for: one after the other, its failure would have come first)
    with os.fdopen(read, encoding="utf-8") as src:  # the child writes once it is done (or failed)
        text = src.read()
    _, status = os.waitpid(pid, 0)
    try:
        child = json.loads(text) if text else None
    except ValueError:
        child = None
    if child is None:
        if failed is not None:
            raise failed
        code = os.waitstatus_to_exitcode(status)
        raise RuntimeError(f"the side-by-side build's process ended ({code}) without a result")
    for name, seconds in child["phases"].items():
        phases.seconds[name] = round(phases.seconds.get(name, 0.0) + seconds, 3)
    for name, s in shims.SHIMS.items():  # the child's counts past what both processes had at the fork
        s.hits += max(0, child["shim_hits"].get(name, 0) - hits_before.get(name, 0))
    for key, record in child["calls"].items():
        shims.CALLS.setdefault(key, {**record, "calls": 0})["calls"] += record["calls"] - calls_before.get(key, 0)
    if "failure" in child:
        raise _BuildFailed(child["failure"])
    if failed is not None:
        raise failed
    for note in child["rewrites"]:  # (a note that counts calls differs between the builds: one per kind is kept)
        if not any(r[:40] == note[:40] for r in rewrites):
            rewrites.append(note)
    return [child["measured"], second]


def _short_traceback(exc: BaseException) -> list[str]:
    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" for f in frames][-12:]


def serve(spec_path: str | Path, out_path: str | Path) -> int:
    """Run the rank of the spec at ``spec_path`` and write its result to ``out_path`` (always, a failure included)."""
    result = run(DryRunSpec.read(Path(spec_path)))
    Path(out_path).write_text(json.dumps(result, default=str), encoding="utf-8")
    print("PHASE done", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return serve(args[0], args[1])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
