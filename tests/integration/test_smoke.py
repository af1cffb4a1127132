"""run_smoke_test really launches processes: every layout family on CPU (gloo) against one process,
plus the ways a run can fail (parity skew, crash, hang, interrupted parent, cancellation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from automodel_dist import run_smoke_test as _run_smoke_test
from automodel_dist.smoke import SmokeUsageError
from automodel_dist.smoke.request import SmokeRequest
from support.paths import EXAMPLES
from support.session import own_processes

FP32 = {"precision": "fp32"}


def run_smoke_test(*args, **kwargs):
    """This file tests the tiny stack and the launcher both stacks share (faults, timeouts, cancellation, exports):
    every run asks for the tiny stack unless a test says otherwise. AutoModel's stack: test_smoke_automodel.py."""
    kwargs.setdefault("stack", "tiny")
    return _run_smoke_test(*args, **kwargs)


def survivors() -> list[str]:
    """Processes this test session's smoke runs left (elastic agent, torchrun, ranks)."""
    return own_processes("automodel_dist.smoke", "torch.distributed.run")


def leftover_dirs() -> list[str]:
    import tempfile
    from pathlib import Path

    return [p.name for p in Path(tempfile.gettempdir()).glob("automodel-dist-smoke-*")]


@pytest.fixture(autouse=True)
def no_leftovers():
    before = set(leftover_dirs())
    yield
    deadline = time.time() + 10
    while survivors() and time.time() < deadline:
        time.sleep(0.2)
    assert survivors() == []
    assert set(leftover_dirs()) - before == set()


def assert_passed(report, *, precision="fp32"):
    assert report.passed, f"{report.reason}\n{report.error}\n" + "\n".join(report.traceback_tail[-10:])
    assert report.status == "passed" and report.mesh_matches and report.loss_decreasing
    assert report.tolerance.precision == precision
    assert max(report.loss_rel_diffs) <= report.tolerance.loss_rel
    assert report.max_param_rel_diff <= report.tolerance.param_rel
    assert report.max_grad_rel_diff <= report.tolerance.grad_rel
    assert len(report.losses) == len(report.reference_losses) == report.steps
    assert all(r.state == "finished" and r.mesh_matches for r in report.ranks)
    assert report.command.startswith("OMP_NUM_THREADS=1 torchrun --standalone")


# The tiny stack's default cases: what AutoModel's own stack cannot run here (DDP, CP) and one of each family; the
# layouts AutoModel's stack proves on its own classes (test_smoke_automodel.py) run here under the slow marker.
LAYOUTS = [
    pytest.param(dict(strategy="ddp"), 2, {}, id="ddp"),
    pytest.param({}, 2, {"precision": "auto"}, id="fsdp2-bf16-default-mp"),
    pytest.param(dict(cp=2), 4, FP32, id="cp-fsdp2"),
    pytest.param(dict(pp=2, pp_schedule="interleaved1f1b"), 2, FP32, id="pp-interleaved1f1b"),
    pytest.param(dict(ep=2), 4, dict(FP32, model="tiny-moe"), id="ep-fsdp2-on-ep_shard"),
    pytest.param(dict(activation_checkpointing="selective"), 2, FP32, id="ac-selective"),
]

