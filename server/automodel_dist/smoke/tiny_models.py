"""Tiny Llama-style decoders (dense and MoE) sized to fit any requested tp/ep/pp/cp.

Structure mirrors HF Llama naming (embed_tokens, layers.N.self_attn.{q,k,v,o}_proj,
layers.N.mlp.{gate,up,down}_proj, norm, lm_head) so TP plans read like AutoModel's. Expert
parallelism lives in :class:`MoE`: each EP rank owns a contiguous slice of the experts and
tokens travel with autograd-aware all_to_all.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyConfig:
    vocab_size: int = 128
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    intermediate_size: int = 64
    num_experts: int = 0  # 0 = dense
    top_k: int = 2
    moe_intermediate_size: int = 32
    shared_expert: bool = True  # sizes come from smoke.model_size.tiny_config
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    balanced_routing: bool = False  # static round-robin expert assignment (memory measurement on fake tensors)

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding for x: (batch, seq, heads, head_dim), positions: (batch, seq)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # (b, s, d/2)
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.cp: tuple[int, int, bool] | None = None  # (cp rank, cp size, head-tail load balanced)

    def positions_for(self, b: int, s: int, device: torch.device) -> torch.Tensor:
        """Global positions of the local tokens: all of them, or this rank's CP chunk(s)."""
        if self.cp is None:
            return torch.arange(s, device=device).expand(b, -1)
        rank, size, balanced = self.cp
        if not balanced:  # contiguous chunks
            return (rank * s + torch.arange(s, device=device)).expand(b, -1)
        half = s // 2  # head-tail: chunks rank and 2*size-1-rank
        first = rank * half + torch.arange(half, device=device)
        second = (2 * size - 1 - rank) * half + torch.arange(half, device=device)
        return torch.cat([first, second]).expand(b, -1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        if positions is None:  # whole sequence (SP gathers it before attention) or this CP chunk
            positions = self.positions_for(b, s, x.device)
        # Head counts come from the (possibly TP-sharded) projections' local outputs.
        q = self.q_proj(x).view(b, s, -1, self.head_dim)
        k = self.k_proj(x).view(b, s, -1, self.head_dim)
        v = self.v_proj(x).view(b, s, -1, self.head_dim)
        q, k = rope(q, positions, self.theta), rope(k, positions, self.theta)
        rep = q.shape[2] // k.shape[2]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """Stacked SwiGLU experts: this rank's ``[first, first + local)`` slice of ``num_experts``."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.num_experts, self.first = num_experts, 0
        self.gate_up = nn.Parameter(torch.empty(num_experts, hidden, 2 * inter))
        self.down = nn.Parameter(torch.empty(num_experts, inter, hidden))
        nn.init.normal_(self.gate_up, std=hidden**-0.5)
        nn.init.normal_(self.down, std=inter**-0.5)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens sorted by local expert; counts: tokens per local expert."""
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start : start + n]
            g, u = (xe @ self.gate_up[e]).chunk(2, dim=-1)
            outs.append((F.silu(g) * u) @ self.down[e])
            start += n
        return torch.cat(outs) if outs else x[:0]


class MoE(nn.Module):
    """Top-k router, routed experts (optionally expert-parallel) and an optional shared expert."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.balanced = cfg.balanced_routing
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = MLP(cfg.hidden_size, cfg.moe_intermediate_size) if cfg.shared_expert else None
        self.ep_group = None  # set by enable_expert_parallel
        self.ep_size = 1

    def enable_expert_parallel(self, group, ep_rank: int, ep_size: int) -> None:
        """Keep only this EP rank's experts (a slice of the full, identically seeded init)."""
        e = self.experts
        local = e.num_experts // ep_size
        e.first = ep_rank * local
        e.gate_up = nn.Parameter(e.gate_up.detach()[e.first : e.first + local].clone())
        e.down = nn.Parameter(e.down.detach()[e.first : e.first + local].clone())
        self.ep_group, self.ep_size = group, ep_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        logits = self.router(tokens).float()
        num_experts = self.experts.num_experts
        weights, chosen = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        if self.balanced:  # shapes only: every expert gets the same share, no data-dependent sizes
            n = tokens.shape[0] * self.top_k
            chosen = (torch.arange(n, device=x.device) % num_experts).view(-1, self.top_k)
            counts_list = [n // num_experts + (1 if e < n % num_experts else 0) for e in range(num_experts)]
        weights = (weights / weights.sum(-1, keepdim=True)).type_as(x)
        flat_expert = chosen.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)
        routed = tokens.repeat_interleave(self.top_k, dim=0)[order]
        if self.balanced:
            counts = torch.tensor(counts_list, device=x.device)
        else:
            counts = torch.bincount(flat_expert, minlength=num_experts)
            counts_list = counts.tolist()
        if self.ep_group is None:
            out_sorted = self.experts(routed, counts_list)
        else:
            out_sorted = self._dispatch(routed, counts, num_experts, counts_list)
        out = torch.empty_like(out_sorted)
        out[order] = out_sorted
        combined = (out.view(-1, self.top_k, h) * weights.unsqueeze(-1)).sum(1)
        if self.shared_expert is not None:
            combined = combined + self.shared_expert(tokens)
        return combined.view(b, s, h)

    def _dispatch(
        self, routed: torch.Tensor, counts: torch.Tensor, num_experts: int, counts_list: list[int]
    ) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, local = self.ep_size, num_experts // self.ep_size
        send = [counts_list[r * local : (r + 1) * local] for r in range(ep)]  # per destination rank
        if self.balanced:  # every rank routes identically: what it sends is what it receives
            per_src = send
        else:
            send_per_rank = counts.view(ep, local)
            recv_counts = torch.empty_like(send_per_rank)
            dist.all_to_all_single(recv_counts, send_per_rank, group=self.ep_group)  # (src rank, local expert)
            per_src = recv_counts.tolist()
        send_splits = [sum(x) for x in send]
        recv_splits = [sum(x) for x in per_src]
        received = all_to_all_single_autograd(routed, recv_splits, send_splits, self.ep_group)
        # Group received tokens by local expert (they arrive grouped by source rank).
        chunks = list(received.split(recv_splits))
        pieces = [[] for _ in range(local)]
        for src, chunk in enumerate(chunks):
            for e, part in enumerate(chunk.split(per_src[src])):
                pieces[e].append((src, part))
        by_expert = torch.cat([p for e in range(local) for _, p in pieces[e]])
        expert_counts = [sum(per_src[src][e] for src in range(ep)) for e in range(local)]
        out = self.experts(by_expert, expert_counts)
        # Undo the grouping: back to (source rank, local expert) order, then return to senders.
        parts = list(out.split(expert_counts))
        back, offsets = [], [0] * local
        for src in range(ep):
            for e in range(local):
                n = per_src[src][e]
                back.append(parts[e][offsets[e] : offsets[e] + n])
                offsets[e] += n
        returned = torch.cat(back)
        return all_to_all_single_autograd(returned, send_splits, recv_splits, self.ep_group)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size)
        self.mlp = MoE(cfg) if cfg.num_experts else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLM(nn.Module):
    """embed_tokens -> layers -> norm -> lm_head; any part may be absent (pipeline stages)."""

    def __init__(self, cfg: TinyConfig, layer_ids: list[int] | None = None, *, first: bool = True, last: bool = True):
        super().__init__()
        self.cfg = cfg
        ids = list(range(cfg.num_layers)) if layer_ids is None else layer_ids
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in ids})
        self.norm = RMSNorm(cfg.hidden_size) if last else None
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if last else None
        if cfg.tie_word_embeddings and first and last:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: global token positions (needed under CP); None means 0..seq-1."""
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        for layer in self.layers.values():
            h = layer(h, positions)
        if self.norm is not None:
            h = self.lm_head(self.norm(h))
        return h


def build_full(cfg: TinyConfig, seed: int) -> TinyLM:
    """The whole model, identically initialised on every rank (same seed)."""
    torch.manual_seed(seed)
    model = TinyLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "experts" not in name:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def synthetic_batch(cfg: TinyConfig, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded token ids and next-token labels (a learnable pattern: label = (token + 1) % vocab)."""
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    return ids, (ids + 1) % cfg.vocab_size
