"""Apply a layout to the tiny model with torch's own APIs, the way AutoModel's FSDP2 path does:
meshes (init_device_mesh, _flatten, _unflatten) -> TP plan -> (CP at run time) -> EP -> activation
checkpointing -> fully_shard per block and root; DDP for ``ddp``; pipeline stages for pp > 1."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..dims import block_reshard
from ..layout import Layout
from .tiny_models import MoE, TinyLM


@dataclass
class Meshes:
    """Every mesh the worker built, by AutoModel axis name."""

    root: DeviceMesh | None = None
    moe: DeviceMesh | None = None
    axes: dict[str, DeviceMesh] = field(default_factory=dict)
    fsdp: DeviceMesh | None = None

    def group_ranks(self, name: str) -> list[int]:
        return dist.get_process_group_ranks(self.axes[name].get_group())


def _unflatten(flat: DeviceMesh, sizes: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
    if hasattr(flat, "_unflatten"):  # torch >= 2.10
        return flat._unflatten(0, sizes, names)
    return DeviceMesh(flat.device_type, flat.mesh.reshape(sizes), mesh_dim_names=names)  # pragma: no cover


def build_meshes(layout: Layout, device_type: str) -> Meshes:
    """AutoModel's meshes, built with torch from the engine's layout (``mesh_utils.py``)."""
    out = Meshes()
    dims = layout.device_mesh()
    if dims is None:  # DDP
        return out
    names, shape = tuple(dims[0]), tuple(dims[1])
    root = init_device_mesh(device_type, shape, mesh_dim_names=names)
    out.root = root
    for n in names:
        out.axes[n] = root[n]
    for flat_name, sources in layout.flattened().items():
        out.axes[flat_name] = root[tuple(sources)]._flatten(mesh_dim_name=flat_name)
    if layout.strategy == "fsdp2":
        if layout.ep > 1:
            non_pp = root[("dp_replicate", "dp_shard", "cp", "tp")]._flatten()
            out.moe = _unflatten(non_pp, (layout.ep_shard, layout.ep), ("ep_shard", "ep"))
            out.axes["ep_shard"], out.axes["ep"] = out.moe["ep_shard"], out.moe["ep"]
        fsdp_dims = layout.fsdp_mesh() or ["dp_shard"]
        if fsdp_dims == ["dp_replicate", "dp_shard_cp"]:  # get_submesh: unflatten the flattened dp_cp
            out.fsdp = _unflatten(
                out.axes["dp_cp"], (layout.dp_replicate, layout.dp_shard * layout.cp), ("dp_replicate", "dp_shard_cp")
            )
        elif len(fsdp_dims) == 2:
            out.fsdp = root[tuple(fsdp_dims)]
        else:
            out.fsdp = out.axes[fsdp_dims[0]]
    return out


def mesh_mismatches(meshes: Meshes, layout: Layout, rank: int) -> dict[str, dict[str, list[int]]]:
    """Axes whose torch process-group ranks differ from the engine's groups for ``rank``."""
    expected = layout.rank_groups(rank) or {}
    bad = {}
    for axis, ranks in expected.items():
        got = meshes.group_ranks(axis) if axis in meshes.axes else None
        if got != ranks:
            bad[axis] = {"engine": ranks, "torch": got or []}
    return bad


# --------------------------------------------------------------------------- tensor parallel
def apply_tp(model: TinyLM, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Colwise/Rowwise plan (plus SequenceParallel norms and sequence-sharded residuals with SP)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    top: dict[str, Any] = {}
    if model.embed_tokens is not None:
        top["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.lm_head is not None:
        top["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
        if sp:
            top["norm"] = SequenceParallel()
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
            plan["self_attn"] = PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            )
        if isinstance(block.mlp, MoE):  # experts are EP-sharded, not TP: the MoE sees whole tokens
            if sp:
                plan["mlp"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
                )
                parallelize_module(block, tp_mesh, plan)
                parallelize_module(
                    block.mlp,
                    tp_mesh,
                    PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),)),
                )
                continue
        else:
            plan.update(
                {
                    "mlp.gate_proj": ColwiseParallel(),
                    "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel(output_layouts=seq),
                }
            )
            if sp:
                plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)


