"""The smoke-test worker: one per rank, launched by torchrun (``python -m automodel_dist.smoke.worker
--spec spec.json``). The same command runs unchanged under a multi-node torchrun or srun.

Each rank on the tiny stack: init the process group (short timeout) -> build AutoModel's meshes from the engine's
layout and check every group against it -> build the tiny model (same seed everywhere) -> apply the layout -> train
a single-process reference of the same model and data -> K AdamW steps -> compare losses, first-step gradients and
final full parameters -> write ``rank<r>.json`` (and progress events). On AutoModel's stack, stack_worker.py."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from .spec import SmokeSpec

T_START = time.time()


_WHERE = {"phase": "start", "step": 0}  # this rank's last phase/step (reported if it is terminated)


class _Progress:
    """Append-only JSON-lines progress file (rank 0 and failing ranks write to it)."""

    def __init__(self, path: str | None, rank: int):
        self.path, self.rank = path, rank

    def __call__(self, phase: str, step: int = 0, total: int = 0, message: str = "", *, force: bool = False) -> None:
        if phase != "error":
            _WHERE.update(phase=phase, step=step)
        if not self.path or (self.rank != 0 and not force):
            return
        line = json.dumps(
            {"t": time.time(), "rank": self.rank, "phase": phase, "step": step, "total": total, "message": message}
        )
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _fault(spec: SmokeSpec, rank: int, step: int, kind: str) -> bool:
    f = spec.fault or {}
    return f.get("kind") == kind and f.get("rank") == rank and f.get("step") == step


def _parent_threads() -> int | None:
    """Threads of the process this rank was forked from (Linux; None elsewhere). A rank forked from a
    multi-threaded process can inherit a libc lock another thread held, and hang on it."""
    try:
        status = Path(f"/proc/{os.getppid()}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), None)


def _peak_rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / (1024 * 1024)


def run(
    spec: SmokeSpec, t_start: float = T_START, publish: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """One rank's smoke run; ``publish`` gets the result before the process group is torn down. The phases: start
    (the rank, its backend and device), then on the tiny stack init (process group, meshes checked against the
    engine's layout, this rank's data), build (the tiny model, split into stages and parallelized), the one-process
    reference, the schedule, the steps and the comparison; AutoModel's stack runs its own (stack_worker.py)."""
    from ..child_process import set_pdeathsig

    set_pdeathsig()  # die with torchrun, whatever happens to it
    r = _start(spec, t_start)
    if spec.stack == "automodel":
        from .stack_worker import run_on_automodel

        run_on_automodel(
            spec, r.result, r.timings, r.progress, r.backend, lambda step, kind: _fault(spec, r.rank, step, kind)
        )
        r.result.update(timings=r.timings, peak_rss_mib=_peak_rss_mib(), t_end=time.time())
        return _finish(spec, r.rank, r.result, publish)
    _init(r)
    _build(r)
    _reference(r)
    _schedule(r)
    _train(r)
    _check(r)
    return _finish(spec, r.rank, r.result, publish)


@dataclass
class _Rank:
    """One rank's run on the tiny stack, filled in phase by phase."""

    spec: SmokeSpec
    rank: int
    world: int
    backend: str
    device: Any
    progress: _Progress
    result: dict[str, Any]
    timings: dict[str, float]
    t_imported: float
    notes: list[str] = field(default_factory=list)  # workarounds this rank applied (reported once per run)
    # init
    layout: Any = None
    meshes: Any = None
    cfg: Any = None
    data: tuple[Any, ...] = ()  # (ids_all, labels_all, ids, labels, positions): the global batch and this rank's
    # build
    parts: list[tuple[int, Any]] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)
    opt: Any = None
    expert_params: list[Any] = field(default_factory=list)
    expert_scale: float = 1.0
    n_stages: int = 1
    my_stages: tuple[int, ...] = (0,)
    # reference
    ref_losses: list[float] = field(default_factory=list)
    ref_grads0: dict[str, Any] = field(default_factory=dict)
    ref_params: dict[str, Any] = field(default_factory=dict)
    # schedule and train
    schedule: Any = None
    cp_ctx: Any = None
    losses: list[float] = field(default_factory=list)
    grad_diff: tuple[float, str] = (0.0, "")


