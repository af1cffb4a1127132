"""Model-aware rules: what AutoModel only finds at model build time (the implementation's capabilities,
TP heads, EP experts, PP stages)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..catalog.implementations import Implementation, implementation
from ..catalog.models import ModelSpec
from ..config.values import V_SCHEDULES, is_positive_int, is_single_stage
from ..layout import StageError, ep_shard_size, virtual_stages
from ..report import Finding
from .base import Context, finding, note, rule
from .helpers import divisors, fmt_set
from .recipe import TRAIN_FT_RECIPES, recipe_class

F = "model"


def _lacks(m: ModelSpec, what: str) -> Implementation | None:
    """AutoModel's (default) implementation of ``m`` when it is known and cannot do ``what`` (tp, pp or ep)."""
    impl = implementation(m.architecture)
    return impl if impl is not None and not getattr(impl, what) else None


def _impl(ctx: Context) -> Implementation | None:
    """The class AutoModel builds for the context's model (None: unknown, or ``model.force_hf: true``)."""
    if ctx.model is None or ctx.recipe_get("model.force_hf") is True:
        return None
    return implementation(ctx.model.architecture)


def head_tp_sizes(m: ModelSpec, limit: int = 64) -> list[int]:
    """tp sizes that divide the attention heads (and kv heads; MLA shards the full head count)."""
    heads = m.num_attention_heads if m.kv_lora_rank else math.gcd(m.num_attention_heads, m.num_key_value_heads)
    return [d for d in divisors(heads) if d <= limit]


def valid_tp_sizes(m: ModelSpec, limit: int = 64) -> list[int]:
    """tp sizes AutoModel can use for ``m``: the head divisors, or [1] when its class has no TP plan."""
    return [1] if _lacks(m, "tp") else head_tp_sizes(m, limit)


def pp_possible(m: ModelSpec) -> bool:
    """False for tied input/output embeddings: AutoModel's pipeline builder rejects them (no override)."""
    return not m.tie_word_embeddings


def mamba_cp_ok(m: ModelSpec, cp: int) -> bool:
    """Whether AutoModel's MambaContextParallel accepts ``cp`` for ``m``'s Mamba layers: the heads divide by cp,
    and the B/C groups divide by cp (or cp by the groups, when there are fewer groups than CP ranks)."""
    heads, groups = m.mamba_num_heads, m.mamba_n_groups
    if not m.count("mamba") or cp <= 1:
        return True
    if heads % cp:
        return False
    return cp % groups == 0 if groups < cp else groups % cp == 0


def cp_possible(m: ModelSpec, cp: int) -> bool:
    """False when AutoModel's class for ``m`` splits Mamba heads over CP and ``cp`` does not fit them."""
    impl = implementation(m.architecture)
    return impl is None or not impl.mamba_cp or mamba_cp_ok(m, cp)


def sp_refused(ctx: Context) -> Implementation | None:
    """The class AutoModel builds when its FSDP2 parallelizer will raise for ``sequence_parallel: true``."""
    impl, lay = _impl(ctx), ctx.dims.layout
    if impl is None or impl.sequence_parallel or ctx.block.get("sequence_parallel") is not True:
        return None
    if ctx.dims.world_size == 1 or (lay is not None and lay.dp * lay.cp * lay.tp * lay.pp == 1):
        return None  # a one-rank mesh: AutoModel skips parallelization altogether (fsdp2_sharding_enabled)
    return impl if ctx.dims.strategy == "fsdp2" and ctx.dims.ep <= 1 else None


def own_fsdp2(ctx: Context) -> Implementation | None:
    """The class AutoModel builds when its own FSDP2 parallelizer (not AutoModel's shared one) shards it."""
    impl = _impl(ctx)
    return impl if impl is not None and impl.own_fsdp2 and ctx.dims.ep <= 1 else None


