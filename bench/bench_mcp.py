"""MCP server start-up: spawn -> handshake -> tools/list answered, vs a bare ``python -c "import torch"``.

Speaks raw JSON-RPC over the server's stdio (no client library in the measured path), for
``automodel-dist-mcp`` (the stdio relay, which answers the handshake from the recorded answers
while the SDK imports in its child) with the ``initialize`` handshake and with the 2026-07-28
envelope (``server/discover``, what the SDK's own client sends), for ``automodel-dist serve``
(the same relay behind the CLI), and for the SDK server alone
(``--no-fast-start``). Also times ``import mcp.server.mcpserver`` (the SDK's import floor) and the
first ``validate_config`` reply (which waits for the SDK). Goal: tools/list within 1.0 s of spawn.

Run: python bench/bench_mcp.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

RELAY = [sys.executable, "-m", "automodel_dist.mcp_stdio"]
PLAIN = RELAY + ["--no-fast-start"]
CLI_SERVE = [sys.executable, "-m", "automodel_dist.cli", "serve"]
ENVELOPE = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}


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


def server_start(cmd: list[str], modern: bool = False) -> tuple[float, float, int]:
    """Seconds from spawn to the tools/list reply, then to a validate_config reply; tool count."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, bufsize=1)
    extra = ENVELOPE if modern else {}
    try:
        if modern:
            _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": ENVELOPE})
            _reply(proc, 1)
        else:
            _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
            _reply(proc, 1)
            _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list", **({"params": extra} if extra else {})})
        tools = _reply(proc, 2)["result"]["tools"]
        listed = time.perf_counter() - t0
        _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "validate_config", "arguments": {"config_yaml": "tp_size: 2\n", "world_size": 8}, **extra}})
        result = _reply(proc, 3)["result"]
        assert result["structuredContent"]["valid"] is True, result
        called = time.perf_counter() - t0
        return listed, called, len(tools)
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)


def python_c(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    python_c("import torch")  # warm the page cache for every series
    server_start(RELAY)
    series: dict[str, list[tuple[float, float, int]]] = {"relay": [], "relay-2026": [], "cli": [], "sdk": []}
    torch_s, sdk_s, bare_s = [], [], []
    for _ in range(args.repeat):  # interleaved, so machine load hits every series alike
        series["relay"].append(server_start(RELAY))
        series["relay-2026"].append(server_start(RELAY, modern=True))
        series["cli"].append(server_start(CLI_SERVE))
        series["sdk"].append(server_start(PLAIN))
        torch_s.append(python_c("import torch"))
        sdk_s.append(python_c("import mcp.server.mcpserver"))
        bare_s.append(python_c("pass"))
    med, low = statistics.median, min
    print(f"{args.repeat} runs each (interleaved), {series['relay'][0][2]} tools; seconds")
    print(f"{'what':<58} {'median':>7} {'min':>7}")
    rows = [
        ("automodel-dist-mcp, initialize: spawn -> tools/list", [s[0] for s in series["relay"]]),
        ("automodel-dist-mcp, 2026-07-28 envelope: -> tools/list", [s[0] for s in series["relay-2026"]]),
        ("automodel-dist serve, initialize: spawn -> tools/list", [s[0] for s in series["cli"]]),
        ("automodel-dist-mcp --no-fast-start (SDK answers): -> tools/list", [s[0] for s in series["sdk"]]),
        ("automodel-dist-mcp: spawn -> first validate_config reply", [s[1] for s in series["relay"]]),
        ("--no-fast-start: spawn -> first validate_config reply", [s[1] for s in series["sdk"]]),
        ('python -c "import torch" (baseline)', torch_s),
        ('python -c "import mcp.server.mcpserver" (SDK import)', sdk_s),
        ("python -c pass", bare_s),
    ]
    for label, xs in rows:
        print(f"{label:<58} {med(xs):7.3f} {low(xs):7.3f}")
    listed = [s[0] for s in series["relay"] + series["relay-2026"] + series["cli"]]
    print(f"ratio tools/list / import torch: {med(listed) / med(torch_s):.3f}x (median, both entry points and eras)")
    worst = max(listed)
    print(f"goal tools/list <= 1.0 s: {'met' if worst <= 1.0 else 'NOT met'} on every run "
          f"(slowest {worst:.3f} s of {len(listed)})")


if __name__ == "__main__":
    main()
