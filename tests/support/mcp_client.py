"""Calling the MCP server's tools in-process (the official SDK's client over its in-memory transport)."""

from __future__ import annotations

from typing import Any

import anyio
from mcp import Client

from automodel_dist.mcp_server import create_server


def run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


def call(tool: str, args: dict, **kw: Any) -> Any:
    async def go() -> Any:
        async with Client(create_server()) as c:
            return await c.call_tool(tool, args, **kw)

    return run(go)