def valid_ep_sizes(m: ModelSpec) -> list[int]:
    """ep sizes that divide the routed experts ([1] for a dense model or one AutoModel cannot expert-shard)."""
    return divisors(m.num_experts) if m.is_moe and not _lacks(m, "ep") else [1]


note(
    "model-unknown",
    "Model not found",
    family=F,
    severity="warning",
    cause="The model is not in the built-in catalog and is not a readable config.json.",
    fix="Pass a catalog name (automodel-dist models) or the path of the model's config.json.",
)
note("model-from-recipe", "Model taken from the recipe", family=F, severity="info")


@rule(
    "tp-heads",
    family=F,
    severity="error",
    title="tp_size does not divide the attention heads",
    patterns=(
        r"num_key_value_heads \((\d+)\) must be divisible by TP size \((\d+)\)",
        r"num_attention_heads \((\d+)\) must be divisible by TP size \((\d+)\)",
        r"num_(?:key_value|attention)_heads in config does not match the TP size",
        r"Transformer Engine attention head counts must be divisible by tensor-parallel size",
    ),
    cause="Tensor parallelism shards attention by heads: num_attention_heads and num_key_value_heads must both "
    "be divisible by tp_size (AutoModel checks this only after launch, e.g. phi-4's 10 KV heads with tp=4).",
    fix="Use a tp_size that divides both head counts.",
)
def tp_heads(ctx: Context) -> Iterator[Finding]:
    tp, m = ctx.dims.tp, ctx.model
    impl = _impl(ctx)
    if m is None or tp <= 1 or (impl is not None and not impl.tp) or tp in head_tp_sizes(m, limit=1 << 30):
        return
    counts = [("num_attention_heads", m.num_attention_heads)]
    if not m.kv_lora_rank:  # MLA shards the full head count
        counts.append(("num_key_value_heads", m.num_key_value_heads))
    bad = [f"{name}={n}" for name, n in counts if n % tp]
    yield finding(
        ctx,
        "tp-heads",
        ("tp_size",),
        f"tp_size={tp} does not divide {' and '.join(bad)} of {m.name}: AutoModel's TP validation fails after launch",
        f"use tp_size in {fmt_set(head_tp_sizes(m))}",
    )


@rule(
    "ep-experts",
    family=F,
    severity="error",
    title="ep_size does not divide the routed experts",
    patterns=(
        r"n_routed_experts (\d+) must be divisible by expert_parallel_degree (\d+)",
        r"requires n_routed_experts \((\d+)\) to be divisible by ep_size \((\d+)\)",
    ),
    cause="Expert parallelism places num_experts / ep_size whole experts on each EP rank.",
    fix="Use an ep_size that divides the number of routed experts.",
)
def ep_experts(ctx: Context) -> Iterator[Finding]:
    ep, m = ctx.dims.ep, ctx.model
    impl = _impl(ctx)
    if m is None or ep <= 1 or not m.is_moe or (impl is not None and not impl.ep) or m.num_experts % ep == 0:
        return
    yield finding(
        ctx,
        "ep-experts",
        ("ep_size",),
        f"n_routed_experts {m.num_experts} of {m.name} must be divisible by ep_size={ep}",
        f"use ep_size in {fmt_set(d for d in divisors(m.num_experts) if d > 1)}",
    )


def expert_shard_ok(m: ModelSpec, ep_shard: int) -> bool:
    """Whether FSDP can shard ``m``'s grouped expert weights over ``ep_shard`` ranks on dim 1 (AutoModel's
    placement): [experts, hidden, inter] and [experts, inter, hidden] need hidden and inter divisible."""
    return ep_shard <= 1 or (m.hidden_size % ep_shard == 0 and m.moe_intermediate_size % ep_shard == 0)


