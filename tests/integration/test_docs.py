"""Executable documentation: every YAML block in SKILL.md and references/ is validated (and run
through AutoModel 0.7.0 where the oracle is installed), the generated reference sections are
current, the config reference lists exactly the schema's keys and defaults, every CLI and Python
example in the README runs, the scripts work (and print an install hint without the package), and
the skill package (frontmatter, skill card, evals) follows the skills catalog's conventions.

A YAML block starts with a header naming how to check it:
``# check: world_size=8 | nodes=2 gpus_per_node=8 [model=<id>] [expect=error:<rule-id> | expect=warning:<rule-id>]``.
Without ``expect`` the block must be valid with no warnings; with ``warning:`` it is valid and warns of that rule.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from automodel_dist import build_mesh, suggest_strategy, validate_config
from automodel_dist.config import schema
from automodel_dist.docgen import BEGIN, END, SECTIONS, render
from automodel_dist.explain import explain_error
from automodel_dist.rules import RULES
from support import oracle
from support.paths import ROOT, SKILL_DIR
from support.session import wait_for_port

DOCS = [SKILL_DIR / "SKILL.md", *sorted((ROOT / "references").glob("*.md"))]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the newcomer's page and its depth
BIN = Path(sys.executable).parent


@dataclass
class Block:
    where: str
    text: str
    check: dict[str, str]


def _blocks(lang: str, paths: list[Path]) -> list[Block]:
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M):
            line = text[: m.start()].count("\n") + 1
            body = m.group(1)
            header = re.match(r"#\s*check:\s*(.*)", body)
            check = dict(kv.split("=", 1) for kv in header.group(1).split()) if header else {}
            out.append(Block(f"{path.relative_to(ROOT)}:{line}", body, check))
    return out


YAML_BLOCKS = _blocks("yaml", DOCS + PAGES)


def test_docs_have_yaml_blocks() -> None:
    assert len(YAML_BLOCKS) >= 15
    assert {b.where.split(":")[0] for b in YAML_BLOCKS} >= {
        "skills/nemo-automodel-distributed-training/SKILL.md",
        "references/config-reference.md",
        "references/expert-parallel-moe.md",
    }


def _kwargs(check: dict[str, str]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for key in ("world_size", "nodes", "gpus_per_node"):
        if key in check:
            kw[key] = int(check[key])
    if "model" in check:
        kw["model"] = check["model"]
    if "torch_version" in check:
        kw["torch_version"] = check["torch_version"]
    if "overrides" in check:  # the launch command's overrides, comma-separated (evals only)
        kw["overrides"] = check["overrides"].split(",")
    return kw


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_block_validates_as_documented(block: Block) -> None:
    assert block.check, f"{block.where}: a YAML block needs a '# check: ...' header"
    assert set(block.check) <= {"world_size", "nodes", "gpus_per_node", "model", "torch_version", "expect"}, block.check
    report = validate_config(block.text, **_kwargs(block.check))
    shown = "\n".join(f.model_dump_json() for f in report.findings)
    expect = block.check.get("expect", "valid")
    if expect == "valid":
        assert report.valid and not report.warnings, f"{block.where}:\n{shown}"
    else:
        kind, rule = expect.split(":")
        assert kind in ("error", "warning") and rule in RULES, expect
        if kind == "warning":
            assert report.valid and rule in {f.rule for f in report.warnings}, f"{block.where}:\n{shown}"
        else:
            assert not report.valid and rule in {f.rule for f in report.errors}, f"{block.where}:\n{shown}"


@pytest.mark.skipif(not oracle.AVAILABLE, reason="AutoModel 0.7.0 oracle not installed")
@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_block_agrees_with_automodel(block: Block) -> None:
    """Valid blocks build in AutoModel; blocks documented to fail one of AutoModel's own rules fail there."""
    doc = yaml.safe_load(block.text)
    dist = doc.get("distributed", doc)
    kw = _kwargs(block.check)
    world = kw.get("world_size") or kw["nodes"] * kw["gpus_per_node"]
    result = oracle.run(dist, world, [0, world - 1])
    expect = block.check.get("expect", "valid")
    if expect == "valid" or expect.startswith("warning:"):
        assert result.ok, f"{block.where}: AutoModel rejects it: {result.error}"
    elif RULES[expect.split(":")[1]].family == "automodel":
        assert not result.ok, f"{block.where}: AutoModel accepts a block documented as {expect}"
    elif RULES[expect.split(":")[1]].family == "parallelize":  # its setup passes; parallelizing fails
        assert result.ok, f"{block.where}: AutoModel's setup rejects it: {result.error}"
        error = oracle.parallelize(dist, world)
        explained = {m.rule for m in explain_error(error or "").matches}
        assert expect.split(":")[1] in explained, f"{block.where}: AutoModel's parallelize gave {error!r}"