def _start(spec: SmokeSpec, t_start: float) -> _Rank:
    """The rank, its backend (NCCL when every local rank has a GPU, else gloo) and device."""
    t_import = time.time()
    import torch

    t_imported = time.time()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if spec.world_size != world:
        raise RuntimeError(
            f"this spec is for {spec.world_size} ranks, but the launcher started {world} "
            f"(WORLD_SIZE): launch nnodes x nproc-per-node = {spec.world_size}"
        )
    progress = _Progress(spec.progress_file, rank)
    r = _Rank(
        spec=spec,
        rank=rank,
        world=world,
        backend=spec.backend or "auto",
        device=None,
        progress=progress,
        result={"rank": rank, "t_start": t_start, "parent_threads": _parent_threads()},
        timings={"import_s": t_imported - t_import},
        t_imported=t_imported,
    )
    r.result["notes"] = r.notes
    if r.backend == "auto":
        r.backend = (
            "nccl"
            if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", world))
            else "gloo"
        )
    r.device = torch.device("cuda", local_rank) if r.backend == "nccl" else torch.device("cpu")
    if r.device.type == "cuda":
        torch.cuda.set_device(r.device)
    r.result["backend"], r.result["device"] = r.backend, str(r.device)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(False)
    return r


def _init(r: _Rank) -> None:
    """The process group, the meshes (every group checked against the engine's layout) and this rank's batch."""
    import torch
    import torch.distributed as dist

    from . import parallelize as par
    from .tiny_models import TinyConfig, synthetic_batch

    spec, rank, device = r.spec, r.rank, r.device
    r.progress("init", message=f"init_process_group({r.backend}), {r.world} ranks")
    dist.init_process_group(r.backend, timeout=timedelta(seconds=float(spec.pg_timeout_s)))
    layout = spec.dims.layout
    assert layout is not None, "the planner only writes specs whose layout builds"
    meshes = par.build_meshes(layout, device.type)
    mismatch = par.mesh_mismatches(meshes, layout, rank)
    r.result["groups"] = {a: meshes.group_ranks(a) for a in meshes.axes}
    r.result["mesh_mismatches"] = mismatch
    if mismatch:
        raise RuntimeError(f"torch DeviceMesh groups differ from the engine's layout on rank {rank}: {mismatch}")
    r.progress("init", message="device meshes match the engine's layout")
    r.layout, r.meshes = layout, meshes
    r.cfg = TinyConfig(**spec.model_config)
    global_batch, seq = spec.global_batch, spec.seq_len
    ids_all, labels_all = synthetic_batch(r.cfg, global_batch, seq, spec.seed)
    dp_world = layout.dp
    if layout.strategy == "ddp":
        dp_index = rank
    else:
        dp_index = meshes.axes["dp"].get_local_rank() if dp_world > 1 else 0
    per_dp = global_batch // dp_world
    ids = ids_all[dp_index * per_dp : (dp_index + 1) * per_dp].to(device)
    labels = labels_all[dp_index * per_dp : (dp_index + 1) * per_dp].to(device)
    positions = torch.arange(seq, device=device).expand(ids.shape[0], -1).contiguous()
    r.data = (ids_all, labels_all, ids, labels, positions)


