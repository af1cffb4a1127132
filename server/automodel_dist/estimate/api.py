"""estimate_memory: per-GPU memory, communication, step time and MFU of one given layout."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import Unpack

from ..catalog.gpus import GPU, lookup_gpu
from ..catalog.models import ModelConfigError, ModelSpec
from ..catalog.sources import ModelSource, resolve
from ..config.values import clip, is_positive_int
from ..dims import ParallelDims
from ..report import ConfigError
from ..request import ConfigInput, Request, RequestFields
from ..rules.fallbacks import masked_ce_instead
from ..workload import unsized_entry
from .comm import COLLECTIVE_EFFICIENCY, MATMUL_EFFICIENCY, OVERLAP, Cluster, CommEstimate, estimate_comm
from .memory import CUDA_CONTEXT_GIB, FRAGMENTATION, Training, memory_per_rank
from .report import Estimate, MemoryBreakdown
from .training import PRECISIONS, training_for

if TYPE_CHECKING:
    from ..rules import Context

ASSUMPTIONS = [
    f"collectives reach {COLLECTIVE_EFFICIENCY:.0%} of link bandwidth; matmuls {MATMUL_EFFICIENCY:.0%} of bf16 peak",
    f"FSDP/DDP traffic overlaps up to {OVERLAP:.0%} of compute; TP and EP traffic is exposed; CP half hidden",
    f"overhead = {CUDA_CONTEXT_GIB:.0f} GiB CUDA context/NCCL + {FRAGMENTATION:.0%} allocator fragmentation",
    "activations: what AutoModel's own classes save (read from its code run on fake tensors), flash attention (eager "
    "where the recipe asks for it and AutoModel runs it), no dropout",
]


# The estimate's error on a rank's peak memory, as the project holds it: the corpus sweep
# (tests/oracle/test_corpus_sweep.py) asserts every sampled CI recipe's estimate within this fraction of AutoModel's own step
# measured by the dry run, and the calibration tests hold it against AutoModel's published runs.
MEMORY_ERROR = 0.15

Verdict = Literal["fits", "tight", "does not fit"]


MEGATRON_LINEAR_CE = (
    "MegatronFSDP with a linear cross entropy: megatron-fsdp 0.5.0's root backward hook sits on lm_head's output, "
    "which this loss never uses, so its root post-backward and finish_grad_sync never run (validate: "
    "megatron-fsdp-linear-ce); with sharded parameters (zero_dp_strategy 3) counted: every block's gathered bucket, "
    "the root's and the tied head's gradient held from one step to the next (within 5% of the dry run on "
    "Llama-3.2-1B); not counted: that the optimizer then gets no gradients"
)


def verdict_for(total_gib: float, budget_gib: float, error: float = MEMORY_ERROR) -> Verdict:
    """fits: even ``error`` more stays within the budget; does not fit: even ``error`` less exceeds it; tight: the
    budget lies inside the estimate's error band (the dry run decides)."""
    if total_gib * (1 + error) <= budget_gib:
        return "fits"
    if total_gib * (1 - error) > budget_gib:
        return "does not fit"
    return "tight"


FITS: dict[Verdict, bool | None] = {"fits": True, "tight": None, "does not fit": False}


def make_cluster(
    gpu: str | GPU | None,
    gpus_per_node: int | None,
    *,
    memory_gib: float | None = None,
    intra_gbps: float | None = None,
    inter_gbps: float | None = None,
) -> Cluster:
    """The GPU (a catalog name) with ``memory_gib`` and the per-GPU bandwidths overridden where given; raises
    ``ValueError`` for an unknown GPU or a value that is not a positive, finite number."""
    for name, value in (("memory_gib", memory_gib), ("intra_gbps", intra_gbps), ("inter_gbps", inter_gbps)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
        ):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    g = gpu if isinstance(gpu, GPU) else lookup_gpu(gpu or "H100-80GB")
    if memory_gib is not None:
        g = dataclasses.replace(g, memory_gib=float(memory_gib))
    return Cluster(
        gpu=g,
        gpus_per_node=gpus_per_node or g.gpus_per_node,
        intra_gbps=intra_gbps or g.intra_gbps,
        inter_gbps=inter_gbps or g.inter_gbps,
    )


def cluster_of(request: Request, gpus_per_node: int | None = None) -> Cluster:
    """The request's GPU and links (:func:`make_cluster`) on nodes of ``gpus_per_node`` (else the request's)."""
    c = request.cluster
    return make_cluster(
        c.gpu,
        gpus_per_node or c.gpus_per_node,
        memory_gib=c.memory_gib,
        intra_gbps=c.intra_gbps,
        inter_gbps=c.inter_gbps,
    )


