"""Model-aware rules: what AutoModel only finds at model build time (the implementation's capabilities,
TP heads, EP experts, PP stages)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..catalog.implementations import (
    PP_OWN_STAGE_FORWARD,
    PP_PATCH_KEYS,
    Implementation,
    cp_attn_refused,
    implementation,
)
from ..catalog.kernels import ignores_sequence_parallel
from ..catalog.models import ModelSpec
from ..config.values import V_SCHEDULES, is_positive_int, is_single_stage
from ..layout import StageError, ep_shard_size, virtual_stages
from ..report import Finding
from .base import Context, finding, note, rule
from .helpers import divisors, fitting_sizes, fmt_set
from .recipe import TRAIN_FT_RECIPES, recipe_class

F = "model"


def _lacks(m: ModelSpec, what: str) -> Implementation | None:
    """AutoModel's (default) implementation of ``m`` when it is known and cannot do ``what`` (tp, pp or ep)."""
    impl = implementation(m.architecture)
    return impl if impl is not None and not getattr(impl, what) else None


FORCE_HF = "model.force_hf: true"


def _hf_built(ctx: Context) -> str | None:
    """Why AutoModel builds the Hugging Face class (None: it builds its own where it has one): ``model.force_hf``
    (:data:`FORCE_HF`), or a bitsandbytes ``quantization:``, whose weights its own classes do not load
    (_transformers/model_init.py)."""
    if ctx.recipe_get("model.force_hf") is True:
        return FORCE_HF
    if ctx.workload.force_hf:
        return "quantization: (bitsandbytes, whose weights AutoModel's own classes do not load)"
    return None


def _impl(ctx: Context) -> Implementation | None:
    """The class AutoModel builds for the context's model (None: unknown, or the Hugging Face class: _hf_built)."""
    if ctx.model is None or _hf_built(ctx) is not None:
        return None
    return implementation(ctx.model.architecture)


def head_tp_sizes(m: ModelSpec, limit: int = 64) -> list[int]:
    """tp sizes that divide the attention heads and every layer's KV heads (Gemma-4's global layers have their
    own count; MLA shards the full head count)."""
    heads = m.num_attention_heads if m.kv_lora_rank else math.gcd(m.num_attention_heads, *m.kv_head_counts())
    return [d for d in divisors(heads) if d <= limit]


def valid_tp_sizes(m: ModelSpec, limit: int = 64) -> list[int]:
    """tp sizes AutoModel can use for ``m``: the head divisors, or [1] when its class has no TP plan."""
    return [1] if _lacks(m, "tp") else head_tp_sizes(m, limit)


