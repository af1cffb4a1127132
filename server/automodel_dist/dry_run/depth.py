"""A deep model measured from two shallow builds: which layers repeat, the two depths a rank is built at, and the
per-layer line through their measurements that gives the full depth. Pure arithmetic (no torch).

Every byte a training step holds on a rank grows linearly with the layers the rank holds (parameters, gradients,
optimizer states, saved activations of every microbatch in flight, gradients held by a deferred sync), or is one
layer's worth whatever the depth (gathered parameters, the layer being recomputed, the loss's logits). So two builds
of the same rank with u1 and u2 repeating units of layers give the line, and the full depth's value is read off it
per phase and per category (the peak's phase can change with depth, so the maximum is taken after extrapolating).
A unit is the model's repeating period of layer kinds (1 for a uniform model, 4 for three Gated DeltaNet layers and
one full-attention layer, ...); a leading run of another kind (DeepSeek's dense layers) is kept whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..catalog.models import MAX_PERIOD, ModelConfigError, ModelSpec, from_hf_config, nested_text_config, period_of
from ..dims import ParallelDims
from ..layout import stage_ids, stage_layer_counts

# The shallower build holds at least this many layers (per stage under PP). A phase's peak is the largest of its
# moments, each linear in the depth, so the peak is convex in the depth: a build too shallow for the layers to
# dominate (the loss's logits do at two layers of a last stage) sits on another moment's line and the extrapolation
# comes out low. Three layers put every layout the tests build on the deep regime's line.
MIN_LAYERS = 3


def _whole_is_no_more_work(first: float, second: float, whole: float) -> bool:
    """Whether one whole build runs no more layers (or stages) than the two shallow builds together: then it is built
    whole, which is faster (one build, one step) and extrapolates nothing."""
    return first + second >= whole


@dataclass(frozen=True)
class Depth:
    """How one rank is built: the layers of each build and the units they hold on the rank, and the units the rank
    holds at full depth."""

    period: int
    prefix: int  # leading layers of another kind, kept whole (0 under PP: they are built as the repeating kind)
    layers: tuple[int, int]  # num_hidden_layers of the two builds
    units: tuple[int, int]  # repeating units (without PP: layers past the prefix) on the measured rank in each build
    target_units: float  # ... and at full depth
    # trailing layers that break the period (Kimi-Linear's last, an MLA layer where the period has KDA), kept whole at
    # the end of both builds (truncated_config's keep_last)
    suffix: int = 0
    # the units at which every rank's builds hold the whole model (the parameter count's line; a pipeline rank's
    # target_units hold its own layers, pp x those where the stages are uneven is not the model)
    model_units: float | None = None
    layers_per_stage: tuple[int, int] | None = None  # pipeline.layers_per_stage of each build (PP)
    # whether both builds run the same pipeline actions (the same stages and microbatches), so that each action's
    # moment has a line of its own (dry_run/tracker.py pipeline_moments); not where they hold different stage counts
    same_actions: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)


def layer_kinds(spec: ModelSpec) -> list[tuple[str, str, str]]:
    """Per layer: (mixer, attention kind, MLP kind), the three things that make layers differ in memory (a KV-shared
    layer's attention, and its MLP where double-wide, are kinds of their own, as is a layer that reuses an earlier
    layer's DSA indexer selection)."""
    out = []
    for i in range(spec.num_layers):
        mixer = spec.layer_types[i] if i < len(spec.layer_types) else "attention"
        attn = spec.attention_kind(i) + ("/kv-shared" if spec.kv_shared(i) else "")
        attn += "/index-shared" if i in spec.index_shared_layers else ""  # (GLM-5.2: no indexer of its own)
        mlp = "dense" if not spec.is_moe or i < spec.first_dense_layers else "moe"
        mlp += "/hash" if i < spec.hash_layers else ""  # (DeepSeek-V4's token-id-routed layers)
        out.append((mixer, attn, mlp))
    return out


def plan_depth(spec: ModelSpec, dims: ParallelDims, pp_rank: int) -> Depth | None:
    """The two shallow builds that stand for the full model on a rank of pipeline rank ``pp_rank``, or None when it
    is built whole: a model no deeper than the second build, one whose two builds would together run more layers than
    one whole build (slower, and no more exact), or one with no repeating period of layer kinds."""
    kinds = layer_kinds(spec)
    L = spec.num_layers
    notes: list[str] = []
    if dims.pp > 1:
        prefix = 0
        period = period_of(kinds[spec.first_dense_layers :]) if spec.first_dense_layers else period_of(kinds)
        if period is None and spec.hc_mult:
            # DeepSeek-V4's first layers (the window alone, routed by token id) break its period: the shallow builds
            # make them layers of the period (truncated_config(moe_prefix_as_moe)), as a dense prefix is built MoE
            irregular, suffix, period = _prefix_period_and_suffix(spec, kinds)
            if period is None or suffix:
                return None
            notes.append(
                f"the first {irregular} layers (their own attention kinds and token-id routing) are built as layers "
                "of the model's period in the shallow builds: the stage holding them is measured with the period's"
            )
        if period is None:
            return None
        spr = dims.stages_per_rank_of(L)
        num_stages = dims.pp * spr
        per_stage = stage_layer_counts(L, num_stages)
        held = sum(per_stage[s] for s in stage_ids(pp_rank, dims.pp, num_stages, v_style=dims.v_schedule))
        n1 = max(1, math.ceil(MIN_LAYERS / period))
        if min(per_stage) <= (n1 + 1) * period:  # stages already as shallow as the builds
            return _by_stages(spec, dims, per_stage, spr, held, period, tuple(notes))
        if _whole_is_no_more_work(spr * n1 * period, spr * (n1 + 1) * period, held):
            return None
        if spec.first_dense_layers:
            notes.append(
                f"the first {spec.first_dense_layers} dense layers are built as the model's MoE layers in the "
                "shallow builds (an overestimate for the stage holding them)"
            )
        lps = (n1 * period, (n1 + 1) * period)
        notes.insert(
            0, f"built with {lps[0]} and {lps[1]} layers per pipeline stage (the model's stages hold {per_stage[0]})"
        )
        return Depth(
            period=period,
            prefix=0,
            layers=(num_stages * lps[0], num_stages * lps[1]),
            units=(spr * n1, spr * (n1 + 1)),
            target_units=held / period,
            model_units=L / (dims.pp * period),
            layers_per_stage=lps,
            notes=tuple(notes),
        )
    prefix, suffix, period = _prefix_period_and_suffix(spec, kinds)
    if period is None:
        return None
    n1 = max(1, math.ceil(MIN_LAYERS / period))
    # both builds end as the model does: its last part-period (the layers a whole number of periods leaves) follows
    # their periods, so the backward starts at the same kind of layer (GLM-5.2's last three layers share an indexer),
    # then the layers that break the period; the line runs through the layers past the prefix, a period apart
    body = L - prefix - suffix
    tail = body % period + suffix
    built = (prefix + n1 * period + tail, prefix + (n1 + 1) * period + tail)
    if body // period <= n1 + 1 or _whole_is_no_more_work(*built, L):
        return None
    if suffix and not all(_cut_keeps(spec, kinds, n, suffix) for n in built):
        return None
    note = f"built with {built[0]} and {built[1]} of the model's {L} layers"
    if suffix:
        last = "layer, which breaks" if suffix == 1 else f"{suffix} layers, which break"
        note += f", each ending with the model's last {last} its period of {period} layer kinds"
    return Depth(
        period=period,
        prefix=prefix,
        suffix=suffix,
        layers=built,
        units=(built[0] - prefix, built[1] - prefix),
        target_units=float(L - prefix),
        notes=(note,),
    )


def _prefix_period_and_suffix(spec: ModelSpec, kinds: list[tuple[str, str, str]]) -> tuple[int, int, int | None]:
    """The layers built whole before the repeating run (an MoE model's dense prefix, else none; where the run past
    it does not repeat, the fewest more leading layers after which it does: DeepSeek-V4's sliding-window and
    token-id-routed first layers), the run's period and the last layers left out of it (see
    :func:`_period_and_suffix`)."""
    base = spec.first_dense_layers if spec.is_moe else 0
    suffix, period = _period_and_suffix(spec, kinds, base)
    if period is not None or spec.hf_config is None:
        return base, suffix, period
    L = len(kinds)
    for prefix in range(base + 1, min(base + MAX_PERIOD, L)):
        suffix, period = _period_and_suffix(spec, kinds, prefix)
        if period is not None and (L - prefix - suffix) // period >= 3 and _cut_keeps(spec, kinds, L - period, suffix):
            return prefix, suffix, period
    return base, 0, None


def _period_and_suffix(spec: ModelSpec, kinds: list[tuple[str, str, str]], prefix: int) -> tuple[int, int | None]:
    """The repeating period of the layers past ``prefix``, and how many last layers are left out of it: 0 where the
    whole run repeats, else the fewest that let the rest repeat at least three times (plan_depth then checks that
    the config can be cut to keep them)."""
    period = period_of(kinds[prefix:])
    if period is not None or spec.hf_config is None:
        return 0, period
    L = len(kinds)
    for suffix in range(1, MAX_PERIOD):
        period = period_of(kinds[prefix : L - suffix])
        if period is not None and (L - prefix - suffix) // period >= 3:
            return suffix, period
    return 0, None


def _cut_keeps(spec: ModelSpec, kinds: list[tuple[str, str, str]], layers: int, suffix: int) -> bool:
    """Whether the config cut to ``layers`` keeping its last ``suffix`` builds the model's kinds cut in the middle (a
    config that spells its layer kinds some other way, or keeps them in a field the cut does not renumber, fails)."""
    assert spec.hf_config is not None
    try:
        cut = from_hf_config(truncated_config(spec.hf_config, layers, keep_last=suffix))
    except (ModelConfigError, ValueError, KeyError, TypeError):
        return False
    return layer_kinds(cut) == kinds[: layers - suffix] + kinds[len(kinds) - suffix :]


def built_kinds(spec: ModelSpec, dims: ParallelDims) -> ModelSpec:
    """The model as the shallow pipeline builds hold it on the ranks from 1 on, for choosing the ranks where the peak
    can fall: its dense prefix as MoE layers (``truncated_config(moe_prefix_as_moe=True)``) where its layers differ in
    nothing else (one mixer, one attention kind) and every such rank is built shallow, else ``spec``.

    Every stage of such a shallow build holds the same layers, so two ranks from 1 on hold the same layers in each
    build, and the lower one runs no fewer forwards before its first backward, with the same receive buffers: each
    build of the higher rank holds no more at any point of the schedule. The two ranks' difference does not change
    with the depth of the builds (torch's warm-up gives a rank ``2 * (pp - 1 - r)`` forwards more than the last
    whatever its local stages, and the cap of every microbatch on every local stage grows with them), so their lines
    through the two builds run parallel. Where the lower rank also holds at least the higher one's layers of every
    kind at full depth, the prefix counted as MoE (what ``peak_candidate_pp_ranks`` asks of this model), the higher
    rank's line is read at no more layers than the lower one's, so its figure comes out no higher and it need not be
    measured. (On the whole model a rank holding a dense layer of the prefix does not dominate one holding a MoE layer
    in its place, so without this a DeepSeek-like model measures every pipeline rank.)"""
    if dims.pp <= 1 or not spec.first_dense_layers:
        return spec
    if len({(mixer, attention) for mixer, attention, _ in layer_kinds(spec)}) > 1:  # they differ beyond their MLP
        return spec
    if any(plan_depth(spec, dims, r) is None for r in range(1, dims.pp)):
        return spec
    if (
        spec.hf_config
        and from_hf_config(truncated_config(spec.hf_config, spec.num_layers, moe_prefix_as_moe=True)).first_dense_layers
    ):
        return spec  # a config whose dense prefix the builds' cut does not turn into MoE layers
    return replace(spec, first_dense_layers=0)


MIN_STAGES = 3  # at least torch's MAX_ACTIVE_STAGES gathered stages in the shallower build (the cap then holds)


def _by_stages(
    spec: ModelSpec, dims: ParallelDims, per_stage: list[int], spr: int, held: int, period: int, more: tuple[str, ...]
) -> Depth | None:
    """Shallow stages, many per rank (an interleaved schedule with a small layers_per_stage): build the rank with 3 and
    4 of its stages at the same layers per stage and extrapolate per stage. Each stage adds its layers' bytes and, in
    the schedule's steady state, the same count of in-flight microbatches per stage (the warm-up grows by pp per
    stage, and with every microbatch in one round all of them are in flight); torch keeps at most three stages
    gathered, which both builds already hold."""
    # the stages' common size (AutoModel gives the first L % S stages one layer more): most stages hold it, and a
    # rank's few stages of the other size are read off the line by their layers
    sizes = sorted(set(per_stage))
    lps = max(sizes, key=per_stage.count)
    if _whole_is_no_more_work(MIN_STAGES, MIN_STAGES + 1, spr) or lps % period or dims.v_schedule:
        return None
    uneven = "" if len(sizes) == 1 else f"; its stages hold {' or '.join(map(str, sizes))}, {held} layers on this rank"
    notes = [
        f"built with {MIN_STAGES} and {MIN_STAGES + 1} of the rank's {spr} pipeline stages ({lps} layers each) and "
        f"extrapolated per stage{uneven}"
    ]
    if spec.first_dense_layers:
        notes.append(
            f"the first {spec.first_dense_layers} dense layers are built as the model's MoE layers in the "
            "shallow builds (an overestimate for the stage holding them)"
        )
    notes += more
    s1, s2 = MIN_STAGES, MIN_STAGES + 1
    return Depth(
        period=period,
        prefix=0,
        layers=(dims.pp * s1 * lps, dims.pp * s2 * lps),
        units=(s1, s2),
        target_units=held / lps,
        model_units=spec.num_layers / (dims.pp * lps),
        layers_per_stage=(lps, lps),
        same_actions=False,
        notes=tuple(notes),
    )


def truncated_config(
    cfg: Mapping[str, Any], layers: int, *, moe_prefix_as_moe: bool = False, keep_last: int = 0
) -> dict[str, Any]:
    """``cfg`` (a config.json) with only its first ``layers`` layers (per-layer lists and patterns cut to match; a
    multimodal config's language model, its ``text_config``); with ``keep_last``, its first ``layers - keep_last``
    and its last ``keep_last``."""
    out = dict(cfg)
    if nested_text_config(out) is not None:
        out["text_config"] = truncated_config(
            out["text_config"], layers, moe_prefix_as_moe=moe_prefix_as_moe, keep_last=keep_last
        )
        return out
    before, shared = out.get("num_hidden_layers"), out.get("num_kv_shared_layers")
    if not 0 <= keep_last <= layers or (keep_last and not (isinstance(before, int) and layers <= before)):
        raise ValueError(f"cannot cut {before} layers to {layers} keeping the last {keep_last}")
    out["num_hidden_layers"] = layers
    head = layers - keep_last

    def cut(seq: Any) -> Any:
        # (the tail from the model's last layer: a list may run past it, as with trailing MTP entries)
        return seq[:head] + seq[before - keep_last : before] if keep_last else seq[:layers]

    if isinstance(shared, int) and shared > 0 and isinstance(before, int):
        # Gemma-4's KV-shared layers are the last ones: a cut keeps those of its layers that were shared
        out["num_kv_shared_layers"] = min(keep_last, shared) + max(0, head - (before - shared))
    if isinstance(out.get("hybrid_override_pattern"), str):
        out["hybrid_override_pattern"] = cut(out["hybrid_override_pattern"])
    # (GLM's glm_moe_dsa lists its MLP kinds and its IndexShare indexer kinds per layer, Muse-Glimmer its RoPE bases,
    # 0 for a NoPE layer, as layer_rope_theta and AutoModel's flat form as no_rope_layers)
    per_layer = (
        "layer_types",
        "layers_block_type",
        "hybrid_layer_pattern",
        "moe_layer_freq",
        "mlp_layer_types",
        "layer_rope_theta",
        "no_rope_layers",
    )
    for key in (*per_layer, "indexer_types"):
        if isinstance(out.get(key), list):
            out[key] = cut(out[key])
    ratios = out.get("compress_ratios")
    if isinstance(ratios, list) and isinstance(before, int):
        # DeepSeek-V4's per-layer KV compression, then its MTP layers' entries (kept after the cut's layers)
        out["compress_ratios"] = cut(ratios[:before]) + ratios[before:]
    linear = out.get("linear_attn_config")
    if isinstance(linear, Mapping) and isinstance(before, int):
        # Kimi-Linear numbers its KDA and MLA layers from 1: the kept layers renumbered as the cut builds them
        def renumber(nums: Any) -> Any:
            if not isinstance(nums, list):
                return nums
            kept = [j for j in nums if isinstance(j, int) and j <= head]
            return kept + [
                j - (before - layers) for j in nums if isinstance(j, int) and keep_last and j > before - keep_last
            ]

        out["linear_attn_config"] = {
            **linear,
            **{k: renumber(linear.get(k)) for k in ("kda_layers", "full_attn_layers") if k in linear},
        }
    if moe_prefix_as_moe and isinstance(out.get("moe_layer_freq"), list):  # MiMo-V2-Flash's dense prefix
        out["moe_layer_freq"] = [1] * len(out["moe_layer_freq"])
    if moe_prefix_as_moe and out.get("model_type") == "glm_moe_dsa":
        # GLM's dense prefix: AutoModel's GlmMoeDsaConfig reads mlp_layer_types, and without it makes the first three
        # layers dense whatever first_k_dense_replace says
        out["mlp_layer_types"] = ["sparse"] * layers
    if moe_prefix_as_moe and isinstance(out.get("compress_ratios"), list) and isinstance(before, int):
        # DeepSeek-V4's first layers built as layers of its period: their compression ratios continued from the
        # period's, routed by score rather than by token id
        ratios = out["compress_ratios"]
        body = ratios[: min(layers, before)]
        for start in range(1, MAX_PERIOD):
            period = period_of(body[start:])
            if period is not None and len(body) - start >= 2 * period:
                out["compress_ratios"] = [body[start + (i - start) % period] for i in range(start)] + ratios[start:]
                break
        out["num_hash_layers"] = 0
    if moe_prefix_as_moe and out.get("first_k_dense_replace"):
        out["first_k_dense_replace"] = 0
    if moe_prefix_as_moe and out.get("moe_layer_start_index"):  # ERNIE-4.5's dense prefix
        out["moe_layer_start_index"] = 0
    return out


def line(u1: float, v1: float, u2: float, v2: float, target: float) -> float:
    """The value at ``target`` on the line through (u1, v1) and (u2, v2), never below zero."""
    return max(0.0, v1 + (target - u1) * (v2 - v1) / (u2 - u1))


LINEAR = ("params", "grads", "optimizer")  # held for the whole phase: exactly linear in the layers


def extrapolate_splits(
    depth: Depth, first: Mapping[str, Mapping[str, float]], second: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per phase (those both builds reached): the full depth's total, and its split. Parameters, gradients and
    optimizer states are read off their own lines; activations and temporaries share the rest of the total in the
    proportion their own lines give (where the peak's moment moves within a phase, the two trade places between
    builds while their sum stays on its line)."""
    (u1, u2), target = depth.units, depth.target_units
    out: dict[str, dict[str, float]] = {}
    for phase in set(first) & set(second):
        a, b = first[phase], second[phase]
        if not {"total", *LINEAR} <= set(a) & set(b):  # not a split: every key on its own line
            out[phase] = {k: line(u1, a[k], u2, b[k], target) for k in a if k in b}
            continue
        total = line(u1, a["total"], u2, b["total"], target)
        split = {k: line(u1, a[k], u2, b[k], target) for k in LINEAR}
        rest = max(0.0, total - sum(split.values()))
        shares = {k: line(u1, a.get(k, 0.0), u2, b.get(k, 0.0), target) for k in ("activations", "temporaries")}
        if not sum(shares.values()):
            shares = (
                {k: b.get(k, 0.0) for k in shares} if sum(b.get(k, 0.0) for k in shares) else dict.fromkeys(shares, 1.0)
            )
        norm = sum(shares.values())
        split.update({k: rest * v / norm for k, v in shares.items()})
        split["total"] = sum(split.values())
        out[phase] = split
    return out


def phase_moments(splits: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """Per phase, the key of its largest moment (``phase@action`` keys: a pipeline action within the phase,
    dry_run/tracker.py pipeline_moments; a key without ``@`` is the phase itself)."""
    best: dict[str, str] = {}
    for key, split in splits.items():
        phase = key.split("@", 1)[0]
        if phase not in best or split.get("total", 0.0) > splits[best[phase]].get("total", 0.0):
            best[phase] = key
    return best


def by_phase(
    splits: Mapping[str, Mapping[str, float]], categories: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per phase, the split and categories of its largest moment (:func:`phase_moments`)."""
    best = phase_moments(splits)
    return (
        {phase: dict(splits[key]) for phase, key in best.items()},
        {phase: dict(categories.get(key, {})) for phase, key in best.items()},
    )


def peak_phase(splits: Mapping[str, Mapping[str, float]]) -> str | None:
    return max(splits, key=lambda ph: splits[ph].get("total", 0.0), default=None)


__all__ = [
    "Depth",
    "layer_kinds",
    "period_of",
    "plan_depth",
    "truncated_config",
    "line",
    "extrapolate_splits",
    "by_phase",
    "phase_moments",
    "peak_phase",
]
