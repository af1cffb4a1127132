"""A dry run's spec measured on a real GPU: the same AutoModel 0.7.0 setup, model build, parallelizer and training step
as the dry run's worker (:mod:`.worker`, train_ft's order through :mod:`automodel_dist.stack.step`), on real CUDA
tensors, with the CUDA caching allocator's own counters (``torch.cuda.max_memory_allocated``, what AutoModel's log
calls ``mem``) in place of the fake tensors and torch's memory tracker.

A rank of a larger world runs alone on one GPU on torch's fake process group: its collectives move nothing, but every
buffer they allocate, every shard, gathered parameter, gradient and activation is a real allocation of its real size,
so the counters are that rank's memory. What the device lacks is stood in for exactly as the dry run stands in for it
(Transformer Engine's attention and cross-entropy: :mod:`automodel_dist.stack.te_attention`). Weights are AutoModel's
own random initialisation, so a one-rank MoE router routes as random weights route (the dry run assumes balanced
routing); expert parallelism and MoE on more than one rank are refused (:func:`refused`).

Run as ``python -m automodel_dist.dry_run.on_gpu CASES_DIR RESULT.json [--deadline-s S] [--jobs N]``. ``CASES_DIR``
holds one JSON file per case, ``{"name", "recipe", "full_depth", "spec"}`` with ``spec`` a :class:`DryRunSpec`
(written by ``tools/gpu_check.py make``). Every build runs in a process of its own, so no build inherits another's
allocations (a first run in one process kept a finished build's 3.2 GiB of weights and states into the next):
first every case's shallow builds (``--jobs`` at once: each process reads its own peak), then the full depths, one at
a time. The result is rewritten after every build, so a run cut short keeps what it measured, with each build's phase
times.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..catalog.models import EXPERT_COUNT_KEYS
from .spec import Build, DryRunSpec

GIB = float(1 << 30)


def _layers(build: Build) -> int | None:
    cfg = build.hf_config
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return cfg.get("num_hidden_layers") or text.get("num_hidden_layers")


def refused(spec: DryRunSpec) -> str | None:
    """Why this spec cannot be measured on one GPU alone (None: it can)."""
    ep = spec.build.distributed.get("ep_size", 1) or 1
    if ep > 1:
        return f"expert parallelism (ep {ep}): the fake group's token exchange carries no counts"
    if spec.world_size > 1 and _is_moe(spec.build):
        return (
            "a MoE model on a fake group: FSDP's gather leaves the weights unwritten, so the router would not choose "
            "as random weights do"
        )
    if spec.megatron_fsdp:
        return (
            "MegatronFSDP (the GPU check does not yet register its optimizers with the wrapper nor run the untracked "
            "step before the measured one, as the dry run does)"
        )
    if spec.media is not None:
        return "a VLM step (its batches are built for fake tensors)"
    if spec.recipe.fla_gdn:
        return "linear-attention layers (Gated DeltaNet or KDA: fla is not installed on the device)"
    if spec.recipe.mamba_ssm:
        return "Mamba-2 layers (mamba_ssm is not installed on the device)"
    return None


@contextlib.contextmanager
def replicas_agree() -> Iterator[None]:
    """The TP replicas' gradient census (``tp_replicas.synchronize_tp_replica_gradients`` sums, over the TP group,
    which parameters have a gradient) as a world of ranks running the same graph answers it: on the fake group the
    sum moves nothing, so each count is scaled by the group's size (the dry run answers the same read with the TP
    size)."""
    import nemo_automodel.components.distributed.tp_replicas as tp_replicas
    import torch
    import torch.distributed as dist

    from ..stack import shims

    plain = dist.all_reduce

    def all_reduce(tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
        work = plain(tensor, op=op, group=group, async_op=async_op)
        if op == dist.ReduceOp.SUM and tensor.dtype == torch.int32:
            tensor.mul_(dist.get_world_size(group))
        return work

    census = types.SimpleNamespace(**{k: getattr(dist, k) for k in dir(dist) if not k.startswith("__")})
    census.all_reduce = all_reduce
    with shims._patched(tp_replicas, "dist", census):
        yield


def _liger_patched(parts: list[Any]) -> int:
    """How many modules run a Liger kernel's forward (its instance patch rebinds ``forward``; AutoModel falls back to
    the plain class quietly where the patch fails, so the record says whether it took)."""
    count = 0
    for part in parts:
        for module in part.modules():
            fn = getattr(getattr(module, "forward", None), "__func__", None)
            count += bool(fn is not None and getattr(fn, "__module__", "").startswith("liger_kernel"))
    return count


def _is_moe(build: Build) -> bool:
    cfg = build.hf_config
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return any((cfg.get(k) or text.get(k) or 0) > 1 for k in EXPERT_COUNT_KEYS)


def _init_group(spec: DryRunSpec, build: Build, cuda: bool) -> str:
    """The rank alone on torch's fake group, as in the dry run; but a one-rank MoE world on a real group, whose
    collectives keep the values (FSDP's gather on the fake group leaves its output unwritten, and a router fed such
    weights routes as garbage routes, not as random weights do). Returns the backend."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    if spec.world_size == 1 and _is_moe(build):
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return backend
    dist.init_process_group("fake", rank=spec.rank, world_size=spec.world_size, store=FakeStore())
    return "fake"