@rule(
    "ep-shard-uneven",
    family=F,
    severity="error",
    title="ep_shard does not divide the expert weights' dim 1",
    patterns=(r"FSDP does not support uneven sharding on dim 1",),
    cause="With ep_size > 1 AutoModel FSDP-shards each MoE layer's grouped expert weights over the ep_shard ranks "
    "(dp*cp*tp / ep_size) on dim 1 (there may be more shards than local experts); torch's FSDP2 requires "
    "a non-zero shard dim to divide evenly, so hidden_size and moe_intermediate_size must be multiples of "
    "ep_shard, or fully_shard raises 'FSDP does not support uneven sharding on dim 1' when AutoModel "
    "parallelizes the model, after launch (e.g. 3 nodes x 8 GPUs with ep_size 8: ep_shard 3).",
    fix="Pick ep_size (or the number of ranks) so that ep_shard divides hidden_size and moe_intermediate_size.",
)
def ep_shard_uneven(ctx: Context) -> Iterator[Finding]:
    # ep_shard needs dp, cp and tp, not the whole layout: an HSDP error elsewhere does not hide this one
    m, impl, ep, shard = ctx.model, _impl(ctx), ctx.dims.ep, ctx.dims.ep_shard
    if m is None or impl is None or not impl.ep or not m.is_moe or ep <= 1 or ctx.dims.strategy != "fsdp2":
        return
    if ctx.dims.dp is None or shard is None or expert_shard_ok(m, shard) or m.num_experts % ep:
        return
    bad = " and ".join(
        f"{k}={v}"
        for k, v in (("hidden_size", m.hidden_size), ("moe_intermediate_size", m.moe_intermediate_size))
        if v % shard
    )
    dp, cp, tp = ctx.dims.dp, ctx.dims.cp, ctx.dims.tp
    non_pp = dp * cp * tp
    good = [
        e
        for e in valid_ep_sizes(m)
        if e > 1 and non_pp % e == 0 and expert_shard_ok(m, ep_shard_size(dp=dp, cp=cp, tp=tp, ep=e))
    ]
    fix = (
        f"ep_size in {fmt_set(good)}"
        if good
        else f"ep_size: 1 (experts are then FSDP-sharded on dim 0), or a rank count where ep_shard = dp*cp*tp / "
        f"ep_size divides gcd(hidden_size, moe_intermediate_size) = {math.gcd(m.hidden_size, m.moe_intermediate_size)}"
    )
    yield finding(
        ctx,
        "ep-shard-uneven",
        ("ep_size",),
        f"ep_shard={shard} (dp*cp*tp={non_pp} / ep_size={ep}) does not divide {bad} of {m.name}: "
        "AutoModel FSDP-shards the grouped expert weights over ep_shard on dim 1 and torch raises 'FSDP "
        "does not support uneven sharding on dim 1' when AutoModel parallelizes the model, after launch",
        fix,
    )


_EP_NEEDS_MOE = r"Expert parallelism \(ep_size=(\d+)\) requires a MoE model"


@rule(
    "ep-dense-model",
    family=F,
    severity="error",
    title="ep_size > 1 on a dense model",
    patterns=(_EP_NEEDS_MOE,),
    cause="A dense model has no experts; when AutoModel builds it, validate_for_mesh raises 'Expert parallelism "
    "(ep_size=N) requires a MoE model' (no dense class inherits its MoEFSDPSyncMixin).",
    fix="ep_size: 1",
)
def ep_dense_model(ctx: Context) -> Iterator[Finding]:
    impl = _impl(ctx)
    if impl is not None and impl.ep:
        return  # a class with AutoModel's MoE mixin (Nemotron-H) takes ep_size on a dense config: ep-no-experts
    if ctx.model is not None and ctx.dims.ep > 1 and not ctx.model.is_moe:
        yield finding(
            ctx,
            "ep-dense-model",
            ("ep_size",),
            f"ep_size={ctx.dims.ep} but {ctx.model.name} is a dense model (no experts): AutoModel "
            f"raises 'Expert parallelism (ep_size={ctx.dims.ep}) requires a MoE model' when it builds "
            "the model, after launch",
            "ep_size: 1",
        )


