"""Run the planned ranks, each in its own process (the fake process group and AutoModel's module state are per
process; forked from one that imported AutoModel's stack once, dry_run/launcher.py), with a wall-time limit, a
host-memory cap, progress and cancellation; then assemble the report."""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from ..environment import missing_packages
from ..estimate.api import cluster_of
from ..estimate.memory import CUDA_CONTEXT_GIB, FRAGMENTATION, GIB
from ..explain import explain_error
from ..request import ConfigInput, Request, RequestFields
from .plan import TEACHER_NOT_BUILT, DryRunUsageError, Plan, plan_dry_run
from .report import CategoryDiff, DryRunReport, MemorySplit, RankResult, measured_verdict
from .spec import DryRunSpec

ProgressFn = Callable[[str, int, int, str], None]
PHASES = (
    "import",
    "setup",
    "build",
    "optimizer",
    "forward",
    "loss",
    "backward",
    "pipeline_schedule",
    "clip_grad_norm",
    "done",
)
INSTALL = (
    "pip install --no-deps nemo-automodel==0.7.0 && pip install transformers==5.18.0 (beside the torch of the "
    "training environment; nemo-automodel's full dependency set also works)"
)
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_HOST_GIB = 4.0  # per rank process; a rank takes about 0.5 GiB at any model size


class DryRunUnavailable(RuntimeError):
    """NeMo AutoModel, torch or transformers is not installed here (CLI exit 2)."""


