"""The built-in catalogs as one report: ``list_models`` over MCP and ``automodel-dist models``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from .gpus import GPU, gpu_catalog

if TYPE_CHECKING:
    from .models import ModelSpec


class ModelEntry(BaseModel):
    name: str = Field(description="Hugging Face repo id (matched case-insensitively, aliases too).")
    params: int
    active_params: int = Field(description="Parameters one token passes through (MoE: routed experts per token).")
    published_params: float | None = Field(default=None, description="The publisher's total, for comparison.")
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int
    experts_per_token: int
    architecture: str | None = Field(
        default=None,
        description="The class AutoModel builds: config.json architectures[0], or the class AutoModel resolves for the "
        "config where that name is shared (Mistral3FP8VLMForConditionalGeneration for a Mistral3 with a ministral3 "
        "text model).",
    )
    layer_types: dict[str, int] | None = Field(
        default=None, description="Hybrid models (Nemotron-H): layers per mixer (mamba, attention, mlp, moe)."
    )

    @classmethod
    def of(cls, m: ModelSpec) -> ModelEntry:
        return cls(
            name=m.name,
            params=m.param_count(),
            active_params=m.active_param_count(),
            published_params=m.published_params,
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            head_dim=m.hd,
            intermediate_size=m.intermediate_size,
            vocab_size=m.vocab_size,
            num_experts=m.num_experts,
            experts_per_token=m.experts_per_token,
            architecture=m.architecture,
            layer_types=m.layer_mix,
        )


class GpuEntry(BaseModel):
    name: str
    memory_gib: float
    bf16_tflops: float = Field(description="Dense bf16 peak (no sparsity).")
    intra_gbps: float = Field(
        description="GB/s per GPU, one direction, inside a node (NVLink / PCIe): the estimates' default."
    )
    inter_gbps: float = Field(
        description="GB/s per GPU, one direction, between nodes (its NIC): the estimates' default."
    )
    gpus_per_node: int
    interconnect: str

    @classmethod
    def of(cls, g: GPU) -> GpuEntry:
        return cls(
            name=g.name,
            memory_gib=g.memory_gib,
            bf16_tflops=g.bf16_tflops,
            intra_gbps=g.intra_gbps,
            inter_gbps=g.inter_gbps,
            gpus_per_node=g.gpus_per_node,
            interconnect=g.interconnect,
        )


class Catalogs(BaseModel):
    models: list[ModelEntry]
    gpus: list[GpuEntry]


def catalogs() -> Catalogs:
    """Every built-in model and GPU, as ``--model`` and ``--gpu`` (``model`` and ``gpu``) accept them."""
    from .models import catalog

    return Catalogs(models=[ModelEntry.of(m) for m in catalog()], gpus=[GpuEntry.of(g) for g in gpu_catalog()])