@rule(
    "ep-no-experts",
    family=F,
    severity="warning",
    title="ep_size > 1 on a model without experts",
    cause="AutoModel's Nemotron-H class carries its MoE mixin for dense configs too, so validate_for_mesh accepts "
    "ep_size > 1 on a dense Nemotron-H; the expert-parallel path then finds no experts to place: the ep "
    "split shards nothing and the job is plain data parallel.",
    fix="ep_size: 1",
)
def ep_no_experts(ctx: Context) -> Iterator[Finding]:
    impl, m, ep = _impl(ctx), ctx.model, ctx.dims.ep
    if impl is None or not impl.ep or m is None or m.is_moe or ep <= 1:
        return
    yield finding(
        ctx,
        "ep-no-experts",
        ("ep_size",),
        f"ep_size={ep} but {m.name} has no MoE layers: {impl.describe()} accepts it and its expert-parallel "
        "path has no experts to place, so the ep split does nothing",
        "ep_size: 1",
    )


_REFUSAL = {  # AutoModel's own text (_transformers/capabilities.py validate_for_mesh)
    "tp": ("tp_size", "Tensor parallelism (tp_size={n}) requested but {arch} has no TP plan"),
    "pp": ("pp_size", "Pipeline parallelism (pp_size={n}) requires a _pp_plan attribute on {arch}"),
    "ep": (
        "ep_size",
        "Expert parallelism (ep_size={n}) requires a MoE model, but {arch} does not inherit from MoEFSDPSyncMixin",
    ),
}
_INSTEAD = {
    "tp": "tp_size: 1, and shard with FSDP (dp) plus ep_size / pp_size / cp_size",
    "pp": "pp_size: 1, and shard with FSDP (dp) plus tp_size / cp_size",
    "ep": "ep_size: 1: the experts are then FSDP-sharded with the rest of the model",
}


@rule(
    "model-capability",
    family=F,
    severity="error",
    title="Parallelism AutoModel's implementation of the model lacks",
    patterns=(
        r"Tensor parallelism \(tp_size=(\d+)\) requested but (\w+) has no TP plan",
        r"Pipeline parallelism \(pp_size=(\d+)\) requires a _pp_plan",
        _EP_NEEDS_MOE,
        r"Hugging Face TP plan is not supported for (\w+)",
        r"No tensor-parallel plan is registered for the custom-code architecture '(\w+)'",
    ),
    cause="Right after building the model, AutoModel's validate_for_mesh rejects a parallelism the class it uses "
    "cannot do: its own Qwen3-MoE, DeepSeek-V3 and gpt-oss classes have no TP plan, and the Hugging Face "
    "Mixtral class (AutoModel 0.7.0 has none of its own) cannot take ep_size > 1. With model.force_hf: "
    "true AutoModel builds the Hugging Face class, and only EP is checked (no such class has its MoE mixin). "
    "A Hugging Face class with no _tp_plan (or a trust_remote_code class) cannot take tp_size > 1 either, "
    "unless the block gives its own tp_plan.",
    fix="Set that size to 1 and shard with the parallelisms the model supports (for TP, or give distributed.tp_plan).",
)
def model_capability(ctx: Context) -> Iterator[Finding]:
    m, impl = ctx.model, _impl(ctx)
    if m is not None and m.is_moe and ctx.dims.ep > 1 and ctx.recipe_get("model.force_hf") is True:
        # no Hugging Face class inherits AutoModel's MoEFSDPSyncMixin, whatever the architecture
        arch = m.architecture or "the Hugging Face class"
        ep = ctx.dims.ep
        yield finding(
            ctx,
            "model-capability",
            ("ep_size",),
            f"ep_size={ep} with model.force_hf: true: AutoModel builds {m.name} with the Hugging Face class "
            f"and raises '{_REFUSAL['ep'][1].format(n=ep, arch=arch)}' right after building it, after launch",
            "drop model.force_hf (AutoModel's own MoE classes do EP), or " + _INSTEAD["ep"],
        )
    if m is None or impl is None:
        return
    for what, (key, refusal) in _REFUSAL.items():
        size = ctx.dims.degree(key)
        if getattr(impl, what) or size <= 1 or (what == "ep" and not m.is_moe):  # dense + ep: ep-dense-model
            continue
        yield finding(
            ctx,
            "model-capability",
            (key,),
            f"{key}={size}: AutoModel 0.7.0 builds {m.name} with {impl.describe()} and raises "
            f"'{refusal.format(n=size, arch=impl.architecture)}' right after building it, after launch",
            _INSTEAD[what],
        )


