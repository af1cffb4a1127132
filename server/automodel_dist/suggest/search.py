"""suggest_strategy: search every layout of a cluster, keep those that fit, rank by step time.

Candidates enumerate the factorisations of the world into (pp, dp_replicate, dp_shard, cp, tp) and
ep, for each strategy and activation-checkpointing choice. Sizes come from the engine's own hints
(``valid_tp_sizes``/``valid_ep_sizes`` from the model rules); memory and time come from
``estimate.evaluate``; the winners are confirmed by ``validate_config`` with the model and cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import yaml
from typing_extensions import Unpack

from ..api import validate_config
from ..catalog.implementations import (
    PP_OWN_STAGE_FORWARD,
    PP_PATCH_KEYS,
    builds_own_class,
    cp_attn_refused,
    implementation,
)
from ..catalog.kernels import ignores_sequence_parallel
from ..catalog.models import ModelSpec
from ..catalog.sources import resolve
from ..config.load import flow
from ..config.values import STRATEGIES, STRATEGY_ALIASES, applied_ac
from ..dims import FSDP2_DEFAULT_MP, ParallelDims
from ..estimate.api import (
    Cluster,
    Training,
    check_headroom,
    check_positive_ints,
    cluster_of,
    evaluate,
    model_of,
    recipe_training,
    teacher_of,
    verdict_for,
)
from ..estimate.comm import estimate_comm
from ..estimate.memory import GIB, overhead_bytes
from ..estimate.report import MemoryBreakdown
from ..estimate.training import PRECISIONS, training_for
from ..layout import StageError, ep_shard_size, virtual_stages
from ..request import ConfigInput, ModelInput, Request, RequestFields
from ..rules.fallbacks import masked_ce_instead
from ..rules.helpers import divisors
from ..rules.model import cp_possible, expert_shard_ok, pp_possible, valid_ep_sizes, valid_tp_sizes
from ..rules.parallelize import moe_tp_unplanned
from ..workload import Workload
from .report import Candidate, CurrentLayout, Rejected, SuggestReport

SCHEDULES = ("1F1B", "Interleaved1F1B")


def _microbatches(p: ParallelDims, gbs: int, mbs: int, given_lbs: int | None = None) -> int | None:
    """Pipeline microbatches per local batch of a layout the search built (None without PP)."""
    if p.pp <= 1 or not p.dp:
        return None
    return _batches(p, gbs, mbs, given_lbs)[0]["local_batch_size"] // mbs


def _options(
    m: ModelSpec, world: int, gpn: int, seq: int, gbs: int, mbs: int, allow_ac: bool, strategies: tuple[str, ...]
) -> Iterator[ParallelDims]:
    tps = [t for t in valid_tp_sizes(m) if world % t == 0 and t <= max(gpn, 1) * 2]
    eps = valid_ep_sizes(m)
    acs: list[bool | str] = [False, "selective", True] if allow_ac else [False]
    cps = [c for c in (1, 2, 4, 8, 16, 32) if (seq % (2 * c) == 0 or c == 1) and cp_possible(m, c)]
    for tp in tps:
        for cp in cps:
            if world % (tp * cp):
                continue
            for pp in divisors(world // (tp * cp)):
                if pp > m.num_layers or (pp > 1 and not pp_possible(m)):
                    continue
                dp = world // (tp * cp * pp)
                for strategy in strategies:
                    if strategy == "ddp" and (tp > 1 or cp > 1 or pp > 1):
                        continue
                    if strategy == "megatron_fsdp" and pp > 1:
                        continue
                    if pp > 1:
                        lbs = gbs // dp
                        if gbs % dp or lbs % mbs or lbs // mbs < pp:
                            continue
                        n_mb = lbs // mbs
                        schedules = [s for s in SCHEDULES if _stages_ok(m, pp, s, n_mb)]
                    else:
                        if gbs % (mbs * dp):
                            continue
                        n_mb, schedules = None, [None]
                    reps = [1]
                    if strategy == "fsdp2":  # HSDP: shard groups of at least a node, replicated across them
                        reps += [r for r in divisors(dp) if 1 < r < dp and (dp // r) * cp * tp >= gpn]
                    for rep in reps:
                        for ep in (
                            [1]
                            if strategy != "fsdp2"
                            else [
                                e
                                for e in eps
                                if (dp * cp * tp) % e == 0
                                and not moe_tp_unplanned(tp, e)
                                and (e == 1 or expert_shard_ok(m, ep_shard_size(dp=dp, cp=cp, tp=tp, ep=e)))
                            ]
                        ):
                            for sched in schedules:
                                for ac in acs:
                                    if ac == "selective" and strategy == "megatron_fsdp":
                                        continue  # AutoModel rejects it (ac-selective-strategy)
                                    if ac and applied_ac(strategy, ac, world) is False:  # megatron_fsdp skips AC
                                        continue
                                    yield ParallelDims(
                                        strategy=strategy,
                                        world_size=world,
                                        tp=tp,
                                        pp=pp,
                                        cp=cp,
                                        ep=ep,
                                        dp_replicate=rep,
                                        # (not where AutoModel's TP plan ignores it)
                                        sequence_parallel=tp > 1
                                        and strategy == "fsdp2"
                                        and not ignores_sequence_parallel(m.architecture, m.parallel_mamba),
                                        activation_checkpointing=ac,
                                        pp_schedule=sched,
                                        pp_microbatch_size=mbs if pp > 1 else None,
                                        mp_policy=FSDP2_DEFAULT_MP if strategy == "fsdp2" else None,
                                    )


def _may_fit_eagerly(mem: MemoryBreakdown, budget: float) -> bool:
    """False when the layout cannot fit even without deferred gradient sync: that keeps the parameters, the
    optimizer states and (at the same peak moment) the activations, plus the overhead on them."""
    kept = (mem.params + mem.optimizer + mem.activations) * GIB
    return (kept + overhead_bytes(kept)) / GIB <= budget


def _stages_ok(m: ModelSpec, pp: int, schedule: str, n_mb: int) -> bool:
    try:
        virtual_stages(m.num_layers, pp=pp, single_stage=schedule == "1F1B")
    except StageError:
        return False
    if schedule == "Interleaved1F1B":
        rounds = max(1, n_mb // pp)
        return n_mb % rounds == 0
    return True


def _rationale(
    p: ParallelDims,
    mem: MemoryBreakdown,
    comm: Any,
    cluster: Cluster,
    m: ModelSpec,
    tr: Training,
    no_ac_gib: float | None,
    freed_gib: float | None = None,
) -> list[str]:
    out = [
        f"peak {mem.total:.1f} GiB per GPU of {cluster.gpu.memory_gib:.0f} GiB (model states "
        f"{mem.model_states:.1f}, activations {mem.activations:.1f}, buffers {mem.buffers:.1f}, overhead "
        f"{mem.overhead:.1f}); est. step {comm.step_time_s:.2f} s, MFU {comm.mfu:.0%}"
    ]
    shard = p.dp_shard * p.cp
    if p.strategy == "fsdp2":
        held = (
            f"FSDP2 shards parameters, gradients and optimizer states over {shard} ranks"
            if shard > 1
            else "FSDP2 with a shard group of 1: each GPU holds whole parameters, gradients and optimizer states "
            "of its tp/pp slice"
        )
        out.append(
            held
            + (
                f", replicated {p.dp_replicate}x (HSDP: the all-reduce across replicas is the only "
                "cross-group gradient traffic)"
                if p.dp_replicate > 1
                else ""
            )
        )
    elif p.strategy == "ddp":
        out.append("DDP: the model fits replicated; one gradient all-reduce per step, the least communication")
    else:
        sharded = p.dp * p.cp
        out.append(
            f"MegatronFSDP (ZeRO-3) shards everything over {sharded} ranks"
            if sharded > 1
            else "MegatronFSDP with a data-parallel group of 1: nothing is sharded beyond tp/pp"
        )
    if p.tp > 1:
        where = (
            "cross nodes (inter-node bandwidth!)"
            if comm.crosses_nodes.get("tp")
            else (f"stay inside a node ({cluster.intra_gbps:.0f} GB/s)")
        )
        splits = (
            "every layer's matmuls and activations"
            if p.sequence_parallel
            else "every layer's matmuls (no sequence parallelism: MegatronFSDP's TP plan runs without it)"
        )
        out.append(
            f"tp={p.tp}{' with sequence parallelism' if p.sequence_parallel else ''} splits {splits}; "
            f"its per-layer collectives {where}"
        )
    if p.cp > 1:
        out.append(
            f"cp={p.cp}: seq_len {tr.seq_len} is split into {p.cp} chunks, cutting activations to "
            f"1/{p.cp} for long sequences"
        )
    if p.pp > 1:
        out.append(
            f"pp={p.pp} ({p.pp_schedule}, {_microbatches(p, tr.global_batch_size or 0, tr.micro_batch_size)} microbatches, bubble {comm.bubble_fraction:.0%}): "
            "layers split across stages so each GPU holds a fraction of the model"
        )
    if p.ep > 1:
        out.append(
            f"ep={p.ep}: {m.num_experts // p.ep} of {m.num_experts} experts per rank, "
            + (
                f"experts FSDP-sharded over ep_shard={p.ep_shard}"
                if p.ep_shard > 1
                else "expert weights not sharded further (ep_shard=1)"
            )
        )
    if freed_gib is not None:
        out.append(
            f"defer_fsdp_grad_sync: false: gradients are reduce-scattered after every backward pass, "
            f"not held unsharded in fp32 until the step's last ({freed_gib:.1f} GiB with AutoModel's default); "
            "needed to fit, at the cost of one reduce-scatter per microbatch"
        )
    elif mem.deferred_grads:
        out.append(
            f"holds {mem.deferred_grads:.1f} GiB of unsharded fp32 gradients across the step's backward "
            "passes (defer_fsdp_grad_sync, AutoModel's default); it fits with them"
        )
    if p.activation_checkpointing and no_ac_gib is not None:
        out.append(
            f"activation checkpointing ({'full' if p.activation_checkpointing is True else 'selective'}): "
            f"needed to fit (without it: {no_ac_gib:.1f} GiB)"
        )
    return out


def suggest_strategy(
    model: ModelInput | Request = None,
    *,
    config: ConfigInput | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    allow_activation_checkpointing: bool = True,
    headroom: float = 0.1,
    top_k: int = 5,
    strategies: str | Iterable[str] | None = None,
    **fields: Unpack[RequestFields],
) -> SuggestReport:
    """Ranked layouts for ``model`` on ``nodes`` (1) x ``gpus_per_node`` GPUs (a :class:`Request`'s fields, or a
    whole request as ``model``) that fit memory with ``headroom``; ``strategies`` (names or AutoModel's aliases,
    default all three) limits the search. ``gpu`` (default H100-80GB), ``memory_gib`` and the link speeds describe
    the hardware.

    ``config`` (a recipe: YAML text, path or mapping) fills what is not passed, as validate reads it: the model
    (``model.pretrained_model_name_or_path``), nodes and GPUs per node (``ci:``), ``seq_len`` (``dataset``), the
    batch sizes (``step_scheduler``); the report says which, and how the recipe's own layout compares."""
    if isinstance(model, Request):
        request = model.replace(**fields)
        if config is not None:
            request = request.with_config(config)
    else:
        request = Request.of(config, model=model, **fields)
    if request.cluster.world_size is not None:
        raise ValueError("suggest searches nodes x gpus_per_node GPUs: give those instead of world_size")
    config = request.config
    nodes, gpus_per_node = request.cluster.nodes, request.cluster.gpus_per_node
    seq_len, micro_batch_size = request.workload.seq_len, request.workload.micro_batch_size
    global_batch_size = request.workload.global_batch_size
    strategies = search_strategies(strategies)
    if precision is not None and precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)} or auto, got {precision!r}")
    check_positive_ints(
        {
            "nodes": nodes,
            "seq_len": seq_len,
            "micro_batch_size": micro_batch_size,
            "global_batch_size": global_batch_size,
        },
        optional=True,
    )
    check_positive_ints({"top_k": top_k})
    check_headroom(headroom)
    from_recipe: dict[str, str] = {}
    teacher: ModelSpec | None = None
    workload = Workload()
    given_lbs: int | None = None
    recipe_kind: str | None = None
    loss_section: dict[str, Any] | None = None
    recipe_value: Any = None
    if config is not None:
        d = _recipe_defaults(request, from_recipe)
        spec, recipe_block, model_source = d.spec, d.block, d.model_source
        nodes, gpus_per_node = d.request.cluster.nodes, d.request.cluster.gpus_per_node
        w = d.request.workload
        seq_len, global_batch_size, micro_batch_size = w.seq_len, w.global_batch_size, w.micro_batch_size
        teacher, workload, given_lbs, recipe_kind = d.teacher, d.workload, d.local_batch_size, d.recipe_kind
        loss_section, recipe_value = d.loss_section, d.recipe_value
    elif request.lookup.model is None:
        raise ValueError("give a model (a catalog name or config.json path) or a recipe (config) that names one")
    else:
        given = resolve(request.lookup.model, fetch=request.lookup.fetch_config)
        spec, model_source = given.spec, given.describe()
    assumed = [
        k
        for k, v in (
            ("nodes", nodes),
            ("gpus_per_node", gpus_per_node),
            ("seq_len", seq_len),
            ("global_batch_size", global_batch_size),
            ("micro_batch_size", micro_batch_size),
        )
        if v is None
    ]
    nodes, seq_len, micro_batch_size = nodes or 1, seq_len or 4096, micro_batch_size or 1
    cluster = cluster_of(request, gpus_per_node)
    gpn = cluster.gpus_per_node
    world = nodes * gpn
    if world > 1 << 20:
        raise ValueError(f"world size {world} is too large to search (limit {1 << 20})")
    gbs = global_batch_size or world * micro_batch_size

    def trains(pp: int) -> Any:
        # the loss AutoModel trains for a candidate with this pp (its fallback to MaskedCrossEntropy; a candidate's
        # pipeline: block is AutoModel's default, so the model's own class decides)
        why = masked_ce_instead(workload.loss, recipe_kind, spec.architecture, workload.force_hf, pp, None)
        return training_for(
            spec,
            workload,
            precision=precision,
            optimizer=optimizer,
            seq_len=seq_len,
            micro_batch_size=micro_batch_size,
            global_batch_size=gbs,
            pp_microbatches=None,
            teacher=teacher,
            masked_ce_instead=why,
            recipe=recipe_kind,
        )

    terms = trains(1)
    base_tr = terms.training
    piped_tr = trains(2).training  # (the fallback depends on pp only through pp > 1)
    budget = cluster.gpu.memory_gib * (1 - headroom)
    scored: list[tuple[float, ParallelDims, MemoryBreakdown, Any]] = []
    oom: list[tuple[float, ParallelDims, MemoryBreakdown]] = []
    no_ac: dict[tuple, float] = {}  # layout (without its AC mode) -> peak GiB without checkpointing
    held: dict[ParallelDims, float] = {}  # layouts that fit only with defer_fsdp_grad_sync: false -> GiB it frees
    fits_without_ac: set[tuple] = set()
    searched = 0
    trainings: dict[tuple[bool, int | None], Training] = {}  # one per pp > 1 and microbatch count (replace() is slow)
    for p in _options(spec, world, gpn, seq_len, gbs, micro_batch_size, allow_activation_checkpointing, strategies):
        base_key = (p.strategy, p.dp_replicate, p.tp, p.pp, p.cp, p.ep, p.pp_schedule)
        if p.activation_checkpointing and base_key in fits_without_ac:
            continue  # checkpointing only adds recompute once the layout already fits
        searched += 1
        n_mb = _microbatches(p, gbs, micro_batch_size, given_lbs)
        key = (p.pp > 1, n_mb)
        tr = trainings.get(key) or trainings.setdefault(
            key, replace(piped_tr if p.pp > 1 else base_tr, pp_microbatches=n_mb)
        )
        mem, _, _ = evaluate(spec, p, tr, None)
        fits = mem.total <= budget
        if not p.activation_checkpointing:
            no_ac[base_key] = mem.total
            if fits:
                fits_without_ac.add(base_key)
        sure = verdict_for(mem.total, budget) == "fits"
        if not sure and mem.deferred_grads and _may_fit_eagerly(mem, budget):
            # reduce-scatter after every backward instead of holding fp32 grads (when the held ones make the layout
            # not fit, or fit only within the estimate's error)
            eager = replace(p, defer_fsdp_grad_sync=False)
            eager_mem, _, _ = evaluate(spec, eager, tr, None)
            if eager_mem.total <= budget and (not fits or verdict_for(eager_mem.total, budget) == "fits"):
                p = eager
                held[p] = mem.deferred_grads
                mem, fits = eager_mem, True
        if fits:  # communication and time only for layouts that fit (and near misses, below)
            comm = estimate_comm(spec, p, tr, cluster)
            scored.append((comm.step_time_s, p, mem, comm))
        elif mem.total <= 2 * budget:
            oom.append((estimate_comm(spec, p, tr, cluster).step_time_s, p, mem))
        else:
            oom.append((float("inf"), p, mem))

    # Layouts that fit even with the estimate's memory error first, then the tight ones (the budget inside that
    # error: the dry run decides); within each, by predicted step time (to three digits: fewer parallel axes on a tie).
    def order(x: tuple[float, ParallelDims, MemoryBreakdown, Any]) -> tuple[bool, float, tuple[int, int], float]:
        return verdict_for(x[2].total, budget) != "fits", float(f"{x[0]:.3g}"), _complexity(x[1]), x[0]

    scored.sort(key=order)
    candidates: list[Candidate] = []
    rejected: list[Rejected] = []
    shapes: set[tuple] = set()
    for step, p, mem, comm in scored:
        if len(candidates) >= top_k:
            break
        shape = (p.strategy, p.tp, p.cp, p.pp, p.ep)
        if shape in shapes:
            continue  # one candidate per layout shape (its best HSDP / checkpointing / schedule variant)
        shapes.add(shape)
        block = p.to_block()
        if "pipeline" in block and spec.architecture in PP_OWN_STAGE_FORWARD and not workload.force_hf:
            block["pipeline"].update(dict.fromkeys(PP_PATCH_KEYS, False))  # (its own stage forward: pp-patched-forward)
        batches, changed = _batches(p, gbs, micro_batch_size, given_lbs)
        recipe: dict[str, Any] = {"distributed": block, "step_scheduler": batches}
        attn, needs = _model_needs(spec, p, workload) or (None, None)
        if attn is not None:
            recipe["model"] = {"backend": {"attn": attn}}
        # checked as the recipe runs it: with its own model.backend.attn where the layout needs no other (DeepSeek-V4's
        # tilelang under CP), which the snippet leaves out, the recipe having it already
        own = workload.backend.get("attn")
        checked = (
            recipe if attn is not None or not isinstance(own, str) else {**recipe, "model": {"backend": {"attn": own}}}
        )
        if loss_section is not None:  # (and with the recipe's loss, which rules read with its recipe: as written)
            checked = {**checked, "loss_fn": loss_section} | ({"recipe": recipe_value} if recipe_value else {})
        report = validate_config(checked, nodes=nodes, gpus_per_node=gpn, model=spec)
        if not report.valid:
            rejected.append(Rejected(distributed=block, reason="; ".join(f.message for f in report.errors)))
            continue
        tps = comm.tokens_per_step / step if step else 0.0
        candidates.append(
            Candidate(
                rank=len(candidates) + 1,
                verdict=verdict_for(mem.total, budget),
                yaml=yaml.safe_dump(recipe, sort_keys=False),
                distributed=block,
                memory_gib=mem,
                comm_bytes_per_step=comm.bytes_per_step,
                step_time_s=step,
                mfu=comm.mfu,
                tokens_per_second=tps,
                rationale=_rationale(
                    p,
                    mem,
                    comm,
                    cluster,
                    spec,
                    piped_tr if p.pp > 1 else base_tr,
                    no_ac.get((p.strategy, p.dp_replicate, p.tp, p.pp, p.cp, p.ep, p.pp_schedule)),
                    held.get(p),
                )
                + [x for x in (changed, needs) if x],
                findings=[f for f in report.findings if f.severity == "warning"],
            )
        )
    rejected += _alternatives(
        spec,
        world,
        gpn,
        cluster,
        budget,
        oom,
        candidates[0].step_time_s if candidates else None,
        micro_batch_size,
        strategies,
    )
    note = None
    if not candidates:
        best = min(oom, key=lambda x: x[2].total) if oom else None
        note = (
            f"no layout fits {budget:.0f} GiB per GPU; the smallest needs {best[2].total:.1f} GiB "
            f"({flow(best[1].to_block())}): add GPUs, use a larger GPU, shorten seq_len or lower the "
            "micro batch"
            if best
            else "no layout could be built for this model and cluster"
        )
    current = None
    if config is not None:
        sized = request.replace(
            model=spec,
            nodes=nodes,
            gpus_per_node=gpn,
            seq_len=seq_len,
            global_batch_size=global_batch_size,
            micro_batch_size=None,  # the recipe's own layout runs its own per-rank batch
        )
        current = _current(sized, recipe_block, precision, optimizer, headroom, candidates)
    return SuggestReport(
        model=spec.name,
        model_source=model_source,
        nodes=nodes,
        gpus_per_node=gpn,
        world_size=world,
        gpu=cluster.gpu.name,
        gpu_memory_gib=cluster.gpu.memory_gib,
        intra_gbps=cluster.intra_gbps,
        inter_gbps=cluster.inter_gbps,
        seq_len=seq_len,
        global_batch_size=gbs,
        micro_batch_size=micro_batch_size,
        precision=terms.precision,
        headroom=headroom,
        strategies=list(strategies),
        candidates=candidates,
        rejected=rejected[:8],
        searched=searched,
        fitting=len(scored),
        note=note,
        teacher=teacher.name if teacher is not None else None,
        workload=list(terms.read) if config is not None else [],
        from_recipe=from_recipe,
        current=current,
        assumed=assumed,
    )