def versions() -> dict[str, str]:
    out = {}
    for dist in ("nemo_automodel", "torch", "transformers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def _rss_mib(pgid: int) -> float:
    """Resident memory of every process in the group (Linux /proc), MiB: each process's proportional share of its
    pages (Pss, where the kernel gives it), so that pages a rank shares with a process it forked (a side-by-side
    build) or was forked from count once, else its resident set (VmRSS)."""
    total = 0
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            total += _kib(entry / "smaps_rollup", "Pss:") or _kib(entry / "status", "VmRSS:")
        except (OSError, ValueError, ProcessLookupError):
            continue
    return total / 1024


def _kib(path: Path, key: str) -> int:
    """The ``key`` line's KiB in a /proc file (0 where the file or the line is missing)."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def _environment() -> dict[str, str]:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        # torch.compile'd functions (GPT-OSS's experts) run eagerly: Dynamo refuses the fake-tensor and tracker
        # dispatch modes; eager code keeps at least what a compiled graph keeps (stated in the report)
        TORCHDYNAMO_DISABLE="1",
    )
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class _Launcher:
    """The parent's side of dry_run/launcher.py: the process the ranks are started from (through a fork server that
    imports AutoModel's stack once). Ranks are named by their tag, unique for the launcher's life: it serves every dry
    run of this process while their ranks' environment and the dry run's code stay the same (:func:`_acquire`)."""

    def __init__(self, env: dict[str, str] | None = None, key: Any = None) -> None:
        self._err = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "automodel_dist.dry_run.launcher"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            errors="replace",
            env=env if env is not None else _environment(),
            start_new_session=True,
        )
        self.key = key
        self.users = 0  # runs using it now (guarded by _POOL_LOCK)
        self.served = 0  # runs that have used it
        self._idle: threading.Timer | None = None
        self._runs = itertools.count()
        self._changed = threading.Condition()
        self.gone = False
        self.closed = False
        self.pids: dict[str, int] = {}
        self.exits: dict[str, int] = {}
        self._abandoned: set[str] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                try:
                    kind, tag, value = json.loads(line)
                except (ValueError, TypeError):
                    continue
                with self._changed:
                    if kind == "pid":
                        self.pids[tag] = value
                        if tag in self._abandoned:  # its rank gave up while the fork server imported
                            _stop(value)
                    elif kind == "exit":
                        self.exits[tag] = value
                    self._changed.notify_all()
        finally:
            with self._changed:
                self.gone = True
                self._changed.notify_all()

    def start(self, tag: str, paths: list[Path], give_up: Callable[[], str | None]) -> int | str:
        """The started rank's pid (the id of its own process group), or why there is none: ``give_up``'s answer
        (a rank started meanwhile is stopped as soon as its pid arrives), or ``"gone"`` when the launcher exited."""
        assert self.proc.stdin is not None
        with self._changed:
            why = give_up()
            if why:
                return why
            try:
                self.proc.stdin.write(json.dumps([tag, *map(str, paths)]) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                return "gone"
            while tag not in self.pids:
                why = "gone" if self.gone else give_up()
                if why:
                    self._abandoned.add(tag)
                    return why
                self._changed.wait(0.2)
            return self.pids[tag]

    def exit_code(self, tag: str, timeout: float) -> int | None:
        """The rank's exit code once it ended (None while it runs); a rank the launcher left behind counts as
        killed."""
        with self._changed:
            if tag not in self.exits and not self.gone:
                self._changed.wait(timeout)
            return self.exits.get(tag, -signal.SIGKILL if self.gone else None)

    def orphaned(self, tag: str) -> bool:
        """The launcher exited with the rank still running (it is stopped by :meth:`close`)."""
        with self._changed:
            return self.gone and tag not in self.exits

    def exited(self, when: str) -> str:
        """A rank's error where the launcher exited ``when``."""
        code = self.proc.poll()
        return f"the process the ranks are started from (automodel_dist.dry_run.launcher) exited with {code} {when}"

    def begin(self) -> tuple[str, int]:
        """A run's tag prefix, unique for the launcher's life, and where the launcher's stderr stood when it began
        (what a failure of the run shows is what came after: the launcher outlives runs)."""
        with self._changed:
            self._err.seek(0, os.SEEK_END)
            return f"run{next(self._runs)}", self._err.tell()

    def stderr(self, since: int = 0) -> list[str]:
        with self._changed:
            self._err.seek(since)
            return self._err.read().strip().splitlines()[-12:]

    def _running(self, tags: set[str] | None = None) -> list[int]:
        with self._changed:
            return [pid for tag, pid in self.pids.items() if tag not in self.exits and (tags is None or tag in tags)]

    def alive(self) -> bool:
        return not (self.closed or self.gone) and self.proc.poll() is None

    def stop(self, tags: set[str]) -> None:
        """A run's end: its ranks still running (a cancelled run's, an orphan's) are stopped, and a rank whose start
        it gave up on is stopped once its pid arrives."""
        with self._changed:
            self._abandoned |= {t for t in tags if t not in self.pids}
        for pid in self._running(tags):
            _stop(pid)

    def close(self, *, cancelled: bool = False) -> None:
        """No more ranks: the launcher exits; a rank still running is stopped, and so is the launcher's session (its
        fork server, which may still be importing, and its resource tracker) once it has exited, or at once when the
        run was cancelled."""
        with self._changed:
            if self.closed:
                return
            self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        for pid in self._running():
            _stop(pid)
        if not cancelled:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        _stop(self.proc.pid)
        self.proc.wait()
        for pid in self._running():  # started while the launcher wound down
            _stop(pid)
        self._err.close()


IDLE_S = 60.0
"""How long a launcher with no run waits for the next before it exits (its fork server holds AutoModel's stack
imported, about 0.4 GiB of host memory)."""

_POOL_LOCK = threading.Lock()
_SHARED: _Launcher | None = None


def _code_stamp() -> tuple[Any, ...]:
    """What the fork server imported: this package's newest source file and AutoModel's, torch's and transformers'
    versions (an edit or an upgrade starts a new launcher rather than fork ranks from the old code), and the
    directory the ranks start in."""
    root = Path(__file__).resolve().parents[1]

    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:  # (an editor's lock file, a file removed meanwhile)
            return 0.0

    newest = max((mtime(p) for p in root.rglob("*.py")), default=0.0)
    return str(root), newest, tuple(versions().items()), os.getcwd()


def _acquire() -> _Launcher:
    """A launcher for one run: the shared one while it lives and the ranks' environment and the code are what it
    started with, else a new one (the old one exits once its runs end)."""
    global _SHARED
    env = _environment()
    # (pytest's per-test variable changes from test to test and means nothing to a rank)
    key = (tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST")), _code_stamp())
    with _POOL_LOCK:
        current = _SHARED
        if current is not None and current.key == key and current.alive():
            if current._idle is not None:
                current._idle.cancel()
                current._idle = None
            current.users += 1
            current.served += 1
            return current
        retired = current if current is not None and current.users == 0 else None
        _SHARED = _Launcher(env, key)
        _SHARED.users = _SHARED.served = 1
        launcher = _SHARED
    if retired is not None:
        retired.close()
    return launcher


def _release(launcher: _Launcher, tags: set[str], *, cancelled: bool) -> None:
    """A run's end: its ranks stopped; the launcher kept for the next run for :data:`IDLE_S` (closed at once after a
    cancelled run, after one that outlived it, or where a newer one has replaced it)."""
    global _SHARED
    launcher.stop(tags)
    with _POOL_LOCK:
        launcher.users -= 1
        if launcher.users > 0:
            return
        if not cancelled and launcher is _SHARED and launcher.alive():
            launcher._idle = threading.Timer(IDLE_S, _close_idle, args=(launcher,))
            launcher._idle.daemon = True
            launcher._idle.start()
            return
        if _SHARED is launcher:
            _SHARED = None
    launcher.close(cancelled=cancelled)


def _close_idle(launcher: _Launcher) -> None:
    global _SHARED
    with _POOL_LOCK:
        # a run took it as the timer fired, or took it and left it again (a newer timer is its own)
        if launcher.users or launcher._idle is not threading.current_thread():
            return
        if _SHARED is launcher:
            _SHARED = None
    launcher.close()


def shut_down() -> None:
    """Close the launcher kept between dry runs (its fork server with it): at once, or where runs use it as the last
    of them ends; the next dry run starts a new one. Runs at interpreter exit."""
    global _SHARED
    with _POOL_LOCK:
        launcher, _SHARED = _SHARED, None
        if launcher is None or launcher.users:
            return
    launcher.close()


def _forget_in_child() -> None:
    """A process forked from this one owns neither the launcher nor the lock's state."""
    global _SHARED, _POOL_LOCK
    _SHARED, _POOL_LOCK = None, threading.Lock()


atexit.register(shut_down)
os.register_at_fork(after_in_child=_forget_in_child)


def _stop(pgid: int) -> None:
    """Kill the process group ``pgid`` (a rank's, or the launcher's session): a rank's pid is reported only once it
    leads its own group, so no process is ever killed by a pid that may since have been reused."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _run_rank(
    spec: DryRunSpec,
    launcher: _Launcher,
    tmp: Path,
    *,
    timeout_s: float,
    host_gib: float,
    cancel: threading.Event,
    progress: Callable[[int, str], None],
    tag: str,
    since: int,
    began: float,
) -> dict[str, Any]:
    rank = spec.rank
    start = time.monotonic()
    paths = {name: tmp / f"rank{rank}.{name}" for name in ("spec.json", "result.json", "stdout", "stderr")}
    spec.write(paths["spec.json"])
    peak_rss = 0.0
    seen = 0

    def limit_hit(rss: float = 0.0) -> str | None:
        if cancel.is_set():
            return "cancelled"
        if time.monotonic() - start > timeout_s:
            return "timeout"
        return "host_memory_cap" if rss > host_gib * 1024 else None

    def read_progress() -> None:
        nonlocal seen
        with contextlib.suppress(OSError):
            lines = paths["stdout"].read_text(encoding="utf-8", errors="replace").splitlines()
            for line in lines[seen:]:
                if line.startswith("PHASE "):
                    progress(rank, line[6:].strip())
            seen = len(lines)

    started = launcher.start(tag, list(paths.values()), limit_hit)
    why = started if isinstance(started, str) else None
    code = None
    if why == "gone":
        return {
            "rank": rank,
            "status": "failed",
            "error": launcher.exited(f"before rank {rank} started"),
            "traceback": launcher.stderr(since),
        }
    while isinstance(started, int):
        code = launcher.exit_code(tag, timeout=0.2)
        read_progress()
        if code is not None:
            break
        rss = _rss_mib(started)
        peak_rss = max(peak_rss, rss)
        why = limit_hit(rss)
        if why:
            _stop(started)
            break
    if why:
        limit = {
            "timeout": f"the wall-time limit of {timeout_s:.0f} s",
            "host_memory_cap": (
                f"the host-memory cap of {host_gib:g} GiB (raise it with --host-memory-gib / host_gib; a rank "
                "that holds real tensors, e.g. a model built at full depth, needs more)"
            ),
            "cancelled": "cancellation",
        }[why]
        return {"rank": rank, "status": why, "reason": f"stopped by {limit}", "host_peak_rss_mib": round(peak_rss, 1)}
    try:
        result = json.loads(paths["result.json"].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = paths["stderr"].read_text(encoding="utf-8", errors="replace")
        orphaned = launcher.orphaned(tag)
        return {
            "rank": rank,
            "status": "failed",
            "error": (
                launcher.exited(f"while rank {rank} ran")
                if orphaned
                else f"the dry-run process exited with {code} and wrote no result"
            ),
            "traceback": (launcher.stderr(since) if orphaned else []) + stderr.strip().splitlines()[-12:],
        }
    result["host_peak_rss_mib"] = max(float(result.get("host_peak_rss_mib") or 0), round(peak_rss, 1))
    preload_s, done = result.pop("preload_s", None), result.pop("preload_done", None)
    if preload_s is not None and done is not None:
        # what of the fork server's import this run waited for (all of it where the run started the fork server,
        # none where an earlier run's had finished before this one began) is the rank's import time too
        waited = min(preload_s, max(0.0, done - began))
        phases = result.setdefault("phases_s", {})
        phases["import"] = round(phases.get("import", 0.0) + waited, 3)
        result["import_earlier"] = done <= began
    return result


# the report's moments: a rank built whole with many stages and microbatches records hundreds (three per pipeline action)
REPORTED_MOMENTS = 24


def largest_moments(moments: dict[str, float], keep: int = REPORTED_MOMENTS) -> dict[str, float]:
    """The ``keep`` largest moments, in the order the step reached them."""
    top = set(sorted(moments, key=moments.__getitem__, reverse=True)[:keep])
    return {k: v for k, v in moments.items() if k in top}


def _rank_result(raw: dict[str, Any]) -> RankResult:
    peak = raw.get("peak")
    error = raw.get("error")
    explanations = []
    if error:
        text = error + "\n" + "\n".join(raw.get("traceback") or [])
        explanations = explain_error(text).matches
    loc = raw.get("local_bytes") or {}
    return RankResult(
        rank=raw["rank"],
        status=raw["status"],
        pp_stages=raw.get("pp_stages") or [],
        peak_allocated_gib=peak["total"] if peak else None,
        peak=MemorySplit(**peak) if peak else None,
        peak_phase=raw.get("peak_phase"),
        tracker=raw.get("tracker"),
        tracker_categories_gib=raw.get("peak_categories") or {},
        phase_peaks_gib=raw.get("phase_peaks") or {},
        moment_peaks_gib=largest_moments(raw.get("moment_peaks") or {}),
        peak_moment=raw.get("peak_moment"),
        largest_modules=[tuple(x) for x in raw.get("largest_modules") or []],
        forward_retained=[tuple(x) for x in raw.get("forward_retained") or []],
        after_forward=MemorySplit(**raw["after_forward"]) if raw.get("after_forward") else None,
        local_param_bytes=loc.get("params"),
        local_grad_bytes=loc.get("grads"),
        local_trainable_param_bytes=loc.get("trainable_params"),
        optimizer_state_bytes=loc.get("optimizer_states"),
        phases_s=raw.get("phases_s") or {},
        import_shared=bool(raw.get("import_shared")),
        import_earlier=bool(raw.get("import_earlier")),
        side_by_side=bool(raw.get("side_by_side")),
        host_peak_rss_mib=raw.get("host_peak_rss_mib"),
        error=error,
        error_phase=raw.get("error_phase"),
        traceback=raw.get("traceback") or [],
        explanations=explanations,
        reason=raw.get("reason"),
        builds=raw.get("builds") or [],
        shim_hits=raw.get("shim_hits") or {},
    )


def _estimate(request: Request, plan: Plan) -> dict[str, float] | None:
    """The analytic estimate of the same request's layout at the sizes the dry run ran (None where it cannot size
    it)."""
    from ..estimate import estimate_memory
    from ..report import ConfigError

    if plan.num_layers != plan.model.num_layers:
        import dataclasses

        model: Any = dataclasses.replace(
            plan.model,
            num_layers=plan.num_layers,
            layer_types=plan.model.layer_types[: plan.num_layers],
            hf_config=None,
        )
    else:
        model = plan.model
    try:
        est = estimate_memory(
            request.replace(
                model=model,
                world_size=plan.dims.world_size,
                seq_len=plan.seq_len,
                micro_batch_size=plan.micro_batch_size,
            )
        )
    except (ConfigError, ValueError):
        return None
    m = est.memory_gib
    return {
        "params": m.params,
        "grads": m.grads,
        "optimizer": m.optimizer,
        "activations": m.activations,
        "temporaries": m.buffers,
        "total": m.tracked_peak,
    }


def concurrency(ranks: int, cores: int) -> int:
    """How many measured ranks run at once: never more than 4 (each rank's process takes about 0.5 GiB of host
    memory). A rank's work is CPU-bound and fixed: 3 ranks on 2 cores finish in 1.5 ranks' time all at once rather
    than 2 in two rounds, while 4 ranks on 2 cores took longer all at once than two at a time (Ling-1T's PP 8 recipe,
    two alternating runs: 96 and 80 s against 84 and 64 s), so more ranks than cores run at once only where all of
    them fit under the cap and the cores cannot take them in even rounds."""
    if ranks <= min(cores, 4) or (ranks <= 4 and ranks % cores):
        return max(1, ranks)
    return min(cores, 4)


def side_by_side(ranks: int, cores: int) -> bool:
    """Whether each rank's two shallow builds run at once in two processes: where every build then has a core of its
    own under the cap of 4 processes (one rank on two cores; two on four). A rank's builds one after the other share
    FakeTensorMode's operator cache (the second runs about 15% faster than on its own), so where the cores are busy
    anyway they stay in one process."""
    return 2 * ranks <= min(cores, 4)


def dry_run(
    config: ConfigInput | Request,
    *,
    ranks: list[int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    num_layers: int | None = None,
    full_depth: bool = False,
    headroom: float = 0.1,
    host_gib: float = DEFAULT_HOST_GIB,
    **fields: Unpack[RequestFields],
) -> DryRunReport:
    """AutoModel 0.7.0's own setup, model build (its registry's class, its PEFT, its TP/SP/EP/AC/FSDP2
    parallelizer), weight materialisation, loss and optimizer step for ``config`` (or a whole :class:`Request`; the
    keywords are its fields: world size or nodes x GPUs per node, model, sizes, overrides, ``gpu`` for the verdict)
    at the full model size and world size, on a fake process group under FakeTensorMode: nothing is allocated.
    Measures rank 0, or the first rank of each pipeline stage position where the peak can fall (or ``ranks``) with
    torch's memory tracker.

    The model is found as ``validate_config`` finds it (``fetch_config``: may download its config.json alone).
    A model whose layers repeat is built twice per rank at a shallow depth and its figures extrapolated per layer to
    the full depth (the report says so); ``full_depth`` builds every layer (slower, the same figures up to the
    extrapolation). ``num_layers`` builds only the first N layers (tests, quick looks; the report says so). Raises
    :class:`DryRunUnavailable` without AutoModel, torch or transformers, :class:`DryRunUsageError` (a ValueError)
    for arguments that do not describe a run. A layout AutoModel rejects comes back as a FAILED report carrying
    AutoModel's own exception.
    """
    request = Request.of(config, **fields)
    missing = missing_packages()
    if missing:
        raise DryRunUnavailable(
            f"the dry run runs NeMo AutoModel's own code and needs {', '.join(missing)} installed here: {INSTALL}"
        )
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise DryRunUsageError(f"timeout_s must be positive, got {timeout_s!r}")
    if not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
        raise DryRunUsageError(f"headroom must be in [0, 1), got {headroom!r}")
    try:
        gpu_spec = cluster_of(request).gpu  # the named GPU with the request's memory_gib, when given
    except ValueError as exc:
        raise DryRunUsageError(str(exc)) from exc
    t0 = time.monotonic()
    plan = plan_dry_run(request, ranks=ranks, num_layers=num_layers, full_depth=full_depth)
    cancel = cancel or threading.Event()
    notify = progress or (lambda *a: None)
    done: dict[int, int] = {}

    def on_phase(rank: int, phase: str) -> None:
        done[rank] = done.get(rank, 0) + 1
        notify(phase, sum(done.values()), len(plan.specs) * len(PHASES), f"rank {rank}")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = concurrency(len(plan.specs), cores)
    specs = plan.specs
    if side_by_side(len(specs), cores):
        specs = [s.model_copy(update={"side_by_side": bool(s.builds)}) for s in specs]
    raws: list[dict[str, Any]] = []
    if specs:  # none where every rank is refused before it runs: no launcher, no import
        with tempfile.TemporaryDirectory(prefix="automodel-dist-dryrun-") as tmp:
            began = time.time()  # (the wall clock: the fork server's import is timed on it, in another process)
            launcher = _acquire()
            run_tag, since = launcher.begin()
            tags = {s.rank: f"{run_tag}.{s.rank}" for s in specs}
            try:
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    raws = list(
                        pool.map(
                            lambda s: _run_rank(
                                s,
                                launcher,
                                Path(tmp),
                                timeout_s=timeout_s,
                                host_gib=host_gib,
                                cancel=cancel,
                                progress=on_phase,
                                tag=tags[s.rank],
                                since=since,
                                began=began,
                            ),
                            specs,
                        )
                    )
            finally:
                _release(launcher, set(tags.values()), cancelled=cancel.is_set())
    results = [_rank_result(r) for r in raws]
    results += [RankResult(rank=r, status="not_measured", reason=why) for r, why in plan.unmeasured_ranks.items()]
    results.sort(key=lambda r: r.rank)
    measured = [r for r in results if r.status == "measured"]
    if measured and len(measured) == len(results):
        status = "measured"
    elif any(r.status in ("failed", "timeout", "host_memory_cap", "cancelled") for r in results):
        status = "failed"
    else:
        status = "partial"
    rewrites = sorted({x for raw in raws for x in raw.get("rewrites") or []})
    first = next((raw for raw in raws if raw.get("params")), None)
    budget = gpu_spec.memory_gib * (1 - headroom)
    worst = max((r.peak_allocated_gib or 0.0 for r in measured), default=None)
    with_overhead = worst + CUDA_CONTEXT_GIB + FRAGMENTATION * worst if worst is not None else None
    estimate = _estimate(request, plan) if measured else None
    diffs = []
    if estimate is not None:
        top = max(measured, key=lambda r: r.peak_allocated_gib or 0.0)
        assert top.peak is not None
        for cat in ("params", "grads", "optimizer", "activations", "temporaries", "total"):
            ours = getattr(top.peak, cat)
            diffs.append(
                CategoryDiff(
                    category=cat,
                    dry_run_gib=round(ours, 4),
                    estimate_gib=round(estimate[cat], 4),
                    difference=round((estimate[cat] - ours) / ours, 4) if ours else 0.0,
                )
            )
    notes = list(plan.notes) + [
        "the step ran with Python's cyclic garbage collector held off after one collection, as AutoModel runs it "
        "where a recipe sets step_scheduler.gc_every_steps; elsewhere a collection mid-step could only free memory, "
        "so the figures are at most that much higher",
        "figures are bytes torch's allocator would be asked for (FakeTensorMode: nothing allocated), without its "
        "caching and fragmentation, CUDA context or NCCL buffers; the same figure as a GPU's max_memory_allocated "
        "where one was compared (docs/gpu-check.md: within 0.3% on the builds an H200 ran)",
    ]
    expected = plan.model.param_count() if plan.num_layers == plan.model.num_layers else None
    if (
        first
        and plan.dims.pp > 1
        and plan.model.tie_word_embeddings
        and (expected is None or first["params"]["total"] > expected)
    ):
        notes.append(
            "AutoModel 0.7.0 trains a separate lm_head under pipeline parallelism for this tied model (its "
            "meta-device init breaks the tie and only the path without PP ties it again): the parameters "
            "above include it"
        )
    version = versions().get("nemo_automodel", "?")
    if version.split("+")[0] != "0.7.0":
        notes.append(f"AutoModel {version} is installed, not 0.7.0: the dry run ran that release's own code")
    judged = (
        with_overhead is not None
        and status == "measured"
        and not any(x.startswith(TEACHER_NOT_BUILT) for x in plan.not_measured)
        and not any(x.startswith(("seq_len", "image")) for x in plan.assumed)  # none on an assumed length or image
    )
    verdict = None
    if judged and with_overhead is not None:
        verdict = measured_verdict(with_overhead, budget, gpu_spec.memory_gib)
    return DryRunReport(
        status=status,
        fits=(with_overhead <= budget) if judged and with_overhead is not None else None,
        verdict=verdict,
        model=plan.model.name,
        model_source=plan.model_source,
        world_size=plan.dims.world_size or 0,
        gpus_per_node=plan.report.gpus_per_node,
        layout=plan.report.resolved,
        seq_len=plan.seq_len,
        micro_batch_size=plan.micro_batch_size,
        local_batch_size=plan.local_batch_size,
        microbatches=plan.microbatches,
        measured_microbatches=plan.measured_microbatches,
        num_layers=plan.num_layers,
        assumed=plan.assumed,
        ranks=results,
        params_total=first["params"]["total"] if first else None,
        params_trainable=first["params"]["trainable"] if first else None,
        gpu=gpu_spec.name,
        gpu_memory_gib=gpu_spec.memory_gib,
        headroom=headroom,
        overhead={"cuda_context_gib": CUDA_CONTEXT_GIB, "fragmentation": FRAGMENTATION},
        peak_with_overhead_gib=round(with_overhead, 3) if with_overhead is not None else None,
        estimate=estimate,
        estimate_vs_dry_run=diffs,
        substitutions=plan.substitutions + rewrites,
        not_measured=plan.not_measured,
        notes=notes,
        versions=versions(),
        wall_s=round(time.monotonic() - t0, 2),
        findings=[f for f in plan.report.findings if f.severity != "info"],
    )


__all__ = ["dry_run", "DryRunUnavailable", "DryRunUsageError", "missing_packages", "GIB"]