def _build(spec: DryRunSpec, build: Build, dist_setup: Any, device: Any, out: dict[str, Any]) -> Any:
    """AutoModel's build of ``build``. On a GPU its modules are first made with the GPU as torch's default device:
    AutoModel builds a model without a pretrained checkpoint on the host and initialises every weight there twice
    (the layers' own reset, then transformers' init) before moving it, which took a three-layer 8B build over a
    minute on the device; made on the GPU the weights end where they would, and the step's peak is measured after
    the build. Should AutoModel refuse to build that way, it is built again as it builds itself (and says so)."""
    import gc

    import torch

    from ..stack import shims, step

    def plain(rewrites: list[str]) -> Any:
        return step.build(
            spec.recipe,
            build.hf_config,
            dist_setup,
            shims.real_build_patches(),
            rewrites,
            local_batch_size=spec.local_batch_size,
            seq_len=spec.seq_len,
        )

    if device.type != "cuda":
        return plain(out["rewrites"])
    rewrites: list[str] = []
    try:
        with torch.device(device):
            built = plain(rewrites)
        out["rewrites"] += rewrites
        out["init_on_gpu"] = True
        return built
    except torch.cuda.OutOfMemoryError:
        raise  # the build does not fit: building it on the host first would not change that
    except Exception as exc:  # noqa: BLE001 - retried as AutoModel builds it
        out["init_on_gpu"] = False
        out["init_on_gpu_error"] = f"{type(exc).__name__}: {exc}"[:500]
    gc.collect()
    torch.cuda.empty_cache()
    out["retry_start_allocated_gib"] = torch.cuda.memory_allocated() / GIB
    return plain(out["rewrites"])


def measure_build(spec: DryRunSpec, build: Build) -> dict[str, Any]:
    """One build of ``spec`` trained one step on the GPU (after a first optimizer step, so Adam's states exist, as
    in the dry run): the allocator's peak over the step, what was allocated before it, and each phase's seconds.
    Meant to run once per process (``--one``)."""
    import torch
    import torch.distributed as dist

    from ..stack import shims, step

    out: dict[str, Any] = {"layers": _layers(build), "status": "failed", "rewrites": [], "phases_s": {}}
    out["pid"] = os.getpid()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    cuda = device.type == "cuda"
    out["start_allocated_gib"] = torch.cuda.memory_allocated() / GIB if cuda else None
    if cuda:  # what the device had free: builds measured side by side (--jobs) share it
        out["free_at_start_gib"] = round(torch.cuda.mem_get_info()[0] / GIB, 3)
    t0 = time.perf_counter()
    mark = [t0]

    def phase(name: str) -> None:
        now = time.perf_counter()
        out["phases_s"][name] = round(now - mark[0], 3)
        mark[0] = now

    try:
        out["process_group"] = _init_group(spec, build, cuda)
        dist_setup = step.setup(build.distributed, spec.world_size)
        phase("group")
        built = _build(spec, build, dist_setup, device, out)
        out["class"] = built.params.get("class")
        out["liger_patched_modules"] = _liger_patched(built.parts)
        out["after_build_gib"] = torch.cuda.memory_allocated() / GIB if cuda else None
        phase("build")
        optimizers = step.optimizer(built, spec.recipe.optimizer["target"], spec.recipe.optimizer["kwargs"])
        with contextlib.ExitStack() as patches:
            patches.enter_context(replicas_agree())
            if spec.recipe.loss["name"] == "TEParallelCrossEntropy":
                patches.enter_context(shims.te_cross_entropy())
            step.first_optimizer_step(
                built.parts,
                optimizers,
                media=False,
                state_dtype=spec.recipe.optimizer["state_dtype"],
                master=spec.recipe.optimizer.get("master_weights"),
            )
            vocab = built.hf_config.get_text_config().vocab_size
            shapes = step.batch_shapes(
                built.pp_enabled, spec.micro_batch_size, spec.local_batch_size, spec.microbatches, spec.seq_len
            )
            batches = []
            for shape in shapes:
                ids = torch.randint(0, vocab, shape, device=device)
                batches.append({"input_ids": ids, "labels": ids.clone()})
            num_label_tokens = step.every_token_labelled(built, batches)
            if built.pp_enabled:
                step.configure_pipeline_loss(built)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                out["before_step_gib"] = torch.cuda.memory_allocated() / GIB
            phase("optimizer")
            step.train_step(
                built,
                optimizers,
                batches,
                num_label_tokens=num_label_tokens,
                clip_grad_norm=spec.recipe.clip_grad_norm,
                step_optimizer=spec.recipe.steps_optimizer,
            )
            if cuda:
                torch.cuda.synchronize()
                out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
                out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
            phase("step")
        out["status"] = "measured"
    except Exception as exc:  # noqa: BLE001 - AutoModel's own exception is the result
        oom = cuda and isinstance(exc, torch.cuda.OutOfMemoryError)
        out.update(status="out_of_memory" if oom else "failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        frames = traceback.extract_tb(exc.__traceback__)
        out["traceback"] = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" for f in frames][-10:]
        if oom:
            out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    finally:
        out["wall_s"] = round(time.perf_counter() - t0, 2)
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
    return out


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_memory_gib=round(props.total_memory / GIB, 2))
    for dist_name in ("nemo-automodel", "transformers", "liger-kernel", "triton"):
        with contextlib.suppress(md.PackageNotFoundError):
            env[dist_name] = md.version(dist_name)
    return env