def check_positive_ints(values: dict[str, Any], *, optional: bool = False) -> None:
    """``ValueError`` naming the first value that is not a positive integer (``optional``: None passes)."""
    for name, value in values.items():
        if not (optional and value is None) and not is_positive_int(value):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_headroom(headroom: float) -> None:
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom!r}")


def recipe_training(ctx: Context | None) -> dict[str, tuple[int, str]]:
    """What a recipe says about the training run: ``seq_len``, ``global_batch_size``, ``local_batch_size`` and
    ``pp_microbatch_size`` (each with the key it came from) where the recipe states a positive integer."""
    out: dict[str, tuple[int, str]] = {}
    if ctx is None or not ctx.recipe:
        return out
    w = ctx.workload
    for name in ("seq_len", "global_batch_size", "local_batch_size"):
        if getattr(w, name) is not None:
            out[name] = getattr(w, name)
    pipe = ctx.block.get("pipeline") if isinstance(ctx.block, dict) else None
    if isinstance(pipe, dict) and is_positive_int(v := pipe.get("pp_microbatch_size")):
        out["pp_microbatch_size"] = (v, ".".join(ctx.base + ("pipeline", "pp_microbatch_size")))
    return out


def model_of(ctx: Context | None) -> ModelSpec:
    """The model a check resolved (the argument, else the recipe's); ``ValueError`` saying how to name one."""
    if ctx is not None and ctx.model is not None:
        return ctx.model
    why = (
        f": {ctx.model_skipped}"
        if ctx is not None and ctx.model_skipped and "no model given" not in ctx.model_skipped
        else ""
    )
    raise ValueError(
        f"no model to size{why}. Pass a model: a config.json path or model folder, a Hugging Face repo id whose "
        "config.json is in the local cache (or with --fetch-config / fetch_config), or a catalog name from "
        "`automodel-dist models` (list_models)"
    )


def teacher_of(ctx: Context | None, fetch: bool = False) -> tuple[ModelSpec | None, str | None, bool]:
    """The knowledge-distillation teacher resident on the student's GPUs, what is assumed about it, and whether
    its memory is known (False: the teacher is on these GPUs but not in the catalog)."""
    if ctx is None or not ctx.kind.teacher:
        return None, None, True
    w = ctx.workload
    if w.teacher is None:
        return None, "knowledge distillation with no teacher_model.pretrained_model_name_or_path: not counted", False
    if w.teacher_separate_mesh:
        return None, f"teacher {w.teacher}: separate_meshes puts it on ranks of its own, not on these GPUs", True
    if w.teacher_offloaded:
        return (
            None,
            f"teacher {w.teacher}: offload_teacher_model keeps it on the CPU and moves it to the GPU only for its "
            "forward, before the student's backward (its host memory and the transfer are not counted)",
            True,
        )
    try:
        spec = resolve(w.teacher, fetch=fetch).spec
    except ModelConfigError as exc:
        return None, f"teacher: {clip(str(exc), 300)}: its memory is NOT counted (no fit verdict)", False
    note = (
        f"teacher {spec.name}: sharded like the student (kd.py builds it with the same setup), weights in the "
        "compute dtype, no gradients or optimizer states, its fp32 probabilities kept for the KD loss; its forward "
        "(2 FLOPs per active parameter per token) and its layers' all-gathers count in the step time"
    )
    return spec, note, True


MAX_SEARCH_SEQ_LEN = 1 << 21
MAX_SEARCH_MICRO_BATCH = 4096


def resolved_model(request: Request) -> ModelSource | None:
    """The model the request names, resolved (None: the recipe's is used); ``ValueError`` when it cannot be."""
    model = request.lookup.model
    try:
        return resolve(model, fetch=request.lookup.fetch_config) if model is not None else None
    except ModelConfigError as exc:
        raise ValueError(str(exc)) from exc


def seq_len_step(p: ParallelDims) -> int:
    """The seq_len granularity of the limits search: 128 tokens, and a multiple of what CP and SP split by."""
    return math.lcm(128, 2 * p.cp if p.cp > 1 else 1, p.tp if p.sequence_parallel else 1)


