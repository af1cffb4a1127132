"""Plan and launch a smoke run through torch's elastic launcher (torchrun), without importing torch.

The parent writes a JSON spec, runs ``python -m torch.distributed.run --standalone ... -m
automodel_dist.smoke.worker --spec spec.json`` in its own process session, streams progress
events, enforces the wall-clock timeout and cancellation, and always reaps every rank: the whole
session is killed, survivors are hunted down by the run's unique directory name, and the run
directory is removed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..api import NO_MODEL, analyze, validate_config
from ..config.values import is_positive_int
from ..dims import ParallelDims
from ..environment import missing_packages
from ..explain import explain_error
from ..report import Finding
from .report import TOLERANCES, RankReport, SmokeReport, Timing
from .request import LAYOUT_KEYS, SmokeRequest
from .spec import PipelineSpec, SmokeSpec
from .stack_plan import StackPlan

ProgressFn = Callable[[str, int, int, str], None]


def _env_int(name: str, default: int) -> int:
    """A positive integer limit from the environment; the default when unset or malformed."""
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else default


MAX_CPU_WORLD = _env_int("AUTOMODEL_DIST_MAX_CPU_WORLD", 16)
MAX_PARAMS = _env_int("AUTOMODEL_DIST_MAX_SMOKE_PARAMS", 50_000_000)
MAX_CONCURRENT = _env_int("AUTOMODEL_DIST_MAX_CONCURRENT_SMOKE", 2)
DEFAULT_TIMEOUT_S = 600.0
# stall: never exits after publishing its result; abort: SIGABRT after publishing and tearing down (STEP unused)
FAULT_KINDS = ("crash", "hang", "skew", "stall", "abort")
TEARDOWN_GRACE_S = 20.0  # once every rank has published its result, the ranks get this long to exit
_ACTIVE: set[subprocess.Popen] = set()
_ACTIVE_LOCK = threading.Lock()
_SLOTS = threading.BoundedSemaphore(MAX_CONCURRENT)


class SmokeUsageError(ValueError):
    """Arguments that cannot describe a smoke run (CLI exit 2)."""


class Cancelled(Exception):
    pass


# --------------------------------------------------------------------------- faults
def parse_fault(fault: str | dict | None) -> dict | None:
    """``crash@RANK:STEP``, ``hang@RANK:STEP``, ``skew@RANK:STEP``, ``stall@RANK:0`` or ``abort@RANK:0`` ->
    {kind, rank, step}."""
    if fault is None or isinstance(fault, dict):
        return fault
    try:
        kind, where = fault.split("@", 1)
        rank, step = (int(x) for x in where.split(":", 1))
    except ValueError as exc:
        raise SmokeUsageError(
            f"--fault must look like crash@RANK:STEP, hang@RANK:STEP, skew@RANK:STEP, "
            f"stall@RANK:0 or abort@RANK:0, got {fault!r}"
        ) from exc
    if kind not in FAULT_KINDS or rank < 0 or step < 0:
        raise SmokeUsageError(f"unknown fault {fault!r}; use {', '.join(k + '@RANK:STEP' for k in FAULT_KINDS)}")
    return {"kind": kind, "rank": rank, "step": step}


# --------------------------------------------------------------------------- plan
@dataclass
class Plan:
    spec: SmokeSpec
    world_size: int
    findings: list[Finding] = field(default_factory=list)
    report_base: dict[str, Any] = field(default_factory=dict)


def merged_overrides(request: SmokeRequest) -> tuple[list[str] | None, dict[str, Any]]:
    """The overrides to validate the request's config with (the launch command's, then the layout keywords' as
    ``distributed.*`` overrides, so a recipe keeps its other sections and its line numbers) and the
    resulting ``distributed:`` block. With layout keywords, pp > 1 without a ``pipeline:`` block gets ``{}``."""
    launch = request.overrides
    over = list(launch) if launch is not None else []
    active = {k: v for k, v in request.layout.items() if v is not None}
    over += [f"distributed.{LAYOUT_KEYS[k]}={v}" for k, v in active.items()]
    ctx = analyze(request.job.replace(overrides=over, world_size=None)).context
    block = dict(ctx.block) if ctx is not None else {}
    if active and is_positive_int(block.get("pp_size")) and block["pp_size"] > 1 and block.get("pipeline") is None:
        over.append("distributed.pipeline={}")
        block["pipeline"] = {}
    return (over if launch is not None or active else None), block


TINY_TORCH_NOTE = (
    " (that is the torch installed here: this smoke run shards with torch's own fully_shard, so it can pass where "
    "AutoModel 0.7.0 would fail)"
)
AUTOMODEL_TORCH_NOTE = (
    " (that is the torch installed here: this run is AutoModel's own parallelizer on it, so a failure below is what "
    "AutoModel does on this torch)"
)


def _split_findings(report: Any) -> tuple[list[str], list[Any]]:
    """(notes, findings) of a run's validation: torch-version is about AutoModel on the torch installed here, not
    about the layout this run proves, so it becomes a note, not a refusal; info findings are dropped."""
    env = [f.message + TINY_TORCH_NOTE for f in report.findings if f.rule == "torch-version" and f.severity == "error"]
    return env, [f for f in report.findings if f.severity != "info" and not (f.rule == "torch-version" and env)]


DDP_OPTIONS = (
    "broadcast_buffers",
    "find_unused_parameters",
    "static_graph",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
)
DEFAULT_WORLD = 4
_MOE_ROUNDING = (
    "with bf16 compute, context or tensor parallelism rounds attention differently from one process and "
    "the MoE router then sends near-tied tokens to other experts (router gradients 0.1-0.3 off with no "
    "layout error)"
)


def default_world_size(request: SmokeRequest) -> tuple[int, str | None]:
    """The world size a run takes when none is given: 4, or when the layout is invalid on 4 ranks the smallest
    world (up to the CPU limit) it is valid on; with a note saying so (None when 4 is kept)."""
    over, _ = merged_overrides(request)
    version = _installed_torch()
    job = request.job.replace(overrides=over, torch_version=version)

    def ok(world: int) -> bool:
        report = validate_config(job, world_size=world)
        return not any(f.severity == "error" for f in _split_findings(report)[1])

    if ok(DEFAULT_WORLD):
        return DEFAULT_WORLD, None
    for world in (w for w in range(2, MAX_CPU_WORLD + 1) if w != DEFAULT_WORLD):
        if ok(world):
            return world, (
                f"world_size {world}: the smallest number of processes this layout is valid on "
                f"({DEFAULT_WORLD}, the default, is not)"
            )
    return DEFAULT_WORLD, (
        f"no world size from 2 to {MAX_CPU_WORLD} makes this layout valid; the findings are "
        f"at the default {DEFAULT_WORLD} (override the sizes, e.g. -- --distributed.dp_size ..., "
        "to smoke-test a scaled-down version)"
    )


def make_plan(request: SmokeRequest, *, seed: int = 1234, lr: float = 5e-3, local: bool = True) -> Plan | SmokeReport:
    """The worker spec of a run (the request's world size given), or the report of why it cannot run.
    ``local=False``: the run is exported to another machine, so this machine's GPUs, packages and CPU limit do not
    decide what can run."""
    world_size, steps, model, stack = request.world_size, request.steps, request.model, request.stack
    backend, precision, run_invalid = request.backend, request.precision, request.run_invalid
    if model not in ("tiny-llama", "tiny-moe"):
        raise SmokeUsageError(f"model must be tiny-llama or tiny-moe, got {model!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise SmokeUsageError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(steps, int) or not 1 <= steps <= 100:
        raise SmokeUsageError(f"steps must be between 1 and 100, got {steps!r}")
    if precision not in ("auto", "fp32", "bf16"):
        raise SmokeUsageError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    if backend not in (None, "auto", "gloo", "nccl"):
        raise SmokeUsageError(f"backend must be gloo or nccl, got {backend!r}")
    if stack not in STACKS:
        raise SmokeUsageError(f"stack must be one of {', '.join(STACKS)}, got {stack!r}")
    fault_d = parse_fault(request.fault)
    over, block = merged_overrides(request)
    result = analyze(request.job.replace(overrides=over, torch_version=_installed_torch()))
    report = result.report
    env, findings = _split_findings(report)
    base = dict(world_size=world_size, model=model, steps=steps, layout=report.resolved, findings=findings, notes=env)
    errors = [f for f in findings if f.severity == "error"]
    if errors and run_invalid:
        base["notes"].append(
            f"run although validation found {len(errors)} error(s) (run_invalid): a failure below is AutoModel's own "
            "(" + ", ".join(dict.fromkeys(f.rule for f in errors)) + ")"
        )
    elif errors:
        return SmokeReport(
            passed=False,
            status="failed",
            reason=f"the config is invalid ({len(errors)} error(s)): " + "; ".join(f.message for f in errors[:3]),
            **base,
        )
    d = result.dims
    if d is None or d.strategy is None or d.dp is None or d.layout is None:
        return SmokeReport(passed=False, status="not_run", reason="not run: the layout cannot be built", **base)
    if fault_d and fault_d["rank"] >= world_size:
        raise SmokeUsageError(f"fault rank {fault_d['rank']} is outside [0, {world_size})")
    if fault_d and fault_d["step"] >= steps:
        raise SmokeUsageError(f"fault step {fault_d['step']} is outside [0, {steps})")
    cuda = _cuda_count()
    want_backend = backend or "auto"
    on_cpu = want_backend == "gloo" or cuda < world_size
    if d.strategy == "megatron_fsdp":
        have_pkg = _has_module("megatron_fsdp") or _has_module("megatron.core")
        why = (
            "MegatronFSDP runs only with the megatron-fsdp package and CUDA GPUs; "
            f"here: package {'present' if have_pkg else 'missing'}, {cuda} CUDA device(s)"
        )
        if not local or (have_pkg and cuda >= world_size):
            why = "the smoke runner does not implement MegatronFSDP wrapping yet"
        return SmokeReport(passed=False, status="not_run", reason=f"not run: {why}", **base)
    if local and on_cpu and world_size > MAX_CPU_WORLD:
        return SmokeReport(
            passed=False,
            status="not_run",
            **base,
            reason=f"not run: world_size {world_size} is above the CPU limit of {MAX_CPU_WORLD} "
            "processes (set AUTOMODEL_DIST_MAX_CPU_WORLD to raise it, or run it on the "
            "cluster's GPUs: `automodel-dist smoke ... --export DIR` prints the torchrun/srun "
            "commands, then `--judge DIR`)",
        )
    if d.layout.mesh_ranks != world_size:
        return SmokeReport(
            passed=False,
            status="not_run",
            **base,
            reason=f"not run: the mesh covers {d.layout.mesh_ranks} of {world_size} ranks (explicit dp_size)",
        )
    if d.ep > 1 and model != "tiny-moe":
        model = "tiny-moe"
        base["model"] = model

    pp, tp, cp, ep = d.pp, d.tp, d.cp, d.ep
    pipeline = None
    stages_total = 1
    if pp > 1:
        n_mb = 2 * pp
        pipeline = PipelineSpec(
            schedule=d.pp_schedule or "1F1B",
            stages_per_rank=d.stages_per_rank,
            v_style=d.v_schedule,
            n_microbatches=n_mb,
            microbatch_size=d.pp_microbatch_size or 1,
        )
        stages_total = pp * d.stages_per_rank
        per_dp = n_mb * pipeline.microbatch_size
    else:
        per_dp = 2
    from .model_size import param_count, tiny_config

    cfg = tiny_config(tp=tp, stages=stages_total, ep=ep, moe=model == "tiny-moe")
    n_params = param_count(cfg)
    if n_params > MAX_PARAMS:
        return SmokeReport(
            passed=False,
            status="not_run",
            **base,
            reason=f"not run: the {model} model for this layout has {n_params:,} parameters, above the "
            f"limit of {MAX_PARAMS:,} (set AUTOMODEL_DIST_MAX_SMOKE_PARAMS to raise it)",
        )
    seq = 8 * math.lcm(2 * cp, max(tp, 1))
    automodel: StackPlan | None = None
    if stack != "tiny":
        mbs = pipeline.microbatch_size if pipeline is not None else 1
        automodel, why = _automodel_stack(result, block, d, model, precision, local, stages_total, seq, per_dp, mbs)
        if automodel is None:
            if stack == "automodel" or not local or automodel_installed():
                # with AutoModel here (or for an export, which targets AutoModel's stack), a PASS on the tiny model
                # would say nothing of the recipe's class: it runs only when asked for
                hint = (
                    "; --stack tiny (stack=tiny) runs this tool's tiny model through the same layout (it proves the "
                    "layout's meshes, sharding and gradient scaling, not the recipe's class)"
                )
                return SmokeReport(
                    passed=False, status="not_run", reason=f"not run on AutoModel's stack: {why}{hint}", **base
                )
            base["notes"].append(f"the tiny home-made stack ran, not AutoModel's: {why}")
    mp = _mp_policy(d, precision)
    if mp and mp.get("param_dtype") not in (None, "float32") and model == "tiny-moe" and (cp > 1 or tp > 1):
        if precision == "auto":
            mp = None
            base["notes"].append(
                _MOE_ROUNDING + "; this run and its reference therefore use fp32 (the dispatch, "
                "expert sharding and gradient scaling under test are the same; --precision bf16 "
                "forces bf16)"
            )
        else:
            base["notes"].append(
                _MOE_ROUNDING + ", so a bf16 run can fail parity on rounding alone (--precision "
                "auto checks this layout in fp32)"
            )
    prec = "bf16" if mp and mp.get("param_dtype") == "bfloat16" else "fp32"
    if automodel is not None:
        prec = "bf16" if precision == "bf16" else "fp32"
        base["notes"] = [
            n.replace(TINY_TORCH_NOTE, AUTOMODEL_TORCH_NOTE) for n in base["notes"] if not n.startswith(_MOE_ROUNDING)
        ]
        if precision == "auto" and mp and mp.get("param_dtype") not in (None, "float32"):
            base["notes"].append(
                "precision: this run and its reference compute in fp32, so a layout's error stands out from "
                "rounding (--precision bf16 runs FSDP2's bf16 policy on both)"
            )
        base["notes"] += automodel.notes
        base["substitutions"] = automodel.substitutions
        base["model"] = automodel.automodel["architecture"]
        cfg = automodel.automodel["hf_config"]
    spec = SmokeSpec(
        world_size=world_size,
        spec_id=uuid.uuid4().hex,
        dims=d,
        model=model,
        model_config=cfg,
        seq_len=seq,
        global_batch=per_dp * d.dp,
        steps=steps,
        lr=lr,
        seed=seed,
        backend=want_backend,
        pg_timeout_s=request.pg_timeout_s,
        precision=prec,
        mp_policy=mp,
        ddp={k: block.get(k) for k in DDP_OPTIONS} if d.strategy == "ddp" else {},
        pipeline=pipeline,
        fault=fault_d,
        stack="automodel" if automodel is not None else "tiny",
        automodel=automodel.automodel if automodel is not None else None,
    )
    base.update(model_dims=cfg, tolerance=TOLERANCES[prec], stack=spec.stack)
    if tp > 1 and block.get("tp_plan") is not None and automodel is None:
        base["notes"].append(
            "tp_plan is not applied: the smoke runner shards its tiny model with its own TP plan "
            "(attention and MLP projections; routed experts stay EP-owned)"
        )
    return Plan(spec=spec, world_size=world_size, findings=base["findings"], report_base=base)


STACKS = ("auto", "automodel", "tiny")
# The architecture a config that names no model runs on AutoModel's stack: untied embeddings, so a pipeline layout
# trains the same model as one process (a tied model under PP trains a separate lm_head: pp-tied-embeddings)
DEFAULT_ARCHITECTURE = {"tiny-llama": "meta-llama/Llama-3.1-8B", "tiny-moe": "Qwen/Qwen3-30B-A3B"}


def _automodel_stack(
    result: Any,
    block: dict[str, Any],
    d: ParallelDims,
    model: str,
    precision: str,
    local: bool,
    stages: int,
    seq: int,
    per_dp: int,
    mbs: int,
) -> tuple[StackPlan | None, str]:
    """The plan on AutoModel's stack, or None and why it cannot run here."""
    from ..catalog.hf_config import NoConfigError, hf_config
    from ..catalog.models import ModelConfigError
    from ..catalog.sources import resolve
    from ..workload import read_workload
    from .stack_plan import StackUnavailable, plan_stack

    if local and not automodel_installed():
        return None, "AutoModel (nemo_automodel) and transformers are not installed here"
    ctx = result.context
    spec = ctx.model if ctx is not None else None
    if spec is None and ctx is not None and ctx.model_skipped not in (None, NO_MODEL):
        # the recipe names a model whose config.json is not found: another architecture would prove nothing of it
        return None, f"the recipe's model cannot be built here: {ctx.model_skipped}"
    if spec is None:
        try:
            spec = resolve(DEFAULT_ARCHITECTURE[model]).spec
        except ModelConfigError as exc:  # pragma: no cover - the catalog holds both
            return None, str(exc)
    try:
        cfg = hf_config(spec)
    except NoConfigError as exc:
        return None, str(exc)
    try:
        plan = plan_stack(
            block=block,
            dims=d,
            workload=read_workload(ctx.recipe if ctx is not None else None),
            architecture=spec.architecture,
            is_moe=spec.is_moe,
            hf_config=cfg,
            stages=stages,
            seq_len=seq,
            per_dp=per_dp,
            micro_batch_size=mbs,
            precision="bf16" if precision == "bf16" else "fp32",
        )
    except StackUnavailable as exc:
        return None, str(exc)
    if ctx is None or ctx.model is None:
        plan.notes.insert(0, f"the config names no model: {spec.name}'s architecture ran ({model})")
    return plan, ""


def automodel_installed() -> bool:
    """AutoModel's stack can run here: torch, AutoModel and transformers importable (nothing is imported)."""
    return not missing_packages()


def _installed_torch() -> str | None:
    """The torch version installed here, read from its metadata (no import)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


_BF16 = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": None, "cast_forward_inputs": False}


def _mp_policy(d: ParallelDims, precision: str) -> dict[str, Any] | None:
    """The FSDP2 mixed precision this run uses: the block's (``auto``), bf16 or none (fp32)."""
    if d.strategy != "fsdp2" or precision == "fp32":
        return None
    if precision == "bf16" or d.mp_policy is None:
        return dict(_BF16)
    mp = asdict(d.mp_policy)
    return mp if mp["param_dtype"] or mp["reduce_dtype"] else None


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _cuda_count() -> int:
    """Visible CUDA devices without importing torch (nvidia-smi), 0 when there is none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if visible:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


# --------------------------------------------------------------------------- commands
LAUNCHERS = ("elastic", "torchrun")


def launcher_args(launcher: str, nproc: int, run_dir: Path, spec_path: Path) -> list[str]:
    """The command the parent runs: torch's elastic agent (ranks from a fork server), or the torchrun CLI."""
    if launcher == "elastic":
        return [sys.executable, "-m", "automodel_dist.smoke.agent", "--spec", str(spec_path), "--nproc", str(nproc)]
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--log-dir",
        str(run_dir / "logs"),
        "--redirects",
        "3",
        "-m",
        "automodel_dist.smoke.worker",
        "--spec",
        str(spec_path),
    ]
    return [sys.executable, "-m", "automodel_dist.smoke._exec", *torchrun]


