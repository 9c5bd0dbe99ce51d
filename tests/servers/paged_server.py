"""A real MCP server (official ``mcp`` SDK, low-level ``Server``) whose tools list comes in pages, as an
upstream for the aggregate's pagination tests.

Usage::

    python tests/servers/paged_server.py [--tools N] [--page-size K]

stdio. Tools ``tool-000`` … (``N``, default 25), listed ``K`` a page (default 10) with the cursor the
index of the next tool as text; each echoes its ``text`` argument. A cursor it did not give is -32602.
"""

from __future__ import annotations

import argparse

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError


def build(count: int, page_size: int) -> Server:
    tools = [
        types.Tool(
            name=f"tool-{index:03d}",
            description=f"echo number {index}",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        )
        for index in range(count)
    ]

    async def list_tools(ctx: object, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        if cursor is not None and not (cursor.isdigit() and int(cursor) < count):
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown cursor {cursor!r}")
        start = int(cursor) if cursor is not None else 0
        end = start + page_size
        return types.ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < count else None)

    async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name}: {text}")])

    return Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def main(count: int, page_size: int) -> None:
    server = build(count, page_size)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=25)
    parser.add_argument("--page-size", type=int, default=10)
    args = parser.parse_args()
    anyio.run(main, args.tools, args.page_size)