@rule(
    "model-sp-unsupported",
    family=F,
    severity="error",
    title="sequence_parallel on a model class that refuses it",
    patterns=(r"Sequence parallelism is not supported for (\w+)",),
    cause="AutoModel 0.7.0's own Nemotron-H class (NemotronHForCausalLM, dense and MoE) brings its own FSDP2 "
    "parallelizer, which raises 'Sequence parallelism is not supported for NemotronHForCausalLM' for "
    "sequence_parallel: true at any tp_size (the class has no TP plan at all); the expert-parallel path "
    "(ep_size > 1) ignores the flag.",
    fix="Remove sequence_parallel; shard the model with FSDP, CP, PP and (MoE) EP.",
)
def model_sp_unsupported(ctx: Context) -> Iterator[Finding]:
    impl = sp_refused(ctx)
    if impl is None:
        return
    assert ctx.model is not None
    yield finding(
        ctx,
        "model-sp-unsupported",
        ("sequence_parallel",),
        f"sequence_parallel: true with {ctx.model.name}: AutoModel 0.7.0 builds it with {impl.describe()}, "
        f"whose FSDP2 parallelizer raises 'Sequence parallelism is not supported for {impl.architecture}' "
        "(at any tp_size) when it parallelizes the model, after launch",
        "remove sequence_parallel",
    )


@rule(
    "cp-mamba-heads",
    family=F,
    severity="error",
    title="cp_size does not divide the Mamba heads or groups",
    patterns=(
        r"num_heads \((\d+)\) must be divisible by cp_size \((\d+)\)",
        r"cp_size \((\d+)\) must be divisible by n_groups \((\d+)\)",
        r"n_groups \((\d+)\) must be divisible by cp_size \((\d+)\)",
    ),
    cause="For a hybrid Mamba model (Nemotron-H) AutoModel's context parallelism gives every CP rank whole Mamba "
    "heads (MambaContextParallel: mamba_num_heads % cp_size == 0) and whole B/C groups (n_groups % cp_size "
    "== 0, or cp_size % n_groups == 0 when there are fewer groups than CP ranks); it asserts this when it "
    "parallelizes the model, after launch.",
    fix="Use a cp_size that divides the Mamba heads and fits the groups.",
)
def cp_mamba_heads(ctx: Context) -> Iterator[Finding]:
    impl, m, cp = _impl(ctx), ctx.model, ctx.dims.cp
    if impl is None or not impl.mamba_cp or m is None or mamba_cp_ok(m, cp):
        return
    heads, groups = m.mamba_num_heads, m.mamba_n_groups
    if heads % cp:
        why = f"mamba_num_heads={heads} is not divisible by cp_size={cp}"
    elif groups < cp:
        why = f"cp_size={cp} is not a multiple of n_groups={groups} (fewer groups than CP ranks)"
    else:
        why = f"n_groups={groups} is not divisible by cp_size={cp}"
    good = [c for c in divisors(heads) if c > 1 and mamba_cp_ok(m, c)][:8]
    yield finding(
        ctx,
        "cp-mamba-heads",
        ("cp_size",),
        f"{why} in {m.name}'s Mamba layers: AutoModel's MambaContextParallel asserts this when it "
        "parallelizes the model, after launch",
        f"use cp_size in {fmt_set(good)}" if good else "cp_size: 1",
    )