def fit_limits(spec: ModelSpec, p: ParallelDims, tr: Training, budget_gib: float) -> tuple[int | None, int | None]:
    """The longest seq_len (at ``tr``'s micro batch) and the largest micro batch (at its seq_len) whose peak stays
    within ``budget_gib``: memory grows with both, so each is a binary search over the estimate, started from
    ``tr``'s own sizes when they fit (with a fixed global batch a smaller micro batch means more accumulation steps,
    whose deferred gradients can cost more than the batch saves)."""
    step = seq_len_step(p)

    def largest(fits: Any, top: int, known: int | None) -> int | None:
        lo = known if known is not None and 1 <= known <= top and fits(known) else None
        if lo is None:
            if not fits(1):
                return None
            lo = 1
        hi = top  # fits(lo) holds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    seq_steps = largest(
        lambda k: memory_per_rank(spec, p, replace(tr, seq_len=k * step)).total <= budget_gib,
        MAX_SEARCH_SEQ_LEN // step,
        tr.seq_len // step if tr.seq_len % step == 0 else None,
    )
    mbs = largest(
        lambda b: memory_per_rank(spec, p, replace(tr, micro_batch_size=b)).total <= budget_gib,
        MAX_SEARCH_MICRO_BATCH,
        tr.micro_batch_size,
    )
    return (seq_steps * step if seq_steps else None), mbs


USUAL_SEQ_LENS = (2048, 4096, 8192)


def micro_batches_at(spec: ModelSpec, p: ParallelDims, tr: Training, budget_gib: float) -> dict[int, int | None]:
    """The largest micro batch that fits at each of the usual sequence lengths (for a recipe that fixes none)."""
    out: dict[int, int | None] = {}
    for seq in USUAL_SEQ_LENS:
        if seq % seq_len_step(p):
            continue
        out[seq] = fit_limits(spec, p, replace(tr, seq_len=seq, micro_batch_size=1), budget_gib)[1]
    return out


def evaluate(
    spec: ModelSpec, p: ParallelDims, tr: Training, cluster: Cluster | None, *, headroom: float = 0.0
) -> tuple[MemoryBreakdown, CommEstimate | None, bool | None]:
    """The one place memory and communication are combined (estimate_memory and the search use it)."""
    mem = memory_per_rank(spec, p, tr)
    if cluster is None:
        return mem, None, None
    comm = estimate_comm(spec, p, tr, cluster)
    fits = mem.total <= cluster.gpu.memory_gib * (1 - headroom)
    return mem, comm, fits


