"""What a dry run measures, decided without torch: the layout AutoModel reads at the world size, the ranks that stand
for every distinct rank, the model's config, the batch shapes, and the recipe's PEFT, loss, optimizer and kernels
with what a CPU has to run instead (each substitution stated)."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from ..api import analyze
from ..catalog.hf_config import NoConfigError, hf_config
from ..catalog.implementations import builds_own_class, implementation
from ..catalog.kernels import (
    DSA_THD_BACKENDS,
    EAGER_UNLESS_TE,
    LOCAL_DISPATCHERS,
    runs_eager_attention,
    takes_blockdiag_cp,
)
from ..catalog.models import ModelSpec
from ..config.kinds import DIFFUSION_LM_RECIPES, FREEZE_CONFIG_RECIPES, MEDIA_RECIPES
from ..dims import ParallelDims
from ..estimate.api import check_positive_ints, model_of, resolved_model
from ..estimate.memory import carries_across_schedule_steps, holds_across_schedule_steps, peak_candidate_pp_ranks
from ..estimate.training import training_for
from ..media import (
    FAKE_IMAGE_PX,
    GEMMA4_SOFT_TOKENS,
    IMAGE_PX,
    IMAGES_PER_SAMPLE,
    KIMI_IN_TOKEN_LIMIT,
    MUSE_GLIMMER_IMAGE_TOKENS,
    PIXTRAL_LONGEST_EDGE,
    is_gemma3_tower,
    is_gemma4_tower,
    is_kimi_vl_tower,
    is_muse_glimmer_tower,
    is_pixtral_tower,
    is_qwen_tower,
    vlm_image,
)
from ..report import ValidationReport
from ..request import Request
from ..stack.recipe import (
    DSA_KERNEL_STAND_INS,
    DSV4_STAND_INS,
    StackRecipe,
    backend_for,
    jsonable,
    loss_for,
    optimizer_for,
    sanitized_block,
)
from ..vlm_packing import recipe_fill_note
from ..workload import Workload, unsized_entry
from .depth import Depth, built_kinds, plan_depth, truncated_config
from .spec import Build, DryRunSpec, Media

DEFAULT_SEQ_LEN = 4096
TEACHER_NOT_BUILT = "knowledge distillation: the teacher_model is not built or run"


class DryRunUsageError(ValueError):
    """Arguments that cannot describe a dry run (CLI exit 2)."""


@dataclass
class Plan:
    """The dry run of one config: a worker spec per measured rank, and what the report states about them."""

    report: ValidationReport
    dims: ParallelDims
    model: ModelSpec
    model_source: str
    specs: list[DryRunSpec]
    seq_len: int
    micro_batch_size: int
    local_batch_size: int
    microbatches: int
    measured_microbatches: int
    num_layers: int
    assumed: list[str] = field(default_factory=list)
    substitutions: list[str] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unmeasured_ranks: dict[int, str] = field(default_factory=dict)


def plan_dry_run(
    request: Request, *, ranks: list[int] | None = None, num_layers: int | None = None, full_depth: bool = False
) -> Plan:
    """Raises :class:`DryRunUsageError` where the request or the config cannot describe one."""
    seq_len, micro_batch_size = request.workload.seq_len, request.workload.micro_batch_size
    global_batch_size = request.workload.global_batch_size
    sizes = {"seq_len": seq_len, "micro_batch_size": micro_batch_size, "global_batch_size": global_batch_size}
    try:
        check_positive_ints(sizes | {"num_layers": num_layers}, optional=True)
    except ValueError as exc:
        raise DryRunUsageError(str(exc)) from None
    try:
        given = resolved_model(request)
    except ValueError as exc:
        raise DryRunUsageError(str(exc)) from exc
    result = analyze(request.replace(model=given.spec if given is not None else None))
    ctx = result.context
    if ctx is None:
        raise DryRunUsageError("the config cannot be read: " + "; ".join(f.message for f in result.report.errors[:3]))
    d = ctx.dims
    if d.world_size is None:
        raise DryRunUsageError(
            "the world size is unknown: pass world_size, or nodes and gpus_per_node (or a recipe "
            "with a ci: block, or --nproc-per-node after --)"
        )
    try:
        spec = model_of(ctx)
    except ValueError as exc:
        raise DryRunUsageError(str(exc)) from exc
    try:
        cfg = hf_config(spec)
    except NoConfigError as exc:
        raise DryRunUsageError(str(exc)) from exc
    w = ctx.workload
    cfg = _with_text_config(cfg, w)
    source = given.describe() if given is not None else (result.report.model_source or "the catalog")
    layers = min(num_layers, spec.num_layers) if num_layers else spec.num_layers
    if layers != spec.num_layers:
        cfg = truncated_config(cfg, layers)
    if (why := unsized_entry(w)) is not None:
        raise DryRunUsageError(why)
    subs: list[str] = []
    not_measured: list[str] = []
    notes: list[str] = []
    assumed: list[str] = []
    if seq_len is None and w.seq_len is None:
        assumed.append(f"seq_len {DEFAULT_SEQ_LEN} (neither passed nor in the recipe: memory grows with it)")
    seq = seq_len or (w.seq_len[0] if w.seq_len else DEFAULT_SEQ_LEN)
    dp = d.dp or 1
    run_steps = 1
    if d.pp > 1:
        mbs = micro_batch_size or d.pp_microbatch_size or 1
        lbs = w.local_batch_size[0] if w.local_batch_size else 2 * d.pp * mbs
        if not w.local_batch_size:
            assumed.append(f"local_batch_size {lbs} (2 x pp microbatches of {mbs})")
        n_mb = max(1, lbs // mbs)
        gbs = global_batch_size or (w.global_batch_size[0] if w.global_batch_size else lbs * dp)
        # Every schedule but GPipe / LoopedBFS reaches its steady in-flight count within 2 x pp microbatches.
        measured = n_mb if d.pp_schedule in ("GPipe", "LoopedBFS") else min(n_mb, 2 * d.pp * d.stages_per_rank)
        schedule_steps = max(1, gbs // (lbs * dp))
        microbatches = n_mb * schedule_steps
        tr = training_for(
            spec,
            w,
            precision=None,
            optimizer=None,
            seq_len=seq,
            micro_batch_size=mbs,
            global_batch_size=gbs,
            pp_microbatches=n_mb,
        ).training
        if schedule_steps > 1 and carries_across_schedule_steps(d, tr):
            run_steps = 2
            why = (
                "AutoModel's patched stage backward on its MoE class (a model part that is no FSDP module, "
                "moe.wrap_outer_model false) keeps every unit's unsharded gradients and gathered blocks until the "
                "optimizer step's last schedule step"
                if holds_across_schedule_steps(d, tr)
                else "the routed experts outside FSDP (a one-rank ep_shard mesh) keep their plain gradients to the "
                "optimizer step"
            )
            notes.append(
                f"{schedule_steps} pipeline schedule steps per optimizer step; the dry run ran 2: {why}, so the "
                "second runs with what the first left, the most any later one holds"
            )
        if measured < n_mb:
            notes.append(
                f"the pipeline schedule ran {measured} of the step's {n_mb} microbatches per rank: "
                f"{d.pp_schedule} holds at most that many in flight, so the peak is the step's (the FSDP "
                "gradients a deferred sync holds included)"
            )
    else:
        mbs = micro_batch_size or (w.local_batch_size[0] if w.local_batch_size else 1)
        if not (micro_batch_size or w.local_batch_size):
            assumed.append("micro batch 1 (neither passed nor in the recipe)")
        lbs = mbs
        gbs = global_batch_size or (w.global_batch_size[0] if w.global_batch_size else mbs * dp)
        microbatches = max(1, gbs // (mbs * dp))
        measured = min(microbatches, 2)
        if microbatches > 2:
            notes.append(
                f"{microbatches} gradient-accumulation microbatches per step; the dry run ran 2: the second "
                "backward runs with every gradient the first left (unsharded fp32 with "
                "defer_fsdp_grad_sync, AutoModel's default), which is the most any later one holds"
            )
    if layers != spec.num_layers:
        notes.append(
            f"built with {layers} of the model's {spec.num_layers} layers (num_layers): the peak is not "
            "the full model's"
        )
    own_class = builds_own_class(spec.architecture, w.force_hf)
    backend = backend_for(w, spec.is_moe, own_class, subs, architecture=spec.architecture)
    if spec.is_moe:
        subs.append(
            "MoE routing assumed balanced: each rank's experts receive 1/ep of the token assignments (a "
            "real router's imbalance raises the hottest rank's peak)"
        )
    if w.quantization is not None:
        not_measured.append(
            "quantization: (QLoRA) is not applied: the frozen base weights are measured in bf16; "
            "4-bit weights take about a quarter of those bytes, plus their scales"
        )
    if ctx.kind.teacher:
        not_measured.append(
            f"{TEACHER_NOT_BUILT}: the figures are the student's alone, so there is no fit verdict (estimate counts "
            "the teacher on the student's GPUs)"
        )
    blocking: list[str] = []  # what makes every rank's figure meaningless: none is run
    media: Media | None = None
    if ctx.kind.recipe in MEDIA_RECIPES:
        why = _media_unsupported(ctx.kind.recipe, cfg, d, w)
        if why:
            blocking.append(why)
        else:
            px = FAKE_IMAGE_PX if w.fake_images else IMAGE_PX
            low, high = w.processor_pixels
            text_only = w.text_only_data is not None
            media = Media(
                image_px=px,
                images_per_sample=0 if text_only else IMAGES_PER_SAMPLE,
                min_pixels=low,
                max_pixels=high,
                # (the Qwen2.5-VL and Kimi-VL collates hand the processor's fp32 pixels on, the model casts them to its
                # dtype; AutoModel picks Kimi-VL's by its processor where the recipe names none)
                pixel_dtype="float32"
                if w.collate in ("qwen2_5_collate_fn", "kimi_vl_collate_fn")
                or (w.collate is None and is_kimi_vl_tower(cfg))
                else "bfloat16",
            )
            bounds = (
                f"the recipe's processor bounds ({low or 'default'}..{high or 'default'} pixels)"
                if low or high
                else "the processor class's default bounds (the checkpoint's preprocessor_config.json is not read)"
            )
            image = vlm_image(cfg, px, (low, high))
            assert image is not None  # _media_unsupported refused every other processor
            if w.fake_images:
                assumed.append(
                    f"image: dataset._target_ {w.fake_images} makes text-only conversations, and AutoModel injects its "
                    f"{px[0]} x {px[1]} fake image into each sample it pretokenizes (dataset.inject_fake_images, "
                    f"default true): one a sequence assumed (a pack carries one a sample it holds), resized to "
                    f"{image.pixels[0]} x {image.pixels[1]} by the model's processor, {image.tokens} placeholder tokens "
                    f"inside the {seq}-token sequence"
                )
            elif text_only:
                notes.append(
                    f"data: dataset._target_ {w.text_only_data} makes text-only conversations, so the VLM step's "
                    "batches carry no images (the towers are built and hold their weights, and run no forward)"
                )
            elif image.processor == "gemma3":
                assumed.append(
                    f"image: one image per sequence (the data set's images are not read), resized to "
                    f"{image.pixels[0]} x {image.pixels[1]} by Gemma-3's processor whatever its size (no pan-and-scan, "
                    f"its default) and pooled to {image.tokens} soft tokens, inside the {seq}-token sequence"
                )
            elif image.processor == "pixtral":
                assumed.append(
                    f"image: one {px[0]} x {px[1]} image per sequence (the data set's images are not read), resized by "
                    f"Mistral3's Pixtral processor, its aspect ratio kept, within the processor class's longest edge of "
                    f"{PIXTRAL_LONGEST_EDGE} to whole {image.patch_size * image.merge}-pixel cells (the checkpoint's "
                    f"preprocessor_config.json is not read): {image.pixels[0]} x {image.pixels[1]}, {image.tokens} "
                    f"placeholder tokens and {image.sequence_tokens - image.tokens} row breaks inside the {seq}-token "
                    "sequence"
                )
            elif image.processor == "kimi":
                assumed.append(
                    f"image: one {px[0]} x {px[1]} image per sequence (the data set's images are not read), scaled by "
                    f"Kimi-VL's processor, its aspect ratio kept, within {KIMI_IN_TOKEN_LIMIT:,} patches and padded to "
                    f"whole {image.patch_size * image.merge}-pixel merge cells (in_token_limit and pad_input as a "
                    "public copy of the checkpoint's preprocessor_config.json sets them; the file itself is not "
                    f"read): {image.pixels[0]} x {image.pixels[1]}, {image.tokens} placeholder tokens inside the "
                    f"{seq}-token sequence"
                )
            elif image.processor == "gemma4":
                assumed.append(
                    f"image: one {px[0]} x {px[1]} image per sequence (the data set's images are not read), resized by "
                    f"Gemma-4's processor, its aspect ratio kept, within the processor class's budget of "
                    f"{GEMMA4_SOFT_TOKENS} soft tokens (the checkpoint's preprocessor_config.json is not read): "
                    f"{image.pixels[0]} x {image.pixels[1]}, {image.tokens} soft tokens inside the {seq}-token sequence"
                )
            elif image.processor == "muse_glimmer":
                assumed.append(
                    f"image: one {px[0]} x {px[1]} image per sequence (the data set's images are not read), resized by "
                    f"Muse-Glimmer's processor to the grid of {image.patch_size * image.merge}-pixel cells nearest its "
                    f"aspect ratio within the processor class's budget of {MUSE_GLIMMER_IMAGE_TOKENS:,} tokens (the "
                    f"checkpoint's preprocessor_config.json is not read): {image.pixels[0]} x {image.pixels[1]}, "
                    f"{image.tokens} placeholder tokens inside the {seq}-token sequence"
                )
            else:
                assumed.append(
                    f"image: one {px[0]} x {px[1]} image per sequence (the data set's images are not read), resized "
                    f"within {bounds}; its patches, grid and placeholder tokens as the Qwen-VL processor makes them, "
                    f"inside the {seq}-token sequence (the rank's result gives the grid)"
                )
            if (
                not text_only
                and w.vlm_packing is not None
                and (packing := recipe_fill_note(w.vlm_packing, cfg, (low, high), seq))
            ):
                assumed.append(packing)
            subs.append(
                "VLM step: AutoModel's NeMoAutoModelForImageTextToText with the recipe's freeze_config, its step's "
                "context-parallel pre-embed hook and vision frame-sharding context, and the model output kept "
                "through backward as its step keeps it"
                + (
                    "; the image tokens typed for Gemma-3's bidirectional image attention (token_type_ids)"
                    if image.processor == "gemma3"
                    else "; the image tokens typed in mm_token_type_ids and the patches' grid positions given, as "
                    "Gemma-4's processor hands them over"
                    if image.processor == "gemma4"
                    else "; the images padded to the batch's largest with their sizes in image_sizes, which the Pixtral "
                    "tower reads to cut each image's patches, as Mistral3's processor hands them over"
                    if image.processor == "pixtral"
                    else "; the images' patches flattened with their grids in image_grid_hws, which the MoonViT tower "
                    "reads to cut, position and merge each image's patches, as Kimi-VL's processor hands them over"
                    if image.processor == "kimi"
                    else "; the images' patches flattened with their grids in image_grid_thw, from which AutoModel's "
                    "Muse-Glimmer tower computes its segments, window order and position tables (its get_vision_* "
                    "helpers, run on the grids' known values), as its processor hands them over"
                    if image.processor == "muse_glimmer"
                    else "; the multimodal position ids come from the model's own get_rope_index on the batch's ids "
                    "(computed ahead, as its CP hook does)"
                )
            )
            if d.pp > 1:
                subs.append(
                    "VLM under pipeline parallelism: the batch's images split per microbatch by AutoModel's "
                    "prepare_vlm_media_for_pp (its loader's PP collate) and staged on the first stage's model for the "
                    "schedule (stage_vlm_media_for_pp); multimodal positions are handed to the schedule only where "
                    "the model splits them itself (get_pipeline_kwargs_chunk_dims), else its forward computes them"
                )
    elif ctx.kind.recipe in DIFFUSION_LM_RECIPES:
        blocking.append(
            f"{ctx.kind.recipe}: a diffusion LM's masked-denoising step is not the next-token step the dry run runs: "
            "not measured"
        )
    blockdiag_cp = False
    if "linear" in spec.layer_attention and not w.force_hf and d.cp > 1:
        impl = implementation(spec.architecture)
        if impl is None or not impl.module.startswith(CP_LINEAR_ATTENTION_MODULES):
            blocking.append(
                "linear-attention layers under context parallelism on a class without AutoModel's CP-aware layer "
                "(qwen3_5_moe/cp_linear_attn.py, kimi_linear/cp.py) are not run by the dry run: not measured"
            )
        elif w.vlm_packed and media is not None:
            blockdiag_cp = takes_blockdiag_cp(spec.architecture, hf_class=False, cp=d.cp, packed_vlm=True)
            if not blockdiag_cp:
                blocking.append(
                    f"a packed VLM batch under context parallelism on {impl.architecture}: its CP hook shards "
                    "round-robin, not block-diagonally (only Qwen3.5-MoE's class takes AutoModel's block-diagonal CP "
                    "path), and the dry run does not run a packed batch through that hook (its text model checks the "
                    "packing collate's packed-sequence metadata under that CP): not measured"
                )
            else:
                subs.append(
                    "a packed VLM batch under context parallelism takes AutoModel's block-diagonal CP path, which the "
                    "dry run runs as written: the packing collate's document map (_packed_seq_ids, the indexed "
                    "attention mask and the packed-sequence metadata) handed over, one document filling the pack (a "
                    "pack measured as its unpacked equivalent), each rank a contiguous share of it; every "
                    "full-attention layer all-gathers the stacked keys and values and runs flash-attn's varlen kernel "
                    "as a stand-in with its shapes (stack/flash_varlen.py: q, k, v, the output and an fp32 "
                    "log-sum-exp a row kept; its backward's fp32 dq accumulator and, under GQA, dk and dv at the "
                    "query's head count); the Gated DeltaNet layers take the same document boundaries into fla's CP "
                    "context"
                )
        elif spec.linear_mixer == "kda":
            subs.append(
                "KDA layers under context parallelism run fla's context-parallel path as stand-ins with its shapes "
                "(stack/fla_kda.py, fla_gdn.py: build_cp_context on each row's document map, the CP short convs with "
                "the previous rank's tail tokens, the chunked kernel's state handed along the CP ranks and its "
                "all-gathers) inside AutoModel's own contiguous CP sharding (kimi_linear/cp.py), whose MLA layers "
                "all-gather the compressed KV latent and expand it as written; each row read as one document filling "
                "it (a pack measured as its unpacked equivalent)"
            )
        else:
            subs.append(
                "Gated DeltaNet layers under context parallelism run fla's context-parallel path as stand-ins with its "
                "shapes (stack/fla_gdn.py: build_cp_context, the CP causal conv1d with the previous rank's tail "
                "tokens, the chunked kernel's state handed along the CP ranks and its all-gathers) inside AutoModel's "
                "CP-aware layer, whose own all-gathers of the hidden states around them run as written"
            )
    if spec.index_heads and w.attn_backend in DSA_THD_BACKENDS and not w.force_hf:
        if (spec.architecture, w.attn_backend) not in DSA_KERNEL_STAND_INS:
            blocking.append(
                f"model.backend.attn {w.attn_backend} on {spec.architecture}: CUDA sparse-attention kernels the dry "
                "run does not stand in (TileLang's only for GLM-5.2's and DeepSeek-V4's classes, cuDNN's DSA and "
                "FlashMLA only for GLM-5.2's), where the class takes that backend at all; running the dense attention "
                "instead would hold a seq x seq mask per head: not measured"
            )
        elif not w.thd_batches and not spec.hc_mult:  # (GLM-5.2's; DeepSeek-V4's take padded batches)
            kernels = "cuDNN" if w.attn_backend == "cudnn" else "TileLang"
            blocking.append(
                f"model.backend.attn {w.attn_backend} on {spec.architecture} runs on packed THD batches only, and this "
                "recipe's are not (no packed_sequence.packed_sequence_size with THD packing, nor "
                f"packed_sequence_thd_collater): AutoModel raises '{kernels} DSA indexer requires THD/packed "
                "sequences' in the first forward: not measured"
            )
    if d.strategy == "ddp" and (d.world_size or 1) > 1:
        blocking.append(
            "DDP: its reducer's gradient all-reduce cannot complete on a fake process group (no values come back): "
            "not measured"
        )
    loss = loss_for(w, subs)
    optimizer = optimizer_for(w, subs)
    eager = "torch.compile'd code runs eagerly (Dynamo refuses fake tensors): its fusions' savings are not counted"
    if spec.is_moe:
        eager += (
            ", except in AutoModel's compiled MoE expert activations, which keep their inputs as a compiled graph does"
        )
    subs.append(eager)
    fla_gdn = "linear" in spec.layer_attention and not w.force_hf  # transformers' own class keeps its torch loop
    # AutoModel's MoE parallelizer sets up CP by importing TE's DotProductAttention whatever the attention backend
    # (moe/parallelizer.py apply_cp): TE's module must import, as on the GPUs the recipes ran on
    attn = (backend or {}).get("attn")
    te_module = own_class and spec.is_moe and d.cp > 1 and attn != "te"
    if te_module:
        subs.append(
            f"Transformer Engine importable (the stand-in's module) for AutoModel's MoE context-parallel setup, which "
            f"imports its DotProductAttention whatever the backend; the attention runs as {attn}, which that setup "
            "leaves without a CP group (AutoModel warns so on a GPU too)"
        )
    # AutoModel's Nemotron-H mixer imports mamba_ssm's kernel; transformers' Nemotron-H and Falcon-H1 classes bind
    # mamba_ssm's and causal_conv1d's kernels where they are installed (AutoModel's CUDA environment) and train with
    # their cache on (the config's use_cache), which takes the unfused path: causal_conv1d, the chunk scan and the
    # class's own gated norm
    hf_mamba = ("mamba" in spec.layer_types and spec.architecture == "NemotronHForCausalLM") or spec.parallel_mamba
    mamba_hf = spec.architecture if not own_class and hf_mamba else None
    if mamba_hf and d.ac_applied:
        subs.append(
            f"Mamba-2 layers (transformers' {mamba_hf} class, its cache off under activation checkpointing, which "
            "AutoModel's setup turns off) run mamba_ssm's fused conv1d + SSD scan + out_proj kernel (with the gated "
            "norm where the model has one) as a stand-in with its shapes (stack/mamba_ssd.py: what it keeps for "
            "backward, its chunk states and workspaces while they live, as mamba_ssm 2.3.2 allocates them)"
        )
    elif mamba_hf:
        subs.append(
            f"Mamba-2 layers (transformers' {mamba_hf} class, its cache on) run causal_conv1d's and mamba_ssm's "
            "chunk-scan kernels as stand-ins with their shapes (stack/mamba_ssd.py: causal_conv1d 1.7.0's saved input "
            "and output, the scan's chunk states, C^T B and output, its fp32 final states kept in the cache, and "
            "their backward's working sets); the gated norm and projections run as transformers writes them"
        )
    mamba_ssm = bool(mamba_hf) or (own_class and "mamba" in spec.layer_types)
    if mamba_ssm and not mamba_hf:
        subs.append(
            "Mamba-2 layers run mamba_ssm's fused conv1d + SSD scan + gated RMSNorm + out_proj kernel as a stand-in "
            "with its shapes (stack/mamba_ssd.py: what it keeps for backward, its chunk states and workspaces while "
            "they live, as mamba_ssm 2.3.2 allocates them; split reductions sized for an H100's 132 SMs)"
            + (
                "; under context parallelism the kernel runs without the norm and out_proj, and the gated RMSNorm "
                "as mamba_ssm's rmsnorm_fn stand-in"
                if d.cp > 1
                else ""
            )
        )
    if fla_gdn and spec.linear_mixer == "kda":
        subs.append(
            "KDA layers run fla's pieces as stand-ins with their shapes (stack/fla_kda.py: ShortConvolution, the KDA "
            "gate, the chunked KDA kernel with what it keeps for backward and its chunk states while they live, the "
            "gated RMSNorm), as AutoModel binds them where nemo-automodel[fla] is installed (it requires fla for KDA)"
        )
    elif fla_gdn:
        subs.append(
            "Gated DeltaNet layers run fla's chunked kernel as a stand-in with its shapes (stack/fla_gdn.py: what it "
            "keeps for backward and its chunk states while they live), as AutoModel binds it where nemo-automodel[fla] "
            "is installed; without fla, AutoModel falls back to transformers' torch loop, which keeps far more"
        )
    eager_attn = runs_eager_attention(
        w.attn_implementation,
        hf_class=not own_class,
        architecture=spec.architecture,
        cp=d.cp,
        packed=w.packed,
        backend_attn=w.attn_backend,
    )
    own_eager = eager_attn and own_class and spec.architecture in EAGER_UNLESS_TE
    if eager_attn:  # the class runs transformers' eager attention, whatever model.backend.attn says
        subs[:] = [x for x in subs if not x.startswith("model.backend.attn:")]
    subs.append(
        (
            f"attention runs as on the GPU: model.backend.attn {w.attn_backend} makes AutoModel's "
            f"{spec.architecture} run its own eager attention (every head's seq x seq scores, its fp32 softmax and "
            "their bf16 copy)"
            if own_eager
            else "attention runs as the recipe asks, transformers' eager attention (model.attn_implementation: "
            "eager): every head's seq x seq scores, its fp32 softmax and their bf16 copy, as on the GPU"
            if eager_attn
            else "SDPA attention is measured as the GPU's flash kernel holds it (output and log-sum-exp, no seq x seq "
            "scores)"
        )
        + "; the gradient-norm clip takes its per-tensor CPU path (its temporaries are larger than the fused CUDA "
        "kernel's)"
    )
    # Gemma-4's context-parallel ring recomputes a layer's attention over every ring chunk in its backward and merges
    # them under autograd: a transient of its own per layer kind (its global layers' far above its sliding ones'), so
    # which moment of backward peaks moves with the depth of a shallow build (AutoModel's 31B CP 8 recipe: at its
    # embedding's backward in a one-period build, at a global layer's ring backward in deeper ones), and no line through
    # two shallow builds gives the whole model's peak (+18% at 6 and 12 layers). Built whole.
    gemma4_ring = media is not None and is_gemma4_tower(cfg) and d.cp > 1
    # MegatronFSDP gathers ahead by size, not by layer: its all-gather pipeline prefetches units until half its
    # communication unit (at least 500M elements) is in flight (megatron_fsdp.py, suggested_AG_prefetch_size). Two
    # shallow builds both inside that window hold every layer gathered in backward, and a line through them counts
    # the whole model where the window caps it (Llama-3.2-1B's backward holds 10 of its 16 blocks). Built whole.
    megatron = d.strategy == "megatron_fsdp"
    whole = gemma4_ring or megatron
    if megatron and find_spec("megatron_fsdp") is None:
        blocking.append(
            "MegatronFSDP runs AutoModel's pin of the megatron-fsdp package, which is not installed here (AutoModel "
            "asserts 'MegatronFSDP is not installed' without it): pip install --no-deps megatron-fsdp==0.5.0: not "
            "measured"
        )
    if megatron and any(name in w.optimizer.lower() for name in ("muon", "dion")):
        blocking.append(
            f"optimizer {w.optimizer} under MegatronFSDP: AutoModel's dion-family optimizer configs set "
            "supports_megatron_fsdp_sharding false and its recipe then asserts 'Dion optimizer does not support "
            "fully_shard_optimizer' at setup: the run stops there (use fsdp2, or another optimizer): not measured"
        )
    unmodelled = [k for k in ("fsdp_double_buffer", "nccl_ub") if megatron and ctx.block.get(k) is True]
    if unmodelled:
        blocking.append(
            f"MegatronFSDP with {' and '.join(unmodelled)}: true allocates its fixed pool of parameter and gradient "
            "buffers on the current CUDA device through megatron-fsdp's global memory buffer, which the dry run does "
            "not stand in: not measured"
        )
    if megatron:
        subs.append(
            "MegatronFSDP (megatron-fsdp, AutoModel's pin 0.5.0) runs as written: its parameter, gradient and "
            "bucket buffers, its all-gather prefetch and its reduce-scatter queue. The model is built on fake tensors "
            "where AutoModel builds it with real weights before wrapping; its buffers are made on the rank's (CPU) "
            "device where it takes the current CUDA device; its side streams are placeholders and its coalesced "
            "collectives are issued one by one (a fake process group completes each at once; neither allocates)"
        )
    ffpa = gemma4_ring and w.gemma4_cp_kernels[0] == "ffpa"
    if ffpa:
        subs.append(
            "text_config.cp_full_attn_backend: ffpa runs Gemma-4's full-attention ring chunks through stand-ins for "
            "FFPA's CuTeDSL kernels with their outputs' shapes (stack/ffpa.py); AutoModel's ring around them runs as "
            "written. Its routing reads each shard's document map, answered as one document filling the sequence "
            "(the batch measured as its unpacked equivalent): every chunk takes FFPA's dense path, none its varlen "
            "path (the gather and scatter of a chunk holding several packed documents); the kernels' own workspaces "
            "are not measured"
        )
    if ranks is None:
        lay = d.layout
        ranks = [0]
        if d.pp > 1 and lay is not None and lay.device_mesh() is not None:
            firsts = lay.group("pp", 0)  # the first rank of every pipeline stage position
            shallow = layers == spec.num_layers and not full_depth and not whole
            built = built_kinds(spec, d) if shallow else spec
            ranks = [firsts[i] for i in peak_candidate_pp_ranks(built, d)]
            if len(ranks) < len(firsts):
                notes.append(
                    f"measured the pipeline ranks where the peak can fall ({', '.join(map(str, ranks))}): the "
                    f"other {len(firsts) - len(ranks)} stage positions each run no more forwards before their first "
                    "backward than a lower measured rank past the first, with the same receive buffers and stages "
                    "holding at least their layers of every kind"
                    + (
                        f" (the first {spec.first_dense_layers} dense layers counted as MoE, as every rank past the "
                        "first is built: dry_run/depth.py built_kinds)"
                        if built is not spec
                        else ""
                    )
                    + ", and hold neither end (estimate/memory.py peak_candidate_pp_ranks); `--rank R` (MCP `ranks`) "
                    "measures any of them"
                )
        if blockdiag_cp and lay is not None and lay.device_mesh() is not None:
            # block-diagonal CP's ranks are not alike: each copies the keys and values its documents reach, the last
            # one's reaching back over the whole pack (rank 0 holds the pack's first images instead)
            last = lay.group("cp", 0)[-1]
            ranks.append(last)
            notes.append(
                f"measured rank 0 and the last rank of its CP group ({last}): under block-diagonal CP each rank's "
                "attention copies the keys and values its documents reach, the last rank's over the whole pack"
            )
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < d.world_size]
    if bad or not ranks:
        raise DryRunUsageError(f"ranks must be in [0, {d.world_size}), got {ranks!r}")
    ranks = sorted(set(ranks))
    not_measured += blocking
    unmeasured = {r: blocking[0] for r in ranks} if blocking else {}
    full = Build(hf_config=cfg, distributed=jsonable(sanitized_block(ctx.block, subs, DryRunUsageError)))
    recipe = StackRecipe(
        loss=loss,
        optimizer=optimizer,
        peft=w.peft,
        backend=backend or None,
        torch_dtype=w.torch_dtype,
        force_hf=w.force_hf,
        mtp_use_repeated_layer=spec.mtp_iterations > 0,
        load_base_model=w.load_base_model,
        liger=w.use_liger_kernel,
        attn_implementation="eager" if eager_attn else None,
        local_dispatch=spec.is_moe and w.backend.get("dispatcher") in LOCAL_DISPATCHERS,
        fla_gdn=fla_gdn,
        mamba_ssm=mamba_ssm,
        mamba_hf=mamba_hf,
        ffpa=ffpa,
        dsv4_kernels=DSA_KERNEL_STAND_INS.get((spec.architecture, (backend or {}).get("attn"))) == DSV4_STAND_INS,
        te_module=te_module,
        thd_batches=w.thd_batches,
        blockdiag_cp=blockdiag_cp,
        clip_grad_norm=w.clip_grad_norm,
        vlm=media is not None,
        freeze_config=w.freeze_config if ctx.kind.recipe in FREEZE_CONFIG_RECIPES or media is not None else None,
    )
    depths: dict[int, Depth] = {}
    specs: list[DryRunSpec] = []
    for r in ranks:
        if r in unmeasured:
            continue
        depth = None
        if layers == spec.num_layers and not full_depth and not whole:
            lay = d.layout
            pp_rank = lay.group("pp", r).index(r) if d.pp > 1 and lay is not None else 0
            depth = plan_depth(spec, d, pp_rank)
        builds = None
        if depth is not None:
            depths[r] = depth
            b1, b2 = (
                Build(
                    hf_config=truncated_config(cfg, n, moe_prefix_as_moe=d.pp > 1, keep_last=depth.suffix),
                    distributed=_with_layers_per_stage(full.distributed, lps),
                )
                for n, lps in zip(depth.layers, depth.layers_per_stage or (None, None))
            )
            builds = (b1, b2)
        specs.append(
            DryRunSpec(
                rank=r,
                world_size=d.world_size,
                build=full,
                recipe=recipe,
                micro_batch_size=mbs,
                local_batch_size=measured * mbs if d.pp > 1 else mbs,
                microbatches=measured,
                seq_len=seq,
                schedule_steps=run_steps,
                builds=builds,
                depth=depth,
                media=media,
                megatron_fsdp=megatron,
            )
        )
    if layers == spec.num_layers and not full_depth and specs:
        if depths:
            notes.append(
                "measured at depth by extrapolation: each rank built twice, shallow (its builds are listed per "
                "rank); every phase's bytes per category read off the line through the two, at the rank's full "
                "depth (memory grows linearly with the layers and stages a rank holds); `--full-depth` builds "
                "every layer"
            )
            for note in dict.fromkeys(n for dp in depths.values() for n in dp.notes):
                notes.append(note)
        elif gemma4_ring:
            notes.append(
                "built at full depth: Gemma-4's context-parallel ring holds a per-layer-kind transient in backward (a "
                "global layer's ring recompute over every chunk) that moves the peak's moment between shallow builds, "
                "so none is extrapolated"
            )
        elif megatron:
            notes.append(
                "built at full depth: MegatronFSDP's all-gather pipeline prefetches by size (at least 500M elements "
                "in flight), not by layer, so a shallow build holds every layer gathered where the whole model holds "
                "the window's: no line through two shallow builds stands for it"
            )
        elif spec.num_layers > 4:
            notes.append(
                "built at full depth: the model's layer kinds have no short repeating period (or its stages are "
                "already shallow), so no shallow builds stand for it"
            )
    return Plan(
        report=result.report,
        dims=d,
        model=spec,
        model_source=source,
        specs=specs,
        seq_len=seq,
        micro_batch_size=mbs,
        local_batch_size=lbs,
        microbatches=microbatches,
        measured_microbatches=measured,
        num_layers=layers,
        assumed=assumed,
        substitutions=subs,
        not_measured=not_measured,
        notes=notes,
        unmeasured_ranks=unmeasured,
    )


# AutoModel's classes whose linear-attention layers run under CP: the Gated DeltaNet ones through
# cp_linear_attn.CPAwareGatedDeltaNet (Qwen3-Next's declares no CP support), Kimi-Linear's KDA through fla's CP
# context (kimi_linear/cp.py, the model owning its CP)
CP_LINEAR_ATTENTION_MODULES = tuple(
    f"nemo_automodel.components.models.{m}." for m in ("qwen3_5", "qwen3_5_moe", "qwen3_8_flash_next", "kimi_linear")
)


def _media_unsupported(recipe: str, cfg: dict[str, Any], d: ParallelDims, w: Workload) -> str | None:
    """Why the dry run cannot run this media recipe's step (None: it can). It feeds images the way the Qwen-VL
    processors make them (flattened patches and a grid per image), through the VLM finetune recipe's step."""
    qwen = is_qwen_tower(cfg.get("vision_config")) and isinstance(cfg.get("image_token_id"), int)
    gemma3 = is_gemma3_tower(cfg)  # (its config class defaults the image, begin- and end-of-image token ids)
    gemma4 = is_gemma4_tower(cfg)
    pixtral = is_pixtral_tower(cfg)
    kimi = is_kimi_vl_tower(cfg)
    muse = is_muse_glimmer_tower(cfg)
    if recipe != "FinetuneRecipeForVLM" or not (qwen or gemma3 or gemma4 or pixtral or kimi or muse):
        return (
            f"{recipe}: the dry run feeds images only as the Qwen-VL, Gemma-3, Gemma-4, Pixtral, Kimi-VL and "
            "Muse-Glimmer processors make them (Qwen2.5-VL, Qwen3-VL, Qwen3.5 and their MoE models, Gemma-3, Gemma-4, "
            "Mistral3, Kimi-VL, Muse-Glimmer, through the VLM finetune recipe's step); this model's "
            "images, video or audio would go uncounted: not measured (the estimate counts the towers' weights, not "
            "their activations)"
        )
    if pixtral and d.cp > 1:
        return (
            f"{recipe}: Mistral3 under context parallelism (its image placeholders split over the CP ranks) is not "
            "run by the dry run: not measured"
        )
    if gemma3 and d.cp > 1:
        return (
            f"{recipe}: Gemma-3 under context parallelism (its bidirectional image attention's token types split over "
            "the CP ranks) is not run by the dry run: not measured"
        )
    sliding_kernel = w.gemma4_cp_kernels[1]
    if gemma4 and d.cp > 1 and sliding_kernel == "fa":
        return (
            f"{recipe}: Gemma-4 under context parallelism with cp_sliding_attn_backend: fa (its sliding layers' ring "
            "through a local FlashAttention kernel that keeps its own forward state, no recompute) is not run by the "
            "dry run, which stands in only for the compiled flex attention ring: not measured"
        )
    return None


