"""Hostile and odd input: every case is a clear finding, in bounded time and memory, and nothing
from the input is ever imported, evaluated or executed.

Each hostile YAML case runs in a fresh process that measures its own peak RSS (``ru_maxrss``)
before and after the call, through the file path and the text path of ``validate_config`` and
through ``build_mesh``; the growth must stay far below what expanding the input would take.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from automodel_dist import build_mesh, validate_config
from automodel_dist.config.load import MAX_BYTES
from automodel_dist.report import ConfigError
from support.paths import ROOT

PROBE = r"""
import json, resource, sys, time
from pathlib import Path
from automodel_dist.api import build_mesh, validate_config
from automodel_dist.report import ConfigError

validate_config("distributed:\n  tp_size: 2\n", world_size=8)  # warm: imports, caches
build_mesh("tp_size: 2\n", world_size=8)
path = Path(sys.argv[1])
raw = path.read_bytes()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
out = {}
for via in ("path", "text"):
    if via == "text":
        try:
            source = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
    else:
        source = path
    report = validate_config(source, world_size=8)
    out[via] = sorted({f.rule for f in report.errors})
    out[via + "_lines"] = [f.line for f in report.findings if f.rule == "yaml-duplicate-key"]
    out[via + "_messages"] = [f.message for f in report.errors]
try:
    build_mesh(path, world_size=8)
    out["mesh"] = "built"
except ConfigError as exc:
    out["mesh"] = sorted({f.rule for f in exc.report.errors})
out["seconds"] = time.perf_counter() - t
out["rss_growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(out))
"""


def _bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ",".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\ndistributed:\n  tp_size: *a8\n"


CASES: dict[str, tuple[bytes, str]] = {
    "alias-bomb": (_bomb().encode(), "yaml-too-complex"),  # 9^9 = 387M strings if expanded
    "deep-flow-nesting": (b"distributed: " + b"[" * 100_000 + b"]" * 100_000, "yaml-too-deep"),
    "deep-block-nesting": (
        ("distributed:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 400))).encode(),
        "yaml-too-deep",
    ),
    "over-size-cap": (b"distributed:\n  tp_size: 2\n" + b"# padding\n" * (MAX_BYTES // 10 + 1), "yaml-too-large"),
    "non-utf8": (b"distributed:\n  tp_size: \xff\xfe\x00\x81\n", "yaml-not-utf8"),
    "binary-garbage": (bytes(range(256)) * 64, "yaml-not-utf8"),
    "multiple-documents": (b"distributed:\n  tp_size: 2\n---\ndistributed:\n  tp_size: 4\n", "yaml-multiple-documents"),
    "duplicate-keys": (b"distributed:\n  tp_size: 2\n  cp_size: 1\n  tp_size: 4\n", "yaml-duplicate-key"),
    "tabs": (b"distributed:\n\ttp_size: 2\n", "yaml-syntax"),
    "root-list": (b"- tp_size: 2\n- cp_size: 2\n", "yaml-root-not-mapping"),
    "root-scalar": (b"just a string\n", "yaml-root-not-mapping"),
    "root-null": (b"~\n", "yaml-empty"),
    "empty": (b"", "yaml-empty"),
    "comments-only": (b"# nothing here\n# at all\n", "yaml-empty"),
    "distributed-list": (b"distributed:\n  - tp_size: 2\n", "distributed-invalid"),
    "non-scalar-key": (b"distributed:\n  ? [tp_size, cp_size]\n  : 2\n", "yaml-bad-key"),
    "truncated": (b"distributed:\n  tp_size: [2, 4\n", "yaml-syntax"),
    "python-tag": (
        b"distributed: !!python/object/apply:os.system ['touch /tmp/automodel-dist-pwned']\n",
        "yaml-unsafe-tag",
    ),
    "huge-string": (b"distributed:\n  strategy: " + b"x" * (MAX_BYTES - 64) + b"\n", "strategy-unknown"),
    "huge-int": (b"distributed:\n  tp_size: " + b"9" * 5000 + b"\n", "yaml-syntax"),  # > Python's 4300 digits
    "huge-size": (b"distributed:\n  tp_size: " + b"9" * 4000 + b"\n", "world-not-divisible"),
    "local-tag": (b"distributed:\n  tp_size: !mytag 2\n", "yaml-unsafe-tag"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_yaml_is_a_clear_finding_in_bounded_memory(name: str, tmp_path: Path) -> None:
    data, rule = CASES[name]
    path = tmp_path / "hostile.yaml"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert rule in out["path"], out["path"]
    if "text" in out:
        assert rule in out["text"], out["text"]
    assert out["mesh"] != "built" and rule in out["mesh"]
    # Growth of the peak RSS: the 1 MiB inputs are held a few times over, nothing is expanded.
    assert out["rss_growth_kib"] < 64 * 1024, out["rss_growth_kib"]
    if name == "duplicate-keys":
        assert out["path_lines"] == [4] and "lines 2 and 4" in " ".join(out["path_messages"])
    assert not Path("/tmp/automodel-dist-pwned").exists()


def test_surrogates_and_control_characters_in_text() -> None:
    for text in (
        "distributed:\n  tp_size: \ud800\n",
        "distributed:\n  tp_size: 2\x00\n",
        "\ufeffdistributed: {}\n",
        "distributed:\n  tp_size: 2\r\n  cp_size: 2\r\n",
    ):
        report = validate_config(text, world_size=8)
        assert report.findings or report.valid  # a report either way, never an exception


@pytest.mark.parametrize(
    "world,rule",
    [
        (10**12, "world-size-invalid"),
        (-8, "world-size-invalid"),
        (0, "world-size-invalid"),
        ((1 << 24) + 1, "world-size-invalid"),
        (True, "world-size-invalid"),
        (8.0, "world-size-invalid"),
        ("8", "world-size-invalid"),
    ],
)
def test_odd_world_sizes_are_findings(world: object, rule: str) -> None:
    report = validate_config("distributed:\n  tp_size: 2\n", world_size=world)  # type: ignore[arg-type]
    assert not report.valid and rule in {f.rule for f in report.errors}
    with pytest.raises(ConfigError) as err:
        build_mesh("tp_size: 2\n", world_size=world)  # type: ignore[arg-type]
    assert rule in {f.rule for f in err.value.report.errors}


@pytest.mark.parametrize("nodes,gpn", [(10**9, 8), (-1, 8), (2, 0), (2, 10**7)])
def test_odd_clusters_are_findings(nodes: int, gpn: int) -> None:
    report = validate_config("tp_size: 2\n", nodes=nodes, gpus_per_node=gpn)
    assert not report.valid and report.errors


@pytest.mark.parametrize("key", ["tp_size", "cp_size", "pp_size", "ep_size", "dp_size", "dp_replicate_size"])
@pytest.mark.parametrize("value", [2**40, -(2**40), 10**100, "1e400", "nan", 1.5, "inf"])
def test_huge_and_odd_sizes_are_findings_without_enumeration(key: str, value: object) -> None:
    block = {key: value}
    if key == "pp_size":
        block["pipeline"] = {}
    report = validate_config({"distributed": block}, world_size=1 << 24)
    assert not report.valid
    assert report.errors[0].fix or report.errors[0].message


def test_largest_world_is_arithmetic_not_enumeration() -> None:
    """2^24 ranks: the mesh is laid out without building a group per rank."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mesh = build_mesh(
        {"tp_size": 8, "cp_size": 2, "pp_size": 4, "pipeline": {}},
        world_size=1 << 24,
        ranks=[0, (1 << 24) - 1],
        gpus_per_node=8,
    )
    assert mesh.rank_groups[str((1 << 24) - 1)]["tp"][-1] == (1 << 24) - 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024