def spec_digest(spec: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def one(case_path: Path, which: str, out_path: Path) -> dict[str, Any]:
    """A single build of a case (``which``: the shallow build's index, or ``full``), in this process."""
    import warnings

    import torch._dynamo

    from ..stack import shims

    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    # eager, as the dry run's step runs (Dynamo refuses fake tensors there), so both measure the same graph; a
    # recipe with enable_compile is measured without its fusions on both sides
    torch._dynamo.config.disable = True
    shims.import_automodel()
    spec = DryRunSpec.model_validate(json.loads(case_path.read_text(encoding="utf-8"))["spec"])
    if spec.recipe.te_stand_in:
        shims.install_te_attention()  # TE is not installed on the device either: the dry run's stand-in
    shims.install_compiled_activations()
    build = spec.build if which == "full" else spec.measured_builds()[int(which)]
    import_s = round(time.perf_counter() - t0, 2)
    res = measure_build(spec, build)
    res["phases_s"] = {"import": import_s, **res["phases_s"]}
    res["build"] = which
    # which spec this is the measurement of (the test holds a record to the committed case file)
    res["spec_sha256"] = spec_digest(json.loads(case_path.read_text(encoding="utf-8"))["spec"])
    res["environment"] = environment()
    res["broken_shims"] = shims.broken()
    res["shim_hits"] = {name: s.hits for name, s in shims.SHIMS.items() if s.hits}
    out_path.write_text(json.dumps(res, default=str), encoding="utf-8")
    return res


def _tasks(cases_dir: Path) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], Path, str]], list[Any]]:
    """The result rows, and the builds to run: every case's shallow builds (or its one build), then full depths."""
    rows, shallow, full = [], [], []
    paths = sorted(cases_dir.glob("*.json"))
    if not paths:
        raise SystemExit(f"no case files (*.json) in {cases_dir}: write them with tools/gpu_check.py make")
    for path in paths:
        case = json.loads(path.read_text(encoding="utf-8"))
        spec = DryRunSpec.model_validate(case["spec"])
        row: dict[str, Any] = {k: case[k] for k in ("name", "recipe") if k in case}
        row.update(world_size=spec.world_size, rank=spec.rank, seq_len=spec.seq_len, builds=[])
        rows.append(row)
        why = refused(spec)
        if why:
            row["refused"] = why
            continue
        for i in range(len(spec.measured_builds())):
            shallow.append((row, path, str(i)))
        if spec.builds and case.get("full_depth"):
            full.append((row, path, "full"))
    return rows, shallow, full


