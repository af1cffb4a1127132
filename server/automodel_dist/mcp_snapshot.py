"""The MCP server's handshake answers, recorded from the real server, so stdio can answer at once.

``initialize``, ``server/discover`` and the list results (tools, prompts, resources, resource
templates) depend on nothing but the code, the ``mcp`` SDK and pydantic; the SDK's own import takes most of a second. ``mcp_snapshot.json``
records what the real server (``python -m automodel_dist.mcp_server``) answers at every protocol
version (the ``initialize`` handshake era and the 2026-07-28 per-request-envelope era), with the
versions that produced it. :mod:`automodel_dist.mcp_stdio` serves it only when
the installed versions are the same, and checks it against the real server on every start.

Regenerate after changing a tool: ``python -m automodel_dist.mcp_snapshot --write``
(``--check`` exits 1 when the file is stale).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SNAPSHOT_PATH = Path(__file__).with_name("mcp_snapshot.json")
SNAPSHOT_ENV = "AUTOMODEL_DIST_MCP_SNAPSHOT"  # another snapshot file (tests)
GUARDED = ("mcp", "mcp_types", "pydantic", "pydantic_core")  # distributions whose versions shape the answers
_DIST_INFO = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+?)-(?P<version>[^-]+?)\.dist-info$")


def installed_versions(names: tuple[str, ...] = GUARDED) -> dict[str, str]:
    """Versions of ``names`` from the ``*.dist-info`` folders on ``sys.path`` (no import, no metadata scan)."""
    wanted = {n.replace("-", "_").lower() for n in names}
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            m = _DIST_INFO.match(item)
            if m is None:
                continue
            name = m["name"].replace("-", "_").replace(".", "_").lower()
            if name in wanted and name not in found:  # first on sys.path wins, as for imports
                found[name] = m["version"]
        if len(found) == len(wanted):
            break
    return found


def _own_version() -> str:
    from . import __version__

    return __version__


def load(path: Path | None = None) -> tuple[dict | None, str]:
    """The snapshot and ``""``, or None and why it cannot be used (missing, unreadable, other versions)."""
    path = path or Path(os.environ.get(SNAPSHOT_ENV) or SNAPSHOT_PATH)
    try:
        snap = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"no usable recording at {path}: {exc}"
    if not isinstance(snap, dict) or not all(isinstance(snap.get(k), dict) for k in (
            "initialize", "discover", "lists", "versions")) or not isinstance(snap.get("results"), list):
        return None, f"{path} is not a recording"
    versions = dict(installed_versions(), automodel_dist=_own_version())
    if snap["versions"] != versions:
        diff = ", ".join(f"{k} {snap['versions'].get(k)} (installed {v})" for k, v in sorted(versions.items())
                         if snap["versions"].get(k) != v)
        return None, f"recorded with other versions: {diff}"
    return snap, ""


def _call(proc: subprocess.Popen[str], msg_id: int, method: str, params: dict | None = None) -> dict:
    """One JSON-RPC request over ``proc``'s stdio; its result."""
    msg: dict = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        msg["params"] = params
    proc.stdin.write(json.dumps(msg) + "\n")
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server closed stdout during {method}")
        reply = json.loads(line)
        if reply.get("id") == msg_id:
            if "result" not in reply:
                raise RuntimeError(f"{method} failed: {reply}")
            return reply["result"]


ENVELOPE_VERSION = "io.modelcontextprotocol/protocolVersion"  # the 2026-07-28 per-request _meta envelope


def _spawn() -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "automodel_dist.mcp_server", "--no-fast-start"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, bufsize=1)


LIST_METHODS = ("tools/list", "prompts/list", "resources/list", "resources/templates/list")  # asked at connect


def _handshake(pv: str) -> tuple[dict, dict[str, dict]]:
    """``initialize`` then every list method at a handshake-era version."""
    proc = _spawn()
    try:
        init = _call(proc, 1, "initialize", {"protocolVersion": pv, "capabilities": {},
                                             "clientInfo": {"name": "snapshot", "version": "0"}})
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        return init, {m: _call(proc, i, m) for i, m in enumerate(LIST_METHODS, 2)}
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _discover(pv: str) -> tuple[dict, dict[str, dict]]:
    """``server/discover`` then every list method at a modern (per-request envelope) version."""
    meta = {"_meta": {ENVELOPE_VERSION: pv, "io.modelcontextprotocol/clientInfo": {"name": "snapshot", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}
    proc = _spawn()
    try:
        return _call(proc, 1, "server/discover", meta), {m: _call(proc, i, m, meta) for i, m in enumerate(LIST_METHODS, 2)}
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def generate() -> dict:
    """Record the real server's answers for every protocol version the SDK speaks (both eras)."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    init, discover, lists = {}, {}, {}
    for pv in HANDSHAKE_PROTOCOL_VERSIONS:
        init[pv], lists[pv] = _handshake(pv)
    for pv in MODERN_PROTOCOL_VERSIONS:
        discover[pv], lists[pv] = _discover(pv)
    results: list[dict] = []  # each distinct answer once (most are the same at every version)
    index: dict[str, dict[str, int]] = {m: {} for m in LIST_METHODS}
    for pv, answers in lists.items():
        for method, result in answers.items():
            if result not in results:
                results.append(result)
            index[method][pv] = results.index(result)
    return {"versions": dict(installed_versions(), automodel_dist=_own_version()), "initialize": init,
            "discover": discover, "lists": index, "results": results}


def listed(snap: dict, protocol_version: str) -> dict[str, dict]:
    """The recorded answer of each list method at ``protocol_version``."""
    out = {}
    for method, by_version in snap["lists"].items():
        i = by_version.get(protocol_version) if isinstance(by_version, dict) else None
        if isinstance(i, int) and 0 <= i < len(snap["results"]) and isinstance(snap["results"][i], dict):
            out[method] = snap["results"][i]
    return out


def dumps(snap: dict) -> str:
    return json.dumps(snap, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m automodel_dist.mcp_snapshot", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {SNAPSHOT_PATH.name}")
    ap.add_argument("--check", action="store_true", help="exit 1 when the file differs from the live server")
    args = ap.parse_args(argv)
    text = dumps(generate())
    if args.write:
        SNAPSHOT_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {SNAPSHOT_PATH}")
        return 0
    current = SNAPSHOT_PATH.read_text(encoding="utf-8") if SNAPSHOT_PATH.exists() else ""
    if args.check:
        print("up to date" if current == text else f"{SNAPSHOT_PATH.name} is stale: run with --write")
        return 0 if current == text else 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
