"""MCP server start-up over stdio: this server against a bare SDK ``MCPServer`` with one trivial tool, same run.

Speaks raw JSON-RPC over each server's stdio (no client library in the measured path): spawn -> ``initialize`` ->
``tools/list`` answered, then -> the first tool call answered (``validate_config`` for ours, the trivial tool for the
baseline). Series are interleaved so machine load hits them alike. Goal: both ratios (ours / bare SDK, medians)
<= 1.15, i.e. the server adds nothing measurable above the SDK it runs on.

Run: python bench/bench_mcp.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

OURS = [sys.executable, "-m", "automodel_dist.serve"]  # what automodel-dist-mcp runs
BARE_SDK = [
    sys.executable,
    "-c",
    "from mcp.server.mcpserver import MCPServer\n"
    "s = MCPServer(name='bare')\n"
    "@s.tool()\n"
    "def echo(text: str) -> str:\n"
    "    return text\n"
    "s.run('stdio')\n",
]
OUR_CALL = {"name": "validate_config", "arguments": {"config_yaml": "tp_size: 2\n", "world_size": 8}}
BARE_CALL = {"name": "echo", "arguments": {"text": "hi"}}
GOAL = 1.15


def _send(proc: subprocess.Popen, msg: dict) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(msg) + "\n")
    proc.stdin.flush()


def _reply(proc: subprocess.Popen, msg_id: int) -> dict:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("server closed stdout")
        msg = json.loads(line)
        if msg.get("id") == msg_id and "method" not in msg:
            return msg


def server_start(cmd: list[str], call: dict) -> tuple[float, float]:
    """Seconds from spawn to the tools/list reply, and to the first tool call's reply."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        _reply(proc, 1)
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        _reply(proc, 2)
        listed = time.perf_counter() - t0
        _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
        result = _reply(proc, 3)["result"]
        assert not result.get("isError"), result
        return listed, time.perf_counter() - t0
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)


BREAKDOWN = """
import time
t0 = time.perf_counter()
import mcp.server.mcpserver
t1 = time.perf_counter()
s = mcp.server.mcpserver.MCPServer(name="bare")
def echo(text: str) -> str:
    return text
s.tool()(echo)
t2 = time.perf_counter()
import automodel_dist.mcp_server as m
t3 = time.perf_counter()
m.create_server()
t4 = time.perf_counter()
import automodel_dist.api, automodel_dist.explain
t5 = time.perf_counter()
print(" ".join(f"{1e3 * x:.0f}" for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)))
"""


def breakdown(repeat: int) -> list[float]:
    """Median ms, in a fresh process each: SDK import, bare server + 1 tool, our tools' report models, our
    create_server (7 tools), the engine the first validate_config imports."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", BREAKDOWN], capture_output=True, text=True, check=True).stdout
        runs.append([float(x) for x in out.split()])
    return [statistics.median(col) for col in zip(*runs)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    server_start(OURS, OUR_CALL)  # warm the page cache for both series
    server_start(BARE_SDK, BARE_CALL)
    ours, bare = [], []
    for _ in range(args.repeat):
        ours.append(server_start(OURS, OUR_CALL))
        bare.append(server_start(BARE_SDK, BARE_CALL))
    med = statistics.median
    print(f"{args.repeat} runs each, interleaved; seconds (median / min)")
    rows = [
        ("spawn -> tools/list", 0),
        ("spawn -> first tool result", 1),
    ]
    for label, i in rows:
        o, b = [x[i] for x in ours], [x[i] for x in bare]
        ratio = med(o) / med(b)
        print(
            f"{label:<28} automodel-dist-mcp {med(o):.3f} / {min(o):.3f}   bare SDK {med(b):.3f} / {min(b):.3f}   "
            f"ratio {ratio:.3f}x  goal <= {GOAL}x: {'met' if ratio <= GOAL else 'NOT met'}"
        )
    sdk, bare, models, create, engine = breakdown(max(3, args.repeat // 2))
    print(
        f"in process (ms, medians): SDK import {sdk:.0f}; bare MCPServer + 1 tool {bare:.0f}; ours: the tools' report "
        f"models {models:.0f}, create_server with 7 tools {create:.0f}, the engine the first call imports {engine:.0f}"
    )


if __name__ == "__main__":
    main()
