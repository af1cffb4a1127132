"""Measure per-rank memory with torch's own tracker, on fake tensors (tests and bench only).

``measure(...)`` builds a Llama-style model of real size under ``FakeTensorMode`` on a fake process
group of the target world size (nothing is allocated), applies the parallelism with the smoke
runner's own code (TP/SP plan, activation checkpointing, FSDP2 / HSDP on AutoModel's meshes, EP
experts), runs forward, backward and an AdamW step under ``FSDPMemTracker`` and returns rank 0's
peak and its model states, in bytes. ``estimate_fsdp2(...)`` is the engine's estimate of the same
layout, for comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from automodel_dist.dims import ParallelDims
from automodel_dist.estimate.memory import MemoryBreakdown, Training, memory_per_rank
from automodel_dist.layout import Layout


def estimate_fsdp2(
    spec: Any,
    *,
    world_size: int,
    tp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp_replicate: int = 1,
    seq_len: int = 2048,
    activation_checkpointing: bool | str = False,
    sequence_parallel: bool = False,
    storage_dtype: str = "float32",
    num_layers: int | None = None,
) -> MemoryBreakdown:
    """The engine's per-rank estimate for the FSDP2 layout ``measure`` builds with the same arguments."""
    if num_layers:
        spec = dataclasses.replace(spec, num_layers=num_layers)
    p = ParallelDims(
        "fsdp2",
        world_size=world_size,
        dp_replicate=dp_replicate,
        tp=tp,
        cp=cp,
        ep=ep,
        sequence_parallel=sequence_parallel,
        activation_checkpointing=activation_checkpointing,
    )
    return memory_per_rank(spec, p, Training(seq_len=seq_len, storage_dtype=storage_dtype))


@dataclass
class Measured:
    params: float
    grads: float
    optimizer: float
    peak: float
    categories: dict[str, float]
    after_forward: dict[str, float]

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer


def _cfg(spec: Any) -> Any:
    from automodel_dist.smoke.tiny_models import TinyConfig

    return TinyConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_key_value_heads,
        head_dim=spec.hd,
        intermediate_size=spec.intermediate_size,
        num_experts=spec.num_experts,
        top_k=spec.experts_per_token or 2,
        moe_intermediate_size=spec.moe_intermediate_size or 1,
        shared_expert=spec.shared_expert_intermediate_size > 0,
        tie_word_embeddings=spec.tie_word_embeddings,
        balanced_routing=True,
    )


@contextlib.contextmanager
def _private_propagation_fake_mode():
    """DTensor's sharding propagation runs ops on global-shape fake tensors under
    ``detect_fake_mode() or FakeTensorMode()``; under our outer fake mode that would be ours, and the
    tracker would charge those scratch tensors as allocations. Give propagation its own fake mode
    (the tracker skips ops from a fake mode other than its entry mode, as it does in eager runs)."""
    import torch.distributed.tensor._sharding_prop as sp
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = sp.detect_fake_mode
    concatenate = DeviceMesh.__dict__["_concatenate"]

    def real_concatenate(*args, **kwargs):  # FSDP2+TP builds a DP x TP mesh: its rank tensor must be real
        with unset_fake_temporarily():
            return concatenate.__func__(*args, **kwargs)

    sp.detect_fake_mode = lambda *a, **k: None
    DeviceMesh._concatenate = staticmethod(real_concatenate)
    try:
        yield
    finally:
        sp.detect_fake_mode = original
        DeviceMesh._concatenate = concatenate


def measure(
    spec: Any,
    *,
    world_size: int,
    tp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp_replicate: int = 1,
    seq_len: int = 2048,
    micro_batch: int = 1,
    activation_checkpointing: bool | str = False,
    sequence_parallel: bool = False,
    storage_dtype: str = "float32",
    compute_dtype: str = "bfloat16",
    num_layers: int | None = None,
) -> Measured:
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from automodel_dist.smoke import parallelize as par
    from automodel_dist.smoke.tiny_models import TinyLM, loss_fn

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        lay = Layout.build("fsdp2", world_size=world_size, tp=tp, cp=cp, ep=ep, dp_replicate=dp_replicate)
        meshes = par.build_meshes(lay, "cpu")  # real (tiny) mesh tensors: outside the fake mode
        cfg = _cfg(spec)
        if num_layers is not None:
            cfg.num_layers = num_layers
        mp = {"param_dtype": compute_dtype, "reduce_dtype": "float32"} if compute_dtype != storage_dtype else None
        with warnings.catch_warnings(), _private_propagation_fake_mode(), FakeTensorMode(allow_non_fake_inputs=True):
            warnings.simplefilter("ignore")
            torch.set_default_dtype(getattr(torch, storage_dtype))
            try:
                model = TinyLM(cfg)
            finally:
                torch.set_default_dtype(torch.float32)
            if tp > 1:
                par.apply_tp(model, meshes.axes["tp"], sequence_parallel=sequence_parallel)
            if ep > 1:
                par.apply_ep(model, meshes.moe["ep"])
            par.apply_ac(model, activation_checkpointing)
            par.apply_fsdp(
                model, meshes.fsdp, mp=mp, reshard=None, ep=ep, expert_mesh=meshes.moe["ep_shard"] if ep > 1 else None
            )
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            local_seq = seq_len // cp
            ids = torch.randint(0, cfg.vocab_size, (micro_batch, local_seq))
            for p in model.parameters():  # optimizer states exist before the tracked step, as in training
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tracker = FSDPMemTracker(model, opt)  # registers the existing states at entry
            tracker.track_inputs((ids,))
            with tracker, sdpa_kernel(SDPBackend.FLASH_ATTENTION) if cp == 1 else contextlib.nullcontext():
                loss = loss_fn(model(ids), ids)
                snap = tracker.get_tracker_snapshot("current")
                after_forward = {str(k).split(".")[-1]: float(v) for k, v in snap[next(iter(snap))].items()}
                loss.backward()
                opt.step()
            peak = tracker.get_tracker_snapshot("peak")
            now = tracker.get_tracker_snapshot("current")
        dev = next(iter(peak))
        cats = {str(k).split(".")[-1]: float(v) for k, v in peak[dev].items()}
        cur = {str(k).split(".")[-1]: float(v) for k, v in now[dev].items()}
        return Measured(
            params=cur.get("SHARDED_PARAM", 0.0),
            grads=cur.get("SHARDED_GRAD", 0.0),
            optimizer=cur.get("OPT", 0.0),
            peak=cats["Total"],
            categories=cats,
            after_forward=after_forward,
        )
    finally:
        dist.destroy_process_group()