@rule(
    "pp-stages",
    family=F,
    severity="error",
    title="Pipeline split does not fit the model",
    patterns=(
        r"Number of virtual stages \((\d+)\) must be divisible by pipeline parallel size",
        r"Single stage schedule requires exactly 1 stage per rank",
        r"Multi-stage schedule requires at least 2 stages per rank",
        r"Number of stages \((\d+)\) cannot exceed number of layers",
        r"(ZBV|v schedules) (requires|assume) (exactly )?2 stages per rank",
    ),
    cause="pp_size x stages-per-rank stages must fit the layers; single-stage schedules (1F1B, GPipe) need 1 "
    "stage per rank, multi-stage (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) >= 2, V schedules "
    "(ZBVZeroBubble, DualPipeV) exactly 2.",
    fix="Adjust pipeline.layers_per_stage / pp_size / pp_schedule.",
)
def pp_stages(ctx: Context) -> Iterator[Finding]:
    pp, m = ctx.dims.pp, ctx.model
    pipe = ctx.block.get("pipeline")
    if m is None or pp <= 1 or ctx.dims.pp_schedule is None or not isinstance(pipe, dict):
        return
    if pipe.get("module_fqns_per_model_part"):
        return
    lps = pipe.get("layers_per_stage")
    if lps is not None and not is_positive_int(lps):
        return
    round_to = pipe.get("round_virtual_stages_to_pp_multiple")
    try:
        total, per_rank = virtual_stages(
            m.num_layers,
            pp=pp,
            single_stage=is_single_stage(ctx.dims.pp_schedule),
            layers_per_stage=lps,
            round_to=round_to if round_to in ("up", "down") else None,
            v_style=ctx.dims.pp_schedule in V_SCHEDULES,
        )
    except StageError as exc:
        at = ("pipeline", "layers_per_stage") if lps is not None else ("pipeline", "pp_schedule")
        yield finding(
            ctx,
            "pp-stages",
            at,
            f"{m.name} ({m.num_layers} layers), pp_size={pp}, {ctx.dims.pp_schedule}: {exc}",
            _stage_fix(m.num_layers, pp, ctx.dims.pp_schedule),
        )


