"""torchrun worker for test_estimate: what an FSDP2 pipeline stage holds between microbatches (4 gloo ranks, pp=2 x dp=2).

Three FSDP2 blocks (bf16 compute, fp32 reduce: AutoModel's mixed precision), the first two resharding after forward,
run by torch's own Schedule1F1B over 4 microbatches. Before and after each forward it records the bytes of unsharded
accumulated gradients and of gathered parameters the stage holds, and after the step the receive buffers torch's stage
keeps (per microbatch: inputs, output gradients); rank 0 and rank 2 (one per stage) print them as JSON.
MODES (comma-separated): torch = torch's stage backward (AutoModel's default), automodel-defer /
automodel-eager = AutoModel 0.7.0's patched one with defer_fsdp_grad_sync true / false.
"""

from __future__ import annotations

import json
import os
import types

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

H = 64


def held(blocks: nn.Module) -> tuple[int, int]:
    grads = gathered = 0
    for m in blocks.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        group = state._fsdp_param_group if state is not None else None
        for p in group.fsdp_params if group is not None else ():
            if p.unsharded_accumulated_grad is not None:
                grads += p.unsharded_accumulated_grad.numel() * p.unsharded_accumulated_grad.element_size()
            unsharded = getattr(p, "_unsharded_param", None)
            if unsharded is not None:
                gathered += unsharded.untyped_storage().size()
    return grads, gathered


def run(mode: str, mesh) -> dict:
    stage_index = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Linear(H, H) for _ in range(3)])
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=i < 2)
    fully_shard(blocks, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
    log: list[tuple[int, int]] = []
    after: list[tuple[int, int]] = []
    blocks[0].register_forward_pre_hook(lambda *_: log.append(held(blocks)))
    blocks[-1].register_forward_hook(lambda *_: after.append(held(blocks)))  # the earlier blocks' own hooks ran
    stage = PipelineStage(
        blocks, stage_index=stage_index, num_stages=2, device=torch.device("cpu"), group=mesh["pp"].get_group()
    )
    if mode != "torch":  # AutoModel 0.7.0's own stage backward, installed as its pipeline_model does
        from nemo_automodel.components.moe.fsdp_mixin import patched_backward_maybe_with_nosync

        stage.backward_maybe_with_nosync = types.MethodType(patched_backward_maybe_with_nosync, stage)
        stage._reduce_grad_per_microbatch = mode == "automodel-eager"  # = not defer_fsdp_grad_sync
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, target: ((out.float() - target) ** 2).mean())
    x, y = torch.randn(8, H), torch.randn(8, H)
    schedule.step(x) if stage_index == 0 else schedule.step(target=y)
    log.append(held(blocks))
    full = sum(p.numel() for p in blocks.parameters())  # DTensors: the global (unsharded) element count

    def buffers(infos: dict) -> list[int]:
        return [i.buffer.numel() * i.buffer.element_size() for r in infos.values() for i in r if i.buffer is not None]

    return {
        "mode": mode,
        "stage": stage_index,
        "elements": full,
        "held": log,
        "after_forward": after,
        "input_buffers": buffers(stage.args_recv_info),
        "grad_buffers": buffers(stage.grad_recv_info),
    }


def run_interleaved(stages_per_rank: int, mesh, eager: bool = False) -> dict:
    """torch's ScheduleInterleaved1F1B over ``stages_per_rank`` stages a rank of the same three blocks, 8 microbatches,
    two steps: the gathered blocks of all the rank's stages (in blocks) before and after each backward of the second
    step. ``eager``: AutoModel 0.7.0's own stage backward with defer_fsdp_grad_sync false (a reduce-scatter and a
    reshard after every backward)."""
    rank = mesh["pp"].get_local_rank()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    parts, stages = [], []
    for k in range(stages_per_rank):
        torch.manual_seed(k)
        blocks = nn.Sequential(*[nn.Linear(H, H) for _ in range(3)])
        for i, block in enumerate(blocks):
            fully_shard(block, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=i < 2)
        fully_shard(blocks, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
        parts.append(blocks)
        stages.append(
            PipelineStage(
                blocks,
                stage_index=2 * k + rank,
                num_stages=2 * stages_per_rank,
                device=torch.device("cpu"),
                group=mesh["pp"].get_group(),
            )
        )
    if eager:
        from nemo_automodel.components.moe.fsdp_mixin import patched_backward_maybe_with_nosync

        for stage in stages:
            stage.backward_maybe_with_nosync = types.MethodType(patched_backward_maybe_with_nosync, stage)
            stage._reduce_grad_per_microbatch = True
    block = (H * H + H) * 2  # one block's parameters in bf16
    log: list[tuple[float, float]] = []

    def gathered() -> float:
        # the gathered blocks and the all-gathers in flight (the schedule's UNSHARD prefetches a stage asynchronously)
        pending = 0
        for module in (m for blocks in parts for m in blocks.modules()):
            state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
            group = state._fsdp_param_group if state is not None else None
            result = getattr(group, "_all_gather_result", None) if group is not None else None
            if result is not None:
                pending += result.all_gather_output.untyped_storage().nbytes()
        return (sum(held(blocks)[1] for blocks in parts) + pending) / block

    for stage in stages:
        backward = stage.backward_one_chunk

        def logged(*args, _backward=backward, **kwargs):
            before = gathered()
            out = _backward(*args, **kwargs)
            log.append((before, gathered()))
            return out

        stage.backward_one_chunk = logged
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=8, loss_fn=lambda out, t: ((out.float() - t) ** 2).mean())
    x, y = torch.randn(16, H), torch.randn(16, H)
    for _ in range(2):
        log.clear()
        schedule.step(x, target=y) if rank == 0 else schedule.step(target=y)
    return {"stages_per_rank": stages_per_rank, "stage": rank, "eager": eager, "backward": log}


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    for mode in os.environ.get("MODES", "torch").split(","):
        result = run(mode, mesh)
        if dist.get_rank() in (0, 2):
            print("RESULT " + json.dumps(result), flush=True)
        dist.barrier()
    for spr in [int(v) for v in os.environ.get("INTERLEAVED", "").split(",") if v]:
        for eager in (False, True):
            result = run_interleaved(spr, mesh, eager)
            if dist.get_rank() in (0, 2):
                print("RESULT " + json.dumps(result), flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
