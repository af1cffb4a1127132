"""Launch-command overrides (``automodel recipe.yaml --nproc-per-node 8 --distributed.tp_size 4``): read and
applied the way AutoModel 0.7.0 reads and applies them (its own parser and ConfigNode are the oracle), on
every surface (API, CLI after ``--``, MCP)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_oracle_parity import MID_RUN

from automodel_dist import build_mesh, validate_config
from automodel_dist.api import analyze
from automodel_dist.cli import main
from automodel_dist.config.overrides import parse_launch_args
from automodel_dist.estimate import estimate_memory
from automodel_dist.report import ConfigError
from automodel_dist.request import Request
from automodel_dist.smoke.request import SmokeRequest
from support import oracle
from support.mcp_client import call

needs_oracle = pytest.mark.skipif(not oracle.AVAILABLE, reason="the AutoModel oracle is not installed")

RECIPE = """\
step_scheduler:
  local_batch_size: 8
distributed:
  strategy: fsdp2
  tp_size: 2
  pipeline:
    pp_schedule: 1f1b
model:
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
"""


def _by_rule(report, rule):
    return [f for f in report.findings if f.rule == rule]


# --------------------------------------------------------------------------- the engine
def test_override_replaces_the_value_and_its_line():
    r = validate_config(RECIPE, world_size=8, overrides=["distributed.tp_size=3"])
    tp = {f.rule: f for f in r.findings if f.path == "distributed.tp_size"}
    assert tp["tp-heads"].line is None  # the value no longer comes from line 5
    assert tp["tp-heads"].message.startswith("tp_size=3 does not divide num_attention_heads=32")
    applied = tp["override-applied"]
    assert (applied.severity, applied.line) == ("info", 5)  # points at the value it replaces
    assert applied.message == "distributed.tp_size = 3 from the command line (the config has 2)"
    assert r.resolved.tp == 3 and not r.valid


def test_new_keys_intermediate_mappings_and_value_semantics():
    r = validate_config(
        RECIPE,
        world_size=8,
        overrides=[
            "distributed.pp_size=2",
            "distributed.pipeline.pp_microbatch_size='4'",
            "distributed.cp_size=none",
            "model.extra.items=[1, '2']",
        ],
    )
    assert r.valid, [f.message for f in r.errors]
    assert (r.resolved.pp, r.resolved.cp, r.resolved.pp_microbatch_size) == (2, 1, 4)  # '4' -> '4' -> 4, as _wrap
    msgs = [f.message for f in _by_rule(r, "override-applied")]
    assert "distributed.pp_size = 2 from the command line (not in the config)" in msgs
    assert "model.extra.items = [1, 2] from the command line (not in the config)" in msgs
    assert all(f.line is None for f in _by_rule(r, "override-applied") if "not in the config" in f.message)


def test_a_non_mapping_on_the_way_becomes_a_mapping():
    text = "distributed:\n  pp_size: 2\n  pipeline: null\n"
    r = validate_config(text, world_size=2, overrides=["distributed.pipeline.pp_schedule=gpipe"])
    assert r.resolved.pp_schedule == "GPipe"
    assert not _by_rule(r, "pipeline-missing")


def test_a_later_override_wins_and_the_callers_mapping_is_untouched():
    block = {"distributed": {"tp_size": 2, "pipeline": {"pp_schedule": "1f1b"}}}
    before = copy.deepcopy(block)
    r = validate_config(
        block,
        world_size=8,
        overrides=["distributed.tp_size=8", "distributed.tp_size=4", "distributed.pipeline.pp_schedule=gpipe"],
    )
    assert r.resolved.tp == 4 and block == before


def test_malformed_overrides_are_findings_and_the_rest_still_apply():
    r = validate_config(RECIPE, world_size=8, overrides=["distributed.tp_size", "distributed.cp_size=2", 7])
    bad = _by_rule(r, "override-invalid")
    assert [f.message for f in bad] == [
        "override 'distributed.tp_size' has no '=' (AutoModel fails splitting it: 'not enough values to unpack')",
        "override 7 is a int, not a 'dotted.key=value' string",
    ]
    assert all(f.severity == "error" and f.path == "<overrides>" for f in bad)
    assert r.resolved.cp == 2 and not r.valid
    assert _by_rule(validate_config(RECIPE, overrides="distributed.tp_size=2"), "override-invalid")


def test_bare_block_takes_distributed_keys_only():
    r = validate_config("tp_size: 2\n", world_size=8, overrides=["distributed.tp_size=4", "dataset.seq_len=3"])
    assert r.resolved.tp == 4
    assert [f.message for f in _by_rule(r, "override-invalid")] == [
        "override 'dataset.seq_len=3' is outside the distributed: block, and the config is a bare block"
    ]
    assert _by_rule(r, "override-applied")[0].path == "tp_size"


def test_overrides_reach_build_mesh_and_estimate():
    mesh = build_mesh(RECIPE, world_size=8, overrides=["distributed.tp_size=4"], ranks=[0])
    assert mesh.rank_groups["0"]["tp"] == [0, 1, 2, 3]
    with pytest.raises(ConfigError):
        build_mesh(RECIPE, world_size=8, overrides=["distributed.tp_size=3"])
    est = estimate_memory(RECIPE, model="meta-llama/Llama-3.1-8B", world_size=8, overrides=["distributed.tp_size=8"])
    assert est.layout.tp == 8


def test_target_values_are_checked_never_imported():
    text = RECIPE + "  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained\n"
    assert not _by_rule(validate_config(text, world_size=8), "target-path-invalid")
    r = validate_config(text, world_size=8, overrides=["model._target_=os.system('x')"])
    [bad] = _by_rule(r, "target-path-invalid")
    assert (bad.path, bad.line) == ("model._target_", None)  # the command line's value, not line 10's


# --------------------------------------------------------------------------- the launch command
def test_launch_forms():
    a = parse_launch_args(["r.yaml", "--nproc-per-node", "8", "--distributed.tp_size", "4", "--x=1", "--flag"])
    assert (a.config, a.nproc_per_node, a.overrides) == ("r.yaml", 8, ["distributed.tp_size=4", "x=1", "flag=True"])
    a = parse_launch_args(["-c", "r.yaml", "--distributed.tp_size=2", "stray", "--nproc-per-node", "8"])
    assert (a.config, a.nproc_per_node) == ("r.yaml", None)  # a recipe script has no --nproc-per-node option
    assert a.overrides == ["distributed.tp_size=2", "nproc-per-node=8"]
    assert parse_launch_args(["--nproc_per_node=2", "r.yaml", "--a.b", "-1"]).overrides == ["a.b=-1"]
    for bad in (
        ["r.yaml", "--nproc-per-node", "x"],
        ["r.yaml", "--nproc-per-node"],
        ["-c"],
        ["r.yaml", "--nproc-per-node", "0"],
    ):
        with pytest.raises(ValueError):
            parse_launch_args(bad)


_TOKENS = st.sampled_from(
    [
        "--distributed.tp_size",
        "--distributed.tp_size=4",
        "4",
        "none",
        "--distributed.sequence_parallel",
        "--nproc-per-node",
        "--nproc_per_node=2",
        "8",
        "--a.b=c=d",
        "stray",
        "-1",
        "--x.y",
        "[1, 2]",
        "--nproc-",
        "--nproc",
        "--step_scheduler.local_batch_size",
        "--",
        "-c",
        "--config",
        "other.yaml",
    ]
)


@needs_oracle
@settings(max_examples=300)
@given(st.lists(_TOKENS, max_size=8), st.booleans())
def test_launch_args_are_read_as_automodel_reads_them(tokens, script):
    """Against AutoModel's launcher (argparse of cli/app.py, then parse_cli_argv on what it leaves), or
    against parse_cli_argv alone for a recipe script's ``-c CONFIG`` form."""
    from nemo_automodel.cli.app import build_parser
    from nemo_automodel.components.config._arg_parser import parse_cli_argv

    argv = (["-c", "r.yaml"] if script else ["r.yaml"]) + tokens
    try:
        if script:
            theirs = (*parse_cli_argv(None, argv=argv), None)
        else:
            import contextlib
            import io

            with contextlib.redirect_stderr(io.StringIO()):
                ns, extra = build_parser().parse_known_args(argv)
            theirs = (*parse_cli_argv(str(ns.config), argv=extra), ns.nproc_per_node)
            if ns.nproc_per_node is not None and ns.nproc_per_node < 1:
                raise ValueError("no processes")  # AutoModel would launch nothing; we refuse it
    except (ValueError, SystemExit):
        with pytest.raises(ValueError):
            parse_launch_args(argv)
        return
    ours = parse_launch_args(argv)
    assert (ours.config, ours.overrides, ours.nproc_per_node) == theirs