def pp_possible(m: ModelSpec) -> bool:
    """False for tied input/output embeddings: under a pipeline AutoModel either trains an untied lm_head or
    (quantized) refuses the model (pp-tied-embeddings), so suggest does not offer pp for them; and for Falcon-H1,
    whose pipeline stages would run another function (pp-falcon-h1-forward)."""
    return not m.tie_word_embeddings and not m.parallel_mamba


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
    """False when AutoModel's class for ``m`` splits Mamba heads over CP and ``cp`` does not fit them, and for any
    ``cp`` above 1 on Falcon-H1, whose Mamba branch CP would leave a share of the sequence (cp-parallel-mamba)."""
    if m.parallel_mamba and cp > 1:
        return False
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
    cause="The model given is not a readable config.json or model folder, not in the local Hugging Face cache "
    "(HF_HOME / HF_HUB_CACHE) and not in the built-in catalog; the model-aware checks do not run.",
    fix="Pass the path of its config.json, download it once (huggingface-cli download REPO config.json, or "
    "--fetch-config), or use a catalog name (automodel-dist models).",
)
note("model-from-recipe", "Model taken from the recipe", family=F, severity="info")
note(
    "automodel-version",
    "Installed AutoModel is not 0.7.0",
    family=F,
    severity="info",
    cause="The rules and the capability table are AutoModel 0.7.0's; a job launched from an environment with another "
    "release runs that release's registry and checks.",
    fix="Regenerate the table with tools/gen_capabilities.py against the installed release, or pin 0.7.0.",
)


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
    if impl is not None and impl.sidecar == "Gemma4ModelParallelizer" and m.is_moe:
        return  # model-capability: its parallelizer refuses TP on the MoE variant whatever the heads
    good = fmt_set(fitting_sizes(ctx, "tp", head_tp_sizes(m)))
    if impl is not None and impl.sidecar == "Gemma4ModelParallelizer":
        pairs = sorted({(m.num_attention_heads, kv) for kv in m.kv_head_counts()})
        bad = [p for p in pairs if p[0] % tp or p[1] % tp]
        yield finding(
            ctx,
            ("tp_size",),
            f"tp_size={tp} does not divide every layer's (attention, KV) heads of {m.name} {pairs}: AutoModel's "
            "Gemma4ModelParallelizer raises 'Gemma4 TP requires every layer attention head count to be divisible "
            f"by tp_size; got incompatible_head_counts={bad}, tp_size={tp}.' when it parallelizes the model, "
            "after launch",
            f"use tp_size in {good}",
        )
        return
    counts = [("num_attention_heads", m.num_attention_heads)]
    if not m.kv_lora_rank:  # MLA shards the full head count
        counts.append(("num_key_value_heads", m.num_key_value_heads))
        if m.full_kv_heads and "full" in m.layer_attention:
            counts.append(("the full-attention layers' KV heads", m.full_kv_heads))
    bad = [f"{name}={n}" for name, n in counts if n % tp]
    yield finding(
        ctx,
        ("tp_size",),
        f"tp_size={tp} does not divide {' and '.join(bad)} of {m.name}: AutoModel's TP validation fails after launch",
        f"use tp_size in {good}",
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
        ("ep_size",),
        f"n_routed_experts {m.num_experts} of {m.name} must be divisible by ep_size={ep}",
        f"use ep_size in {fmt_set(fitting_sizes(ctx, 'ep', [d for d in divisors(m.num_experts) if d > 1]))}",
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
        r"Custom MoE tensor-parallel plan patterns must each match at least one concrete module",
        r"Gemma4 MoE does not support tensor parallelism",
        r"Context parallelism \(cp_size=(\d+)\) (?:is not supported for hybrid model|not supported with) (\w+)",
        r"Model does not support SDPA required for context parallelism",
    ),
    cause="Right after building the model, AutoModel's validate_for_mesh rejects a parallelism the class it uses "
    "cannot do (its registry's classes are tabled in capabilities.json, generated from AutoModel 0.7.0): e.g. its "
    "own Qwen3-MoE, Qwen3-Next, DeepSeek-V3 and gpt-oss classes have no TP plan, a Hugging Face class with hybrid "
    "(Mamba / linear-attention) layers or without SDPA cannot take cp_size > 1, and no Hugging Face class has its "
    "MoE mixin for ep_size > 1. Some classes pass that gate and fail when they are parallelized: Qwen3.5's classes "
    "have no usable TP plan, the Qwen3-VL-MoE / Omni classes' fallback plan matches no module, Gemma-4's MoE "
    "variant refuses TP. With model.force_hf: true, or a bitsandbytes quantization: (its own classes do not load "
    "those weights), AutoModel builds the Hugging Face class, and only EP is checked.",
    fix="Set that size to 1 and shard with the parallelisms the model supports (for TP, or give distributed.tp_plan).",
)
def model_capability(ctx: Context) -> Iterator[Finding]:
    m, impl, why = ctx.model, _impl(ctx), _hf_built(ctx)
    if m is not None and m.is_moe and ctx.dims.ep > 1 and why is not None:
        # no Hugging Face class inherits AutoModel's MoEFSDPSyncMixin, whatever the architecture
        arch = m.architecture or "the Hugging Face class"
        ep = ctx.dims.ep
        drop = "drop model.force_hf" if why == FORCE_HF else "train without quantization:"
        yield finding(
            ctx,
            ("ep_size",),
            f"ep_size={ep} with {why}: AutoModel builds {m.name} with the Hugging Face class "
            f"and raises '{_REFUSAL['ep'][1].format(n=ep, arch=arch)}' right after building it, after launch",
            f"{drop} (AutoModel's own MoE classes do EP), or " + _INSTEAD["ep"],
        )
    if m is None or impl is None:
        return
    for what, (key, refusal) in _REFUSAL.items():
        size = ctx.dims.degree(key)
        if getattr(impl, what) or size <= 1 or (what == "ep" and not m.is_moe):  # dense + ep: ep-dense-model
            continue
        yield finding(
            ctx,
            (key,),
            f"{key}={size}: AutoModel 0.7.0 builds {m.name} with {impl.describe()} and raises "
            f"'{refusal.format(n=size, arch=impl.architecture)}' right after building it, after launch",
            _INSTEAD[what],
        )
    tp, own_plan = ctx.dims.tp, ctx.block.get("tp_plan") is not None
    if tp > 1 and impl.tp and not own_plan:
        error = impl.tp_plan_error
        if impl.sidecar == "Gemma4ModelParallelizer" and m.is_moe:
            error = "ValueError: Gemma4 MoE does not support tensor parallelism; use expert parallelism instead."
        if error:
            yield finding(
                ctx,
                ("tp_size",),
                f"tp_size={tp}: AutoModel 0.7.0 builds {m.name} with {impl.describe()}, which passes its "
                f"capability check but raises '{error.split(': ', 1)[-1]}' when it parallelizes the model, after "
                "launch",
                _INSTEAD["tp"] + ("" if "MoE" in error else ", or give distributed.tp_plan"),
            )
    cp = ctx.dims.cp
    if cp > 1 and (not impl.custom or impl.cp_backends(m.mixes_layers) is None) and not impl.cp_ok(m.mixes_layers):
        arch = impl.architecture
        said = (
            f"Context parallelism (cp_size={cp}) is not supported for hybrid model {arch} (contains Mamba/SSM layers)"
            if m.mixes_layers
            else f"Context parallelism (cp_size={cp}) not supported with {arch} (model does not declare _supports_sdpa)"
        )
        yield finding(
            ctx,
            ("cp_size",),
            f"cp_size={cp}: AutoModel 0.7.0 builds {m.name} with {impl.describe()} and raises '{said}' right after "
            "building it, after launch",
            "cp_size: 1, and shard the sequence's activations with activation checkpointing, tp_size or pp_size",
        )


