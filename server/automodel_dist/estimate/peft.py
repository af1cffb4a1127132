"""LoRA as AutoModel 0.7.0 applies it (components/_peft): which modules a ``peft:`` section adapts and how many
parameters that adds, per layer and at the top of the model; QLoRA's bytes per quantized weight. Pure.

Matching follows ``module_matcher.ModuleMatcher`` on the module's full dotted name (``model.layers.3.self_attn
.q_proj``): ``match_all_linear`` takes every Linear (lm_head included); else ``target_modules`` patterns (an
exact full name, or AutoModel's wildcard: ``*`` matches any text, dots included; ``.*`` right after a whole
segment or an index matches that segment's children or nothing); else every Linear not excluded by
``exclude_modules``; nothing given means ``['*_proj']``. A bare ``q_proj`` matches nothing. Routed experts are
one module (``mlp.experts``), adapted only when a target pattern names it; each expert then gets
``dim*(h + up) + dim*(I + h)`` parameters (``lora_experts.py``). The pattern is matched here by a linear-time
reading of the same grammar, never compiled as a regular expression (AutoModel's unescaped ``.`` matches any
character here too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ..catalog.kernels import OUTPUT_GATE_PROJ
from ..catalog.models import ModelSpec

DEFAULT_TARGETS = ("*_proj",)
# AutoModel's TP plans: row-parallel, full-width outputs (Llama's names, Mamba's, Phi's and StarCoder2's)
_ROW_PARALLEL = (".o_proj", ".down_proj", ".out_proj", ".dense", ".fc2", ".c_proj")
MAX_PATTERNS = 256
MAX_PATTERN_CHARS = 512
# bitsandbytes NF4 with double quantization (AutoModel's default): 4-bit codes, an 8-bit absmax per 64 weights and
# an fp32 scale per 256 of those blocks; 8-bit: one byte and an fp32 scale per row (counted per weight).
QLORA_BYTES = {4: 0.5 + 1 / 64 + 4 / (64 * 256), 8: 1.0 + 4 / 4096}


@dataclass(frozen=True)
class Linear:
    """One Linear module of a layer (``{i}`` is the layer index), or of the model (``per_layer`` False)."""

    name: str
    fan_in: int
    fan_out: int
    kind: str = "linear"  # linear | experts (one module holding every routed expert of the layer)


@dataclass(frozen=True)
class Lora:
    """What a peft: section adds: trainable parameters per layer of each kind, on the lm_head, and which modules."""

    dim: int
    per_layer: tuple[tuple[str, float], ...]  # (layer kind, adapter parameters per layer of that kind)
    lm_head: float
    adapted: tuple[str, ...]  # the matched module names of the first layer of each kind, and lm_head
    adapted_weights: tuple[tuple[str, float], ...]  # (layer kind, base Linear weights adapted per layer)
    quant_bits: int | None = None
    # (layer kind, the part of per_layer on the routed experts): GroupedExpertsLoRA's adapters are split over EP
    # with the experts they adapt (_peft/lora_experts.py)
    per_layer_experts: tuple[tuple[str, float], ...] = ()
    # (layer kind, bytes per token LoRA dropout keeps for backward): with dropout > 0, "post" (PeftConfig's default)
    # keeps a one-byte mask of each adapted Linear's output (lora.py's F.dropout on lora_res); "pre" a dropped bf16
    # copy of its input and the mask. The routed experts' adapters take no dropout.
    dropout_per_layer: tuple[tuple[str, float], ...] = ()
    # the part of dropout_per_layer on row-parallel Linears (o_proj, down_proj, out_proj): their LoRA output is full
    # width on every TP rank, the others' are split by TP ("pre"'s copies are counted in bf16)
    dropout_rowwise_per_layer: tuple[tuple[str, float], ...] = ()
    # (layer kind, the part of per_layer on modules AutoModel's TP plan leaves whole: Falcon-H1's Mamba mixer), whose
    # adapters are whole on every TP rank
    per_layer_whole: tuple[tuple[str, float], ...] = ()

    def layer(self, kind: str) -> float:
        return dict(self.per_layer).get(kind, 0.0)

    def whole(self, kind: str) -> float:
        return dict(self.per_layer_whole).get(kind, 0.0)

    def experts(self, kind: str) -> float:
        return dict(self.per_layer_experts).get(kind, 0.0)

    def dropout_bytes(self, kind: str, tp: int = 1) -> float:
        """Bytes per token a layer's LoRA dropout keeps on a rank at TP ``tp``."""
        rowwise = dict(self.dropout_rowwise_per_layer).get(kind, 0.0)
        return (dict(self.dropout_per_layer).get(kind, 0.0) - rowwise) / tp + rowwise

    def total(self, m: ModelSpec) -> float:
        return sum(self.layer(m.layer_kind(i)) for i in range(m.num_layers)) + self.lm_head