# --------------------------------------------------------------------------- AutoModel's own overrides
_KEYS = {
    "distributed.tp_size": ["2", "4", "'2'", "none", "1"],
    "distributed.cp_size": ["1", "2", "None"],
    "distributed.pp_size": ["1", "2", "4"],
    "distributed.ep_size": ["1", "2", "8"],
    "distributed.dp_replicate_size": ["none", "2"],
    "distributed.strategy": ["fsdp2", "megatron_fsdp", "ddp", "'mfsdp'"],
    "distributed.sequence_parallel": [None, "true", "False"],
    "distributed.activation_checkpointing": ["true", "selective", "off"],
    "distributed.pipeline": ["{}", "{'pp_schedule': 'gpipe'}", "None"],
    "distributed.pipeline.pp_schedule": ["interleaved1f1b", "1f1b", "'gpipe'"],
    "distributed.pipeline.pp_microbatch_size": ["1", "2"],
    "distributed.moe": ["{'reshard_after_forward': True}"],
}


@st.composite
def _launches(draw):
    block = {}
    for key, values in (("tp_size", [1, 2, 4]), ("pp_size", [1, 2]), ("cp_size", [1, 2]), ("ep_size", [1, 2, 4])):
        if draw(st.booleans()):
            block[key] = draw(st.sampled_from(values))
    if draw(st.booleans()):
        block["pipeline"] = {"pp_schedule": draw(st.sampled_from(["1f1b", "gpipe"]))}
    if draw(st.booleans()):
        block["strategy"] = draw(st.sampled_from(["fsdp2", "megatron_fsdp", "ddp"]))
    argv = []
    for key in draw(st.lists(st.sampled_from(sorted(_KEYS)), max_size=5)):
        value = draw(st.sampled_from(_KEYS[key]))
        form = draw(st.integers(0, 1))
        argv += [f"--{key}"] if value is None else [f"--{key}={value}"] if form else [f"--{key}", value]
    return block, argv, draw(st.sampled_from([2, 4, 8, 16, 32]))


