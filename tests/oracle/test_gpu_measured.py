"""The dry run and the estimate against AutoModel's own step on a real GPU.

``tests/calibration/gpu/`` holds what a GPU measured (``python -m automodel_dist.dry_run.on_gpu``: AutoModel 0.7.0's
build and training step on real CUDA tensors, the caching allocator's ``max_memory_allocated``) for the case specs
beside it, which the dry run's own planner wrote. Here the dry run measures the same builds on fake tensors and the
estimate sizes them; both are held to the GPU's figure. The runner itself is run on the CPU on a small case, so a
session with a GPU only has to run it (docs/gpu-check.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from automodel_dist.dry_run import on_gpu
from automodel_dist.dry_run.plan import plan_dry_run
from automodel_dist.request import Request
from support.paths import CALIBRATION, ROOT

HAS_AUTOMODEL = importlib.util.find_spec("nemo_automodel") is not None
_tool = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_tool)
_tool.loader.exec_module(gpu_check)
GPU = CALIBRATION / "gpu"
RECORDS = sorted(GPU.glob("h200_*.json"))
CASES = GPU / "cases"
DRY_RUN_ERROR = 0.01  # the same code and shapes: only what the stand-ins hold differently may differ
ESTIMATE_ERROR = 0.15  # the project's band for the estimate against AutoModel's step


def _measured() -> list[tuple[str, dict[str, Any], int, dict[str, Any] | None]]:
    """(record, case, position of the build in its process, the build) for every measured build."""
    out = []
    for record in RECORDS:
        for row in json.loads(record.read_text(encoding="utf-8"))["cases"]:
            case = json.loads((CASES / f"{row['name']}.json").read_text(encoding="utf-8"))
            for i, build in enumerate(row["builds"]):
                if build["status"] == "measured":
                    out.append((record.name, case, i, build))
    return out


MEASURED = _measured()


def test_a_gpu_record_exists_and_names_its_stack():
    assert RECORDS
    for record in RECORDS:
        env = json.loads(record.read_text(encoding="utf-8"))["environment"]
        assert env["nemo-automodel"] == "0.7.0" and env["device"].startswith("NVIDIA")
    assert MEASURED


def _recipe(case: dict[str, Any]) -> Path:
    path = gpu_check.recipe_path(case)
    if not path.exists():
        pytest.skip(f"{case['recipe']} is not here (a corpus recipe: ../shared/corpus)")
    return path


def _previous(record: str, case: dict[str, Any], position: int) -> dict[str, Any] | None:
    if not position:
        return None
    row = next(r for r in json.loads((GPU / record).read_text(encoding="utf-8"))["cases"] if r["name"] == case["name"])
    return row["builds"][position - 1]


def _as_recorded(planned: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The planner's spec less the fields added to StackRecipe and DryRunSpec after the case was recorded, where they
    hold their default: a field at its default builds and trains nothing differently (any other value stays, and
    fails)."""
    from automodel_dist.dry_run.spec import DryRunSpec
    from automodel_dist.stack.recipe import StackRecipe

    recipe = dict(planned["recipe"])
    for name in set(recipe) - set(recorded["recipe"]):
        if recipe[name] == StackRecipe.model_fields[name].default:
            del recipe[name]
    out = {**planned, "recipe": recipe}
    for name in set(out) - set(recorded):
        if out[name] == DryRunSpec.model_fields[name].default:
            del out[name]
    return out