@dataclass
class RecipeDefaults:
    """What a recipe says for the search (None where it says nothing)."""

    spec: ModelSpec
    model_source: str | None
    block: dict[str, Any]
    request: Request  # the request with the nodes, GPUs per node, seq_len and batch sizes the recipe gives
    local_batch_size: int | None
    teacher: ModelSpec | None
    workload: Workload
    recipe_kind: str | None = None  # the recipe's class (its loss fallbacks depend on it)
    # the recipe's loss_fn: section and its recipe: value as written, which each candidate is checked with (the
    # linear cross entropies' rules read both)
    loss_section: dict[str, Any] | None = None
    recipe_value: Any = None


def _recipe_defaults(request: Request, used: dict[str, str]) -> RecipeDefaults:
    """The model, the recipe's distributed: block, the arguments not passed and a knowledge-distillation teacher on
    the same GPUs, from the recipe (``used`` records each one's source key)."""
    from ..api import analyze

    model, fetch = request.lookup.model, request.lookup.fetch_config
    nodes, gpus_per_node = request.cluster.nodes, request.cluster.gpus_per_node
    seq_len, micro_batch_size = request.workload.seq_len, request.workload.micro_batch_size
    global_batch_size = request.workload.global_batch_size
    given = None if model is None else resolve(model, fetch=fetch)
    result = analyze(request.replace(model=None if given is None else given.spec))
    report, ctx = result.report, result.context
    if ctx is None:
        raise ValueError("the recipe cannot be read: " + "; ".join(f.message for f in report.errors[:3]))
    spec = model_of(ctx)
    if model is None:
        used["model"] = next(
            (f.path for f in report.findings if f.rule == "model-from-recipe"), "model.pretrained_model_name_or_path"
        )
    if (report.world_size_source or "").startswith("ci: block"):  # a given half completes the ci: block's other
        if nodes is None:
            nodes, used["nodes"] = ctx.nodes, "ci.nodes"
        if gpus_per_node is None:
            gpus_per_node, used["gpus_per_node"] = ctx.gpus_per_node, "ci.nproc_per_node"
    facts = recipe_training(ctx)
    if seq_len is None and "seq_len" in facts:
        seq_len, used["seq_len"] = facts["seq_len"]
    if global_batch_size is None and "global_batch_size" in facts:
        global_batch_size, used["global_batch_size"] = facts["global_batch_size"]
    if micro_batch_size is None:  # sequences per microbatch: the pipeline's, else the per-rank batch
        key = "pp_microbatch_size" if ctx.dims.pp > 1 else "local_batch_size"
        if key in facts:
            micro_batch_size, used["micro_batch_size"] = facts[key]
    teacher, why, known = teacher_of(ctx, fetch)
    if not known:
        raise ValueError(f"the recipe's knowledge-distillation teacher cannot be sized on the student's GPUs: {why}")
    if teacher is not None:
        used["teacher"] = "teacher_model.pretrained_model_name_or_path"
    lbs = facts["local_batch_size"][0] if "local_batch_size" in facts else None
    return RecipeDefaults(
        spec,
        given.describe() if given is not None else report.model_source,
        ctx.block,
        request.replace(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            seq_len=seq_len,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
        ),
        lbs,
        teacher,
        ctx.workload,
        ctx.kind.recipe,
        loss if isinstance(loss := (ctx.recipe or {}).get("loss_fn"), dict) else None,
        (ctx.recipe or {}).get("recipe"),
    )