def _stage_fix(layers: int, pp: int, schedule: str) -> str:
    if is_single_stage(schedule):
        return f"layers_per_stage: {math.ceil(layers / pp)} (or unset) with pp_size dividing into {layers} layers"
    good: list[int] = []
    for lps in range(1, min(layers, 10_000) + 1):  # the first few fitting values are the useful hint
        stages = -(-layers // lps)
        if stages % pp == 0 and stages // pp >= 2 and (schedule not in V_SCHEDULES or stages // pp == 2):
            good.append(lps)
            if len(good) == 6:
                break
    return f"layers_per_stage in {fmt_set(good)}" if good else "a smaller pp_size or a single-stage schedule (1f1b)"


@rule(
    "model-cp-backend",
    family=F,
    severity="error",
    title="Context parallelism with an attention backend it lacks",
    patterns=(
        r"Context parallelism \(cp_size=(\d+)\) for (\w+) requires the TE attention backend",
        r"Context parallelism \(cp_size=(\d+)\) for hybrid model (\w+) requires the TE or SDPA",
    ),
    cause="AutoModel's own model classes run context parallelism only with the TE (or MagiAttention) attention "
    "backend (hybrid Mamba models: TE or SDPA); with another model.backend.attn (sdpa, flex, ...) "
    "validate_for_mesh raises right after building the model.",
    fix="Set model.backend.attn: te, or cp_size: 1.",
)
def model_cp_backend(ctx: Context) -> Iterator[Finding]:
    impl, cp = _impl(ctx), ctx.dims.cp
    attn = ctx.recipe_get("model.backend.attn")
    if impl is None or impl.cp_attn is None or cp <= 1 or not isinstance(attn, str) or attn in impl.cp_attn:
        return
    assert ctx.model is not None
    needs = (
        "for hybrid model {a} requires the TE or SDPA attention backend"
        if impl.mamba_cp
        else "for {a} requires the TE attention backend"
    ).format(a=impl.architecture)
    yield finding(
        ctx,
        "model-cp-backend",
        (),
        f"cp_size={cp} with model.backend.attn: {attn}: AutoModel 0.7.0 builds "
        f"{ctx.model.name} with {impl.describe()}, whose context parallelism needs attn {fmt_set(sorted(impl.cp_attn))}; "
        f"it raises 'Context parallelism (cp_size={cp}) {needs}' right after building the model, after launch",
        f"model.backend.attn: {'te or sdpa' if impl.mamba_cp else 'te'} (or cp_size: 1)",
        recipe_path="model.backend.attn",
    )


@rule(
    "pp-tied-embeddings",
    family=F,
    severity="error",
    title="Pipeline parallelism with tied embeddings",
    patterns=(r"Pipeline parallelism does not support tie_word_embeddings=True",),
    cause="AutoModel's pipeline builder (AutoPipeline.build -> validate_hf_model_for_pipeline_support) rejects a "
    "model whose lm_head shares the embedding weight, and overriding tie_word_embeddings to false is not "
    "supported either.",
    fix="pp_size: 1 (shard with FSDP, tp_size or cp_size), or pick an untied model.",
)
def pp_tied_embeddings(ctx: Context) -> Iterator[Finding]:
    m, pp = ctx.model, ctx.dims.pp
    if m is None or pp <= 1 or pp_possible(m):
        return
    yield finding(
        ctx,
        "pp-tied-embeddings",
        ("pp_size",),
        f"pp_size={pp} but {m.name} ties its input and output embeddings (tie_word_embeddings: true): "
        "AutoModel's pipeline builder raises 'Pipeline parallelism does not support "
        "tie_word_embeddings=True' after launch, and turning the tie off is not supported either",
        "pp_size: 1, and shard with FSDP (dp), tp_size or cp_size",
    )


@rule(
    "model-cp-packing",
    family=F,
    severity="error",
    title="Packed sequences with CP on a Hugging Face model class",
    patterns=(
        r"Packed sequence is only supported with CP size 1",
        r"Context parallelism \(cp_size=(\d+)\) with packed sequences is not supported for (\w+)",
    ),
    cause="For a Hugging Face model class (an architecture AutoModel has no class of its own for, or "
    "model.force_hf: true), AutoModel's model build raises 'Packed sequence is only supported with CP size 1' "
    "when the LLM recipe packs sequences and cp_size > 1; only attn_implementation: magi is exempt.",
    fix="packed_sequence_size: 0 or cp_size: 1 (AutoModel's own classes run CP with packing on the TE backend).",
)
def model_cp_packing(ctx: Context) -> Iterator[Finding]:
    cp, packed, m = ctx.dims.cp, ctx.recipe_get("packed_sequence.packed_sequence_size"), ctx.model
    if cp <= 1 or not is_positive_int(packed) or recipe_class(ctx)[0] not in TRAIN_FT_RECIPES:
        return
    if ctx.recipe_get("model.attn_implementation") == "magi":
        return
    force_hf = ctx.recipe_get("model.force_hf") is True
    impl = implementation(m.architecture) if m is not None else None
    if not force_hf and (impl is None or impl.custom):
        return
    what = f"the Hugging Face {m.architecture}" if m is not None and m.architecture else "a Hugging Face class"
    why = "model.force_hf: true" if force_hf else "AutoModel 0.7.0 has no class of its own for it"
    yield finding(
        ctx,
        "model-cp-packing",
        (),
        f"cp_size={cp} with packed_sequence_size={packed}: "
        f"{m.name if m else 'the model'} is built as {what} ({why}), and for Hugging Face classes AutoModel "
        "raises 'Packed sequence is only supported with CP size 1' when it builds the model, after launch",
        "packed_sequence_size: 0, or cp_size: 1" + ("" if not force_hf else ", or drop model.force_hf"),
        recipe_path="packed_sequence.packed_sequence_size",
    )