def _build(r: _Rank) -> None:
    """The tiny model (same seed everywhere), this rank's pipeline stages, parallelized in AutoModel's order."""
    import torch

    from ..layout import stage_ids
    from . import parallelize as par
    from .tiny_models import TinyLM, build_full

    spec, device, layout, meshes, cfg = r.spec, r.device, r.layout, r.meshes, r.cfg
    pp, tp, cp, ep = layout.pp, layout.tp, layout.cp, layout.ep
    pipe = spec.pipeline
    full = build_full(cfg, spec.seed).to(device)
    pp_rank = meshes.axes["pp"].get_local_rank() if pp > 1 else 0
    if pp > 1:
        from ..layout import stage_layer_counts

        assert pipe is not None
        n_stages = pp * pipe.stages_per_rank
        counts = stage_layer_counts(cfg.num_layers, n_stages)
        my_stages = stage_ids(pp_rank, pp, n_stages, v_style=pipe.v_style)
        modules = []
        for sid in my_stages:
            first_layer = sum(counts[:sid])
            layer_ids = list(range(first_layer, first_layer + counts[sid]))
            part = TinyLM(cfg, layer_ids, first=sid == 0, last=sid == n_stages - 1).to(device)
            part.load_state_dict({k: v for k, v in full.state_dict().items() if k in part.state_dict()})
            modules.append((sid, part))
    else:
        modules = [(0, full)]
        n_stages, my_stages = 1, (0,)

    expert_params: list[torch.nn.Parameter] = []
    non_pp = layout.dp * cp * tp
    # Expert grads are summed over every EP peer's tokens; FSDP then averages over ep_shard (or DDP
    # over the world); the rest of the 1/(dp*cp*tp) global mean is applied after backward.
    r.expert_scale = layout.ep_shard / non_pp if layout.strategy == "fsdp2" else 1.0 / non_pp
    parts = []
    for sid, m in modules:
        if tp > 1:
            par.apply_tp(m, meshes.axes["tp"], sequence_parallel=spec.dims.sequence_parallel)
        if ep > 1:
            expert_params += par.apply_ep(m, meshes.moe["ep"])
        par.apply_ac(m, spec.dims.activation_checkpointing or False)
        if layout.strategy == "fsdp2":
            par.apply_fsdp(
                m,
                meshes.fsdp,
                mp=spec.mp_policy,
                reshard=spec.dims.reshard_after_forward,
                moe_reshard=spec.dims.moe_reshard_after_forward,
                ep=ep,
                expert_mesh=meshes.moe["ep_shard"] if ep > 1 else None,
            )
        elif layout.strategy == "ddp":
            m = par.apply_ddp(m, spec.ddp, device)
        parts.append((sid, m))
    params = [p for _, m in parts for p in m.parameters()]
    # foreach=False on both sides (as in AutoModel's MoE recipes): a DTensor foreach step pays ~0.7 s of uncached
    # sharding propagation on the first step; per-parameter ops hit the cache after the first of each shape
    r.opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0, foreach=False)
    r.result["param_bytes"] = sum(par.local_tensor(p).numel() * par.local_tensor(p).element_size() for p in params)
    r.parts, r.params, r.expert_params = parts, params, expert_params
    r.n_stages, r.my_stages = n_stages, tuple(my_stages)


def _reference(r: _Rank) -> None:
    """The same model trained on one process over the whole global batch (same seed, same precision policy)."""
    import torch

    from .tiny_models import build_full, loss_fn

    spec, device = r.spec, r.device
    ids_all, labels_all = r.data[:2]
    t_ref = time.time()
    r.progress("reference", message="single-process reference")
    ref = build_full(r.cfg, spec.seed).to(device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=spec.lr, weight_decay=0.0, foreach=False)
    low = _compute_copy(ref, spec.mp_policy)
    for ref_step in range(spec.steps):
        ref_opt.zero_grad(set_to_none=True)
        if low is not ref:
            _mixed_precision_sync(ref, low)
        ref_loss = loss_fn(low(ids_all.to(device)), labels_all.to(device))
        ref_loss.backward()
        if low is not ref:
            for master, p in zip(ref.parameters(), low.parameters()):
                master.grad = None if p.grad is None else p.grad.to(master.dtype)
        if ref_step == 0:
            r.ref_grads0 = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
        ref_opt.step()
        r.ref_losses.append(ref_loss.item())
    r.ref_params = dict(ref.named_parameters())
    r.timings["reference_s"] = time.time() - t_ref


def _schedule(r: _Rank) -> None:
    """torch's pipeline schedule over this rank's stages, and the context-parallel buffers' context."""
    from .tiny_models import loss_fn

    layout, meshes, pipe = r.layout, r.meshes, r.spec.pipeline
    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        assert pipe is not None
        group = meshes.axes["pp"].get_group()
        stages = [PipelineStage(m, sid, r.n_stages, r.device, group=group) for sid, m in r.parts]
        if r.backend == "gloo":
            for stage in stages:
                _skip_self_p2p_warmup(stage, r.notes)
        cls = get_schedule_class(pipe.schedule)
        multi = len(stages) > 1 or pipe.schedule not in ("1F1B", "GPipe")
        r.schedule = cls(
            stages if multi else stages[0], n_microbatches=pipe.n_microbatches, loss_fn=loss_fn, scale_grads=True
        )
    cp = layout.cp
    r.cp_ctx = _cp_context(meshes, cp, r.device) if cp > 1 else None
    if r.cp_ctx is not None:
        from .tiny_models import Attention

        cp_info = (meshes.axes["cp"].get_local_rank(), cp, r.device.type != "cpu")
        for _, m in r.parts:
            for mod in m.modules():
                if isinstance(mod, Attention):
                    mod.cp = cp_info


