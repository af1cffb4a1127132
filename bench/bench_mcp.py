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


if __name__ == "__main__":
    main()
