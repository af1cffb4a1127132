"""Tiny model dimensions for a layout (pure: the parent plans without importing torch)."""

from __future__ import annotations

from typing import Any


def tiny_config(*, tp: int, stages: int, ep: int, moe: bool) -> dict[str, Any]:
    """Smallest model whose heads, kv heads, experts, vocab and layers divide by tp, ep and the stages."""
    kv = max(2, tp)
    heads = 2 * kv
    head_dim = 8
    hidden = heads * head_dim
    return {
        "vocab_size": 32 * max(tp, 2),
        "hidden_size": hidden,
        "num_layers": max(2, stages),
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": 2 * hidden,
        "num_experts": max(4, 2 * ep) if moe else 0,
        "top_k": 2,
        "moe_intermediate_size": hidden,
        "shared_expert": True,
    }


def param_count(cfg: dict[str, Any]) -> int:
    """Parameters of the tiny model (to enforce the CPU size limit before launching)."""
    h, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_layers"]
    q, kv = cfg["num_heads"] * cfg["head_dim"], cfg["num_kv_heads"] * cfg["head_dim"]
    attn = h * q + 2 * h * kv + q * h
    if cfg["num_experts"]:
        i = cfg["moe_intermediate_size"]
        mlp = cfg["num_experts"] * 3 * h * i + cfg["num_experts"] * h + (3 * h * i if cfg["shared_expert"] else 0)
    else:
        mlp = 3 * h * cfg["intermediate_size"]
    return 2 * v * h + layers * (attn + mlp + 2 * h) + h