_REMOTE_TP = (
    "No tensor-parallel plan is registered for the custom-code architecture '{arch}' (loaded via "
    "trust_remote_code=True), and no usable HuggingFace `_tp_plan` was found"
)


@rule(
    "model-remote-code-tp",
    family=F,
    severity="warning",
    title="tp_size > 1 on a trust_remote_code architecture",
    patterns=(r"No tensor-parallel plan is registered for the custom-code architecture '(\w+)'",),
    cause="The model's config.json maps its classes to the checkpoint's own code (auto_map) and its architecture is "
    "neither in AutoModel 0.7.0's registry nor in transformers: AutoModel loads it with trust_remote_code, its "
    "capability check passes, and at tp_size > 1 its parallelizer raises 'No tensor-parallel plan is registered for "
    "the custom-code architecture ...' unless the class brings a _tp_plan of styles AutoModel recognizes (which "
    "cannot be checked without running that code).",
    fix="tp_size: 1, or give distributed.tp_plan (a dict or an import path).",
)
def model_remote_code_tp(ctx: Context) -> Iterator[Finding]:
    m, tp = ctx.model, ctx.dims.tp
    if m is None or tp <= 1 or ctx.block.get("tp_plan") is not None or ctx.recipe_get("model.force_hf") is True:
        return
    cfg = m.hf_config or {}
    if not isinstance(cfg.get("auto_map"), dict) or implementation(m.architecture) is not None:
        return
    arch = m.architecture or "its class"
    yield finding(
        ctx,
        ("tp_size",),
        f"tp_size={tp} with {m.name}, a trust_remote_code architecture ({arch}, config.json auto_map) that AutoModel "
        f"0.7.0 has no plan for: unless its code defines a usable _tp_plan, AutoModel raises "
        f"'{_REMOTE_TP.format(arch=arch)}' when it parallelizes the model, after launch (its code was not run here)",
        "tp_size: 1, or give distributed.tp_plan",
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
        ("sequence_parallel",),
        f"sequence_parallel: true with {ctx.model.name}: AutoModel 0.7.0 builds it with {impl.describe()}, "
        f"whose FSDP2 parallelizer raises 'Sequence parallelism is not supported for {impl.architecture}' "
        "(at any tp_size) when it parallelizes the model, after launch",
        "remove sequence_parallel",
    )