def _tokens(pattern: str) -> tuple[str, ...]:
    """AutoModel's split of a pattern (``re.split(r"(\\.?\\*)", pattern)``): literal text, ``*`` (any text) and
    ``?seg`` (its ``(\\..*)?``: a ``.*`` right after a whole segment or an index)."""
    parts = re.split(r"(\.?\*)", pattern)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            if part:
                out.append(part)
        elif part == ".*" and (
            parts[i - 1].startswith(".") or (i == 1 and bool(parts[0])) or re.search(r"\.\d+$", parts[i - 1])
        ):
            out.append("?seg")
        else:
            out.append("*")
    return tuple(out)


@lru_cache(maxsize=4096)
def wildcard_match(pattern: str, name: str) -> bool:
    """AutoModel's ``wildcard_match`` (anchored), as a dynamic program over the pattern's pieces."""
    pieces = _tokens(pattern)
    # states: set of positions in ``name`` reachable after consuming a prefix of the pieces
    states = {0}
    for piece in pieces:
        nxt: set[int] = set()
        if piece == "*":
            low = min(states) if states else len(name) + 1
            nxt = set(range(low, len(name) + 1))
        elif piece == "?seg":
            for s in states:
                nxt.add(s)
                if s < len(name) and name[s] == ".":
                    nxt.update(range(s + 1, len(name) + 1))
        else:
            n = len(piece)
            for s in states:
                chunk = name[s : s + n]
                if len(chunk) == n and all(p == "." or p == c for p, c in zip(piece, chunk)):
                    nxt.add(s + n)
        states = nxt
        if not states:
            return False
    return len(name) in states


def _tp_whole(name: str) -> bool:
    """Whether a layer's Linear is whole on every TP rank: Falcon-H1's Mamba mixer, which AutoModel's TP plan leaves
    out."""
    return ".mamba." in name


def _matches(name: str, targets: tuple[str, ...], excludes: tuple[str, ...], match_all: bool, kind: str) -> bool:
    if match_all:
        return kind == "linear"
    if targets:
        return any(name == t or wildcard_match(t, name) for t in targets)
    return kind == "linear" and name not in excludes and not any(wildcard_match(e, name) for e in excludes)


def layer_modules(m: ModelSpec, kind: str) -> list[Linear]:
    """The Linear modules of one layer of ``kind`` in AutoModel's (or transformers') module tree."""
    h = m.hidden_size
    if m.is_hybrid:
        base = "backbone.layers.{i}.mixer"
        if kind == "mamba":
            return [Linear(f"{base}.in_proj", h, m.mamba_in_proj_width), Linear(f"{base}.out_proj", m.mamba_inner, h)]
        if kind == "attention":
            return _attention(m, base)
        if kind == "mlp":
            return [
                Linear(f"{base}.up_proj", h, m.intermediate_size),
                Linear(f"{base}.down_proj", m.intermediate_size, h),
            ]
        return _moe(m, base, shared="shared_experts")
    layer = "model.layers.{i}"
    # transformers' Falcon-H1 layer names its MLP feed_forward and its Mamba-2 mixer (beside the attention) mamba
    mlp = f"{layer}.feed_forward" if m.parallel_mamba else f"{layer}.mlp"
    out = _attention(m, f"{layer}.self_attn")
    if m.parallel_mamba:
        mamba = f"{layer}.mamba"
        out += [Linear(f"{mamba}.in_proj", h, m.mamba_in_proj_width), Linear(f"{mamba}.out_proj", m.mamba_inner, h)]
    if kind == "moe" and m.router_scale:
        # Gemma-4's MoE layer (AutoModel's Gemma4MoEDecoderLayer): its dense MLP is the layer's mlp, the routed
        # experts are the moe block's
        dense = [Linear(f"{mlp}.gate_proj", h, m.shared_expert_intermediate_size)]
        dense += [Linear(f"{mlp}.up_proj", h, m.shared_expert_intermediate_size)]
        dense += [Linear(f"{mlp}.down_proj", m.shared_expert_intermediate_size, h)]
        return out + dense + _moe(replace(m, shared_expert_intermediate_size=0), f"{layer}.moe", shared="")
    if kind == "moe":
        return out + _moe(m, mlp, shared="shared_experts")
    inter = m.intermediate_size
    up, down = m.mlp_names
    if m.gated_mlp:
        out += [Linear(f"{mlp}.gate_proj", h, inter), Linear(f"{mlp}.{up}", h, inter)]
    else:
        out += [Linear(f"{mlp}.{up}", h, inter)]
    out.append(Linear(f"{mlp}.{down}", inter, h))
    if m.per_layer_input:  # Gemma-4's E-series: the per-layer input's gate and projection (a layer's first layer)
        p = m.per_layer_input
        out += [Linear(f"{layer}.per_layer_input_gate", h, p), Linear(f"{layer}.per_layer_projection", p, h)]
    return out