def reproduce_commands(nproc: int, spec_name: str = "spec.json") -> tuple[str, str, str]:
    worker = f"-m automodel_dist.smoke.worker --spec {spec_name}"
    single = f"OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node {nproc} {worker}"
    multi = (
        "torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE --rdzv-backend c10d "
        f"--rdzv-endpoint $HEAD_NODE:29500 --rdzv-id $RUN_ID {worker}"
    )
    srun = (
        "srun --nodes $SLURM_NNODES --ntasks-per-node 1 bash -c 'torchrun --nnodes $SLURM_NNODES "
        "--nproc-per-node $SLURM_GPUS_ON_NODE --rdzv-backend c10d --rdzv-id $SLURM_JOB_ID "
        "--rdzv-endpoint $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29500 "
        f"{worker}'"
    )
    return single, multi, srun


# --------------------------------------------------------------------------- processes
def _survivors(token: str) -> list[int]:
    """PIDs whose command line mentions this run's directory (Linux /proc; empty elsewhere)."""
    pids = []
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmd:
            pids.append(int(entry.name))
    return pids


def _kill_tree(proc: subprocess.Popen, token: str, grace_s: float = 3.0) -> None:
    """SIGTERM the run's session, then SIGKILL it and anything else still carrying the run token."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for _ in range(20):
        left = _survivors(token)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def kill_all_active() -> None:
    """Kill every smoke run this process started (signal handlers of the CLI and MCP server)."""
    with _ACTIVE_LOCK:
        procs = list(_ACTIVE)
    for p in procs:
        _kill_tree(p, getattr(p, "_amd_token", ""), grace_s=1.0)


class _Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _terminate_as_exception():
    """Turn SIGTERM into an exception while a run is in flight (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def execute(
    plan: Plan,
    *,
    timeout_s: float,
    progress: ProgressFn | None,
    cancel: Any = None,
    keep_dir: bool = False,
    launcher: str = "elastic",
) -> SmokeReport:
    """Launch torchrun for ``plan`` and turn what the ranks wrote into a :class:`SmokeReport`."""
    if not _SLOTS.acquire(blocking=False):
        return SmokeReport(
            passed=False,
            status="not_run",
            **plan.report_base,
            reason=f"not run: {MAX_CONCURRENT} smoke runs are already in flight in this process "
            "(AUTOMODEL_DIST_MAX_CONCURRENT_SMOKE)",
        )
    run_dir = Path(tempfile.mkdtemp(prefix="automodel-dist-smoke-"))
    try:
        return _execute(plan, run_dir, timeout_s=timeout_s, progress=progress, cancel=cancel, launcher=launcher)
    finally:
        _SLOTS.release()
        if not keep_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def _execute(
    plan: Plan, run_dir: Path, *, timeout_s: float, progress: ProgressFn | None, cancel: Any, launcher: str
) -> SmokeReport:
    spec = replace(plan.spec, run_dir=str(run_dir), progress_file=str(run_dir / "progress.jsonl"))
    spec_path = run_dir / "spec.json"
    spec.write(spec_path)
    (run_dir / "logs").mkdir()
    args = launcher_args(launcher, plan.world_size, run_dir, spec_path)
    single, multi, srun = reproduce_commands(plan.world_size)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        AUTOMODEL_DIST_PARENT_PID=str(os.getpid()),
    )
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    notify = progress or (lambda *a: None)
    notify("launch", 0, plan.spec.steps, f"{launcher} launcher, {plan.world_size} ranks")
    log_path = run_dir / "torchrun.log"
    t0 = time.time()
    interrupted: str | None = None
    timed_out = False
    with open(log_path, "wb") as log, _terminate_as_exception():
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(run_dir),
            start_new_session=True,
        )
        proc._amd_token = run_dir.name  # type: ignore[attr-defined]
        with _ACTIVE_LOCK:
            _ACTIVE.add(proc)
        offset = 0
        published_at: float | None = None
        stuck_teardown = False
        try:
            while True:
                offset = _pump_progress(run_dir / "progress.jsonl", offset, notify)
                if proc.poll() is not None:
                    break
                if published_at is None and _all_published(run_dir, plan.world_size):
                    published_at = time.time()
                if published_at is not None and time.time() - published_at > TEARDOWN_GRACE_S:
                    stuck_teardown = True  # every result is in; a rank's process-group teardown hangs
                    break
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                if time.time() - t0 > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            interrupted = "SIGINT"
        except _Terminated as exc:
            interrupted = str(exc)
        except Cancelled:
            interrupted = "cancelled"
        finally:
            if proc.poll() is None or _survivors(run_dir.name):
                _kill_tree(proc, run_dir.name)
            with _ACTIVE_LOCK:
                _ACTIVE.discard(proc)
        _pump_progress(run_dir / "progress.jsonl", offset, notify)
    total = time.time() - t0
    report = collect_results(
        plan,
        run_dir,
        0 if stuck_teardown else proc.returncode,
        total=total,
        t0=t0,
        timed_out=timed_out,
        interrupted=interrupted,
        timeout_s=timeout_s,
    )
    if stuck_teardown:
        report.notes.append(
            f"every rank published its result, but rank process(es) had not exited "
            f"{TEARDOWN_GRACE_S:.0f}s later (process-group teardown); they were stopped, "
            "which does not change the results"
        )
    report.launcher = launcher
    report.command = single
    report.multinode_command = multi
    report.srun_command = srun
    notify("done", plan.spec.steps, plan.spec.steps, "passed" if report.passed else f"failed: {report.reason}")
    return report


