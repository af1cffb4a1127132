"""``automodel-dist-mcp``: the MCP server's entry point, answering the stdio handshake at once.

The official SDK's own import takes most of a second, and more on a busy machine. On stdio this
process therefore starts the real server (:mod:`automodel_dist.mcp_server`, the SDK's
``MCPServer``) as a child at once and relays lines both ways; while the child imports, it answers
``initialize`` / ``server/discover`` and the list requests clients send at connect (``tools/list``,
``prompts/list``, ``resources/list``, ``resources/templates/list``) itself from
:mod:`automodel_dist.mcp_snapshot`, the answers recorded from that same server. The child still
receives the client's handshake (its replies are compared with the recording and dropped), every
other message goes to it unchanged, and after the first answer the relay asks the child for each
recorded list: one that differs is dropped from the recording, the client gets the matching
``notifications/<kind>/list_changed``, and the child answers that list from then on. Only stdlib
is imported here.

The recording is used only when the installed ``mcp``, ``mcp-types``, ``pydantic`` and
``pydantic-core`` versions are the ones it was made with, the client's first request is
``initialize`` at a recorded version or carries a recorded version in its 2026-07-28 ``_meta``
envelope, and neither ``--no-fast-start`` nor ``AUTOMODEL_DIST_MCP_FAST_START=0`` is given;
otherwise the SDK server runs in this process as before. HTTP never uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .mcp_snapshot import ENVELOPE_VERSION, listed, load

FAST_START_ENV = "AUTOMODEL_DIST_MCP_FAST_START"
VERIFY_ID = "automodel-dist/fast-start/check"
_HANDLED = (b"initialize", b"server/discover", b"/list")  # methods the relay may answer (+ initialized)
_CHANGED = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources",
            "resources/templates/list": "resources"}  # notifications/<x>/list_changed when a recording is stale
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from automodel_dist.mcp_server import main; sys.exit(main(sys.argv[2:]))"


def add_serve_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--allowed-host", action="append", default=[], help="extra Host header allowed over HTTP")
    ap.add_argument("--allow-root", action="append", default=[],
                    help="only read config_path files under these directories (repeatable)")
    ap.add_argument("--no-fast-start", action="store_true",
                    help=f"stdio: import the SDK before answering the handshake (also {FAST_START_ENV}=0)")


def fast_start_wanted(args: argparse.Namespace) -> bool:
    return (args.transport == "stdio" and not getattr(args, "no_fast_start", False)
            and os.environ.get(FAST_START_ENV, "1").strip().lower() not in ("0", "false", "no", "off"))


def run(args: argparse.Namespace) -> int:
    """Serve as ``args`` say: the relay on stdio when a usable recording exists, else the SDK server here."""
    if fast_start_wanted(args):
        snap, why_not = load()
        if snap is None:
            _warn(f"fast start off ({why_not}); the SDK answers the handshake after its import")
        else:
            child_args = ["--transport", "stdio"] + [f"--allow-root={r}" for r in args.allow_root]
            return Relay(snap, child_args).run()
    from .mcp_server import serve

    serve("stdio" if args.transport == "stdio" else "http", host=args.host, port=args.port,
          allowed_hosts=args.allowed_host, allowed_roots=args.allow_root)
    return 0


def _key(msg_id: object) -> str:
    return json.dumps(msg_id)  # 1 and "1" are different JSON-RPC ids


def _warn(text: str) -> None:
    sys.stderr.write(f"automodel-dist-mcp: {text}\n")
    sys.stderr.flush()


class Relay:
    """Answers the handshake from the recording and relays everything else to the real server."""

    def __init__(self, snap: dict, server_args: list[str]):
        self.snap = snap
        self.server_args = server_args
        self.child: subprocess.Popen[bytes] | None = None
        self.out_lock = threading.Lock()
        self.swallow: dict[str, str] = {}  # ids whose replies from the child are checked, not relayed
        self.swallow_lock = threading.Lock()
        self.decided = False  # the client's first request has been seen
        self.era: str | None = None  # "legacy" (initialize handshake) or "modern" (per-request envelope)
        self.version: str | None = None
        self.init: dict | None = None  # recorded answers, each served while it is trusted (init: once)
        self.discover: dict | None = None
        self.lists: dict[str, dict] = {}  # list method -> recorded result
        self.verify_sent = False

    # -- process --------------------------------------------------------------------------------
    def run(self) -> int:
        package_parent = str(Path(__file__).resolve().parents[1])
        self.child = subprocess.Popen([sys.executable, "-c", _CHILD, package_parent, *self.server_args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=dict(os.environ, **{FAST_START_ENV: "0"}))
        previous = {}
        for name in ("SIGTERM", "SIGINT", "SIGHUP"):
            if hasattr(signal, name):
                sig = getattr(signal, name)
                previous[sig] = signal.signal(sig, self._forward_signal)
        threading.Thread(target=self._from_client, name="client->server", daemon=True).start()
        try:
            self._from_server()
            rc = self.child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.child.poll() is None:
                self.child.terminate()
                try:
                    self.child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.child.kill()
                    self.child.wait()
        return 128 - rc if rc < 0 else rc

    def _forward_signal(self, signum: int, frame: object) -> None:
        if self.child is not None and self.child.poll() is None:
            try:
                self.child.send_signal(signum)
            except ProcessLookupError:
                pass

    # -- wire -----------------------------------------------------------------------------------
    def _to_client(self, data: bytes) -> None:
        with self.out_lock:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, ValueError, OSError):
                self._forward_signal(signal.SIGTERM, None)  # the client is gone

    def _reply(self, msg_id: object, result: dict) -> None:
        msg = {"jsonrpc": "2.0", "id": msg_id, "result": result}
        self._to_client(json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n")

    def _to_server(self, data: bytes) -> None:
        assert self.child is not None and self.child.stdin is not None
        try:
            self.child.stdin.write(data)
            self.child.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the server exited; _from_server sees its stdout close

    def _expect(self, msg_id: object, what: str) -> None:
        with self.swallow_lock:
            self.swallow[_key(msg_id)] = what

    # -- client -> server -------------------------------------------------------------------------
    def _from_client(self) -> None:
        try:
            for line in iter(sys.stdin.buffer.readline, b""):
                if not self._answered(line):
                    self._to_server(line)
        except (OSError, ValueError):
            pass
        finally:
            assert self.child is not None and self.child.stdin is not None
            try:
                self.child.stdin.close()  # EOF: the server shuts down as it would on its own stdin
            except OSError:
                pass

    def _answered(self, line: bytes) -> bool:
        """Handle ``line`` here (answer it, and forward it if the server must see it); False: forward it."""
        if self.decided and (self.era is None or not any(m in line for m in _HANDLED)):
            return False  # plain relay, and no JSON parsing of tool calls (config_yaml may be 1 MiB)
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        if not isinstance(msg, dict):
            return False  # a batch or garbage: the server answers
        method, has_id = msg.get("method"), "id" in msg
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        if not self.decided:
            if not isinstance(method, str) or not has_id:
                return False  # notifications before the first request
            self.decided = True
            self._open(method, params)
            if self.era is None:
                return False
        if self.era == "legacy":
            if method == "initialize" and has_id and self.init is not None:
                init, self.init = self.init, None  # answered once; a second one is the SDK's to refuse
                self._expect(msg["id"], "initialize")
                self._reply(msg["id"], init)
                self._to_server(line)  # the server sees the client's own handshake; its reply is checked
                return True
            if method == "notifications/initialized" and not has_id and not self.verify_sent:
                self._to_server(line)
                self._verify(None)
                return True
        else:  # modern: every request carries its version; answer only the recorded one
            meta = params.get("_meta")
            if not isinstance(meta, dict) or meta.get(ENVELOPE_VERSION) != self.version:
                return False
            if not self.verify_sent:
                self._verify({"_meta": meta})
            if method == "server/discover" and has_id and self.discover is not None:
                self._expect(msg["id"], "server/discover")
                self._reply(msg["id"], self.discover)
                self._to_server(line)
                return True
        recorded = self.lists.get(method) if isinstance(method, str) else None  # .get: the server thread may drop it
        if recorded is not None and has_id and params.get("cursor") is None:
            self._reply(msg["id"], recorded)
            return True
        return False

    def _open(self, method: str, params: dict) -> None:
        """Pick the era from the client's first request, as the SDK does (it stays None if nothing is recorded)."""
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        if method == "initialize":
            version = params.get("protocolVersion")
            init = self.snap["initialize"].get(version) if isinstance(version, str) else None
            if isinstance(init, dict):
                self.era, self.version, self.init = "legacy", version, init
        elif isinstance(meta.get(ENVELOPE_VERSION), str) and meta[ENVELOPE_VERSION] in self.snap["discover"]:
            self.era, self.version = "modern", meta[ENVELOPE_VERSION]
            self.discover = self.snap["discover"][self.version]
        if self.era is not None:
            self.lists = listed(self.snap, self.version)

    def _verify(self, params: dict | None) -> None:
        """Ask the server once for each recorded list (its replies are compared, not relayed)."""
        self.verify_sent = True
        for method in list(self.lists):
            msg: dict = {"jsonrpc": "2.0", "id": f"{VERIFY_ID}:{method}", "method": method}
            if params is not None:
                msg["params"] = params
            self._expect(msg["id"], method)
            self._to_server(json.dumps(msg).encode() + b"\n")

    # -- server -> client -------------------------------------------------------------------------
    def _from_server(self) -> None:
        assert self.child is not None and self.child.stdout is not None
        for line in iter(self.child.stdout.readline, b""):
            if self.swallow and self._checked(line):
                continue
            self._to_client(line)

    def _checked(self, line: bytes) -> bool:
        """True for the server's reply to a message this relay answered or sent (it is not relayed)."""
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        if not isinstance(msg, dict) or "method" in msg or "id" not in msg:
            return False
        with self.swallow_lock:
            what = self.swallow.pop(_key(msg["id"]), None)
        if what == "initialize" and msg.get("result") != self.snap["initialize"].get(self.version):
            _warn("the recorded initialize answer differs from the server's; regenerate it with "
                  "`python -m automodel_dist.mcp_snapshot --write`")
        elif what == "server/discover" and msg.get("result") != self.discover:
            self.discover = None  # from now on the server answers server/discover itself
            _warn("the recorded server/discover answer differs from the server's; regenerate it with "
                  "`python -m automodel_dist.mcp_snapshot --write`")
        elif what in self.lists and msg.get("result") != self.lists[what]:
            del self.lists[what]  # from now on the server answers it itself
            kind = _CHANGED.get(what, "tools")
            _warn(f"the recorded {what} answer differs from the server's; sent notifications/{kind}/list_changed "
                  "(regenerate it with `python -m automodel_dist.mcp_snapshot --write`)")
            self._to_client(json.dumps({"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"}).encode()
                            + b"\n")
        return what is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="automodel-dist-mcp", description="MCP server for NeMo AutoModel configs")
    add_serve_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