@rule(
    "sp-ignored",
    family=F,
    severity="warning",
    title="sequence_parallel that the model's TP plan ignores",
    cause="AutoModel 0.7.0's TP plans for Falcon-H1 (optimized_tp_plans._parallelize_falcon_h1: its Mamba branch's "
    "whole-sequence output is summed with the attention's) and Muse-Glimmer (_parallelize_muse_glimmer, which warns "
    "'sequence_parallel=True is not yet supported for MuseGlimmer and will be ignored') accept sequence_parallel and "
    "leave it out: the norms, residuals and the MLP's input stay whole on every TP rank, so the activation memory SP "
    "would save is not saved, with no error.",
    fix="Remove sequence_parallel (it changes nothing here); for activation memory checkpoint the layers, raise "
    "cp_size where the model allows it, or shorten the sequence.",
)
def sp_ignored(ctx: Context) -> Iterator[Finding]:
    m, d = ctx.model, ctx.dims
    if m is None or ctx.block.get("sequence_parallel") is not True or d.tp <= 1 or d.strategy != "fsdp2":
        return
    if not ignores_sequence_parallel(m.architecture, m.parallel_mamba):
        return
    yield finding(
        ctx,
        ("sequence_parallel",),
        f"sequence_parallel: true with {m.name}: AutoModel 0.7.0's TP plan for it ignores the flag, so the "
        f"activations SP would split stay whole on each of the {d.tp} TP ranks (the estimate counts them so), with "
        "no error",
        "remove sequence_parallel (it changes nothing here)",
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
    good = fitting_sizes(ctx, "cp", [c for c in divisors(heads) if c > 1 and mamba_cp_ok(m, c)])[:8]
    yield finding(
        ctx,
        ("cp_size",),
        f"{why} in {m.name}'s Mamba layers: AutoModel's MambaContextParallel asserts this when it "
        "parallelizes the model, after launch",
        f"use cp_size in {fmt_set(good)}" if good else "cp_size: 1",
    )


@rule(
    "cp-parallel-mamba",
    family=F,
    severity="warning",
    title="Context parallelism leaves Falcon-H1's Mamba branch a share of the sequence",
    cause="AutoModel 0.7.0 accepts context parallelism on transformers' Falcon-H1 class: its hybrid check "
    "(_transformers/capabilities._is_hybrid) looks for 'M' in layers_block_type, which Falcon-H1's config fills "
    "with 'hybrid', so CP takes the generic torch context_parallel path. That path hands each CP rank a "
    "load-balanced share of every sequence (two chunks, from either end) and makes only SDPA whole through its "
    "ring; the Mamba-2 mixer that runs beside every attention block scans the rank's share as if it were the "
    "sequence. The step runs and the loss is finite, but it is not the model's.",
    fix="cp_size: 1 (AutoModel 0.7.0 has no context-parallel path for Falcon-H1's Mamba branch); shard with FSDP, "
    "or TP (AutoModel's Falcon-H1 plan splits the attention and the MLP).",
)
def cp_parallel_mamba(ctx: Context) -> Iterator[Finding]:
    m, cp = ctx.model, ctx.dims.cp
    if m is None or not m.parallel_mamba or cp <= 1:
        return
    yield finding(
        ctx,
        ("cp_size",),
        f"cp_size={cp} with {m.name}: AutoModel accepts it (its hybrid check does not see Falcon-H1's Mamba layers) "
        f"and shards every sequence {cp} ways, but only the attention is made whole; the Mamba-2 branch in each of "
        f"the {m.num_layers} layers scans its rank's 1/{cp} of the sequence alone, so the step trains on outputs "
        "that are not the model's",
        "cp_size: 1 (no context-parallel path for Falcon-H1's Mamba branch in AutoModel 0.7.0)",
    )


@rule(
    "pp-falcon-h1-forward",
    family=F,
    severity="warning",
    title="Pipeline stages run another function than Falcon-H1's",
    cause="Under pipeline parallelism AutoModel 0.7.0 replaces a Hugging Face model's forward with its generic stage "
    "forward (components/distributed/pipelining/hf_utils.py, create_pipeline_forward_inner), which embeds the ids, "
    "runs the layers, applies the text module's `norm` and returns the hidden states for the last stage's lm_head. "
    "Falcon-H1's own forward also scales the embeddings by embedding_multiplier and the logits by "
    "lm_head_multiplier (its muP multipliers), and names its final norm final_layernorm, which the generic forward "
    "does not look for: the stages train a different function (no multipliers, no final norm), with no error.",
    fix="pp_size: 1: shard Falcon-H1 with FSDP, or TP (AutoModel's Falcon-H1 plan splits the attention and the MLP).",
)
def pp_falcon_h1_forward(ctx: Context) -> Iterator[Finding]:
    m, pp = ctx.model, ctx.dims.pp
    if m is None or not m.parallel_mamba or pp <= 1:
        return
    yield finding(
        ctx,
        ("pp_size",),
        f"pp_size={pp} with {m.name}: AutoModel's generic pipeline stage forward replaces Falcon-H1's and leaves out "
        "its embedding and logits multipliers and its final norm (final_layernorm): the stages train another "
        "function than the checkpoint's, with no error",
        "pp_size: 1 (shard with FSDP, or TP)",
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
        r"Context parallelism \(cp_size=(\d+)\) for (\w+) requires the TileLang",
    ),
    cause="AutoModel's own model classes run context parallelism only with the TE (or MagiAttention) attention "
    "backend (hybrid Mamba models: TE or SDPA; DeepSeek-V4: TileLang; GLM-MoE-DSA: TileLang or cuDNN); with another "
    "model.backend.attn (sdpa, flex, ...) validate_for_mesh raises right after building the model. Unset, the "
    "backend is te with Transformer Engine on CUDA, else sdpa: a class that accepts neither raises too.",
    fix="Set model.backend.attn: te, or cp_size: 1.",
)
def model_cp_backend(ctx: Context) -> Iterator[Finding]:
    impl, cp, m = _impl(ctx), ctx.dims.cp, ctx.model
    if impl is None or m is None or cp <= 1:
        return
    attn = ctx.recipe_get("model.backend.attn")
    unset = attn is None
    backends = cp_attn_refused(impl, m.mixes_layers, attn)
    if backends is None:
        return
    said = (
        "model.backend.attn unset (AutoModel's default: te with Transformer Engine on CUDA, else sdpa)"
        if unset
        else f"model.backend.attn: {attn}"
    )
    a = impl.architecture
    if backends == {"tilelang"}:
        needs, fix = f"for {a} requires the TileLang attention backend (backend.attn='tilelang')", "tilelang"
    elif backends == {"tilelang", "cudnn"}:
        needs, fix = f"for {a} requires the TileLang or cuDNN DSA attention backend", "tilelang or cudnn"
    elif m.mixes_layers:
        needs, fix = f"for hybrid model {a} requires the TE or SDPA attention backend", "te or sdpa"
    else:
        needs, fix = f"for {a} requires the TE attention backend", "te"
    yield finding(
        ctx,
        ("cp_size",) if unset else (),
        f"cp_size={cp} with {said}: AutoModel 0.7.0 builds "
        f"{m.name} with {impl.describe()}, whose context parallelism needs attn {fmt_set(sorted(backends))}; "
        f"it raises 'Context parallelism (cp_size={cp}) {needs}' right after building the model, after launch",
        f"model.backend.attn: {fix} (or cp_size: 1)",
        recipe_path=None if unset else "model.backend.attn",
    )