def estimate_memory(
    config: ConfigInput | Request,
    *,
    precision: str | None = None,
    optimizer: str | None = None,
    headroom: float = 0.1,
    **fields: Unpack[RequestFields],
) -> Estimate:
    """Per-GPU memory (params, grads, optimizer, activations, buffers, overhead) and communication of the
    layout in ``config`` (or a whole :class:`Request`; the keywords are its fields), for ``model`` (default: the
    recipe's ``model.pretrained_model_name_or_path``), found as ``validate_config`` finds it (a config.json path, the
    local Hugging Face cache, the catalog, with ``fetch_config`` a download of config.json alone). ``overrides``: the
    launch command's ``"dotted.key=value"`` overrides, as in ``validate_config``. ``gpu`` (default H100-80GB),
    ``memory_gib``, ``intra_gbps`` and ``inter_gbps`` describe the hardware; ``seq_len`` and the batch sizes default
    to the recipe's.

    Raises :class:`ConfigError` when the config is invalid, ``ValueError`` for bad arguments.
    """
    from ..api import analyze

    request = Request.of(config, **fields)
    seq_len, micro_batch_size, global_batch_size = (
        request.workload.seq_len,
        request.workload.micro_batch_size,
        request.workload.global_batch_size,
    )
    if precision is not None and precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)} or auto, got {precision!r}")
    check_headroom(headroom)
    check_positive_ints(
        {"seq_len": seq_len, "micro_batch_size": micro_batch_size, "global_batch_size": global_batch_size},
        optional=True,
    )
    given = resolved_model(request)
    spec = given.spec if given is not None else None
    result = analyze(request.replace(model=spec))
    report, ctx = result.report, result.context
    if ctx is not None:
        spec = model_of(ctx)
    if not report.valid or ctx is None or report.world_size is None or spec is None:
        raise ConfigError(report)
    p = ctx.dims
    facts = recipe_training(ctx)
    lbs = facts["local_batch_size"][0] if "local_batch_size" in facts else None
    if global_batch_size is None and "global_batch_size" in facts:
        global_batch_size = facts["global_batch_size"][0]
    assumed = ["seq_len"] if seq_len is None and "seq_len" not in facts else []
    seq_len = seq_len or (facts["seq_len"][0] if "seq_len" in facts else 4096)
    n_mb = None
    if p.pp > 1:
        mbs = micro_batch_size or p.pp_microbatch_size or 1
        assumed += ["micro_batch_size"] if not (micro_batch_size or p.pp_microbatch_size) else []
        if lbs is not None:
            n_mb = max(1, lbs // mbs)
    else:
        mbs = micro_batch_size or lbs or 1
        assumed += ["micro_batch_size"] if not (micro_batch_size or lbs) else []
    teacher, teacher_note, teacher_known = teacher_of(ctx, request.lookup.fetch_config)
    workload = ctx.workload
    if (why := unsized_entry(workload)) is not None:
        raise ValueError(why)
    terms = training_for(
        spec,
        workload,
        precision=precision,
        optimizer=optimizer,
        seq_len=seq_len,
        micro_batch_size=mbs,
        global_batch_size=global_batch_size,
        pp_microbatches=n_mb,
        compile_layers=ctx.block.get("enable_compile") is True,
        teacher=teacher,
        masked_ce_instead=masked_ce_instead(
            workload.loss,
            ctx.kind.recipe,
            spec.architecture,
            workload.force_hf,
            p.pp,
            ctx.block.get("pipeline"),
        ),
        recipe=ctx.kind.recipe,
    )
    tr = terms.training
    if tr.vlm_step and workload.text_only_data is None:
        assumed.append("image")  # the data's images are not read: a VLM step's figures are at an assumed image
    cluster = cluster_of(request, ctx.gpus_per_node)
    mem, comm, _ = evaluate(spec, p, tr, cluster, headroom=headroom)
    assert comm is not None
    budget = cluster.gpu.memory_gib * (1 - headroom)
    verdict: Verdict | None = verdict_for(mem.total, budget)
    if not teacher_known or "seq_len" in assumed or "image" in assumed:
        verdict = None  # the length is the unknown (or the teacher, or the images): no verdict on an assumed value
    fits = FITS[verdict] if verdict is not None else None
    max_seq, max_mbs = fit_limits(spec, p, tr, budget)
    seq_known = "seq_len" not in assumed
    shortest = seq_len_step(p) if max_seq is None else None
    return Estimate(
        model=spec.name,
        model_source=given.describe() if given is not None else report.model_source,
        world_size=report.world_size,
        layout=report.resolved,
        gpu=cluster.gpu.name,
        gpu_memory_gib=cluster.gpu.memory_gib,
        intra_gbps=cluster.intra_gbps,
        inter_gbps=cluster.inter_gbps,
        precision=terms.precision,
        seq_len=seq_len,
        micro_batch_size=mbs,
        global_batch_size=global_batch_size,
        memory_gib=mem,
        workload=list(terms.read),
        trainable_params=(tr.lora.total(spec) if tr.lora else float(spec.param_count())),
        fits=fits,
        verdict=verdict,
        memory_error=MEMORY_ERROR,
        headroom=headroom,
        comm_bytes_per_step=comm.bytes_per_step,
        comm_time_s=comm.time_s,
        crosses_nodes=comm.crosses_nodes,
        step_time_s=comm.step_time_s,
        mfu=comm.mfu,
        tokens_per_step=comm.tokens_per_step,
        grad_accumulation_steps=comm.grad_accumulation_steps,
        bubble_fraction=comm.bubble_fraction,
        max_seq_len=max_seq,
        max_micro_batch_size=max_mbs,
        seq_len_known=seq_known,
        micro_batch_at_lengths={} if seq_known else micro_batches_at(spec, p, tr, budget),
        assumed=assumed,
        shortest_seq_len=shortest,
        shortest=memory_per_rank(spec, p, replace(tr, seq_len=shortest)) if shortest is not None else None,
        findings=[f for f in report.findings if f.severity != "info"],
        assumptions=[
            *ASSUMPTIONS,
            *([teacher_note] if teacher_note else []),
            *([MEGATRON_LINEAR_CE] if p.megatron_wraps and tr.megatron_root_unfired else []),
        ],
    )


__all__ = [
    "estimate_memory",
    "Estimate",
    "PRECISIONS",
    "Training",
    "MemoryBreakdown",
    "evaluate",
    "make_cluster",
    "recipe_training",
    "model_of",
    "fit_limits",
]
