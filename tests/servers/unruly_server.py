"""A real MCP server (official ``mcp`` SDK) that misbehaves in the ways the gateway must bound, as an upstream
for its deadline and line-limit tests.

Usage::

    python tests/servers/unruly_server.py [--http PORT] [--start-delay SECONDS]

stdio without ``--http``; otherwise Streamable HTTP on ``http://127.0.0.1:PORT/mcp`` (SDK defaults).
``--start-delay`` makes it read nothing for that long after it starts: a cold start on a loaded host.

Tools:

* ``never_answers(marker)``: appends ``started`` to the file ``marker``, then never answers; when the request is
  cancelled (a ``notifications/cancelled``, or a dropped 2026-07-28 POST) it appends ``cancelled``;
* ``oversized(size)``: answers with a text of ``size`` bytes (a response line longer than that);
* ``large(size)``: answers with a text of ``size`` bytes that no two offsets share (``patterned(size)``), to
  show it arrives intact;
* ``oversized_log(size)``: sends an ``info`` log whose data is ``size`` bytes, then answers ``logged``;
* ``hold(key, marker="")``: appends ``holding <key>`` to ``marker`` (if given), and answers ``released <key>`` once
  ``release(key)`` was called (in the same process);
* ``release(key)``, ``echo(text)``, ``pid()`` (the process id, as text).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("unruly-server", version="0.1.0", log_level="WARNING")

_released: defaultdict[str, anyio.Event] = defaultdict(anyio.Event)


def _mark(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@mcp.tool()
async def never_answers(marker: str) -> str:
    """Start, then never answer."""
    _mark(marker, "started")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _mark(marker, "cancelled")
        raise
    return "unreachable"


@mcp.tool()
async def oversized(size: int) -> str:
    """A text of `size` bytes."""
    return "x" * size


def patterned(size: int) -> str:
    """`size` characters: the decimal offsets 0, 8, 16, ... each padded to 8 digits, so a piece lost,
    doubled or moved changes the text."""
    return "".join(f"{offset:08d}" for offset in range(0, size, 8))[:size]


@mcp.tool(structured_output=False)
async def large(size: int) -> str:
    """The `patterned` text of `size` bytes."""
    return patterned(size)


@mcp.tool()
async def oversized_log(ctx: Context[Any, Any], size: int) -> str:
    """Send a log message of `size` bytes, then answer."""
    await ctx.info("y" * size)
    return "logged"


@mcp.tool()
async def hold(key: str, marker: str = "") -> str:
    """Answer once `release(key)` is called."""
    if marker:
        _mark(marker, f"holding {key}")
    await _released[key].wait()
    return f"released {key}"


@mcp.tool()
async def release(key: str) -> str:
    _released[key].set()
    return f"releasing {key}"


@mcp.tool()
async def echo(text: str) -> str:
    return text


@mcp.tool()
async def pid() -> str:
    return str(os.getpid())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on this port")
    parser.add_argument("--start-delay", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    time.sleep(args.start_delay)
    if args.http:
        mcp.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        mcp.run("stdio")


if __name__ == "__main__":
    main()