def _all_published(run_dir: Path, world: int) -> bool:
    return all((run_dir / f"rank{r}.json").exists() for r in range(world))


def _pump_progress(path: Path, offset: int, notify: ProgressFn) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:
        return offset
    end = chunk.rfind(b"\n")
    if end < 0:
        return offset
    for line in chunk[:end].splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        notify(ev.get("phase", ""), int(ev.get("step", 0)), int(ev.get("total", 0)), ev.get("message", ""))
    return offset + end + 1


_COLLATERAL = (
    "timed out",
    "timeout",
    "connection closed",
    "connection reset",
    "broken pipe",
    "NCCL communicator was aborted",
    "terminated",
    "SIGTERM",
)


def collect_results(
    plan: Plan,
    run_dir: Path,
    returncode: int | None,
    *,
    total: float,
    t0: float,
    timed_out: bool,
    interrupted: str | None,
    timeout_s: float,
) -> SmokeReport:
    """The report of a finished launch from the results, progress and logs its ranks left in ``run_dir``."""
    world = plan.world_size
    results = read_results(run_dir, world, plan.spec.spec_id)
    log_tail = []
    with contextlib.suppress(OSError):
        log_tail = (run_dir / "torchrun.log").read_text(errors="replace").splitlines()[-30:]
    ranks: list[RankReport] = []
    for r in range(world):
        res = results.get(r)
        if res is None:
            state = "hung" if timed_out or _hung_by_progress(run_dir, r) else "terminated"
            tail = _rank_log_tail(run_dir, r)
            ranks.append(RankReport(rank=r, ok=False, state=state, traceback_tail=tail))
            continue
        ok = "error" not in res and "terminated" not in res
        state = "finished" if ok else ("terminated" if "terminated" in res else "failed")
        where = res.get("where") or {}
        ranks.append(
            RankReport(
                rank=r,
                ok=ok,
                state=state,
                groups=res.get("groups", {}),
                where=where,
                mesh_matches=(not res.get("mesh_mismatches")) if "groups" in res else None,
                stages=res.get("stages", []),
                step_times_s=res.get("step_times_s", []),
                peak_rss_mib=res.get("peak_rss_mib"),
                cuda_max_allocated_mib=res.get("cuda_max_allocated_mib"),
                param_bytes=res.get("param_bytes"),
                grad_bytes=res.get("grad_bytes"),
                optim_bytes=res.get("optim_bytes"),
                max_param_rel_diff=res.get("max_param_rel_diff"),
                worst_param=res.get("worst_param"),
                max_grad_rel_diff=res.get("max_grad_rel_diff"),
                error=res.get("error"),
                traceback_tail=res.get("traceback", []),
            )
        )
    base = dict(plan.report_base, ranks=ranks, launcher_log_tail=log_tail)
    base["notes"] = list(base.get("notes") or [])
    for res in results.values():  # workarounds the ranks applied, once each
        base["notes"] += [n for n in res.get("notes") or [] if isinstance(n, str) and n not in base["notes"]]
    first = next((results[r] for r in sorted(results) if "error" not in results[r]), None)
    any_res = results.get(0) or next(iter(results.values()), {})
    base.update(backend=any_res.get("backend"), device=any_res.get("device"))
    timing = Timing(total_s=total)
    if first:
        tm = first.get("timings", {})
        last_end = max((res.get("t_end", 0.0) for res in results.values()), default=0.0)
        timing = Timing(
            launch_s=max(0.0, first.get("t_start", t0) - t0),
            import_s=tm.get("import_s"),
            init_s=tm.get("init_s"),
            steps_s=tm.get("steps_s"),
            check_s=tm.get("check_s"),
            teardown_s=max(0.0, t0 + total - last_end) if last_end else None,
            total_s=total,
        )
    base["timing"] = timing
    if returncode and not (interrupted or timed_out) and all(rk.state == "finished" for rk in ranks):
        base["notes"].append(
            f"every rank published its result, then the launcher exited with code {returncode} "
            f"({_exit_detail(run_dir, log_tail)}): a process failed while shutting down (process-group teardown "
            "or interpreter exit), after every check here had run, so the results stand (launcher_log_tail has "
            "the launcher's account)"
        )
        return _judge(plan, results, base)
    failed = [rk.rank for rk in ranks if rk.state == "failed"]
    if failed and all(_collateral(rk.error) for rk in ranks if rk.state == "failed"):
        for rk in ranks:  # peers timed out waiting: ranks stopped from outside meanwhile were the hung ones
            if rk.state == "terminated":
                rk.state = "hung"
    hung = [rk.rank for rk in ranks if rk.state == "hung"]
    stopped = [rk.rank for rk in ranks if rk.state == "terminated"]
    if interrupted or timed_out or failed or stopped or len(results) < world or returncode:
        real = sorted(
            (rk for rk in ranks if rk.state == "failed" and not _collateral(rk.error)),
            key=lambda rk: results.get(rk.rank, {}).get("t_error", 0),
        )
        waiting = [rk.rank for rk in ranks if rk.state == "failed" and _collateral(rk.error)]
        root = real[0] if real else None
        last = _last_progress(run_dir)
        hung_at = {rk.rank: rk.where for rk in ranks if rk.state == "hung" and rk.where}
        if hung_at:
            last = "; ".join(f"rank {r} at {w.get('phase')} {w.get('step')}" for r, w in hung_at.items())
        if interrupted:
            reason = f"interrupted ({interrupted}): every rank was stopped"
        elif timed_out:
            reason = f"timed out after {timeout_s:.0f}s (last progress: {last}); rank(s) {hung} never finished"
        elif root is not None:
            reason = f"rank {root.rank} failed: {root.error}"
            if hung:
                reason += f"; rank(s) {hung} hung"
        elif hung:
            reason = f"rank(s) {hung} hung (last progress: {last})"
            if waiting:
                reason += (
                    f"; rank(s) {waiting} timed out waiting for them in a collective after "
                    f"{plan.spec.pg_timeout_s:.0f}s"
                )
        elif waiting:
            root = next(rk for rk in ranks if rk.rank == waiting[0])
            reason = f"rank {root.rank} failed: {root.error}"
        elif stopped:
            reason = f"rank(s) {stopped} were stopped from outside before they finished (last progress: {last})"
        else:
            missing = sorted(set(range(world)) - set(results))
            reason = f"torchrun exited with code {returncode} and rank(s) {missing} left no result"
        culprits = [rk.rank for rk in real] or hung or waiting[:1]
        tail = root.traceback_tail if root else log_tail[-15:]
        return SmokeReport(
            passed=False,
            status="failed",
            reason=reason,
            failed_ranks=culprits,
            hung_ranks=hung,
            error=root.error if root else None,
            traceback_tail=tail,
            explanations=explain_error("\n".join([*tail, root.error if root and root.error else ""])).matches[:3],
            **base,
        )
    return _judge(plan, results, base)