def lora_trains(lora: Lora | None, module: str) -> bool:
    """Whether a layer's Linear named ``module`` trains (no peft:, or an adapter on it), so backward keeps its
    input."""
    return lora is None or any(name.endswith("." + module) for name in lora.adapted)


def down_adapted(m: ModelSpec, lora: Lora | None) -> bool:
    """Whether the dense MLP's down projection trains (no peft:, or LoRA on it), so backward keeps its input."""
    return lora_trains(lora, m.mlp_names[1])


def _attention(m: ModelSpec, base: str) -> list[Linear]:
    h, heads = m.hidden_size, m.num_attention_heads
    if m.hc_mult:  # DeepSeek-V4 (its first layer's kind: a sliding layer has no compressor or indexer)
        return _dsv4_attention(m, base, m.attention_kind(0))
    if m.kv_lora_rank:  # MLA (DeepSeek-V3, Kimi-K2)
        nope, rope, v = m.qk_nope_head_dim or 0, m.qk_rope_head_dim or 0, m.v_head_dim or m.hd
        q = (
            [
                Linear(f"{base}.q_a_proj", h, m.q_lora_rank),
                Linear(f"{base}.q_b_proj", m.q_lora_rank, heads * (nope + rope)),
            ]
            if m.q_lora_rank
            else [Linear(f"{base}.q_proj", h, heads * (nope + rope))]
        )
        return q + [
            Linear(f"{base}.kv_a_proj_with_mqa", h, m.kv_lora_rank + rope),
            Linear(f"{base}.kv_b_proj", m.kv_lora_rank, heads * (nope + v)),
            Linear(f"{base}.o_proj", heads * v, h),
        ]
    d, kv = m.hd, m.num_key_value_heads
    gate = [Linear(f"{base}.output_gate_proj", h, heads * d)] if m.architecture in OUTPUT_GATE_PROJ else []
    return [
        Linear(f"{base}.q_proj", h, heads * d),
        Linear(f"{base}.k_proj", h, kv * d),
        Linear(f"{base}.v_proj", h, kv * d),
        *gate,
        Linear(f"{base}.{m.o_name}", heads * d, h),
    ]


