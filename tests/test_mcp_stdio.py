"""The stdio relay (``automodel-dist-mcp``): handshake answered from the recording, everything else
relayed to the real SDK server, the recording kept honest (checked against the server on every
start, and against a freshly generated one here), clean shutdown."""

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

from automodel_dist import mcp_snapshot
from automodel_dist.mcp_snapshot import LIST_METHODS, SNAPSHOT_ENV, SNAPSHOT_PATH, installed_versions, listed, load

RELAY = [sys.executable, "-m", "automodel_dist.mcp_stdio"]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
MODERN = "2026-07-28"


def envelope(version: str = MODERN, capabilities: dict | None = None) -> dict:
    return {"_meta": {"io.modelcontextprotocol/protocolVersion": version,
                      "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": capabilities or {}}}


class Wire:
    """Raw JSON-RPC over a spawned server's stdio."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=dict(os.environ, **(env or {})))
        self.others: list[dict] = []
        self.modern, self.capabilities = False, None

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")

    def reply(self, msg_id: object, timeout: float = 60) -> dict:
        assert self.proc.stdout is not None
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"server closed stdout; stderr: {self.stderr()}")
            msg = json.loads(line)
            if msg.get("id") == msg_id and "method" not in msg:
                return msg
            self.others.append(msg)
        raise AssertionError(f"no reply to {msg_id}")

    def handshake(self, version: str = "2025-06-18", capabilities: dict | None = None) -> dict:
        """``initialize`` (handshake era) or ``server/discover`` (2026-07-28 envelope era)."""
        self.modern, self.capabilities = version == MODERN, capabilities
        if self.modern:
            self.send({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                       "params": envelope(version, capabilities)})
            return self.reply(1)["result"]
        self.send(dict(INIT, params=dict(INIT["params"], protocolVersion=version, capabilities=capabilities or {})))
        result = self.reply(1)["result"]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def request(self, msg_id: object, method: str, params: dict | None = None) -> None:
        params = dict(params or {}, **(envelope(MODERN, self.capabilities) if self.modern else {}))
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, **({"params": params} if params else {})})

    def wait_for(self, method: str, timeout: float = 60) -> None:
        """Make calls until the server has sent notification ``method``."""
        deadline = time.time() + timeout
        while not any(m.get("method") == method for m in self.others):
            assert time.time() < deadline, f"no {method}"
            self.request("wait", "tools/call", {"name": "list_models", "arguments": {}})
            self.reply("wait")

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "<running>"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _doctored(tmp_path: Path, **changes) -> Path:
    snap = json.loads(SNAPSHOT_PATH.read_text())
    for answer in [*snap["initialize"].values(), *snap["discover"].values()]:
        if "instructions" in changes:
            answer["instructions"] = changes["instructions"]
    if "drop_tool" in changes:
        for result in snap["results"]:
            if "tools" in result:
                result["tools"] = [t for t in result["tools"] if t["name"] != changes["drop_tool"]]
    if "fake_prompt" in changes:
        for result in snap["results"]:
            if "prompts" in result:
                result["prompts"] = [{"name": changes["fake_prompt"]}]
    snap["versions"].update(changes.get("versions") or {})
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snap))
    return path


def test_recording_matches_the_live_server():
    """The committed recording is what the server answers now, for every handshake protocol version."""
    snap, why_not = load()
    live = dict(installed_versions(), automodel_dist=mcp_snapshot._own_version())
    recorded = json.loads(SNAPSHOT_PATH.read_text())["versions"]
    if recorded != live:  # another SDK/pydantic: the relay must not use the recording at all
        assert snap is None and "recorded with other versions" in why_not
        return
    assert snap is not None and why_not == ""
    assert mcp_snapshot.dumps(mcp_snapshot.generate()) == SNAPSHOT_PATH.read_text(), \
        "stale: run python -m automodel_dist.mcp_snapshot --write"
    for version, init in snap["initialize"].items():
        assert init["protocolVersion"] == version
    for version in [*snap["initialize"], *snap["discover"]]:
        lists = listed(snap, version)
        assert set(lists) == set(LIST_METHODS) and len(lists["tools/list"]["tools"]) == 7


@pytest.mark.parametrize("version", ["2024-11-05", "2025-11-25", MODERN])
def test_relay_answers_from_recording_and_relays_the_rest(tmp_path: Path, version: str):
    path = _doctored(tmp_path, instructions="RECORDED")
    w = Wire(RELAY, {SNAPSHOT_ENV: str(path)})
    try:
        init = w.handshake(version)
        assert init["instructions"] == "RECORDED"  # answered by the relay, not the SDK
        w.request(2, "tools/list")
        assert len(w.reply(2)["result"]["tools"]) == 7
        w.request("three", "tools/call", {
            "name": "build_mesh", "arguments": {"config_yaml": "tp_size: 2\n", "world_size": 4, "ranks": [3]}})
        result = w.reply("three")["result"]
        assert result["structuredContent"]["mesh"]["rank_groups"]["3"]["tp"] == [2, 3]
        for i, (method, key) in enumerate((("prompts/list", "prompts"), ("resources/list", "resources"),
                                           ("resources/templates/list", "resourceTemplates")), 10):
            w.request(i, method)
            assert w.reply(i)["result"][key] == []
        if not w.modern:
            w.request(4, "ping")
            assert w.reply(4)["result"] == {}
        assert w.others == []  # the server's own handshake reply and the check were not relayed
        assert w.close() == 0
    finally:
        w.proc.kill()
    # the server's real instructions differ from the doctored ones: the relay says so
    what = "server/discover" if version == MODERN else "initialize"
    assert f"recorded {what} answer differs" in w.stderr()


@pytest.mark.parametrize("version", ["2025-06-18", MODERN])
def test_stale_tool_list_is_corrected(tmp_path: Path, version: str):
    path = _doctored(tmp_path, drop_tool="list_models")
    w = Wire(RELAY, {SNAPSHOT_ENV: str(path)})
    try:
        w.handshake(version)
        w.request(2, "tools/list")
        first = {t["name"] for t in w.reply(2)["result"]["tools"]}
        w.wait_for("notifications/tools/list_changed")
        w.request(6, "tools/list")
        second = {t["name"] for t in w.reply(6)["result"]["tools"]}
        assert "list_models" not in first and "list_models" in second and len(second) == 7
        assert w.close() == 0
    finally:
        w.proc.kill()
    assert "recorded tools/list answer differs" in w.stderr()


@pytest.mark.parametrize("case", ["other-versions", "unrecorded-protocol", "disabled"])
def test_falls_back_to_the_sdk(tmp_path: Path, case: str):
    env = {SNAPSHOT_ENV: str(_doctored(tmp_path, instructions="RECORDED",
                                       versions={"mcp": "0.0.1"} if case == "other-versions" else None))}
    if case != "other-versions":
        env[SNAPSHOT_ENV] = str(_doctored(tmp_path, instructions="RECORDED"))
    if case == "disabled":
        env["AUTOMODEL_DIST_MCP_FAST_START"] = "0"
    w = Wire(RELAY, env)
    try:
        init = w.handshake("2024-01-01" if case == "unrecorded-protocol" else "2025-06-18")
        assert init["instructions"] != "RECORDED"  # the SDK answered
        if case == "unrecorded-protocol":
            assert init["protocolVersion"] == "2025-11-25"  # the SDK's counter-offer
        w.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert len(w.reply(2)["result"]["tools"]) == 7
        assert w.close() == 0
    finally:
        w.proc.kill()
    err = w.stderr()
    assert "differs" not in err
    assert ("fast start off (recorded with other versions: mcp" in err) == (case == "other-versions")


def test_sigterm_stops_relay_and_server():
    w = Wire(RELAY)
    try:
        w.handshake()
        w.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "validate_config", "arguments": {"config_yaml": "tp_size: 2\n", "world_size": 4}}})
        assert w.reply(2)["result"]["structuredContent"]["valid"] is True  # the server is up
        children = _children(w.proc.pid)
        assert len(children) == 1
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(timeout=30)
        deadline = time.time() + 15
        while _alive(children[0]) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(children[0])
    finally:
        w.proc.kill()


def test_sdk_client_through_relay_and_cli_serve(tmp_path: Path):
    """The SDK's own client (2026-07-28 envelope by default) gets the recorded answers, then real calls."""
    env = dict(os.environ, **{SNAPSHOT_ENV: str(_doctored(tmp_path, instructions="RECORDED"))})

    async def go(args: list[str]):
        params = StdioServerParameters(command=sys.executable, args=args, env=env)
        async with Client(params) as c:
            tools = await c.list_tools()
            r = await c.call_tool("validate_config", {"config_yaml": "tp_size: 3\n", "world_size": 8})
            return c.instructions, len(tools.tools), r.structured_content["findings"][0]["rule"]

    for args in (["-m", "automodel_dist.mcp_stdio"], ["-m", "automodel_dist.cli", "serve"]):
        assert anyio.run(go, args) == ("RECORDED", 7, "world-not-divisible")