def read_results(run_dir: Path, world: int, spec_id: str | None) -> dict[int, dict[str, Any]]:
    """The ranks' ``rank<R>.json`` results in ``run_dir`` that belong to the spec ``spec_id``."""
    results: dict[int, dict[str, Any]] = {}
    for r in range(world):
        path = run_dir / f"rank{r}.json"
        if path.exists():
            with contextlib.suppress(ValueError, OSError):
                res = json.loads(path.read_text())
                if isinstance(res, dict) and res.get("spec_id") == spec_id:
                    results[r] = res
    return results


def _last_progress(run_dir: Path) -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        events = [json.loads(x) for x in (run_dir / "progress.jsonl").read_text().strip().splitlines()]
        ev = [e for e in events if e.get("phase") != "error"][-1]
        return f"{ev['phase']} {ev['step']}/{ev['total']} {ev['message']}".strip()
    return "none"


def _collateral(error: str | None) -> bool:
    low = (error or "").lower()
    return any(c.lower() in low for c in _COLLATERAL)


def _hung_by_progress(run_dir: Path, rank: int) -> bool:
    with contextlib.suppress(OSError):
        return f"rank {rank} hangs" in (run_dir / "progress.jsonl").read_text()
    return False


def _exit_detail(run_dir: Path, log_tail: list[str]) -> str:
    """How the ranks that exited badly ended: from the elastic agent's failure record, else torchrun's summary."""
    codes: list[tuple[str, int]] = []
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError, KeyError):
        failures = json.loads((run_dir / "agent_failure.json").read_text())["failures"]
        codes = [(rank, int(f["exitcode"])) for rank, f in failures.items()]
    if not codes:
        found = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", "\n".join(log_tail))
        codes = [(rank, int(code)) for rank, code in found]
    parts = []
    for rank, code in codes:
        name = None
        if code < 0:
            with contextlib.suppress(ValueError):
                name = signal.Signals(-code).name
        parts.append(f"rank {rank} ended by {name}" if name else f"rank {rank} exit code {code}")
    return "; ".join(parts) or "no rank named in its log"