def _current(
    request: Request,
    block: dict[str, Any],
    precision: str,
    optimizer: str,
    headroom: float,
    candidates: list[Candidate],
) -> CurrentLayout:
    """The recipe's own layout on the same cluster and training sizes (``request``, with the model resolved and the
    sizes the search used), measured as the candidates are."""
    from ..estimate.api import estimate_memory
    from ..report import ConfigError

    try:
        est = estimate_memory(request, precision=precision, optimizer=optimizer, headroom=headroom)
    except ConfigError as exc:
        return CurrentLayout(distributed=block, valid=False, errors=[f.message for f in exc.report.errors])
    best = candidates[0].step_time_s if candidates else None
    return CurrentLayout(
        distributed=block,
        valid=True,
        memory_gib=est.memory_gib.total,
        fits=est.fits,
        step_time_s=est.step_time_s,
        best_speedup=round(est.step_time_s / best, 2) if best and est.step_time_s else None,
    )


def _model_needs(m: ModelSpec, p: ParallelDims, w: Workload) -> tuple[str, str] | None:
    """The ``model.backend.attn`` the recipe's model: section must say for this layout, and why, where AutoModel's
    class refuses the recipe's under CP (model-cp-backend's test: catalog/implementations.cp_attn_refused)."""
    if p.cp <= 1 or not builds_own_class(m.architecture, w.force_hf):
        return None
    attn = w.backend.get("attn")
    impl = implementation(m.architecture)
    accepted = cp_attn_refused(impl, m.mixes_layers, attn)
    if accepted is None and attn is None and impl is not None:
        # unset, BackendConfig picks te where Transformer Engine is installed, else sdpa: said outright unless the
        # class takes sdpa too
        backends = impl.cp_backends(m.mixes_layers)
        if backends is not None and "sdpa" not in backends:
            accepted = backends
    if accepted is None:
        return None
    pick = "te" if "te" in accepted else sorted(accepted)[0]
    return pick, (
        f"model.backend.attn: {pick} added: context parallelism on AutoModel's {m.architecture} runs only with "
        f"attention {', '.join(sorted(accepted))}"
        + (f" (the recipe has {attn})" if attn else " (set it explicitly; the default depends on the image)")
    )