def _train(r: _Rank) -> None:
    """The spec's steps (with the injected faults), the loss averaged over the ranks that hold it."""
    import torch
    import torch.distributed as dist

    from . import parallelize as par
    from .tiny_models import loss_fn

    spec, rank, device, layout, meshes, parts = r.spec, r.rank, r.device, r.layout, r.meshes, r.parts
    tp, ep, steps = layout.tp, layout.ep, spec.steps
    ids, labels, positions = r.data[2:]
    skew = float((spec.fault or {}).get("factor", 0.5))
    step_times = []
    t_steps = time.time()
    # init covers the parallelism imports, the process group, meshes, model and wrapping
    r.timings["init_s"] = t_steps - r.t_imported - r.timings["reference_s"]
    r.progress("step", 0, steps, "training")
    for step in range(steps):
        ts = time.time()
        if _fault(spec, rank, step, "crash"):
            raise RuntimeError(f"injected fault: crash@{rank}:{step}")
        _WHERE.update(phase="step", step=step)
        if _fault(spec, rank, step, "hang"):
            r.progress("step", step, steps, f"injected fault: rank {rank} hangs at step {step}", force=True)
            time.sleep(10**9)
        r.opt.zero_grad(set_to_none=True)
        loss_val, count = torch.zeros((), device=device), torch.zeros((), device=device)
        if r.schedule is not None:
            first = any(sid == 0 for sid, _ in parts)
            last = any(sid == r.n_stages - 1 for sid, _ in parts)
            mb_losses: list[torch.Tensor] = []
            buf_ids, buf_labels = ids.clone(), labels.clone()
            kwargs: dict[str, Any] = {"target": buf_labels, "losses": mb_losses} if last else {}
            with contextlib.ExitStack() as stack:
                if r.cp_ctx is not None:
                    from torch.distributed.tensor.experimental import implicit_replication

                    stack.enter_context(r.cp_ctx(buffers=[buf_ids, buf_labels], buffer_seq_dims=[1, 1]))
                    stack.enter_context(implicit_replication())
                if first:
                    r.schedule.step(buf_ids, **kwargs)
                else:
                    r.schedule.step(**kwargs)
            if last and (tp == 1 or meshes.axes["tp"].get_local_rank() == 0):
                loss_val = torch.stack([x.detach().float() for x in mb_losses]).mean()
                count = torch.ones((), device=device)
        else:
            model = parts[0][1]
            if r.cp_ctx is not None:
                from torch.distributed.tensor.experimental import implicit_replication

                buf_ids, buf_labels = ids.clone(), labels.clone()
                with r.cp_ctx(buffers=[buf_ids, buf_labels], buffer_seq_dims=[1, 1]), implicit_replication():
                    loss = loss_fn(model(buf_ids), buf_labels)  # attention derives global positions
                    loss.backward()
            else:
                loss = loss_fn(model(ids, positions), labels)
                loss.backward()
            if tp == 1 or meshes.axes["tp"].get_local_rank() == 0:
                loss_val, count = loss.detach().float(), torch.ones((), device=device)
        if r.expert_params:
            par.scale_expert_grads([p for _, m in parts for p in m.parameters() if _is_expert(m, p)], r.expert_scale)
        if _fault(spec, rank, step, "skew"):
            par.skew_gradients(r.params, rank * 1000 + step, skew, device)
        if step == 0:  # AdamW hides gradient scale errors: compare the first gradients directly
            r.grad_diff = _compare(parts, r.ref_grads0, par, ep, grads=True)
        r.opt.step()
        pair = torch.stack([loss_val * count, count])
        dist.all_reduce(pair)
        r.losses.append((pair[0] / pair[1]).item())
        step_times.append(time.time() - ts)
        r.progress("step", step + 1, steps, f"loss {r.losses[-1]:.5f}")
    r.timings["steps_s"] = time.time() - t_steps
    r.result["step_times_s"] = step_times
    r.result["grad_bytes"] = sum(
        par.local_tensor(p.grad).numel() * par.local_tensor(p.grad).element_size()
        for p in r.params
        if p.grad is not None
    )
    r.result["optim_bytes"] = sum(
        par.local_tensor(v).numel() * par.local_tensor(v).element_size()
        for st in r.opt.state.values()
        for v in st.values()
        if torch.is_tensor(v)
    )


