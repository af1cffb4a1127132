"""MCP server start-up: spawn -> initialize -> tools/list answered, vs a bare ``python -c "import torch"``.

Speaks raw JSON-RPC over the server's stdio (no client library in the measured path). Also times
``import mcp.server.mcpserver`` alone (the SDK's own import floor) and a first ``validate_config``
call. Goal: tools/list within 1.0 s of spawn.

Run: python bench/bench_mcp.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


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
        if msg.get("id") == msg_id:
            return msg


def server_start() -> tuple[float, float, int]:
    """Seconds from spawn to the tools/list reply, then to a validate_config reply; tool count."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "automodel_dist.mcp_server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    try:
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
        _reply(proc, 1)
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = _reply(proc, 2)["result"]["tools"]
        listed = time.perf_counter() - t0
        _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "validate_config", "arguments": {"config_yaml": "tp_size: 2\n", "world_size": 8}}})
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
    python_c("import torch")  # warm the page cache for both sides
    server_start()
    starts, torch_s, sdk_s, bare_s = [], [], [], []
    for _ in range(args.repeat):  # interleaved, so machine load hits every series alike
        starts.append(server_start())
        torch_s.append(python_c("import torch"))
        sdk_s.append(python_c("import mcp.server.mcpserver"))
        bare_s.append(python_c("pass"))
    listed = [s[0] for s in starts]
    called = [s[1] for s in starts]
    med, low = statistics.median, min
    print(f"{args.repeat} runs each (interleaved), {starts[0][2]} tools; seconds")
    print(f"{'what':<46} {'median':>7} {'min':>7}")
    for label, xs in (("server spawn -> tools/list reply", listed),
                      ("server spawn -> first validate_config reply", called),
                      ('python -c "import torch" (baseline)', torch_s),
                      ('python -c "import mcp.server.mcpserver" (SDK)', sdk_s), ("python -c pass", bare_s)):
        print(f"{label:<46} {med(xs):7.3f} {low(xs):7.3f}")
    print(f"ratio tools/list / import torch: {med(listed) / med(torch_s):.2f}x (median), "
          f"{low(listed) / low(torch_s):.2f}x (min)")
    print(f"above the SDK's own import: {med(listed) - med(sdk_s):+.2f} s (median), {low(listed) - low(sdk_s):+.2f} s (min)")
    print(f"goal tools/list <= 1.0 s: {'met' if med(listed) <= 1.0 else 'NOT met'} at the median "
          f"({med(listed):.2f} s), {'met' if low(listed) <= 1.0 else 'NOT met'} at the best run ({low(listed):.2f} s)")

if __name__ == "__main__":
    main()
