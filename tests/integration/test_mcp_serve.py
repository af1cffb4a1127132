"""Starting the MCP server over stdio: the SDK's own client through every entry point, junk lines, SIGTERM, and an
install that cannot start (non-zero exit, the error on stderr, nothing on stdout: no handshake)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

ENTRY_POINTS = {
    "automodel-dist-mcp": [str(Path(sys.executable).parent / "automodel-dist-mcp")],
    "automodel-dist serve": [sys.executable, "-m", "automodel_dist.cli", "serve"],
    "python -m automodel_dist.serve": [sys.executable, "-m", "automodel_dist.serve"],
}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
}


def _reply(proc: subprocess.Popen, msg_id: object, timeout: float = 60) -> dict:
    assert proc.stdout is not None
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"server closed stdout; stderr: {proc.stderr.read() if proc.stderr else ''}")
        msg = json.loads(line)
        if msg.get("id") == msg_id and "method" not in msg:
            return msg
    raise AssertionError(f"no reply to {msg_id}")


def _spawn(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env=dict(os.environ, **(env or {})),
    )


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_sdk_client_through_every_entry_point(entry: str) -> None:
    cmd = ENTRY_POINTS[entry]

    async def go() -> tuple[str | None, int, str]:
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
        async with Client(params) as c:
            tools = await c.list_tools()
            r = await c.call_tool("validate_config", {"config_yaml": "tp_size: 3\n", "world_size": 8})
            return c.instructions, len(tools.tools), r.structured_content["findings"][0]["rule"]

    instructions, n_tools, rule = anyio.run(go)
    assert n_tools == 8 and rule == "world-not-divisible"
    assert instructions and "validate_config" in instructions


def test_malformed_lines_are_answered_and_the_server_keeps_serving() -> None:
    proc = _spawn(ENTRY_POINTS["automodel-dist-mcp"])
    try:
        assert proc.stdin is not None
        for junk in ("not json", "[1, 2]", '{"jsonrpc": "2.0", "id": 7}', '"a string"', "{" * 5000):
            proc.stdin.write(junk + "\n")
        proc.stdin.write(json.dumps(INIT) + "\n")
        assert _reply(proc, 1)["result"]["serverInfo"]["name"] == "nemo-automodel-distributed-training"
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        call = {"name": "validate_config", "arguments": {"config_yaml": "tp_size: 3\n", "world_size": 8}}
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}) + "\n")
        assert _reply(proc, 2)["result"]["structuredContent"]["valid"] is False
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_sigterm_stops_the_server() -> None:
    proc = _spawn(ENTRY_POINTS["automodel-dist-mcp"])
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(INIT) + "\n")
        _reply(proc, 1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # no handler keeps it alive
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param({"mcp/__init__.py": "raise ImportError('mcp is broken here')\n"}, id="sdk-import-error"),
        pytest.param({"mcp/__init__.py": "", "mcp/server/__init__.py": ""}, id="sdk-v1-layout"),
        pytest.param({"pydantic/__init__.py": "raise RuntimeError('half-installed pydantic')\n"}, id="pydantic-broken"),
    ],
)
@pytest.mark.parametrize("entry", ["automodel-dist-mcp", "automodel-dist serve"])
def test_a_server_that_cannot_start_says_why_before_any_handshake(tmp_path: Path, broken: dict, entry: str) -> None:
    for rel, text in broken.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = _spawn(ENTRY_POINTS[entry], env={"PYTHONPATH": str(tmp_path)})
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(INIT) + "\n")
        proc.stdin.flush()
    except BrokenPipeError:  # it may be gone already
        pass
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert out == ""  # no handshake, no half-alive server
    assert "the MCP server cannot start" in err and "Traceback" not in err, err
    assert ("mcp is broken here" in err) or ("mcpserver" in err) or ("half-installed pydantic" in err), err