@rule(
    "pp-tied-embeddings",
    family=F,
    severity="warning",
    title="Pipeline parallelism with tied embeddings",
    patterns=(r"Pipeline parallelism does not support tie_word_embeddings=True",),
    cause="AutoModel's pipeline builder (validate_hf_model_for_pipeline_support) rejects a tied model only when "
    "lm_head.weight IS embed_tokens.weight. Its meta-device init (FSDP2 on more than one rank, no quantization) "
    "re-creates every parameter it registers, so the tie made in the model's __init__ is lost: the check passes and "
    "the pipeline trains a separate lm_head (its non-pipeline path re-ties after sharding, the pipeline path does "
    "not). Without meta init (a quantized QLoRA model) the weights stay tied and the builder raises.",
    fix="pp_size: 1 to keep the tie (shard with FSDP, tp_size or cp_size), or accept an untied lm_head.",
)
def pp_tied_embeddings(ctx: Context) -> Iterator[Finding]:
    m, pp = ctx.model, ctx.dims.pp
    if m is None or pp <= 1 or pp_possible(m):
        return
    # AutoModel builds without meta init when the recipe quantizes (a quantization: section, even empty) or, for a
    # Hugging Face class, when the checkpoint's own config.json carries a quantization_config
    impl = _impl(ctx)
    native = isinstance(m.hf_config, dict) and m.hf_config.get("quantization_config") is not None
    quantized = ctx.recipe_get("quantization") is not None or (native and (impl is None or not impl.custom))
    if quantized:
        yield finding(
            ctx,
            ("pp_size",),
            f"pp_size={pp} but {m.name} ties its input and output embeddings (tie_word_embeddings: true) and the "
            "model is quantized (the recipe's quantization: or its config.json), so AutoModel builds it without meta init and the weights stay tied: its "
            "pipeline builder raises 'Pipeline parallelism does not support tie_word_embeddings=True' after launch",
            "pp_size: 1, and shard with FSDP (dp), tp_size or cp_size",
            severity="error",
        )
        return
    head = m.embedding_params()
    yield finding(
        ctx,
        ("pp_size",),
        f"pp_size={pp} with {m.name}, which ties its input and output embeddings: AutoModel's meta init loses the "
        f"tie, so its pipeline check passes and the last stage trains a separate lm_head ({head:,} more parameters "
        "that no longer share the embedding's weight)",
        "pp_size: 1 to keep the tie, or accept an untied lm_head",
    )


