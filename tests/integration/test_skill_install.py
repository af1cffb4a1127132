"""Install the skill with the real skills CLI (`npx skills add`) for Claude Code, Codex, Cursor and
GitHub Copilot into a temporary project, then use what was installed: its SKILL.md, its scripts and
its MCP server.

Marked ``node``: CI runs it when Node.js is present (`.ci/run`). The source is a clean export of
this checkout (tracked and untracked-but-not-ignored files), as a clone would be: the skills CLI
copies every file of a local folder, so a `.venv` inside the checkout would be copied too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import yaml

from support.paths import ROOT

NAME = "nemo-automodel-distributed-training"
SKILLS = ["npx", "-y", "skills@1.5.16", "add"]
INSTALLED = {  # where skills 1.5.16 puts the skill for each agent (Codex, Cursor, Copilot share .agents/skills)
    "claude-code": Path(".claude/skills") / NAME,
    "codex": Path(".agents/skills") / NAME,
    "cursor": Path(".agents/skills") / NAME,
    "github-copilot": Path(".agents/skills") / NAME,
}

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(shutil.which("npx") is None, reason="Node.js (npx) is not installed"),
]


def _export(dest: Path) -> Path:
    """A clean copy of the checkout: what `git clone` of this working tree would contain."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # the skill folder links the engine and its pages, as a clone keeps them
            os.symlink(os.readlink(src), dest / rel)
        elif src.is_file():
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(tmp_path_factory.mktemp("src") / "nemo-automodel-distributed-training")


@pytest.mark.parametrize("agent", sorted(INSTALLED))
def test_skills_cli_installs_a_working_skill(agent: str, source: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = dict(os.environ, npm_config_loglevel="error", DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    proc = subprocess.run(
        [*SKILLS, str(source), "--agent", agent, "-y"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    skill = project / INSTALLED[agent]

    # the agent finds SKILL.md with its frontmatter, and the references it points to
    text = (skill / "SKILL.md").read_text(encoding="utf-8")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["name"] == NAME and meta["license"] == "Apache-2.0"
    for ref in (
        "references/config-reference.md",
        "references/troubleshooting.md",
        "skill-card.md",
        "scripts/validate.py",
        "pyproject.toml",
        "README.md",
        "server/automodel_dist/mcp_server.py",
    ):
        assert (skill / ref).is_file() and not (skill / ref).is_symlink(), ref
    # lean: only what an agent uses (the skill text, its scripts, the engine they drive); none of the repository's
    # tests, benchmarks, CI, tools, developer docs or evals
    assert sorted(p.name for p in skill.iterdir()) == sorted(
        ["SKILL.md", "README.md", "pyproject.toml", "references", "scripts", "server", "skill-card.md"]
    )
    for absent in ("tests", "bench", ".ci", "tools", "docs", "evals", ".git", ".ruff_cache", ".venv"):
        assert not (skill / absent).exists(), absent

    # the installed scripts run (package installed in this Python) ...
    example = ROOT / "tests/examples/llama3_1_8b_hellaswag_pp.yaml"
    run = subprocess.run(
        [sys.executable, str(skill / "scripts/validate.py"), str(example), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=project,
    )
    assert run.returncode == 0 and json.loads(run.stdout)["valid"], run.stdout + run.stderr
    mesh = subprocess.run(
        [sys.executable, str(skill / "scripts/mesh.py"), str(example), "--world-size", "8", "--rank", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=project,
    )
    assert mesh.returncode == 0 and "device_mesh" in mesh.stdout, mesh.stderr
    # ... and without it they name the installed folder to pip install
    bare = subprocess.run(
        [sys.executable, "-I", "-S", str(skill / "scripts/suggest.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert bare.returncode == 2 and str(skill) in bare.stderr, bare.stderr

    # the installed copy of the MCP server itself starts and answers (its own code, not this checkout's),
    # as agents spawn it over stdio
    from mcp import Client, StdioServerParameters

    async def main() -> tuple[list[str], bool]:
        server = f'exec "{sys.executable}" -m automodel_dist.serve 2>"{errlog}"'
        params = StdioServerParameters(
            command="/bin/sh",
            args=["-c", server],
            env={**os.environ, "PYTHONPATH": str(skill / "server")},
            cwd=str(project),
        )
        async with Client(params) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            r = await client.call_tool("validate_config", {"config_path": str(example), "world_size": 8})
            return tools, r.structured_content["valid"]

    errlog = project / "mcp-stderr.txt"
    tools, valid = anyio.run(main)
    assert "fast start off" not in errlog.read_text()  # the installed recording was used
    assert {"validate_config", "build_mesh", "suggest_strategy", "run_smoke_test"} <= set(tools)
    assert valid
    which = subprocess.run(
        [sys.executable, "-c", "import automodel_dist; print(automodel_dist.__file__)"],
        env={**os.environ, "PYTHONPATH": str(skill / "server")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert which.stdout.strip().startswith(str(skill)), which.stdout