def run_cases(cases_dir: Path, result_path: Path, deadline_s: float, jobs: int = 1) -> dict[str, Any]:
    """Every build of every case in a process of its own (see the module's docstring); the result rewritten as each
    ends. A build still running at the deadline is stopped and says so."""
    import subprocess
    import tempfile
    import threading
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    rows, shallow, full = _tasks(cases_dir)
    result: dict[str, Any] = {"cases": rows}
    lock = threading.Lock()
    # no hub: a config is the spec's, and a lookup that waits on a network that is not there costs a build its time
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def save() -> None:
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        result_path.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")

    def measure(path: Path, which: str) -> dict[str, Any]:
        left = deadline_s - (time.perf_counter() - t0)
        if left <= 5:
            return {"build": which, "status": "skipped", "error": "deadline"}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "build.json"
            cmd = [sys.executable, "-m", "automodel_dist.dry_run.on_gpu", "--one", str(path), which, str(out)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=child_env)
            except subprocess.TimeoutExpired:
                return {"build": which, "status": "skipped", "error": f"stopped at the deadline ({deadline_s:.0f} s)"}
            try:
                return json.loads(out.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # killed before or while writing its result
                return {"build": which, "status": "failed", "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}

    def record(row: dict[str, Any], res: dict[str, Any]) -> None:
        with lock:
            env = res.pop("environment", None)
            if env:
                result.setdefault("environment", env)
            row["builds"] = [b for b in row["builds"] if b.get("build") != res.get("build")] + [res]
            said = f"{res['status']} {res.get('peak_allocated_gib')} {res.get('error', '')[:200]}"
            print(f"{row['name']} [{res.get('build')}]: {said}", flush=True)
            save()

    def task(item: tuple[dict[str, Any], Path, str]) -> dict[str, Any]:
        row, path, which = item
        res = measure(path, which)
        record(row, res)
        return res

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(task, shallow))
    if jobs > 1:  # out of memory beside other builds is not out of memory alone: measured again, alone
        for item, res in zip(shallow, done):
            if res.get("status") == "out_of_memory":
                task(item)
    for item in full:
        task(item)
    save()
    return result


def leftover_gib(build: dict[str, Any], previous: dict[str, Any] | None) -> float:
    """What was still allocated when a measured build started, to take off its peak. The runner records it (0 in a
    process of its own). The first record (2026-12-04) ran a case's builds one after another in one process and did
    not: there the build before (``previous``) left its weights and optimizer states, what it had allocated before its
    step. Its one-off allocations in the step (cuBLAS's workspaces) are not taken off: a process of its own makes them
    too."""
    for key in ("retry_start_allocated_gib", "start_allocated_gib"):  # a refused GPU-default build's, else the start's
        if build.get(key) is not None:
            return float(build[key])
    return 0.0 if previous is None else float(previous["before_step_gib"])


def against_gpu(
    recipe: Path,
    fields: dict[str, Any],
    build: dict[str, Any],
    *,
    rank: int = 0,
    full_depth: bool = False,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The dry run (``dry_run(recipe, num_layers=...)``, or extrapolated to the full depth) and the estimate of a build
    the GPU measured on ``rank``, beside the GPU's own peak (less what an earlier build left, :func:`leftover_gib`);
    ``weights_gap_gib``: what the build had allocated beyond the dry run's parameter bytes (nothing but the weights
    exist then)."""
    from .run import dry_run

    layers = None if full_depth else build["layers"]
    report = dry_run(recipe, num_layers=layers, ranks=[rank], headroom=0.0, **fields)
    measured = [r for r in report.ranks if r.peak is not None and r.rank == rank]
    out: dict[str, Any] = {"layers": build["layers"], "full_depth": full_depth, "dry_run_status": report.status}
    if not measured:
        return out
    peak = measured[0].peak
    left = leftover_gib(build, previous)
    gpu = build["peak_allocated_gib"] - left
    total = next((d for d in report.estimate_vs_dry_run if d.category == "total"), None)
    out.update(
        gpu_gib=round(gpu, 3),
        # the allocator's reserve only where nothing was left over (a leftover's share of it is not known)
        gpu_reserved_gib=round(build["peak_reserved_gib"], 3) if abs(left) < 0.01 else None,
        leftover_gib=round(left, 3),
        dry_run_gib=round(peak.total, 3),
        params_gib=round(peak.params, 4),
        weights_gap_gib=round(build["after_build_gib"] - left - peak.params, 4),
        estimate_gib=round(total.estimate_gib, 3) if total else None,
    )
    out["dry_run_vs_gpu"] = round(out["dry_run_gib"] / gpu - 1, 4)
    if total:
        out["estimate_vs_gpu"] = round(total.estimate_gib / gpu - 1, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--one":
        one(Path(args[1]), args[2], Path(args[3]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m automodel_dist.dry_run.on_gpu")
    ap.add_argument("cases", type=Path)
    ap.add_argument("result", type=Path)
    ap.add_argument("--deadline-s", type=float, default=3600.0)
    ap.add_argument("--jobs", type=int, default=1, help="shallow builds measured at once (one process each)")
    ns = ap.parse_args(args)
    run_cases(ns.cases, ns.result, ns.deadline_s, ns.jobs)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
