"""An MCP server on stdio whose tool floods its caller with large progress messages (slow-reader tests).

Tools: `flood(count, min_bytes, max_bytes, delay, marker)` sends `count` progress notifications whose
`message` is min_bytes … max_bytes long (cycling through three sizes), `delay` seconds apart, and
appends `started`, then `finished` or `cancelled` to the file `marker`, one flushed line each, so a
test can tell from outside whether the call ran on or was cancelled; `echo(text)`.
"""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("flood", version="0.1.0")


def _mark(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
        file.flush()


@mcp.tool()
async def echo(text: str) -> str:
    return text


@mcp.tool()
async def flood(ctx: Context, count: int, min_bytes: int, max_bytes: int, delay: float = 0.0, marker: str = "") -> str:
    sizes = [min_bytes, (min_bytes + max_bytes) // 2, max_bytes]
    texts = [("x" * size) for size in sizes]
    if marker:
        _mark(marker, "started")
    try:
        for i in range(count):
            await ctx.report_progress(i + 1, count, texts[i % 3])
            if delay:
                await anyio.sleep(delay)
    except anyio.get_cancelled_exc_class():
        if marker:
            _mark(marker, "cancelled")
        raise
    if marker:
        _mark(marker, "finished")
    return f"sent {count}"


if __name__ == "__main__":
    mcp.run()