PP_VLM_DEDICATED_FORWARD = ("gemma4", "mistral3")  # hf_utils._PP_VLM_MODEL_TYPES_WITH_DEDICATED_FORWARD


@rule(
    "pp-patched-forward",
    family=F,
    severity="error",
    title="Pipeline parallelism with AutoModel's generic stage forward on a model that carries its own",
    patterns=(
        r"a and b must have same reduction dim, but got \[\d+, \d+\] X \[\d+, 24\]",
        r"DeepseekV4Attention: compressor enabled but no rotary_compress / position_embeddings_compress supplied",
    ),
    cause="With pipeline.patch_inner_model and patch_causal_lm_model left on (their default) AutoModel replaces each "
    "stage's forward with its generic one, which hands on the hidden state alone; DeepSeek-V4's stages hand on its "
    "hc_mult hyper-connection streams and its compressed layers' rotary tables, so the next stage's first "
    "hyper-connection gets [B, S, hidden] (or a compressed layer none of its tables) and the first forward fails (its "
    "own forward takes the streams on a later stage; the dry run of AutoModel's class fails both ways).",
    fix="distributed.pipeline.patch_inner_model: false and patch_causal_lm_model: false, as AutoModel's DeepSeek-V4 "
    "recipes set them.",
)
def pp_patched_forward(ctx: Context) -> Iterator[Finding]:
    impl = _impl(ctx)
    if ctx.dims.pp <= 1 or impl is None or impl.architecture not in PP_OWN_STAGE_FORWARD:
        return
    pipe = ctx.block.get("pipeline")
    pipe = pipe if isinstance(pipe, dict) else {}
    left = [k for k in PP_PATCH_KEYS if pipe.get(k, True) is not False]
    if left:
        yield finding(
            ctx,
            ("pipeline", left[0]) if "pipeline" in ctx.block else ("pp_size",),
            f"pp_size={ctx.dims.pp} with {', '.join(left)} on (the default): AutoModel's generic stage forward "
            f"replaces {impl.architecture}'s own, which hands its hyper-connection streams ([B, S, hc_mult, hidden]) "
            "from stage to stage; the next stage gets [B, S, hidden] and the first forward fails ('a and b must have "
            "same reduction dim') after launch",
            "distributed.pipeline: {patch_inner_model: false, patch_causal_lm_model: false}",
        )