def test_generated_sections_are_current() -> None:
    for rel, (name, fn) in SECTIONS.items():
        path = ROOT / rel
        assert path.read_text(encoding="utf-8") == render(path, name, fn()), (
            f"{rel} is stale: run python -m automodel_dist.docgen"
        )


def _tables(section: str) -> dict[str, dict[str, str]]:
    """{heading: {key: default cell}} of the markdown tables in a generated section."""
    out: dict[str, dict[str, str]] = {}
    heading = ""
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:]
            out[heading] = {}
        elif line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            out[heading][cells[0].strip("`")] = cells[2]
    return out


def _expected_default(value: Any) -> str:
    if isinstance(value, dict):
        return "see below"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value}`"


def test_config_reference_lists_exactly_the_schema() -> None:
    text = (ROOT / "references/config-reference.md").read_text(encoding="utf-8")
    section = text.split(BEGIN.format("config-reference"))[1].split(END.format("config-reference"))[0]
    tables = _tables(section)

    def table(title_start: str) -> dict[str, str]:
        [key] = [k for k in tables if k.startswith(title_start)]
        return tables[key]

    top = table("Top level")
    fields = set(schema.DistributedConfig.model_fields) - {"options"}
    assert set(top) - {"_target_`, `_recursive_`, `_convert_"} == fields
    for name in ("tp_size", "pp_size", "cp_size", "ep_size", "strategy", "activation_checkpointing"):
        assert top[name] == _expected_default(schema.field_default(schema.DistributedConfig, name)), name
    assert top["dp_size"] == top["dp_replicate_size"] == "null"
    nested = {
        "`strategy: fsdp2`": (schema.FSDP2Options, ""),
        "`strategy: megatron_fsdp`": (schema.MegatronFSDPOptions, ""),
        "`strategy: ddp`": (schema.DDPOptions, ""),
        "`mp_policy:`": (schema.MixedPrecisionPolicy, "mp_policy."),
        "`offload_policy:`": (schema.CPUOffloadPolicy, "offload_policy."),
        "`pipeline:`": (schema.PipelineConfig, "pipeline."),
        "`moe:`": (schema.MoEConfig, "moe."),
    }
    for title, (model, prefix) in nested.items():
        rows = table(title)
        assert set(rows) == {prefix + n for n in model.model_fields}, title
        for name in model.model_fields:
            assert rows[prefix + name] == _expected_default(schema.field_default(model, name)), (title, name)
    mm = table("`multimodal:`")
    assert set(mm) == (
        {f"multimodal.{n}" for n in schema.Multimodal.model_fields}
        | {f"multimodal.vision.frame_sharding.{n}" for n in schema.FrameSharding.model_fields}
    )


def test_rule_table_does_not_depend_on_import_order() -> None:
    import automodel_dist.explain  # noqa: F401  (everything that could register a rule)
    import automodel_dist.mcp_server  # noqa: F401

    fresh = subprocess.run(
        [sys.executable, "-c", "from automodel_dist.rules import RULES; print(sorted(RULES))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert fresh.stdout.strip() == str(sorted(RULES))


def test_every_troubleshooting_error_text_is_explained() -> None:
    """The page says any error text in its tables can be pasted into explain_error: each one is matched."""
    text = (ROOT / "references/troubleshooting.md").read_text(encoding="utf-8")
    tables = text[text.index("## Config errors") : text.index("## Values AutoModel")]
    lines = [line for line in tables.splitlines() if line.startswith(("| `", "| log `"))]
    rows = [
        line.split(" | ")[0][2:].removeprefix("log ").split(" (then")[0].strip().strip("`").strip() for line in lines
    ]
    assert len(rows) > 20
    unexplained = [row for row in rows if not explain_error(row).matches]
    assert not unexplained, unexplained
    # a row that names its rule, (`rule-id`), is explained by that rule first
    for line, row in zip(lines, rows):
        named = [r for r in re.findall(r"\(`([a-z0-9-]+)`", line.split(" | ")[1]) if r in RULES]
        if named:
            assert explain_error(row).matches[0].rule in named, (row, named)