def _check(r: _Rank) -> None:
    """Final parameters and first-step gradients against the reference; the worst over all ranks."""
    import torch
    import torch.distributed as dist

    from . import parallelize as par

    t1 = time.time()
    worst, worst_name = _compare(r.parts, r.ref_params, par, r.layout.ep, grads=False)
    grad_diff, grad_name = r.grad_diff
    worst_t = torch.tensor([worst, grad_diff], device=r.device)
    dist.all_reduce(worst_t, op=dist.ReduceOp.MAX)
    r.timings["check_s"] = time.time() - t1 + r.timings["reference_s"]
    r.result.update(
        losses=r.losses,
        reference_losses=r.ref_losses,
        max_param_rel_diff=worst,
        worst_param=worst_name,
        global_max_param_rel_diff=worst_t[0].item(),
        max_grad_rel_diff=grad_diff,
        worst_grad=grad_name,
        global_max_grad_rel_diff=worst_t[1].item(),
        timings=r.timings,
        peak_rss_mib=_peak_rss_mib(),
        t_end=time.time(),
        stages=list(r.my_stages),
    )
    if r.device.type == "cuda":
        r.result["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated(r.device) / 2**20
    r.progress(
        "compare",
        message=f"max parameter difference {worst_t[0].item():.2e}, first-step gradients {worst_t[1].item():.2e}",
    )


def _finish(
    spec: SmokeSpec, rank: int, result: dict[str, Any], publish: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    """Publish the result, then tear the process group down (with the injected teardown faults)."""
    import torch.distributed as dist

    if publish is not None:  # before teardown: a teardown that hangs cannot hold the result back
        publish(result)
    if (spec.fault or {}).get("kind") == "stall" and (spec.fault or {}).get("rank") == rank:
        time.sleep(10**9)  # injected: this rank never exits (the launcher's teardown grace stops it)
    dist.barrier()
    dist.destroy_process_group()
    if (spec.fault or {}).get("kind") == "abort" and (spec.fault or {}).get("rank") == rank:
        os.abort()  # injected: dies by SIGABRT at exit, after its result and teardown (torch 2.14 was seen to)
    return result


def _compute_copy(ref: Any, mp: dict[str, Any] | None) -> Any:
    """The model the single-process reference computes with: ``ref`` itself, or under a mixed-precision policy
    a copy with its parameters in the policy's param_dtype. FSDP2 runs forward and backward on such copies while
    the fp32 shards keep the master weights and the optimizer; the reference does the same (``ref`` holds the
    master weights), so both sides round alike and a difference is the layout's. Against an fp32 reference a
    bf16 MoE run differs by rounding alone: near-tied router scores pick other experts (0.35 on a router's
    gradient for the 8-expert tiny model in one process, no layout involved)."""
    import torch

    dtype = (mp or {}).get("param_dtype")
    if not dtype or dtype == "float32":
        return ref
    low = copy.deepcopy(ref)
    for p in low.parameters():  # parameters only: FSDP's policy leaves buffers as they are
        p.data = p.data.to(getattr(torch, dtype))
    return low


def _mixed_precision_sync(master: Any, low: Any) -> None:
    """Cast the master weights into the compute copy (FSDP2's all-gather in param_dtype) and clear its grads."""
    import torch

    with torch.no_grad():
        for m, p in zip(master.parameters(), low.parameters()):
            p.copy_(m)
            p.grad = None


def _compare(parts: list, reference: dict, par: Any, ep: int, *, grads: bool) -> tuple[float, str]:
    """Worst per-tensor ||got - ref|| / ||ref|| of this rank's parameters (or their gradients)."""
    worst, worst_name = 0.0, ""
    for _, m in parts:
        for name, p in m.named_parameters():
            key = par.clean_name(name)
            t = p.grad if grads else p
            if t is None:
                continue
            got = par.full_tensor(t.detach()).float()
            want = reference[key].detach().float()
            if "experts." in key and ep > 1:
                owner = _owner_experts(m, key)
                want = want[owner.first : owner.first + got.shape[0]]
            diff = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
            if diff > worst:
                worst, worst_name = diff, key
    return worst, worst_name


def _skip_self_p2p_warmup(stage: Any, notes: list[str]) -> None:
    """Before torch 2.13 a pipeline schedule warms its links up by sending a scalar to each neighbouring
    stage, also to one on the same rank (V schedules such as ZBVZeroBubble and DualPipeV put stages s and
    s+1 together). gloo cannot send to its own rank ("Pair is not connected"; NCCL can, and torch 2.13+
    warms up without it), so under gloo those self-pairs are dropped: both ends are on this rank and the
    schedule itself never sends between them. Adds a note when it happens; a torch without that warm-up
    (2.15 has none) is left as it is."""
    warm = getattr(stage, "_get_init_p2p_neighbors_ops", None)
    if warm is None:
        return

    def ops() -> list:
        all_ops = warm()
        kept = [op for op in all_ops if getattr(op, "group_peer", None) != stage.group_rank]
        if len(kept) < len(all_ops):
            msg = (
                "gloo cannot send to its own rank: this torch release's pipeline warm-up send/recv between "
                "adjacent stages on the same rank was skipped (NCCL sends it; torch 2.13+ does not)"
            )
            if msg not in notes:
                notes.append(msg)
        return kept

    stage._get_init_p2p_neighbors_ops = ops


def _is_expert(model: Any, param: Any) -> bool:
    ids = getattr(model, "_expert_param_ids", None)
    if ids is None:
        ids = {id(p) for n, p in model.named_parameters() if ".experts." in n}
        model._expert_param_ids = ids
    return id(param) in ids


def _owner_experts(model: Any, key: str) -> Any:
    layer = key.split(".")[1]
    module = model.module if hasattr(model, "module") else model
    block = module.layers[layer]
    block = getattr(block, "_checkpoint_wrapped_module", block)
    return block.mlp.experts


def _cp_context(meshes: Any, cp: int, device: Any) -> Any:
    """torch's context_parallel on the cp mesh; head-tail load balancing is off on CPU (see README)."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device.type == "cpu":
        from torch.distributed.tensor.experimental._context_parallel import _cp_options

        _cp_options.enable_load_balance = False
    cp_mesh = meshes.axes["cp"]

    from contextlib import contextmanager

    @contextmanager
    def ctx(buffers: list, buffer_seq_dims: list):
        backend = SDPBackend.MATH if device.type == "cpu" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(backend), context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims):
            yield

    return ctx


class SignalException(Exception):
    """A stop signal (SIGTERM, SIGHUP, SIGQUIT) raised as an exception, so the rank reports where it was."""


def _raise_on_signal(signum: int, frame: Any) -> None:
    raise SignalException(f"Process {os.getpid()} got signal: {signal.Signals(signum).name}")


def _run_and_write(spec_path: str, t_start: float) -> int:
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):  # a fresh rank (fork server, spawn) has no handler of its own
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _raise_on_signal)
    spec = SmokeSpec.read(spec_path)
    rank = int(os.environ.get("RANK", "0"))
    out_dir = Path(spec.run_dir or Path(spec_path).parent)
    published: list[dict[str, Any]] = []

    def publish(res: dict[str, Any]) -> None:
        res = dict(res, spec_id=spec.spec_id)  # the judge ignores results of another spec
        tmp = out_dir / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps(res))
        tmp.replace(out_dir / f"rank{rank}.json")
        published.append(res)

    try:
        result = run(spec, t_start, publish)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report every failure, then exit non-zero
        if type(exc).__name__ in ("SignalException", "KeyboardInterrupt", "SystemExit"):
            result = {
                "rank": rank,
                "terminated": f"{type(exc).__name__}: {exc}",
                "where": dict(_WHERE),
                "t_start": t_start,
            }  # stopped from outside (the launcher, a signal)
        else:
            tb = traceback.format_exc()
            shown: BaseException = exc
            if "[Stage" in str(exc) and exc.__cause__ is not None:  # the pipeline wraps a stage's own error
                shown = exc.__cause__
                tb = "".join(traceback.format_exception(shown))
            result = {
                "rank": rank,
                "error": f"{type(shown).__name__}: {shown}",
                "traceback": tb.splitlines()[-25:],
                "t_error": time.time(),
                "t_start": t_start,
                "where": dict(_WHERE),
            }
            _Progress(spec.progress_file, rank)("error", message=result["error"], force=True)
        code = 1
        if published and "terminated" in result:
            return code  # stopped during teardown (the launcher's grace period): the published result stands
    if not published or code:
        publish(result)  # an error during teardown replaces the published result
    return code


def entry(spec_path: str) -> None:
    """Entry point for torch's elastic_launch (the ranks are forked from the agent's fork server)."""
    if _run_and_write(spec_path, time.time()):
        raise SystemExit(1)  # the elastic agent sees the failure and stops the other ranks


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``torchrun -m automodel_dist.smoke.worker --spec spec.json``."""
    ap = argparse.ArgumentParser(description="automodel-dist smoke-test worker (launched by torchrun)")
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    return _run_and_write(args.spec, T_START)


if __name__ == "__main__":
    sys.exit(main())
