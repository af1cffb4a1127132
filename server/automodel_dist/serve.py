"""Start the MCP server: ``automodel-dist serve`` and ``automodel-dist-mcp`` (``python -m automodel_dist.serve``).

Imports nothing heavy itself: the SDK and the tools load in :func:`run`, which builds the server before the transport
starts, so an install that cannot import the SDK or build the tools exits 1 with the reason on stderr before a
client sees any handshake.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_FAIL = 0, 1


def add_serve_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--allowed-host", action="append", default=[], help="extra Host header allowed over HTTP")
    ap.add_argument(
        "--allow-root",
        action="append",
        default=[],
        help="only read config_path files under these directories (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from .mcp_server import create_server, serve

        server = create_server()
    except Exception as exc:  # noqa: BLE001 - any import or build failure means the server cannot start
        print(
            f"automodel-dist: error: the MCP server cannot start: {type(exc).__name__}: {exc}\n"
            "  it needs the `mcp` SDK (>=2,<3) and pydantic>=2: reinstall with `pip install automodel-dist` "
            "(or `pip install -e .` in a checkout)",
            file=sys.stderr,
        )
        return EXIT_FAIL
    serve(
        "stdio" if args.transport == "stdio" else "http",
        host=args.host,
        port=args.port,
        allowed_hosts=args.allowed_host,
        allowed_roots=args.allow_root,
        server=server,
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``automodel-dist-mcp``: the MCP server, as ``automodel-dist serve``."""
    ap = argparse.ArgumentParser(prog="automodel-dist-mcp", description="MCP server for NeMo AutoModel configs")
    add_serve_arguments(ap)
    return run(ap.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
