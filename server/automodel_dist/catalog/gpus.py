"""GPU types: memory, dense bf16 peak, and default interconnect bandwidths (per GPU, one direction)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense (no sparsity)
    intra_gbps: float  # GB/s per GPU inside a node (NVLink / PCIe)
    inter_gbps: float  # GB/s per GPU between nodes (its NIC)
    gpus_per_node: int = 8
    interconnect: str = ""
    nics_per_node: int = 8  # NICs of inter_gbps each: NCCL runs one ring per NIC between nodes


_GPUS = [
    GPU("A100-40GB", 40.0, 312.0, 300.0, 25.0, 8, "NVLink 3 (600 GB/s bidirectional), HDR 200 Gb/s per GPU"),
    GPU("A100-80GB", 80.0, 312.0, 300.0, 25.0, 8, "NVLink 3 (600 GB/s bidirectional), HDR 200 Gb/s per GPU"),
    GPU("H100-80GB", 79.6, 989.0, 450.0, 50.0, 8, "NVLink 4 (900 GB/s bidirectional), NDR 400 Gb/s per GPU"),
    GPU("H200-141GB", 140.4, 989.0, 450.0, 50.0, 8, "NVLink 4 (900 GB/s bidirectional), NDR 400 Gb/s per GPU"),
    GPU("B200", 178.0, 2250.0, 900.0, 50.0, 8, "NVLink 5 (1.8 TB/s bidirectional), 400 Gb/s per GPU"),
    GPU("GB200", 184.0, 2500.0, 900.0, 100.0, 72, "NVL72: 72 GPUs in one NVLink 5 domain, 800 Gb/s per GPU", 72),
    GPU("L40S", 44.7, 362.0, 32.0, 12.5, 8, "PCIe Gen4 x16, 100 Gb/s Ethernet", 8),
]
_ALIASES = {
    "A100": "A100-80GB",
    "H100": "H100-80GB",
    "H200": "H200-141GB",
    "H100-SXM": "H100-80GB",
    "B200-180GB": "B200",
    "GB200-NVL72": "GB200",
}


def gpu_catalog() -> list[GPU]:
    return list(_GPUS)


def lookup_gpu(name: str) -> GPU:
    """A GPU by name (case-insensitive; e.g. H100, H100-80GB, a100-40gb)."""
    key = name.strip().upper()
    key = _ALIASES.get(key, key)
    for g in _GPUS:
        if g.name.upper() == key:
            return g
    hint = difflib.get_close_matches(name.upper(), [g.name.upper() for g in _GPUS], n=2, cutoff=0.4)
    raise ValueError(
        f"unknown GPU {name!r}; known: {', '.join(g.name for g in _GPUS)}"
        + (f" (did you mean {', '.join(hint)}?)" if hint else "")
    )