def _dsv4_attention(m: ModelSpec, base: str, kind: str) -> list[Linear]:
    """DeepSeek-V4's attention Linears (AutoModel's DeepseekV4Attention: wo_a a grouped nn.Linear of one group's
    width; the compressor's and the indexer's fp32 Linears where the layer kind has them)."""
    h, d, heads, q = m.hidden_size, m.hd, m.num_attention_heads, m.q_lora_rank or 0
    go = m.o_groups * m.o_lora_rank
    out = [
        Linear(f"{base}.wq_a", h, q),
        Linear(f"{base}.wq_b", q, heads * d),
        Linear(f"{base}.wkv", h, d),
        Linear(f"{base}.wo_a", heads * d // max(m.o_groups, 1), go),
        Linear(f"{base}.wo_b", go, h),
    ]
    width = m.dsv4_compressor_width(kind)
    if width:
        out += [Linear(f"{base}.compressor.wkv", h, width), Linear(f"{base}.compressor.wgate", h, width)]
    if kind == "csa":
        idx = f"{base}.compressor.indexer"
        ih, idim = m.index_heads, m.index_head_dim
        out += [
            Linear(f"{idx}.wq_b", q, ih * idim),
            Linear(f"{idx}.weights_proj", h, ih),
            Linear(f"{idx}.wkv", h, 2 * idim),
            Linear(f"{idx}.wgate", h, 2 * idim),
        ]
    return out


def _moe(m: ModelSpec, base: str, *, shared: str) -> list[Linear]:
    h, inter = m.hidden_size, m.moe_intermediate_size
    up = 2 * inter if m.gated_mlp else inter
    out = [Linear(f"{base}.experts", m.expert_dim, up, kind="experts")]
    if m.moe_latent_size:  # the projections into the experts' latent width and back (moe/layers.py)
        out += [
            Linear(f"{base}.fc1_latent_proj", h, m.moe_latent_size),
            Linear(f"{base}.fc2_latent_proj", m.moe_latent_size, h),
        ]
    s = m.shared_expert_intermediate_size
    if s:
        if m.gated_mlp:
            out += [Linear(f"{base}.{shared}.gate_proj", h, s), Linear(f"{base}.{shared}.up_proj", h, s)]
        else:
            out += [Linear(f"{base}.{shared}.up_proj", h, s)]
        out.append(Linear(f"{base}.{shared}.down_proj", s, h))
    return out


def _patterns(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(str(v)[:MAX_PATTERN_CHARS] for v in value[:MAX_PATTERNS] if isinstance(v, str))


def lora_of(m: ModelSpec, peft: Mapping[str, Any], quantization: Mapping[str, Any] | None = None) -> Lora:
    """The adapters a ``peft:`` section (PeftConfig's keys) adds to ``m``."""
    dim = peft.get("dim", 8)
    dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else 8
    targets, excludes = _patterns(peft.get("target_modules")), _patterns(peft.get("exclude_modules"))
    match_all = peft.get("match_all_linear") is True
    if not (match_all or targets or excludes):
        targets = DEFAULT_TARGETS
    moe_dim = dim
    if peft.get("moe_rank_scaling") is True and m.experts_per_token:
        moe_dim = max(dim // m.experts_per_token, 1)
    p_drop = peft.get("dropout", 0.0)
    dropout = isinstance(p_drop, (int, float)) and not isinstance(p_drop, bool) and p_drop > 0
    pre = peft.get("dropout_position") == "pre"
    per_layer, adapted_weights, adapted, per_experts, dropout_bytes, dropout_rowwise = [], [], [], [], [], []
    per_whole = []
    for kind in sorted(set(m.layer_kind(i) for i in range(m.num_layers))):
        first = next(i for i in range(m.num_layers) if m.layer_kind(i) == kind)
        params = weights = experts = kept = rowwise = whole = 0.0
        for lin in layer_modules(m, kind):
            name = lin.name.format(i=first)
            if not _matches(name, targets, excludes, match_all, lin.kind):
                continue
            adapted.append(name)
            if lin.kind == "experts":
                inter = m.moe_intermediate_size
                experts += m.num_experts * moe_dim * (lin.fan_in + lin.fan_out + inter + m.expert_dim)
            else:
                params += dim * (lin.fan_in + lin.fan_out)
                whole += dim * (lin.fan_in + lin.fan_out) if _tp_whole(name) else 0
                weights += lin.fan_in * lin.fan_out
                if dropout:
                    mask = 3 * lin.fan_in if pre else lin.fan_out
                    kept += mask
                    # (full width on every TP rank: a row-parallel Linear's output, and Falcon-H1's Mamba mixer's
                    # input or output, which AutoModel's TP plan leaves whole)
                    if _tp_whole(name) or (not pre and name.endswith(_ROW_PARALLEL)):
                        rowwise += mask
        per_layer.append((kind, params + experts))
        per_experts.append((kind, experts))
        adapted_weights.append((kind, weights))
        dropout_bytes.append((kind, kept))
        dropout_rowwise.append((kind, rowwise))
        per_whole.append((kind, whole))
    lm_head = 0.0
    if _matches("lm_head", targets, excludes, match_all, "linear"):
        lm_head = dim * (m.hidden_size + m.vocab_size)
        adapted.append("lm_head")
    bits = None
    if isinstance(quantization, Mapping):
        bits = (
            4 if quantization.get("load_in_4bit") is True else 8 if quantization.get("load_in_8bit") is True else None
        )
    return Lora(
        dim,
        tuple(per_layer),
        lm_head,
        tuple(adapted),
        tuple(adapted_weights),
        bits,
        per_layer_experts=tuple(per_experts),
        dropout_per_layer=tuple(dropout_bytes),
        dropout_rowwise_per_layer=tuple(dropout_rowwise),
        per_layer_whole=tuple(per_whole),
    )


def quantized_linear_weights(m: ModelSpec, *, experts: bool = True) -> float:
    """Weights of the Linear modules bitsandbytes quantizes (every layer Linear and, with ``experts``, the routed
    experts; the embedding, lm_head and norms stay in the compute dtype). transformers' MoE classes hold their routed
    experts as 3D parameters, not Linear modules, which bitsandbytes leaves as they are (``experts=False``)."""
    total = 0.0
    for i in range(m.num_layers):
        for lin in layer_modules(m, m.layer_kind(i)):
            if lin.kind == "experts":
                total += m.num_experts * m.expert_params() if experts else 0.0
            else:
                total += lin.fan_in * lin.fan_out
    return total


def describe(lora: Lora, m: ModelSpec) -> str:
    """One line: what is adapted and how many parameters train."""
    names = sorted({n.rsplit(".", 1)[-1] for n in lora.adapted})
    total = lora.total(m)
    share = total / m.param_count() if m.param_count() else 0.0
    return (
        f"LoRA dim {lora.dim} on {', '.join(names) or 'no module'}: {total:,.0f} trainable parameters "
        f"({share:.2%} of {m.param_count():,.0f})"
    )


__all__ = [
    "DEFAULT_TARGETS",
    "Linear",
    "Lora",
    "QLORA_BYTES",
    "describe",
    "layer_modules",
    "lora_of",
    "quantized_linear_weights",
    "wildcard_match",
]