@needs_oracle
@settings(max_examples=int(__import__("os").environ.get("ORACLE_EXAMPLES", "160")) // 2, deadline=None)
@given(_launches())
def test_overrides_match_automodel(tmp_path_factory, case):
    """AutoModel loads the recipe with the launch command's overrides (parse_args_and_load_config): its
    distributed: block equals ours after the overrides, and so do the verdict and the meshes."""
    block, argv, world = case
    path = tmp_path_factory.mktemp("launch") / "recipe.yaml"
    path.write_text(yaml.safe_dump({"distributed": block}))
    overrides = parse_launch_args([str(path)] + argv).overrides
    ctx = analyze(Request.of(path, world_size=world, overrides=overrides)).context
    theirs = oracle.load_with_overrides(str(path), argv)
    assert ctx is not None and ctx.block == theirs.distributed.to_dict()
    o = oracle.run(None, world, [0, world - 1], make_cfg=lambda: oracle.load_with_overrides(str(path), argv))
    ours = validate_config(path, world_size=world, overrides=overrides)
    errors = {f.rule for f in ours.errors}
    assert (not errors - MID_RUN) == o.ok, f"AutoModel: {o.error}; ours: {errors}"
    if ours.valid:
        mesh = build_mesh(path, world_size=world, ranks=[0, world - 1], overrides=overrides)
        assert (
            (mesh.device_mesh.dim_names, mesh.device_mesh.shape) == tuple(o.device_mesh)
            if mesh.device_mesh
            else o.device_mesh is None
        )
        assert mesh.rank_groups["0"] == o.ranks[0].groups


# --------------------------------------------------------------------------- CLI and MCP
@pytest.fixture
def recipe(tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE)
    return tmp_path / "r.yaml"


def test_cli_reads_the_launch_command_after_double_dash(recipe, capsys):
    assert main(["validate", str(recipe), "--", "--nproc-per-node", "8", "--distributed.tp_size", "3"]) == 1
    out = capsys.readouterr().out
    assert f"{recipe}: error[tp-heads]: tp_size=3 does not divide" in out  # no line: it came from the command
    assert f"{recipe}:5: info[override-applied]: distributed.tp_size = 3 from the command line" in out
    assert "world_size=8 (argument)" in out  # --nproc-per-node: one node of 8
    assert main(["validate", "--json", "--", str(recipe), "--nproc-per-node", "4", "--distributed.tp_size=4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == validate_config(recipe, world_size=4, overrides=["distributed.tp_size=4"]).model_dump(mode="json")
    assert (
        main(["validate", "--world-size", "16", "--json", "--", "-c", str(recipe), "--distributed.tp_size", "4"]) == 0
    )  # the recipe-script form
    assert json.loads(capsys.readouterr().out)["resolved"]["dp"] == 4


def test_cli_mesh_and_estimate_take_the_launch_command(recipe, capsys):
    assert (
        main(["mesh", str(recipe), "--rank", "0", "--json", "--", "--nproc-per-node", "4", "--distributed.tp_size=4"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["rank_groups"]["0"]["tp"] == [0, 1, 2, 3]
    assert (
        main(
            [
                "estimate",
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--micro-batch-size",
                "1",
                "--json",
                "--",
                str(recipe),
                "--nproc-per-node",
                "8",
                "--distributed.tp_size",
                "4",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["layout"]["tp"] == 4


def test_cli_launch_usage_errors(recipe, capsys):
    for tail in (["-c", "other.yaml"], ["other.yaml", "--distributed.tp_size", "2"]):
        assert main(["validate", str(recipe), "--", *tail]) == 2
        assert f"the config is given twice: {recipe} and other.yaml" in capsys.readouterr().err
    assert main(["validate", str(recipe), "--world-size", "8", "--", str(recipe), "--distributed.tp_size=2"]) == 0
    assert main(["validate", str(recipe), "--", "--nproc", "8"]) == 2
    assert "ambiguous option" in capsys.readouterr().err
    assert main(["validate", "--", "--distributed.tp_size=2"]) == 2
    assert main(["mesh", str(recipe)]) == 2
    assert "give --world-size" in capsys.readouterr().err
    assert main(["models", "--", "x"]) == 2
    assert main(["mesh", str(recipe), "--", "--nproc-per-node", "8", "--rank", "0"]) == 2
    assert "--rank after -- would be an AutoModel override" in capsys.readouterr().err


def test_mcp_tools_take_overrides():
    res = call("validate_config", {"config_yaml": RECIPE, "world_size": 8, "overrides": ["distributed.tp_size=3"]})
    data = res.structured_content
    assert data["valid"] is False and data["resolved"]["tp"] == 3
    res = call(
        "build_mesh", {"config_yaml": RECIPE, "world_size": 8, "ranks": [0], "overrides": ["distributed.tp_size=8"]}
    )
    assert res.structured_content["mesh"]["rank_groups"]["0"]["tp"] == list(range(8))
    res = call(
        "estimate_memory",
        {
            "config_yaml": RECIPE,
            "model": "meta-llama/Llama-3.1-8B",
            "world_size": 8,
            "overrides": ["distributed.tp_size=3"],
        },
    )
    assert res.structured_content["valid"] is False


_VALUE_TEXT = st.one_of(
    st.text(alphabet="0123456789-+.eE_xob'\"[](){}:, aNnoeTrufls", max_size=12),
    st.sampled_from(
        [
            "1_000",
            "0x10",
            "1e3",
            "(1,)",
            "{1, 2}",
            "b'x'",
            "-0",
            " 5",
            "5 ",
            "None",
            "nan",
            "[1, 'a']",
            "{'a': {'b': '2'}}",
            "'none'",
            "\"'3'\"",
            "inf",
            "1j",
            "--x",
        ]
    ),
)


@needs_oracle
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.sampled_from(["distributed", "pipeline", "tp_size", "a", "b", "0", "x_y"]), min_size=1, max_size=3
            ),
            _VALUE_TEXT,
        ),
        max_size=4,
    )
)
def test_any_override_reads_as_automodel_reads_it(tmp_path_factory, items):
    """Arbitrary keys and value texts (no _target_/*_fn, which AutoModel imports, and no $VAR, which it reads from
    this process's environment): the recipe we check equals the ConfigNode AutoModel builds."""
    path = tmp_path_factory.mktemp("any") / "recipe.yaml"
    path.write_text("distributed:\n  tp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\na: [1, 2]\nb: text\n")
    overrides = [f"{'.'.join(keys)}={value}" for keys, value in items]
    doc = analyze(Request.of(path, world_size=8, overrides=overrides)).document
    theirs = oracle.load_with_overrides(str(path), [f"--{o}" for o in overrides]).to_dict()

    def same(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        return type(a) is type(b) and (a == b or a != a and b != b)

    assert same(doc.data, theirs), (overrides, doc.data, theirs)


# --------------------------------------------------------------------------- smoke runs
def test_smoke_plan_applies_overrides_then_layout_keywords(monkeypatch):
    from automodel_dist.smoke import launch

    monkeypatch.setattr(launch, "_installed_torch", lambda: "2.13.0+cpu")
    plan = launch.make_plan(
        SmokeRequest.of(
            RECIPE,
            world_size=4,
            steps=2,
            model="tiny-llama",
            precision="fp32",
            tp=2,
            overrides=["distributed.tp_size=4", "distributed.pp_size=2"],
        )
    )
    assert isinstance(plan, launch.Plan), plan.reason
    assert (plan.report_base["layout"].tp, plan.report_base["layout"].pp) == (2, 2)  # the keyword wins over --tp 4
    assert plan.spec.pipeline.schedule == "1F1B"  # the recipe's pipeline: block, kept


def test_smoke_refuses_a_launch_command_automodel_would_refuse():
    from automodel_dist import run_smoke_test

    report = run_smoke_test(RECIPE, world_size=4, overrides=["distributed.tp_size=3"])
    assert report.status == "failed" and not report.ranks and "tp_size=3 does not divide" in report.reason
    res = call("run_smoke_test", {"config_yaml": RECIPE, "world_size": 4, "overrides": ["distributed.tp_size"]})
    assert res.structured_content["status"] == "failed" and "has no '='" in res.structured_content["reason"]


def test_cli_smoke_runs_the_launch_command(recipe, capsys):
    assert (
        main(["smoke", "--quiet", "--json", "--", str(recipe), "--nproc-per-node", "2", "--distributed.tp_size", "2"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["world_size"] == 2 and report["layout"]["tp"] == 2
