"""A tiny MCP server on stdio whose tool returns a result of any size, for the gateway's result-bound tests.

Usage: python large_result_server.py

Tool: `blob(size, delay=0)` waits `delay` seconds, then returns one text block of `size` characters
(no structured content, so the result's JSON is `size` plus a few dozen bytes).
"""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("large-result-server", log_level="WARNING")


@mcp.tool(structured_output=False)
async def blob(size: int, delay: float = 0.0) -> str:
    """Return `size` characters of text after `delay` seconds."""
    await anyio.sleep(delay)
    return "x" * size


if __name__ == "__main__":
    mcp.run("stdio")