@rule(
    "pp-model-unsupported",
    family=F,
    severity="error",
    title="Pipeline parallelism on a model its pipeline builder refuses",
    patterns=(
        r"VLM model_type='(\w*)' is not on the pipeline-aware list",
        r"Encoder-Decoder models with cross-attention are not supported yet for pipeline parallelism",
    ),
    cause="AutoModel's pipeline builder (validate_hf_model_for_pipeline_support) refuses an encoder-decoder model, "
    "and a vision-language model (its config has a text_config) unless its model_type has a dedicated pipeline "
    "forward (gemma4, mistral3) or its class keeps its own forward (_pp_keep_self_forward): the generic forward "
    "would drop pixel_values and train on placeholder embeddings.",
    fix="pp_size: 1, and shard with FSDP (dp), tp_size or cp_size.",
)
def pp_model_unsupported(ctx: Context) -> Iterator[Finding]:
    m, pp = ctx.model, ctx.dims.pp
    if m is None or pp <= 1 or not isinstance(m.hf_config, dict):
        return
    cfg = m.hf_config
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    why = None
    if cfg.get("is_encoder_decoder") is True:
        why = "Encoder-Decoder models with cross-attention are not supported yet for pipeline parallelism."
    elif text is not None:
        outer, inner = cfg.get("model_type"), text.get("model_type")
        impl = _impl(ctx)
        if outer not in PP_VLM_DEDICATED_FORWARD and inner not in PP_VLM_DEDICATED_FORWARD:
            if impl is None or not impl.keeps_own_forward:
                cls = impl.architecture if impl is not None else (m.architecture or "its class")
                why = (
                    f"VLM model_type='{outer}' is not on the pipeline-aware list ({', '.join(PP_VLM_DEDICATED_FORWARD)}) "
                    f"and the model class {cls} does not declare ``_pp_keep_self_forward = True``."
                )
    if why is None:
        return
    yield finding(
        ctx,
        ("pp_size",),
        f"pp_size={pp} with {m.name}: AutoModel's pipeline builder raises 'Model ... is not compatible with "
        f"pipeline parallelism: {why}' after launch",
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
    built = _hf_built(ctx)
    force_hf = built is not None
    impl = implementation(m.architecture) if m is not None else None
    if not force_hf and (impl is None or impl.custom):
        return
    what = f"the Hugging Face {m.architecture}" if m is not None and m.architecture else "a Hugging Face class"
    why = built or "AutoModel 0.7.0 has no class of its own for it"
    yield finding(
        ctx,
        (),
        f"cp_size={cp} with packed_sequence_size={packed}: "
        f"{m.name if m else 'the model'} is built as {what} ({why}), and for Hugging Face classes AutoModel "
        "raises 'Packed sequence is only supported with CP size 1' when it builds the model, after launch",
        "packed_sequence_size: 0, or cp_size: 1" + (", or drop model.force_hf" if built == FORCE_HF else ""),
        recipe_path="packed_sequence.packed_sequence_size",
    )