# --------------------------------------------------------------------------- expert parallel
def apply_ep(model: TinyLM, ep_mesh: DeviceMesh) -> list[nn.Parameter]:
    """Keep this EP rank's experts; returns the expert parameters (FSDP'd on ep_shard separately)."""
    params = []
    for block in model.layers.values():
        if isinstance(block.mlp, MoE):
            block.mlp.enable_expert_parallel(ep_mesh.get_group(), ep_mesh.get_local_rank(), ep_mesh.size())
            params += list(block.mlp.experts.parameters())
    return params


# --------------------------------------------------------------------------- activation checkpointing
def apply_ac(model: TinyLM, mode: bool | str) -> None:
    """Full (non-reentrant checkpoint_wrapper) or selective (save matmul outputs) per block."""
    if not mode:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    kwargs: dict[str, Any] = {"checkpoint_impl": CheckpointImpl.NO_REENTRANT}
    if mode == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        save = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default}

        def policy(ctx: Any, op: Any, *args: Any, **kw: Any) -> CheckpointPolicy:
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, policy)
    for key, block in list(model.layers.items()):
        model.layers[key] = checkpoint_wrapper(block, **kwargs)


# --------------------------------------------------------------------------- FSDP2 / DDP
def apply_fsdp(
    model: TinyLM,
    mesh: DeviceMesh,
    *,
    mp: dict[str, Any] | None,
    reshard: bool | None,
    moe_reshard: bool = False,
    ep: int = 1,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """fully_shard each block, then the root, on AutoModel's data-parallel mesh (HSDP when 2-D), resharding after
    forward as AutoModel 0.7.0 does (``block_reshard``: with EP every block and the experts follow
    ``reshard``/``moe_reshard``, else every block but the last reshards; PP changes nothing).

    With EP the experts are sharded on ep_shard first (their own FSDP unit, averaging over
    ep_shard); ``scale_expert_grads`` then completes the 1/(dp*cp*tp) average.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(**_mp(mp)) if mp else MixedPrecisionPolicy()
    chosen = block_reshard(reshard, moe_reshard, ep)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        rfa = chosen if chosen is not None else i < len(blocks) - 1
        if expert_mesh is not None:
            for sub in block.modules():
                if isinstance(sub, MoE):  # dim 1, as AutoModel's _moe_shard_placement: shards may outnumber experts
                    fully_shard(
                        sub.experts,
                        mesh=expert_mesh,
                        mp_policy=policy,
                        reshard_after_forward=rfa,
                        shard_placement_fn=_expert_placement,
                    )
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=rfa)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


def _expert_placement(param: nn.Parameter) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(0) if param.ndim < 2 else Shard(1)


def scale_expert_grads(expert_params: list[nn.Parameter], factor: float) -> None:
    """Expert grads sum every EP peer's tokens; divide so all parameters see the same global mean.

    (torchtitan/AutoModel use FSDP's gradient divide factor, i.e. NCCL PreMulSum, which gloo lacks.)
    """
    with torch.no_grad():
        for p in expert_params:
            if p.grad is not None:
                local_tensor(p.grad).mul_(factor)


def _mp(mp: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("param_dtype", "reduce_dtype", "output_dtype"):
        if mp.get(key):
            out[key] = getattr(torch, mp[key])
    out["cast_forward_inputs"] = bool(mp.get("cast_forward_inputs", False))
    return out


def apply_ddp(model: nn.Module, options: dict[str, Any], device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    keys = ("broadcast_buffers", "find_unused_parameters", "static_graph", "bucket_cap_mb", "gradient_as_bucket_view")
    kwargs = {k: options[k] for k in keys if options.get(k) is not None}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def clean_name(name: str) -> str:
    """Parameter name without wrapper prefixes (DDP module., checkpoint wrapper, torch.compile)."""
    for junk in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(junk, "")
    return name.removeprefix("module.")


def skew_gradients(params: list[torch.nn.Parameter], seed: int, factor: float, device: torch.device) -> None:
    """The ``skew`` fault: seeded noise at ``factor`` x each local gradient's RMS, added on this rank only."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                g = local_tensor(p.grad)
                g.add_(
                    torch.randn(g.shape, generator=gen, device=device, dtype=g.dtype)
                    * factor
                    * g.float().pow(2).mean().sqrt().to(g.dtype)
                )