@pytest.mark.parametrize(
    "record,case,position,build", MEASURED, ids=[f"{c['name']}-{b['layers']}" for _, c, _, b in MEASURED]
)
def test_the_measured_build_is_what_the_dry_run_plans_for_that_depth(record, case, position, build):
    """The GPU's build is the planner's: ``dry_run(recipe, num_layers=N)`` (or at full depth) builds the same config,
    block, recipe and sizes as the case file, and a record that names its spec names this case file's."""
    full = build.get("build") == "full"
    plan = plan_dry_run(Request.of(_recipe(case), **case["fields"]), num_layers=None if full else build["layers"])
    spec = next(s for s in plan.specs if s.rank == case["spec"]["rank"])
    if full:
        recorded = case["spec"]["build"]
    else:
        recorded = next(b for b in case["spec"]["builds"] if b["hf_config"]["num_hidden_layers"] == build["layers"])
    assert spec.build.model_dump() == recorded
    rest = ("build", "builds", "depth")
    planned = spec.model_dump(exclude=set(rest))
    assert _as_recorded(planned, case["spec"]) == {k: v for k, v in case["spec"].items() if k not in rest}
    if "spec_sha256" in build:
        assert build["spec_sha256"] == on_gpu.spec_digest(case["spec"])


@pytest.mark.skipif(not HAS_AUTOMODEL, reason="the dry run needs AutoModel 0.7.0")
@pytest.mark.parametrize(
    "record,case,position,build",
    [pytest.param(*m, marks=[pytest.mark.slow] if m[2] else []) for m in MEASURED],
    ids=[f"{c['name']}-{b['layers']}" for _, c, _, b in MEASURED],
)
def test_the_dry_run_and_the_estimate_match_the_gpu(record, case, position, build):
    """The dry run's allocated peak within 1% of the GPU's ``max_memory_allocated`` for the same build, and the
    estimate within the project's 15%. Before the step the GPU held the dry run's parameter bytes and nothing else
    (for a build after another in one process, also the cuBLAS workspaces the first step made: 64 MiB)."""
    got = on_gpu.against_gpu(
        _recipe(case),
        case["fields"],
        build,
        rank=case["spec"]["rank"],
        full_depth=build.get("build") == "full",
        previous=_previous(record, case, position),
    )
    assert got["dry_run_status"] == "measured", got
    fresh = position == 0 or build.get("start_allocated_gib") is not None
    assert 0 <= got["weights_gap_gib"] < (0.01 if fresh else 0.0625 + 0.01), got
    assert abs(got["dry_run_vs_gpu"]) <= DRY_RUN_ERROR, got
    assert abs(got["estimate_vs_gpu"]) <= ESTIMATE_ERROR, got


@pytest.mark.skipif(not HAS_AUTOMODEL, reason="the runner runs AutoModel 0.7.0")
def test_the_gpu_runner_runs_every_build_in_a_process_of_its_own(tmp_path: Path):
    """The runner end to end on this machine's CPU (the allocator's counters are CUDA's, so they stay empty here): a
    small Llama's two shallow builds and its full depth, each in a process of its own, with its phase times, in the
    order a short lease wants (shallow builds first)."""
    case = json.loads((CASES / "07_llama3_2_1b_full_sft_chat.json").read_text(encoding="utf-8"))
    small = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    small |= {"vocab_size": 512, "max_position_embeddings": 256}
    spec = case["spec"]
    spec["seq_len"] = 32
    for build, layers in zip([*spec["builds"], spec["build"]], (1, 2, 3)):
        build["hf_config"] |= small | {"num_hidden_layers": layers}
    spec["depth"] = None
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "small.json").write_text(json.dumps(case), encoding="utf-8")
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "server")}
    cmd = [sys.executable, "-m", "automodel_dist.dry_run.on_gpu", str(cases), str(out), "--jobs", "2"]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=600)
    [row] = json.loads(out.read_text(encoding="utf-8"))["cases"]
    assert [b["build"] for b in row["builds"]][-1] == "full"
    assert sorted(b["layers"] for b in row["builds"]) == [1, 2, 3]
    assert len({b["pid"] for b in row["builds"]}) == 3  # a process each
    for b in row["builds"]:
        assert b["status"] == "measured", b.get("error")
        assert b["spec_sha256"] == on_gpu.spec_digest(spec)
        assert set(b["phases_s"]) == {"import", "group", "build", "optimizer", "step"}
        assert b["process_group"] == "fake" and b["class"] == "LlamaForCausalLM"
        assert b.get("peak_allocated_gib") is None and b["start_allocated_gib"] is None  # no CUDA: nothing claimed
