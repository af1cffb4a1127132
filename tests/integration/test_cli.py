"""The CLI: exit codes, compiler-style output, JSON equal to the API's model_dump."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from automodel_dist import build_mesh, validate_config
from automodel_dist.cli import main

BAD = "distributed:\n  tp_size: 3\n  strategy: ddp\n"
GOOD = "distributed:\n  tp_size: 2\n  cp_size: 2\n"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD)
    (tmp_path / "good.yaml").write_text(GOOD)
    return tmp_path


def test_validate_exit_codes_and_output(files, capsys):
    assert main(["validate", str(files / "good.yaml"), "--world-size", "8"]) == 0
    assert "VALID" in capsys.readouterr().out
    assert main(["validate", str(files / "bad.yaml"), "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert f"{files / 'bad.yaml'}:2: error[strategy-unsupported]: ddp does not support tensor parallelism" in out
    assert "    fix: " in out
    assert main(["validate", str(files / "missing.yaml")]) == 2
    assert main(["validate"]) == 2  # argparse usage error
    assert main(["validate", str(files / "good.yaml"), "--world-size", "0"]) == 2


def test_validate_torch_version(files, capsys):
    assert main(["validate", str(files / "good.yaml"), "--world-size", "8", "--torch-version", "2.14.1"]) == 0
    capsys.readouterr()
    assert main(["validate", str(files / "good.yaml"), "--world-size", "8", "--torch-version", "2.15.0+cu132"]) == 1
    assert "error[torch-version]: torch 2.15.0+cu132 with strategy fsdp2 on 8 ranks" in capsys.readouterr().out


def test_validate_json_is_the_api_report(files, capsys):
    assert main(["validate", str(files / "bad.yaml"), "--world-size", "8", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed == validate_config(files / "bad.yaml", world_size=8).model_dump(mode="json")


def test_validate_several_files(files, capsys):
    """Each file on its own; exit 1 if any is invalid, 2 if any is unreadable; JSON is the list of reports."""
    good, bad = str(files / "good.yaml"), str(files / "bad.yaml")
    assert main(["validate", good, good, "--world-size", "8"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 files: 2 valid, 0 invalid")
    assert main(["validate", good, bad, "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:2: error[strategy-unsupported]" in out and out.rstrip().endswith(f"1 invalid ({bad})")
    assert main(["validate", good, bad, "--world-size", "8", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == [
        validate_config(files / n, world_size=8).model_dump(mode="json") for n in ("good.yaml", "bad.yaml")
    ]
    assert main(["validate", good, str(files / "missing.yaml"), "--world-size", "8"]) == 2
    assert main(["validate", "-", "-"]) == 2


def test_validate_a_folder(files, capsys):
    """A folder stands for its .yaml/.yml files, nested ones too, in sorted order, hidden folders skipped; JSON is
    always the list of reports; a folder without YAML is a usage error."""
    (files / "sub").mkdir()
    (files / "sub" / "nested.yml").write_text(GOOD)
    (files / ".hidden").mkdir()
    (files / ".hidden" / "skip.yaml").write_text(BAD)
    (files / "notes.txt").write_text("not yaml")
    assert main(["validate", str(files), "--world-size", "8", "--json"]) == 1
    assert [r["source"] for r in json.loads(capsys.readouterr().out)] == [
        str(files / "bad.yaml"),
        str(files / "good.yaml"),
        str(files / "sub" / "nested.yml"),
    ]
    assert main(["validate", str(files / "sub"), "--world-size", "8", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1  # a list, even of one
    assert main(["validate", str(files / "sub"), "--world-size", "8"]) == 0
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith(
            "VALID: 0 error(s), 0 warning(s); world_size=8 (argument); model-aware checks NOT run: no model given (pass "
            "--model / model=, or name one in model.pretrained_model_name_or_path); strategy=fsdp2 dp=2 dp_shard=2 tp=2 "
            "cp=2 pp=1\n"
            "not checked: per-GPU memory and step time: `automodel-dist estimate` (estimate_memory), or `dryrun` "
            "(dry_run, AutoModel's own step)"
        )
    )
    (files / "empty").mkdir()
    assert main(["validate", str(files / "empty")]) == 2
    assert "holds no .yaml or .yml file" in capsys.readouterr().err


def test_validate_github_annotations(files, capsys):
    """--format github prints one workflow command per finding, escaped, on the file and line."""
    (files / "odd, name.yaml").write_text("distributed:\n  tp_size: 3\n  strategy: ddp\n  pipeline: {}\n")
    path = files / "odd, name.yaml"
    assert main(["validate", str(path), "--world-size", "8", "--format", "github"]) == 1
    out = capsys.readouterr().out.splitlines()
    report = validate_config(path, world_size=8)
    assert len(out) == len([f for f in report.findings if f.severity != "info"]) >= 2
    first = report.findings[0]
    escaped = str(path).replace(":", "%3A").replace(",", "%2C")
    assert out[0] == (
        f"::error file={escaped},line={first.line},title={first.rule} (distributed.tp_size)::"
        f"{first.message}%0Afix: {first.fix}"
    )
    assert any(line.startswith("::warning ") and "title=pipeline-ignored" in line for line in out)
    assert main(["validate", str(files / "good.yaml"), "--world-size", "8", "--format", "github"]) == 0
    assert capsys.readouterr().out == ""
    recipe = files / "recipe.yaml"  # info findings (world size from ci:) are not annotations
    recipe.write_text("distributed:\n  tp_size: 2\nci:\n  nodes: 1\n  nproc_per_node: 8\n")
    assert main(["validate", str(recipe), "--format", "github"]) == 0
    assert capsys.readouterr().out == ""


def test_validate_stdin(monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(GOOD))
    assert main(["validate", "-", "--nodes", "1", "--gpus-per-node", "8"]) == 0


def test_mesh_text_json_and_svg(files, capsys, tmp_path):
    assert (
        main(
            [
                "mesh",
                str(files / "good.yaml"),
                "--world-size",
                "8",
                "--rank",
                "5",
                "--gpus-per-node",
                "4",
                "--svg",
                str(tmp_path / "m.svg"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "device_mesh: (pp=1, dp_replicate=1, dp_shard=2, cp=2, tp=2)" in out
    assert "rank 5: " in out and "node 1" in out
    assert (tmp_path / "m.svg").read_text().startswith("<svg")
    assert (
        main(
            [
                "mesh",
                str(files / "good.yaml"),
                "--world-size",
                "1024",
                "--gpus-per-node",
                "8",
                "--svg",
                str(tmp_path / "big.svg"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    big = (tmp_path / "big.svg").read_text()
    assert "first 64 of 128 nodes" in big and big.count("node ") == 64 and ">r511<" in big and ">r512<" not in big
    assert main(["mesh", str(files / "good.yaml"), "--world-size", "8", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == build_mesh(files / "good.yaml", world_size=8).model_dump(mode="json")
    assert main(["mesh", str(files / "bad.yaml"), "--world-size", "8"]) == 1
    assert main(["mesh", str(files / "good.yaml"), "--world-size", "8", "--rank", "9"]) == 2
    assert main(["mesh", str(files / "good.yaml")]) == 2  # no world size anywhere
    assert "or a recipe with a ci: block" in capsys.readouterr().err


def test_mesh_takes_the_cluster_from_the_recipes_ci_block(files, capsys):
    """Like validate: a recipe's ci: block (nodes x nproc_per_node) gives the world size and GPUs per node."""
    recipe = files / "ci.yaml"
    recipe.write_text(GOOD + "ci:\n  nodes: 2\n  nproc_per_node: 4\n")
    assert validate_config(recipe).gpus_per_node == 4 and validate_config(recipe, gpus_per_node=8).gpus_per_node == 8
    assert main(["mesh", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("world_size 8 (ci: block), 4 GPUs per node\n") and "node 1" in out
    assert main(["mesh", str(recipe), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == build_mesh(recipe, world_size=8, gpus_per_node=4).model_dump(
        mode="json"
    )
    assert main(["mesh", str(recipe), "--world-size", "16", "--json"]) == 0  # an explicit size wins
    assert json.loads(capsys.readouterr().out)["world_size"] == 16


def test_mesh_takes_nodes_and_gpus_per_node_like_validate(files, capsys):
    """--nodes N --gpus-per-node G is the world size, as for validate (build_mesh(nodes=...) in Python)."""
    good = str(files / "good.yaml")
    assert main(["mesh", good, "--nodes", "2", "--gpus-per-node", "4", "--json"]) == 0
    by_nodes = json.loads(capsys.readouterr().out)
    assert by_nodes == build_mesh(files / "good.yaml", world_size=8, gpus_per_node=4).model_dump(mode="json")
    assert by_nodes == build_mesh(files / "good.yaml", nodes=2, gpus_per_node=4).model_dump(mode="json")
    assert by_nodes["world_size"] == 8 and by_nodes["gpus_per_node"] == 4
    assert main(["mesh", good, "--nodes", "2", "--gpus-per-node", "4"]) == 0
    assert capsys.readouterr().out.startswith("world_size 8 (nodes x gpus_per_node), 4 GPUs per node\n")
    assert main(["mesh", good, "--nodes", "2"]) == 2  # nodes alone is no world size
    assert "the world size is unknown: give --world-size, or --nodes with --gpus-per-node" in capsys.readouterr().err


def test_explain_and_models(capsys):
    assert main(["explain", "ValueError: non_pp_size=8 must be a multiple of ep_size=3"]) == 0
    assert "[ep-not-divisible]" in capsys.readouterr().out
    assert main(["explain", "all is well"]) == 1
    assert "no known" in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    cat = json.loads(capsys.readouterr().out)
    assert any(m["name"] == "meta-llama/Llama-3.1-8B" and m["head_dim"] == 128 for m in cat["models"])
    assert {"name": "H100-80GB", "intra_gbps": 450.0, "inter_gbps": 50.0, "gpus_per_node": 8}.items() <= next(
        g for g in cat["gpus"] if g["name"] == "H100-80GB"
    ).items()
    assert main(["models"]) == 0
    text = capsys.readouterr().out  # both tables
    assert "meta-llama/Llama-3.1-8B" in text and "GB200" in text and "bf16 TFLOP/s" in text


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "automodel_dist.cli", "validate", "-", "--world-size", "4"],
        input="tp_size: 2\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "VALID" in out.stdout


def test_a_closed_pipe_is_not_a_crash():
    """`automodel-dist models | head -1`: the reader is gone; exit 141 (SIGPIPE), no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "automodel_dist.cli", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and not err, err