SLOW_LAYOUTS = [
    pytest.param({}, 2, FP32, id="fsdp2-fp32"),
    pytest.param(dict(dp_replicate=2), 4, FP32, id="hsdp"),
    pytest.param(dict(tp=2), 2, FP32, id="tp"),
    pytest.param(dict(tp=2, sequence_parallel=True), 2, FP32, id="tp-sp"),
    pytest.param(dict(tp=2), 4, FP32, id="tp-fsdp2"),
    pytest.param(dict(pp=2, pp_schedule="1f1b"), 2, FP32, id="pp-1f1b"),
    pytest.param(dict(pp=2, pp_schedule="gpipe"), 2, FP32, id="pp-gpipe"),
    pytest.param(dict(pp=2), 4, FP32, id="pp-fsdp2"),
    pytest.param(dict(activation_checkpointing=True), 2, FP32, id="ac-full"),
    pytest.param(dict(pp=2, tp=2), 8, FP32, id="3d-pp2-dp2-tp2"),
    # bf16 MoE: against an fp32 reference, rounding alone re-routes tokens (0.35 off on a router's gradient)
    pytest.param(dict(ep=4), 4, dict(model="tiny-moe", precision="auto"), id="ep4-moe-bf16-default-mp"),
    pytest.param(dict(pp=2, pp_schedule="loopedbfs"), 2, FP32, id="pp-loopedbfs"),
    pytest.param(dict(pp=2, pp_schedule="interleavedzerobubble"), 2, FP32, id="pp-izb"),
    pytest.param(dict(pp=2, pp_schedule="zbvzerobubble"), 2, FP32, id="pp-zbv"),
    pytest.param(dict(pp=2, pp_schedule="dualpipev"), 2, FP32, id="pp-dualpipev"),
    pytest.param(dict(cp=2), 2, FP32, id="cp"),
    pytest.param(dict(tp=2, cp=2), 4, FP32, id="tp-cp"),
    pytest.param(dict(dp_replicate=2, cp=2), 8, FP32, id="hsdp-cp"),
    pytest.param(dict(ep=2), 2, dict(FP32, model="tiny-moe"), id="ep"),
    # TP with EP needs a tp_plan in AutoModel (moe-tp); the smoke runner applies its own plan to the tiny model
    pytest.param(
        dict(ep=2, tp=2),
        4,
        dict(FP32, model="tiny-moe", config={"distributed": {"tp_plan": "plans.moe_tp"}}),
        id="ep-tp",
    ),
    pytest.param(dict(pp=2, ep=2), 4, dict(FP32, model="tiny-moe"), id="pp-ep"),
    pytest.param(dict(cp=2, ep=2), 4, dict(FP32, model="tiny-moe"), id="cp-ep"),
    pytest.param(dict(cp=2, pp=2), 4, FP32, id="cp-pp"),
    pytest.param(dict(strategy="ddp", activation_checkpointing="selective"), 2, {}, id="ddp-ac-selective"),
    pytest.param(dict(pp=2), 4, {"precision": "bf16"}, id="pp-fsdp2-bf16"),
]


@pytest.mark.parametrize("overrides,world,kwargs", LAYOUTS)
def test_layout_matches_one_process(overrides, world, kwargs):
    report = run_smoke_test(world_size=world, **overrides, **kwargs)
    precision = "bf16" if kwargs.get("precision") in ("auto", "bf16") else "fp32"
    assert_passed(report, precision=precision)
    assert report.world_size == world and len(report.ranks) == world
    assert report.launcher == "elastic"


def test_pp_tp_sp_is_refused_as_automodel_fails_it():
    """The tiny stack runs PP + TP + SP with parity, but AutoModel's pipeline fails it (pp-sequence-parallel; its
    own stack shows the failure in test_smoke_automodel.py): the smoke run refuses it before launch."""
    report = run_smoke_test(world_size=4, pp=2, tp=2, sequence_parallel=True, stack="tiny")
    assert report.status == "failed" and not report.ranks
    assert [f.rule for f in report.findings if f.severity == "error"] == ["pp-sequence-parallel"]


@pytest.mark.slow
@pytest.mark.parametrize("overrides,world,kwargs", SLOW_LAYOUTS)
def test_more_layouts_match_one_process(overrides, world, kwargs):
    report = run_smoke_test(world_size=world, **overrides, **kwargs)
    assert_passed(report, precision="bf16" if kwargs.get("precision") in ("auto", "bf16") else "fp32")
    if overrides.get("pp_schedule") in ("zbvzerobubble", "dualpipev"):  # two adjacent stages on each rank
        from torch.distributed.pipelining import PipelineStage, schedules

        # torch < 2.13 warms up by sending rank -> itself (2.13-2.14 vote instead; 2.15 has no such warm-up)
        legacy_warmup = hasattr(PipelineStage, "_get_init_p2p_neighbors_ops") and not hasattr(
            schedules.PipelineScheduleMulti, "_warmup_p2p"
        )
        assert any("gloo cannot send to its own rank" in n for n in report.notes) == legacy_warmup, report.notes