def _complexity(p: ParallelDims) -> tuple[int, int]:
    """Tie-breaker: fewer parallel axes, no checkpointing, AutoModel's default strategy first."""
    axes = sum(x > 1 for x in (p.tp, p.cp, p.pp, p.ep, p.dp_replicate))
    return axes + (1 if p.activation_checkpointing else 0), ("fsdp2", "ddp", "megatron_fsdp").index(p.strategy)


def search_strategies(strategies: str | Iterable[str] | None) -> tuple[str, ...]:
    """The canonical strategies to search: all three for None, else the named ones (AutoModel's aliases such as
    ``mfsdp`` accepted, case-insensitive as AutoModel's own lookup), in the canonical order."""
    if strategies is None:
        return STRATEGIES
    names = [strategies] if isinstance(strategies, str) else list(strategies)
    unknown = [n for n in names if not isinstance(n, str) or n.lower() not in STRATEGY_ALIASES]
    if unknown or not names:
        raise ValueError(
            f"strategies must name at least one of {', '.join(STRATEGIES)} (or megatron-fsdp, mfsdp); "
            f"got {unknown or names!r}"
        )
    chosen = {STRATEGY_ALIASES[n.lower()] for n in names}
    return tuple(s for s in STRATEGIES if s in chosen)


def _batches(p: ParallelDims, gbs: int, mbs: int, given_lbs: int | None) -> tuple[dict[str, int], str | None]:
    """The step_scheduler batch sizes of a candidate, and what it changes in the ones given (None: nothing).
    Without PP each rank's local batch is the micro batch; with PP AutoModel needs at least pp_size microbatches
    per step (local_batch_size // pp_microbatch_size >= pp_size), so a given local batch stays where it has them
    and is otherwise raised to the fewest that divide the global batch."""
    if p.pp > 1:
        per_rank = gbs // p.dp
        if given_lbs is not None and given_lbs // mbs >= p.pp and per_rank % given_lbs == 0:
            return {"global_batch_size": gbs, "local_batch_size": given_lbs}, None
        local = next((k * mbs for k in range(p.pp, per_rank // mbs + 1) if per_rank % (k * mbs) == 0), per_rank)
        change = None
        if given_lbs is not None and given_lbs != local:
            change = (
                f"step_scheduler.local_batch_size {given_lbs} -> {local}: pipeline parallelism over {p.pp} stages "
                f"needs at least {p.pp} microbatches of {mbs} per step (AutoModel asserts it)"
            )
        return {"global_batch_size": gbs, "local_batch_size": local}, change
    change = None
    if given_lbs is not None and given_lbs != mbs:
        change = f"step_scheduler.local_batch_size {given_lbs} -> {mbs} (the micro batch asked for)"
    return {"global_batch_size": gbs, "local_batch_size": mbs}, change


def _alternatives(
    m: ModelSpec,
    world: int,
    gpn: int,
    cluster: Cluster,
    budget: float,
    oom: list[tuple[float, ParallelDims, MemoryBreakdown]],
    best: float | None,
    mbs: int,
    strategies: tuple[str, ...],
) -> list[Rejected]:
    """Why the popular simple layouts, and the layouts that would beat the pick (``best`` s/step), were not
    picked (each in a strategy the search covers)."""
    out: list[Rejected] = []
    cap = cluster.gpu.memory_gib
    seen = set()

    def add(block: dict[str, Any], reason: str) -> None:
        key = yaml.safe_dump(block, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(Rejected(distributed=block, reason=reason))

    def why(p: ParallelDims, mem: MemoryBreakdown, step: float) -> str:
        over = f"OOM, {mem.total:.1f} GiB > {budget:.1f} GiB usable of {cap:.0f} GiB"
        if p.strategy == "ddp" and not p.activation_checkpointing:
            return f"DDP replicates the whole model: {over}"
        if (
            p.strategy == "fsdp2"
            and p.tp == p.pp == p.cp == p.ep == p.dp_replicate == 1
            and not p.activation_checkpointing
        ):
            return f"plain FSDP2 over {world} GPUs: {over}"
        if step == float("inf"):
            return over
        if best is None:
            return f"{over} (est. {step:.2f} s/step if it fit)"
        return f"{over} (it would be faster: {step:.2f} vs {best:.2f} s/step)" if step < best else over

    for step, p, mem in sorted(oom, key=lambda x: x[0])[:3]:  # the fastest layouts that do not fit
        if step == float("inf") or (best is not None and step >= best):
            break
        add(p.to_block(), why(p, mem, step))
    for step, p, mem in oom:
        simple = p.tp == p.pp == p.cp == p.ep == p.dp_replicate == 1 and not p.activation_checkpointing
        if simple and p.strategy in ("fsdp2", "ddp"):
            add(p.to_block(), why(p, mem, step))
    sharded = next((s for s in strategies if s != "ddp"), None)  # the strategy the TP/EP examples below use
    if sharded is None:
        return out
    impl = implementation(m.architecture)
    if impl is not None and not impl.tp and world % min(gpn, 8) == 0 and min(gpn, 8) > 1:
        add(
            {"strategy": sharded, "tp_size": min(gpn, 8)},
            f"AutoModel 0.7.0 builds {m.name} with {impl.describe()}, which has no TP plan: validate_for_mesh "
            "raises for tp_size > 1",
        )
    if sharded == "fsdp2" and impl is not None and not impl.ep and m.is_moe and min(gpn, m.num_experts) > 1:
        add(
            {"strategy": "fsdp2", "ep_size": min(gpn, m.num_experts)},
            f"AutoModel 0.7.0 builds {m.name} with {impl.describe()}, which cannot take ep_size > 1 (no "
            "MoEFSDPSyncMixin): its experts are FSDP-sharded instead",
        )
    tps = valid_tp_sizes(m)
    if 2 * gpn in tps and world % (2 * gpn) == 0:
        add(
            {"strategy": sharded, "tp_size": 2 * gpn},
            f"tp={2 * gpn} crosses nodes: per-layer TP collectives would run at {cluster.inter_gbps:.0f} GB/s "
            f"instead of {cluster.intra_gbps:.0f} GB/s",
        )
    bad_tp = next((t for t in (3, 6, 12) if t not in tps and t <= gpn), None) if tps != [1] else None
    if bad_tp:
        add(
            {"strategy": sharded, "tp_size": bad_tp},
            f"tp={bad_tp} does not divide num_attention_heads={m.num_attention_heads} and num_key_value_heads="
            f"{m.num_key_value_heads}; valid tp: {tps}",
        )
    return out


__all__ = ["suggest_strategy", "SuggestReport", "Candidate", "Rejected"]