def _with_text_config(cfg: dict[str, Any], w: Workload) -> dict[str, Any]:
    """The config with what the recipe's ``model:`` section sets on it, as AutoModel's build hands it to the config
    (its Gemma-4 class merges ``text_config`` into the language model's): ``output_hidden_states`` at the top and in
    ``text_config`` (``Workload.output_hidden_states``; a forward that takes it as its own argument and does not pass
    it on, Gemma-4's context-parallel path, returns hidden states for a linear cross entropy only by the config's
    flag), and Gemma-4's CP attention kernels (``text_config.cp_full_attn_backend`` / ``cp_sliding_attn_backend``,
    which its model reads when it attaches the ring)."""
    top, text = w.output_hidden_states
    out = dict(cfg)
    if top is not None:
        out["output_hidden_states"] = top
    text_fields: dict[str, Any] = {} if text is None else {"output_hidden_states": text}
    for kind, kernel in zip(("full", "sliding"), w.gemma4_cp_kernels):
        if kernel is not None:
            text_fields[f"cp_{kind}_attn_backend"] = kernel
    if text_fields and isinstance(out.get("text_config"), dict):
        out["text_config"] = {**out["text_config"], **text_fields}
    return out


def _with_layers_per_stage(block: dict[str, Any], lps: int | None) -> dict[str, Any]:
    """The distributed: block with ``pipeline.layers_per_stage`` set (a shallow build keeps the stage count)."""
    if lps is None:
        return block
    pipeline = {k: v for k, v in (block.get("pipeline") or {}).items() if k != "round_virtual_stages_to_pp_multiple"}
    return {**block, "pipeline": {**pipeline, "layers_per_stage": lps}}


__all__ = ["Plan", "plan_dry_run", "DryRunUsageError", "DEFAULT_SEQ_LEN"]