def test_bf16_reference_computes_like_fsdp2_mixed_precision():
    """Under a mixed-precision policy the single-process reference runs forward and backward on a param_dtype
    copy of its fp32 master weights, as FSDP2 does; fp32 needs no copy."""
    import torch

    from automodel_dist.smoke.model_size import tiny_config
    from automodel_dist.smoke.tiny_models import TinyConfig, build_full
    from automodel_dist.smoke.worker import _compute_copy, _mixed_precision_sync

    ref = build_full(TinyConfig(**tiny_config(tp=1, stages=1, ep=1, moe=True)), 0)
    assert _compute_copy(ref, None) is ref and _compute_copy(ref, {"param_dtype": "float32"}) is ref
    low = _compute_copy(ref, {"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in ref.parameters()} == {torch.float32}
    with torch.no_grad():
        next(ref.parameters()).add_(1.0)  # an optimizer step on the master weights
    _mixed_precision_sync(ref, low)
    assert all(torch.equal(p, m.to(torch.bfloat16)) for m, p in zip(ref.parameters(), low.parameters()))


def test_pipeline_warmup_self_pairs_are_dropped_under_gloo():
    from types import SimpleNamespace

    from automodel_dist.smoke.worker import _skip_self_p2p_warmup

    ops = [
        SimpleNamespace(group_peer=p, name=n)
        for p, n in ((0, "recv-prev"), (1, "send-next"), (1, "recv-next"), (0, "send-prev"))
    ]
    stage = SimpleNamespace(group_rank=1, _get_init_p2p_neighbors_ops=lambda: list(ops))
    notes: list[str] = []
    _skip_self_p2p_warmup(stage, notes)
    assert [op.name for op in stage._get_init_p2p_neighbors_ops()] == ["recv-prev", "send-prev"]
    assert [op.name for op in stage._get_init_p2p_neighbors_ops()] == ["recv-prev", "send-prev"]
    assert len(notes) == 1 and "gloo cannot send to its own rank" in notes[0]
    other = SimpleNamespace(group_rank=0, _get_init_p2p_neighbors_ops=lambda: [ops[1]])  # a peer on another rank
    _skip_self_p2p_warmup(other, quiet := [])
    assert other._get_init_p2p_neighbors_ops() == [ops[1]] and quiet == []
    newer = SimpleNamespace(group_rank=0)  # torch 2.15 has no such warm-up: nothing to patch
    _skip_self_p2p_warmup(newer, quiet)
    assert vars(newer) == {"group_rank": 0} and quiet == []


def test_tp_plan_is_noted_not_applied(monkeypatch):
    from automodel_dist.smoke import launch
    from automodel_dist.smoke.launch import make_plan

    monkeypatch.setattr(launch, "_installed_torch", lambda: "2.13.0+cpu")  # no torch-release note, whatever is here
    plan = make_plan(
        SmokeRequest.of(
            {"distributed": {"tp_size": 2, "ep_size": 2, "tp_plan": "plans.moe_tp"}},
            world_size=4,
            steps=2,
            model="tiny-moe",
            precision="fp32",
            stack="tiny",
        )
    )
    assert plan.report_base["notes"] == [
        "tp_plan is not applied: the smoke runner shards its tiny model with its own "
        "TP plan (attention and MLP projections; routed experts stay EP-owned)"
    ]


def test_torch_release_automodel_cannot_use_is_a_note_not_a_refusal(monkeypatch):
    # the run proves the layout with torch's own fully_shard, which works on torch 2.15; AutoModel 0.7.0 would not
    from automodel_dist import render
    from automodel_dist.smoke import launch
    from automodel_dist.smoke.report import SmokeReport

    monkeypatch.setattr(launch, "_installed_torch", lambda: "2.15.0+cu132")
    plan = launch.make_plan(
        SmokeRequest.of(
            {"distributed": {"tp_size": 2}},
            world_size=4,
            steps=2,
            model="tiny-llama",
            precision="fp32",
            stack="tiny",
        )
    )
    assert isinstance(plan, launch.Plan) and not plan.findings
    [note] = plan.report_base["notes"]
    assert note.startswith("torch 2.15.0+cu132 with strategy fsdp2 on 4 ranks: AutoModel 0.7.0's FSDP2 parallelizer")
    assert note.endswith(
        "(that is the torch installed here: this smoke run shards with torch's own fully_shard, "
        "so it can pass where AutoModel 0.7.0 would fail)"
    )
    assert f"note: {note}" in render.smoke_text(SmokeReport(passed=True, status="passed", **plan.report_base))
    ddp_plan = launch.make_plan(
        SmokeRequest.of(
            {"distributed": {"strategy": "ddp"}},
            world_size=2,
            steps=2,
            model="tiny-llama",
            precision="fp32",
            stack="tiny",
        )
    )
    assert isinstance(ddp_plan, launch.Plan) and ddp_plan.report_base["notes"] == []  # ddp does not touch FSDP


def test_layout_automodel_rejects_is_not_launched():
    # AutoModel's MoE path rejects sequence parallelism with TP (moe-tp): the run is refused, nothing starts
    report = run_smoke_test(world_size=4, ep=4, tp=2, sequence_parallel=True, model="tiny-moe", precision="fp32")
    assert not report.passed and report.status == "failed" and not report.ranks
    assert "custom MoE TP path" in report.reason
    assert {f.rule for f in report.findings if f.severity == "error"} == {"moe-tp"}


def test_config_file_layout_and_groups_match_the_engine(tmp_path):
    from automodel_dist import build_mesh

    cfg = tmp_path / "r.yaml"
    cfg.write_text("distributed:\n  tp_size: 2\n  pp_size: 2\n  pipeline:\n    pp_schedule: gpipe\n")
    report = run_smoke_test(cfg, world_size=4, precision="fp32")
    assert_passed(report)
    assert report.layout.pp_schedule == "GPipe"
    engine = build_mesh(cfg, world_size=4)
    for r in report.ranks:
        assert r.groups == engine.rank_groups[str(r.rank)]
    assert sorted(s for r in report.ranks for s in r.stages) == [0, 0, 1, 1]


def test_torchrun_cli_launcher_runs_the_same_worker():
    report = run_smoke_test(world_size=2, tp=2, precision="fp32", launcher="torchrun")
    assert_passed(report)
    assert report.launcher == "torchrun"


def run_exported(exported, nproc: int | None = None) -> subprocess.CompletedProcess:
    """Run the one-node command an export printed, literally (torchrun as ``python -m torch.distributed.run``)."""
    command = exported.command.replace("torchrun", f"{sys.executable} -m torch.distributed.run", 1)
    if nproc is not None:
        command = command.replace(f"--nproc-per-node {exported.world_size}", f"--nproc-per-node {nproc}")
    return subprocess.run(["bash", "-c", command], cwd=exported.directory, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the default suite launches and judges an export on AutoModel's stack (test_smoke_automodel.py)
def test_exported_run_launched_by_torchrun_is_judged_like_a_local_run(tmp_path):
    """export writes DIR/spec.json; the printed torchrun command runs it in DIR; judge gives the local verdict.
    A second export into DIR removes nothing, and the first one's results are never judged as its own."""
    from automodel_dist.smoke import export_smoke_test, judge_smoke_test

    out = tmp_path / "run"
    exported = export_smoke_test(None, out, world_size=2, tp=2, precision="fp32", stack="tiny")
    assert exported.spec_file == str(out / "spec.json") and "--nproc-per-node 2" in exported.command
    assert exported.judge_command == f"automodel-dist smoke --judge {out}"
    from automodel_dist.render import smoke_text

    local = run_smoke_test(world_size=2, tp=2, precision="fp32")  # its reproduce line gives a working export
    assert_passed(local)
    assert (
        f"reproduce: add `--export DIR --world-size 2` to this command (it prints the torchrun/srun lines for a "
        f"cluster too), run `{exported.command}` in DIR, then `automodel-dist smoke --judge DIR`"
    ) in smoke_text(local)
    assert "--nnodes $SLURM_NNODES" in exported.srun_command
    done = run_exported(exported)
    assert done.returncode == 0, done.stderr[-2000:]
    report = judge_smoke_test(out)
    assert_passed(report.model_copy(update={"command": "OMP_NUM_THREADS=1 torchrun --standalone"}))
    assert report.launcher == "external" and report.world_size == 2 and report.layout.tp == 2
    assert report.ranks[1].groups["tp"] == [0, 1] and report.timing.launch_s is None
    cli = subprocess.run(
        [sys.executable, "-m", "automodel_dist.cli", "smoke", "--judge", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0 and json.loads(cli.stdout)["passed"], cli.stderr
    good = (out / "rank0.json").read_text()
    (out / "rank0.json").write_text(json.dumps(dict(json.loads(good), losses=None)))
    with pytest.raises(SmokeUsageError, match="are not what the smoke worker writes"):
        judge_smoke_test(out)
    (out / "rank0.json").write_text(good)
    (out / "notes.txt").write_text("mine")
    again = export_smoke_test(None, out, world_size=2, tp=2, precision="fp32", stack="tiny")
    assert len(list(out.glob("rank*.json"))) == 2 and (out / "notes.txt").read_text() == "mine"  # nothing removed
    missing = judge_smoke_test(out)  # the first spec's results are not this spec's
    assert not missing.passed and missing.failed_ranks == [0, 1] and "left no result" in missing.reason
    assert {r.state for r in missing.ranks} == {"not_started"} and again.spec_file == exported.spec_file


def test_exported_run_launched_with_the_wrong_world_size_says_so(tmp_path):
    from automodel_dist.smoke import export_smoke_test, judge_smoke_test

    exported = export_smoke_test(None, tmp_path, world_size=4, tp=2, stack="tiny")
    assert run_exported(exported, nproc=2).returncode != 0
    report = judge_smoke_test(tmp_path)
    assert not report.passed and "this spec is for 4 ranks, but the launcher started 2" in report.reason
    states = [r.state for r in report.ranks]
    # both started ranks refuse the spec; the launcher may stop one before it gets there once the other has failed
    assert "failed" in states[:2] and set(states[:2]) <= {"failed", "terminated"}, states
    assert states[2:] == ["not_started", "not_started"]


def test_a_failed_cluster_run_is_judged_with_the_known_cause(tmp_path):
    """Ranks of an exported run that failed on the cluster (NCCL transport on rank 1, its peer timing out): the judge
    names the root rank and attaches explain_error's cause and fix."""
    from automodel_dist.render import smoke_text
    from automodel_dist.smoke import export_smoke_test, judge_smoke_test

    exported = export_smoke_test(None, tmp_path, world_size=2, tp=2, stack="tiny")
    spec_id = json.loads(Path(exported.spec_file).read_text())["spec_id"]
    nccl = (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details)"
    )
    for rank, error, t in (
        (
            0,
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out "
            "waiting 60000ms for recv operation to complete",
            20.0,
        ),
        (1, nccl, 10.0),
    ):
        (tmp_path / f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "error": error,
                    "traceback": ["Traceback (most recent call last):", error],
                    "t_start": 1.0,
                    "t_error": t,
                    "where": {"phase": "init"},
                    "spec_id": spec_id,
                }
            )
        )
    report = judge_smoke_test(tmp_path)
    assert not report.passed and report.reason.startswith("rank 1 failed: torch.distributed.DistBackendError")
    assert [e.rule for e in report.explanations][:1] == ["runtime-nccl-system"]
    assert "known cause [runtime-nccl-system]: A system call inside NCCL failed" in smoke_text(report)


def test_export_plans_for_the_cluster_not_this_machine(tmp_path, capsys):
    """64 ranks are over the CPU limit here but fine to export; what cannot run anywhere is still refused; the CLI
    needs a world size for --export and nothing else with --judge."""
    from automodel_dist.cli import main
    from automodel_dist.smoke import SmokeExport, export_smoke_test, judge_smoke_test

    assert isinstance(export_smoke_test(None, tmp_path / "big", world_size=64, tp=8, stack="tiny"), SmokeExport)
    assert json.loads((tmp_path / "big" / "spec.json").read_text())["world_size"] == 64
    mf = export_smoke_test(None, tmp_path / "mf", world_size=8, strategy="megatron_fsdp", stack="tiny")
    assert mf.status == "not_run" and "does not implement MegatronFSDP" in mf.reason
    bad = export_smoke_test(None, tmp_path / "bad", world_size=4, tp=3, stack="tiny")
    assert bad.status == "failed" and "config is invalid" in bad.reason and not (tmp_path / "bad").exists()
    with pytest.raises(SmokeUsageError, match="world_size must be a positive integer"):
        export_smoke_test(None, tmp_path, world_size=0, stack="tiny")
    with pytest.raises(SmokeUsageError, match="is not a smoke spec written by export_smoke_test"):
        judge_smoke_test(tmp_path / "nothing")
    assert main(["smoke", "--export", str(tmp_path / "cli"), "--world-size", "8", "--pp", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {tmp_path / 'cli' / 'spec.json'}: a smoke run on 8 ranks")
    assert f"then: automodel-dist smoke --judge {tmp_path / 'cli'}" in printed
    assert main(["smoke", "--export", str(tmp_path / "cli"), "--tp", "3", "--world-size", "8"]) == 1
    assert main(["smoke", "--export", str(tmp_path / "cli")]) == 2
    assert "--export needs --world-size" in capsys.readouterr().err
    assert main(["smoke", "x.yaml", "--judge", str(tmp_path / "cli")]) == 2
    assert main(["smoke", "--judge", str(tmp_path / "cli")]) == 1  # exported, never launched
    assert "ranks [0,1,2,3,4,5,6,7]: not_started" in capsys.readouterr().out


def test_progress_callback_reports_every_step():
    events = []
    report = run_smoke_test(world_size=2, steps=4, progress=lambda *e: events.append(e), precision="fp32")
    assert_passed(report)
    phases = [e[0] for e in events]
    assert phases[0] == "launch" and phases[-1] == "done"
    assert [e[1] for e in events if e[0] == "step"] == [0, 1, 2, 3, 4]
    assert {"init", "reference", "compare"} <= set(phases)


def test_skew_fault_fails_parity_and_names_the_step():
    report = run_smoke_test(world_size=2, steps=3, precision="fp32", fault="skew@1:1")
    assert not report.passed and report.status == "failed"
    assert report.diverged_at_step == 2  # the step after the skewed update
    assert "loss diverges from the single-process reference at step 2" in report.reason
    assert report.max_param_rel_diff > report.tolerance.param_rel
    assert report.failed_ranks == [] and all(r.state == "finished" for r in report.ranks)


def test_skew_at_step_zero_is_caught_by_the_gradient_check():
    report = run_smoke_test(world_size=2, steps=2, precision="fp32", fault="skew@0:0")
    assert not report.passed and "first-step gradients differ" in report.reason


def test_crashing_rank_is_named_with_its_traceback():
    report = run_smoke_test(world_size=2, precision="fp32", fault="crash@1:1", pg_timeout_s=20)
    assert report.status == "failed" and report.failed_ranks == [1]
    assert report.error == "RuntimeError: injected fault: crash@1:1"
    assert any("injected fault" in line for line in report.traceback_tail)
    assert report.reason.startswith("rank 1 failed: RuntimeError: injected fault")


def test_hanging_rank_is_named_after_the_process_group_timeout():
    t = time.time()
    report = run_smoke_test(world_size=2, precision="fp32", fault="hang@1:1", pg_timeout_s=5, timeout_s=120)
    assert time.time() - t < 60
    assert report.status == "failed" and report.hung_ranks == [1] and report.failed_ranks == [1]
    assert report.reason.startswith("rank(s) [1] hung (last progress: rank 1 at step 1)")


def test_wall_clock_timeout_kills_everything():
    report = run_smoke_test(world_size=2, precision="fp32", fault="hang@1:0", pg_timeout_s=600, timeout_s=12)
    assert report.status == "failed" and report.reason.startswith("timed out after 12s")


def test_rank_stuck_in_teardown_after_publishing_does_not_hold_the_result(monkeypatch):
    """A rank whose process-group teardown never returns (seen once with gloo under DDP) is stopped
    after the grace period; its published result stands."""
    from automodel_dist.smoke import launch

    grace = 4.0  # the default (20 s) only makes the test slower
    monkeypatch.setattr(launch, "TEARDOWN_GRACE_S", grace)
    t = time.time()
    report = run_smoke_test(
        {"distributed": {"strategy": "ddp"}},
        world_size=2,
        precision="fp32",
        fault="stall@1:0",
        pg_timeout_s=120,
        timeout_s=120,
    )
    assert report.passed, report.reason
    assert any("had not exited" in n for n in report.notes)
    assert time.time() - t < grace + 45
    assert report.timing.teardown_s is not None and report.timing.teardown_s >= grace


@pytest.mark.parametrize("launcher", ["elastic", pytest.param("torchrun", marks=pytest.mark.slow)])
def test_rank_dying_at_exit_after_publishing_keeps_the_results(launcher):
    """A rank that dies by a signal after its result and teardown (torch 2.14 aborted once at exit): the launcher
    exits non-zero, yet every check has run; the report judges the results and says how the rank ended."""
    report = run_smoke_test(world_size=2, steps=2, precision="fp32", fault="abort@1:0", launcher=launcher)
    assert_passed(report)
    note = next(n for n in report.notes if "while shutting down" in n)
    assert "rank 1 ended by SIGABRT" in note and "the results stand" in note, note


def test_cancel_event_stops_the_run():
    cancel = threading.Event()

    def progress(phase, step, total, message):
        if phase == "step" and step >= 1:
            cancel.set()

    report = run_smoke_test(world_size=2, steps=50, precision="fp32", progress=progress, cancel=cancel)
    assert report.status == "failed" and report.reason.startswith("interrupted (cancelled)")


@pytest.mark.parametrize("sig,code,name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_to_the_parent_reaps_every_rank(sig, code, name):
    # A shell starts background jobs with SIGINT ignored, and a Python started so never raises KeyboardInterrupt:
    # give the CLI the default disposition, as a terminal's foreground job has it.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "automodel_dist.cli",
            "smoke",
            "--stack",
            "tiny",
            "--world-size",
            "2",
            "--steps",
            "60",
            "--precision",
            "fp32",
            "--fault",
            "hang@1:2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in proc.stderr:  # wait until the ranks are training
        if line.startswith("step"):
            break
    time.sleep(0.5)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert f"interrupted ({name})" in out


def test_not_run_and_invalid_cases_never_pass():
    mf = run_smoke_test(world_size=2, strategy="megatron_fsdp")
    assert mf.status == "not_run" and not mf.passed and "megatron-fsdp" in mf.reason
    bad = run_smoke_test(world_size=4, tp=3)
    assert bad.status == "failed" and "config is invalid" in bad.reason and bad.ranks == []
    big = run_smoke_test(world_size=64, tp=2)
    assert big.status == "not_run" and "CPU limit" in big.reason and "--export DIR" in big.reason


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(steps=0),
        dict(model="gpt5"),
        dict(fault="explode@1:1"),
        dict(fault="crash@9:0"),
        dict(precision="fp8"),
        dict(launcher="mpirun"),
    ],
)
def test_usage_errors(kwargs):
    with pytest.raises(SmokeUsageError):
        run_smoke_test(world_size=2, **kwargs)


def test_cli_smoke_json_and_exit_codes(tmp_path):
    """Exit codes 2 (usage) and 1 (failed run); a passing `--json` run (0) is the README's, checked in test_docs."""
    bad = subprocess.run(
        [sys.executable, "-m", "automodel_dist.cli", "smoke", "--world-size", "2", "--fault", "oops"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--fault must look like" in bad.stderr
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "automodel_dist.cli",
            "smoke",
            "--stack",
            "tiny",
            "--world-size",
            "2",
            "--precision",
            "fp32",
            "--fault",
            "crash@0:0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 1 and "FAILED: rank 0 failed" in failed.stdout
    assert os.environ.get("AUTOMODEL_DIST_MAX_CPU_WORLD", "16") == "16"


@pytest.mark.parametrize("launcher", ["elastic", pytest.param("torchrun", marks=pytest.mark.slow)])
def test_default_rendezvous_port_taken(launcher, monkeypatch):
    """Another job holds torch's default port 29500 (and MASTER_PORT names it): runs pick a free port."""
    import socket

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 29500))
        holder.listen()
    except OSError:
        pass  # already taken by something else: the situation under test anyway
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    try:
        report = run_smoke_test(world_size=2, steps=2, precision="fp32", launcher=launcher)
    finally:
        holder.close()
    assert_passed(report)


def test_ranks_are_forked_from_a_single_threaded_process():
    """The elastic agent has threads (its store's server, a keep-alive timer); a rank forked from it while
    one held a libc lock hung in getaddrinfo inside init_process_group about once in 100 4-rank runs. The
    ranks come from a fork server instead: a process with one thread."""
    import shutil
    import tempfile
    from pathlib import Path

    before = set(leftover_dirs())
    try:
        report = run_smoke_test(world_size=2, steps=2, precision="fp32", keep_dir=True)
        assert_passed(report)
        (run_dir,) = set(leftover_dirs()) - before
        ranks = [json.loads(p.read_text()) for p in (Path(tempfile.gettempdir()) / run_dir).glob("rank*.json")]
        assert sorted(r["rank"] for r in ranks) == [0, 1]
        assert [r["parent_threads"] for r in ranks] == [1, 1]
    finally:
        for name in set(leftover_dirs()) - before:
            shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


@pytest.mark.slow
def test_two_runs_at_once_do_not_interfere():
    reports: dict[str, object] = {}

    def go(name, **kw):
        reports[name] = run_smoke_test(world_size=2, steps=2, precision="fp32", **kw)

    threads = [
        threading.Thread(target=go, args=("tp",), kwargs={"tp": 2}),
        threading.Thread(target=go, args=("ddp",), kwargs={"strategy": "ddp"}),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert_passed(reports["tp"])
    assert_passed(reports["ddp"])
    assert reports["tp"].layout.tp == 2 and reports["ddp"].layout.strategy == "ddp"


def test_concurrency_limit_refuses_a_run_beyond_it(monkeypatch):
    from automodel_dist.smoke import launch

    monkeypatch.setattr(launch, "MAX_CONCURRENT", 1)
    monkeypatch.setattr(launch, "_SLOTS", threading.BoundedSemaphore(1))
    cancel, started, box = threading.Event(), threading.Event(), {}

    def progress(phase, step, total, message):
        if phase == "step":
            started.set()

    first = threading.Thread(
        target=lambda: box.setdefault(
            "r", run_smoke_test(world_size=2, steps=100, precision="fp32", progress=progress, cancel=cancel)
        )
    )
    first.start()
    assert started.wait(120)
    refused = run_smoke_test(world_size=2, precision="fp32")
    cancel.set()
    first.join(timeout=120)
    assert refused.status == "not_run" and "1 smoke runs are already in flight" in refused.reason
    assert box["r"].reason.startswith("interrupted (cancelled)")


def test_model_size_limit(monkeypatch):
    from automodel_dist.smoke import launch

    monkeypatch.setattr(launch, "MAX_PARAMS", 10_000)
    report = run_smoke_test(world_size=2, tp=2)
    assert report.status == "not_run" and "AUTOMODEL_DIST_MAX_SMOKE_PARAMS" in report.reason
    assert "above the limit of 10,000" in report.reason and report.ranks == []


def test_default_world_size_is_4_or_the_smallest_the_layout_is_valid_on():
    from automodel_dist.smoke.launch import default_world_size

    assert default_world_size(SmokeRequest.of({"distributed": {"tp_size": 2}})) == (4, None)
    qwen = EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml"  # cp2 pp2 ep4: ep must divide dp*cp*tp
    world, note = default_world_size(SmokeRequest.of(qwen))
    assert world == 8 and note.startswith("world_size 8: the smallest number of processes")
    assert default_world_size(SmokeRequest.of(qwen, ep=2))[0] == 4  # layout keywords count
    world, note = default_world_size(SmokeRequest.of(EXAMPLES / "deepseekv3_pretrain.yaml"))  # dp_size 16, pp 8
    assert world == 4 and note.startswith("no world size from 2 to 16 makes this layout valid")


def test_moe_with_cp_or_tp_is_checked_in_fp32_under_auto_precision():
    """Rounding re-routes near-tied tokens when CP/TP change attention's bf16 rounding: auto picks fp32 and says
    why; an explicit bf16 keeps bf16 and warns; MoE without CP/TP and dense models keep AutoModel's bf16."""
    from automodel_dist.smoke.launch import make_plan

    def plan(model, precision, **layout):
        keys = dict.fromkeys(
            (
                "strategy",
                "tp",
                "pp",
                "cp",
                "ep",
                "dp_replicate",
                "pp_schedule",
                "sequence_parallel",
                "activation_checkpointing",
            )
        )
        p = make_plan(
            SmokeRequest.of(
                {},
                world_size=4,
                steps=1,
                model=model,
                precision=precision,
                stack="tiny",
                **{**keys, **layout},
            )
        )
        return p.spec.precision, " ".join(p.report_base["notes"])

    prec, notes = plan("tiny-moe", "auto", cp=2, ep=2)
    assert prec == "fp32" and "this run and its reference therefore use fp32" in notes
    prec, notes = plan("tiny-moe", "bf16", cp=2, ep=2)
    assert prec == "bf16" and "can fail parity on rounding alone" in notes
    for model, layout in (("tiny-moe", {"ep": 2}), ("tiny-llama", {"cp": 2})):  # no precision note (a torch
        prec, notes = plan(model, "auto", **layout)  # release note may stand there: torch 2.15 has one)
        assert prec == "bf16" and "rounding" not in notes and "fp32" not in notes, notes


@pytest.mark.slow  # the README's `smoke tests/examples/qwen3_moe_30b_te_chat_thd.yaml` checks the same in test_docs
def test_a_moe_recipe_runs_at_its_smallest_world_without_options():
    """`smoke recipe.yaml` on an MoE recipe (cp2 pp2 ep4, interleaved, AC): 4 ranks cannot run it, 8 can."""
    report = run_smoke_test(EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml")
    assert_passed(report)
    assert report.world_size == 8 and report.notes[0].startswith("world_size 8: the smallest")