def _rank_log_tail(run_dir: Path, rank: int) -> list[str]:
    for path in sorted((run_dir / "logs").rglob(f"{rank}/std*.log")):
        with contextlib.suppress(OSError):
            lines = path.read_text(errors="replace").splitlines()
            if lines:
                return lines[-10:]
    return []


def _judge(plan: Plan, results: dict[int, dict[str, Any]], base: dict[str, Any]) -> SmokeReport:
    tol = TOLERANCES[plan.spec.precision]
    r0 = results[0]
    losses, ref = r0["losses"], r0["reference_losses"]
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref)]
    diverged = next((i for i, d in enumerate(rel) if d > tol.loss_rel), None)
    worst = max(res.get("global_max_param_rel_diff", 0.0) for res in results.values())
    worst_grad = max(res.get("global_max_grad_rel_diff", 0.0) for res in results.values())
    mesh_ok = all(not res.get("mesh_mismatches") for res in results.values())
    finite = all(math.isfinite(x) for x in losses)
    decreasing = finite and len(losses) > 1 and losses[-1] < losses[0]
    problems = []
    if not mesh_ok:
        problems.append("torch's device-mesh groups differ from the engine's layout")
    if not finite:
        problems.append("non-finite loss")
    if diverged is not None:
        problems.append(
            f"loss diverges from the single-process reference at step {diverged} "
            f"({losses[diverged]:.6f} vs {ref[diverged]:.6f}, {rel[diverged]:.1e} > {tol.loss_rel:.0e})"
        )
    if worst_grad > tol.grad_rel:
        who = max(results.values(), key=lambda x: x.get("max_grad_rel_diff", 0.0))
        problems.append(
            f"first-step gradients differ from the reference by {worst_grad:.1e} (> {tol.grad_rel:.0e}), "
            f"worst {who.get('worst_grad')} on rank {who['rank']}"
        )
    if worst > tol.param_rel:
        worst_rank = max(results.values(), key=lambda x: x.get("max_param_rel_diff", 0.0))
        problems.append(
            f"final parameters differ from the reference by {worst:.1e} (> {tol.param_rel:.0e}), "
            f"worst {worst_rank.get('worst_param')} on rank {worst_rank['rank']}"
        )
    norms, ref_norms = r0.get("grad_norms") or [], r0.get("reference_grad_norms") or []
    norm_rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, ref_norms)]
    norm_off = next((i for i, x in enumerate(norm_rel) if not x <= tol.loss_rel), None)
    if norm_off is not None:
        problems.append(
            f"AutoModel's grad norm differs from the reference at step {norm_off} ({norms[norm_off]:.6g} vs "
            f"{ref_norms[norm_off]:.6g}, {norm_rel[norm_off]:.1e} > {tol.loss_rel:.0e})"
        )
    unmatched = sorted({n for res in results.values() for n in res.get("unmatched_tensors") or []})
    if unmatched:
        problems.append(
            f"{len(unmatched)} tensor(s) have no counterpart of the same shape in the reference: {', '.join(unmatched[:3])}"
        )
    if len(losses) > 1 and not decreasing:
        problems.append("loss did not decrease")
    still = max((res.get("still_elements") or 0 for res in results.values()), default=0)
    if still:
        base = {
            **base,
            "notes": [
                *base.get("notes", []),
                (
                    f"{still} parameter element(s) whose reference gradient is zero up to rounding (a key bias on "
                    "dimensions RoPE leaves alone, an expert no token of the batch reached) are left out of the "
                    "final-parameter comparison: Adam moves them by up to the learning rate on rounding alone; their "
                    "gradients are compared"
                ),
            ],
        }
    passed = not problems
    return SmokeReport(
        passed=passed,
        status="passed" if passed else "failed",
        reason="; ".join(problems) or None,
        losses=losses,
        reference_losses=ref,
        loss_rel_diffs=rel,
        max_param_rel_diff=worst,
        max_grad_rel_diff=worst_grad,
        diverged_at_step=diverged,
        loss_decreasing=decreasing,
        mesh_matches=mesh_ok,
        grad_norms=norms,
        reference_grad_norms=ref_norms,
        model_class=r0.get("model_class"),
        rewrites=list(dict.fromkeys(x for res in results.values() for x in res.get("rewrites") or [])),
        **base,
    )