def test_target_strings_are_never_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_target_ / *_fn values naming real callables are checked by name only."""
    marker = tmp_path / "imported"
    module = tmp_path / "evil_module_xyz.py"
    module.write_text(f"open({str(marker)!r}, 'w').close()\nclass DDPManager: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = """
distributed:
  _target_: evil_module_xyz.DDPManager
  mp_policy:
    _target_: evil_module_xyz.DDPManager
  pipeline:
    loss_fn: evil_module_xyz.DDPManager
    _target_: evil_module_xyz.DDPManager
  pp_size: 2
  moe:
    mp_policy:
      _target_: evil_module_xyz.DDPManager
loss_fn:
  _target_: evil_module_xyz.DDPManager
model:
  _target_: evil_module_xyz.DDPManager
"""
    report = validate_config(text, world_size=8)
    assert {"hydra-target", "mp-policy-invalid"} <= {f.rule for f in report.findings}
    with pytest.raises(ConfigError):
        build_mesh(text, world_size=8)
    assert not marker.exists()
    assert "evil_module_xyz" not in sys.modules


LONG = "a/" * 3000  # longer than any path the OS accepts: stat() raises OSError (File name too long)


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "tests/examples/llama3_2_1b_packed_cp2.yaml", "--model", LONG],
        ["validate", "tests/examples/llama3_2_1b_packed_cp2.yaml", "--model", LONG + ".json"],
        ["estimate", "tests/examples/llama3_2_1b_packed_cp2.yaml", "--model", LONG],
        ["suggest", "--model", LONG],
        ["validate", LONG],
        ["mesh", LONG, "--world-size", "8"],
        ["estimate", LONG, "--model", "meta-llama/Llama-3.2-1B"],
        ["smoke", LONG],
        ["explain", "CUDA out of memory " + "x" * 5000],
    ],
)
def test_overlong_names_are_usage_errors_or_findings_not_crashes(argv: list[str], capsys) -> None:
    """A model name or path the OS cannot stat is an unknown model or an unreadable file (exit 0-2, a clipped
    message), never an OSError traceback."""
    from automodel_dist.cli import main

    root = ROOT
    argv = [str(root / a) if a.startswith("tests/") else a for a in argv]
    assert main(argv) in (0, 1, 2)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    if "--model" in argv:
        assert LONG not in out.err + out.out  # the name is clipped in messages