def test_malformed_lines_reach_the_sdk_and_the_relay_keeps_serving(tmp_path: Path):
    path = _doctored(tmp_path, instructions="RECORDED")
    w = Wire(RELAY, {SNAPSHOT_ENV: str(path)})
    try:
        assert w.proc.stdin is not None
        for junk in ("not json", "[1, 2]", '{"jsonrpc": "2.0", "id": 7}', '{"jsonrpc": "2.0", "method": 5, "id": 8}',
                     '"a string"', "{" * 5000):
            w.proc.stdin.write(junk + "\n")
        init = w.handshake()  # the first well-formed request decides, as in the SDK
        w.request(2, "tools/list")
        assert len(w.reply(2)["result"]["tools"]) == 7
        w.request(3, "tools/call", {"name": "validate_config", "arguments": {"config_yaml": "tp_size: 3\n",
                                                                             "world_size": 8}})
        assert w.reply(3)["result"]["structuredContent"]["valid"] is False
        assert w.close() == 0
    finally:
        w.proc.kill()
    assert init["instructions"] == "RECORDED"  # junk before it did not turn the fast path off


@pytest.mark.parametrize("version", ["2025-11-25", MODERN])
def test_real_recording_agrees_with_the_server_for_a_rich_client(version: str):
    """A client declaring roots, sampling and elicitation gets exactly what the SDK would answer."""
    w = Wire(RELAY)
    try:
        w.handshake(version, {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {}})
        w.request(2, "tools/list")
        assert len(w.reply(2)["result"]["tools"]) == 7
        w.request(3, "tools/call", {"name": "list_models", "arguments": {}})
        assert "result" in w.reply(3)  # by now the check of the recording has come back
        assert w.close() == 0
    finally:
        w.proc.kill()
    err = w.stderr()
    assert "differs" not in err and "fast start off" not in err, err


def test_stale_prompt_list_is_corrected(tmp_path: Path):
    w = Wire(RELAY, {SNAPSHOT_ENV: str(_doctored(tmp_path, fake_prompt="recorded-only"))})
    try:
        w.handshake(MODERN)
        w.request(2, "prompts/list")
        assert [p["name"] for p in w.reply(2)["result"]["prompts"]] == ["recorded-only"]  # from the recording
        w.wait_for("notifications/prompts/list_changed")
        w.request(6, "prompts/list")
        assert w.reply(6)["result"]["prompts"] == []  # the server's own answer from now on
        assert w.close() == 0
    finally:
        w.proc.kill()
    assert "recorded prompts/list answer differs" in w.stderr()