def test_rule_index_lists_every_rule() -> None:
    text = (ROOT / "references/troubleshooting.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, re.M))
    assert listed == set(RULES)


# --- SKILL.md, skill card, evals -------------------------------------------------------------------


def _frontmatter(path: Path) -> tuple[dict[str, Any], str]:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_skill_md_frontmatter_and_size() -> None:
    meta, _ = _frontmatter(SKILL_DIR / "SKILL.md")
    assert meta["name"] == "nemo-automodel-distributed-training"
    assert meta["license"] == "Apache-2.0"
    assert 100 <= len(meta["description"]) <= 1024
    assert len((SKILL_DIR / "SKILL.md").read_text(encoding="utf-8").splitlines()) <= 500


def test_doc_paths_and_links_exist() -> None:
    for path in [*DOCS, *PAGES, ROOT / "skill-card.md"]:
        text = path.read_text(encoding="utf-8")
        for ref in re.findall(r"`((?:references|scripts|bench|tests|evals)/[\w./-]+\.(?:md|py|json|yaml|sh))`", text):
            assert (ROOT / ref).exists(), f"{path.name} names {ref}, which does not exist"
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (path.parent / link).exists(), f"{path.name} links {link}, which does not exist"


def test_every_rule_id_named_in_docs_exists() -> None:
    for path in [*DOCS, *PAGES]:
        for rule in re.findall(r"(?:error|warning|info)\[([a-z0-9-]+)\]", path.read_text(encoding="utf-8")):
            assert rule in RULES, f"{path.name} names rule {rule}"


def test_skill_card_sections() -> None:
    text = (ROOT / "skill-card.md").read_text(encoding="utf-8")
    for heading in (
        "Description",
        "Owner",
        "License",
        "Use Case",
        "Requirements",
        "Known Risks",
        "Reference",
        "Skill Output",
        "Evaluation",
        "Ethical Considerations",
    ):
        assert re.search(rf"^#+ .*{heading}", text, re.M | re.I), heading


def test_evals_cover_the_topics() -> None:
    evals = json.loads((ROOT / "evals/evals.json").read_text(encoding="utf-8"))
    assert evals["skill_name"] == "nemo-automodel-distributed-training"
    tasks = evals["evals"]
    assert len(tasks) >= 10
    ids = [t["id"] for t in tasks]
    assert len(set(ids)) == len(ids)
    for t in tasks:
        assert t["question"].strip() and t["ground_truth"].strip(), t["id"]
        assert t["expected_behavior"] and all(isinstance(b, str) and b for b in t["expected_behavior"]), t["id"]
        if t.get("expected_script"):
            assert (ROOT / t["expected_script"]).exists(), t["expected_script"]
        for block in t.get("configs", []):  # configs the ground truth relies on are checked like doc blocks
            report = validate_config(block["yaml"], **_kwargs(block["check"]))
            expect = block["check"].get("expect", "valid")
            found = {f.rule for f in (report.warnings if expect.startswith("warning:") else report.errors)}
            if expect == "valid" or expect.startswith("warning:"):
                assert report.valid, (t["id"], [f.rule for f in report.errors])
            if expect != "valid":
                assert expect.split(":")[1] in found, (t["id"], found)
        if "suggest" in t:  # ground truths about layouts are checked against the search itself
            check = t["suggest"]
            report = suggest_strategy(**check["args"], top_k=1)
            if check["expect_top"] is None:
                assert not report.candidates, (t["id"], report.candidates[0].distributed)
            else:
                top = report.candidates[0].distributed
                assert all(top.get(k) == v for k, v in check["expect_top"].items()), (t["id"], top)
            if "expect_rejected_contains" in check:
                assert any(check["expect_rejected_contains"] in r.reason for r in report.rejected), t["id"]
        if "explain" in t:  # ground truths about an error text are checked against explain_error
            check = t["explain"]
            assert [m.rule for m in explain_error(check["text"]).matches] == check["expect_rules"], t["id"]
        if "mesh" in t:
            check = t["mesh"]
            [cfg] = t["configs"]
            mesh = build_mesh(cfg["yaml"], **check["args"])
            groups = mesh.rank_groups[str(check["args"]["ranks"][0])]
            assert {k: groups[k] for k in check["expect_groups"]} == check["expect_groups"], t["id"]
            crossing = sorted(a.name for a in mesh.axes if a.crosses_nodes)
            assert crossing == sorted(check["expect_crossing"]), (t["id"], crossing)
    topics = {topic for t in tasks for topic in t["topics"]}
    assert topics >= {
        "strategy-choice",
        "sizing",
        "moe-ep",
        "pp-schedules",
        "cp",
        "hsdp",
        "megatron-fsdp",
        "ddp",
        "troubleshooting",
        "negative-control",
    }


# --- README examples -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """A command of a ```bash block in the README or docs/: its expected exit code (``# exit N`` comment, else 0)
    and, when the next block is ```text, the output it must print: each line verbatim, in order, where a line
    ending in ``...`` stands for any line that starts with what precedes it, and a bare ``...`` for any lines."""

    where: str
    cmd: str
    exit_code: int = 0
    shown: tuple[str, ...] | None = None


def _examples() -> list[Example]:
    out = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^```bash\n(.*?)^```\n(?:\n```text\n(.*?)^```)?", text, re.S | re.M):
            lines = [ln for ln in m.group(1).replace("\\\n", " ").splitlines() if ln.startswith("automodel-dist")]
            shown = tuple(m.group(2).splitlines()) if m.group(2) is not None else None
            for i, line in enumerate(lines):
                code = re.search(r"#\s*exit\s+(\d+)", line)
                cmd = re.sub(r"\s+#.*$", "", line).strip()
                where = f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
                out.append(
                    Example(where, cmd, int(code.group(1)) if code else 0, shown if i == len(lines) - 1 else None)
                )
    return out


EXAMPLES_RUN = _examples()
README_COMMANDS = [e.cmd for e in EXAMPLES_RUN]


def test_readme_shows_every_command() -> None:
    readme = {e.cmd.split()[1] for e in EXAMPLES_RUN if e.where.startswith("README.md") and len(e.cmd.split()) > 1}
    assert readme >= {"validate", "mesh", "smoke", "estimate", "dryrun", "suggest", "explain", "models", "serve"}


def shows(output: str, shown: tuple[str, ...]) -> str | None:
    """None when ``output`` has the ``shown`` lines in order (see :class:`Example`), else the first it lacks."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    at = 0
    for want in (w.rstrip() for w in shown):
        if want == "...":
            continue
        prefix = want[:-3] if want.endswith("...") else None
        for i in range(at, len(lines)):
            if lines[i].startswith(prefix) if prefix is not None else lines[i] == want:
                at = i + 1
                break
        else:
            return want
    return None


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _moe_recipe_runs_at_8(out: str) -> None:
    """`smoke recipe.yaml --stack tiny` on the MoE recipe (cp2 pp2 ep4, interleaved, AC): 4 ranks cannot run it, 8
    can."""
    assert out.startswith("PASSED") and "on 8 ranks" in out
    assert (
        "note: world_size 8: the smallest number of processes this layout is valid on (4, the default, is not)" in out
    )


def _moe_recipe_with_cp_is_not_run_on_automodels_stack(out: str) -> None:
    """The same recipe on AutoModel's stack: CP on its own MoE class needs TE attention (CUDA) and its Hugging Face
    fallback has no expert parallelism, said with the way to run the tiny stack instead; nothing launched."""
    assert out.startswith("NOT_RUN: not run on AutoModel's stack: AutoModel's own class for Qwen3MoeForCausalLM")
    assert "context parallelism" in out and "expert parallelism" in out
    assert "--stack tiny (stack=tiny) runs this tool's tiny model" in out


def _cp_runs_through_automodels_hugging_face_fallback(out: str) -> None:
    """CP 2 on Llama: AutoModel's own class takes only TE attention under CP, so its Hugging Face fallback runs,
    with parity, and the report says so."""
    assert out.startswith("PASSED") and "cp=2" in out
    assert "built as FSDPLlamaForCausalLM, the Hugging Face class through AutoModel's fallback" in out
    assert "model.force_hf: true" in out and "SDPA's math kernel" in out


def _smoke_json_passes_with_ep2(out: str) -> None:
    report = json.loads(out)
    assert report["passed"] and report["world_size"] == 4 and report["layout"]["ep"] == 2


EXPECTED_OUTPUT = {
    "automodel-dist smoke tests/examples/qwen3_moe_30b_te_chat_thd.yaml --stack tiny --quiet": _moe_recipe_runs_at_8,
    "automodel-dist smoke tests/examples/qwen3_moe_30b_te_chat_thd.yaml --quiet": (
        _moe_recipe_with_cp_is_not_run_on_automodels_stack
    ),
    "automodel-dist smoke --world-size 4 --ep 2 --model tiny-moe --json": _smoke_json_passes_with_ep2,
    "automodel-dist smoke tests/examples/llama3_2_1b_packed_cp2.yaml --world-size 4": (
        _cp_runs_through_automodels_hugging_face_fallback
    ),
}
"""What a README command must print besides exiting 0 (each is the only run of its case in the default suite)."""


def test_expected_outputs_are_readme_commands() -> None:
    assert set(EXPECTED_OUTPUT) <= set(README_COMMANDS)


@pytest.mark.parametrize("example", [e for e in EXAMPLES_RUN if " serve" not in e.cmd], ids=lambda e: e.where)
def test_readme_command_runs(example: Example) -> None:
    argv = shlex.split(example.cmd)
    assert argv[0] == "automodel-dist"
    proc = subprocess.run(
        [str(BIN / "automodel-dist"), *argv[1:]], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    said = f"{example.where}: {example.cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == example.exit_code, said
    assert "Traceback" not in proc.stderr
    if example.shown is not None:
        missing = shows(proc.stdout, example.shown)
        assert missing is None, f"{example.where}: the output lacks the line shown as {missing!r}\n{said}"
    if example.cmd in EXPECTED_OUTPUT:
        EXPECTED_OUTPUT[example.cmd](proc.stdout)


def test_shown_output_matching() -> None:
    out = "a\nb 1\nc\nd\n"
    assert shows(out, ("a", "b ...", "...", "d")) is None
    assert shows(out, ("a", "c")) is None and shows(out, ("b 2",)) == "b 2" and shows(out, ("c", "a")) == "a"


@pytest.mark.parametrize("cmd", [c for c in README_COMMANDS if " serve" in c])
def test_readme_serve_command_answers(cmd: str) -> None:
    """`serve` examples start a server that answers an MCP client (stdio) or listens (http)."""
    import anyio

    argv = shlex.split(cmd)
    if "http" not in argv:
        from mcp import Client, StdioServerParameters

        async def main() -> list[str]:
            params = StdioServerParameters(
                command=str(BIN / "automodel-dist"), args=argv[1:], cwd=str(ROOT), env=_env()
            )
            async with Client(params) as client:
                return [t.name for t in (await client.list_tools()).tools]

        assert "validate_config" in anyio.run(main)
        return
    proc = subprocess.Popen(
        [str(BIN / "automodel-dist"), *argv[1:]],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_port(int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "block", [b for b in _blocks("python", PAGES) if "automodel_dist" in b.text], ids=lambda b: b.where
)
def test_readme_python_example_runs(tmp_path: Path, block: Block) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.text, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- scripts/ ------------------------------------------------------------------------------------

SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_"))


def test_scripts_cover_the_tools() -> None:
    assert {p.stem for p in SCRIPTS} >= {
        "validate",
        "mesh",
        "suggest",
        "smoke",
        "estimate",
        "dryrun",
        "explain",
        "models",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_runs_with_the_package(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0 and "usage: automodel-dist" in proc.stdout, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_prints_install_hint_without_the_package(script: Path) -> None:
    # -I -S: no site-packages, no user paths, so automodel_dist cannot be imported.
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(script), "--help"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install" in lines[0] and str(ROOT) in lines[0], proc.stderr


def test_script_validates_a_file() -> None:
    example = ROOT / "tests/examples/llama3_1_8b_hellaswag_pp.yaml"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/validate.py"), str(example), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["valid"] is True
