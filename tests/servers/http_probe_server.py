"""A tiny MCP server on Streamable HTTP for the HTTP upstream link's tests.

Usage: python http_probe_server.py PORT

Tools: `echo(text)`; `slow(steps, delay, label)` reporting progress each step and recording how it ended
(read it back with `outcome(label)`); `stream_closer(steps, delay)` closing its SSE stream after step 1
(the client must resume with Last-Event-ID); `announce()` sending `notifications/tools/list_changed`
on the session's GET stream. Built with an in-memory EventStore (retry 300 ms) so legacy streams carry
event ids and priming events like a resumable production server.
"""

from __future__ import annotations

import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage


class MemoryEventStore(EventStore):
    def __init__(self) -> None:
        self._events: list[tuple[StreamId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        self._events.append((stream_id, message))
        return str(len(self._events) - 1)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        if not last_event_id.isdigit() or int(last_event_id) >= len(self._events):
            return None
        stream_id = self._events[int(last_event_id)][0]
        for index in range(int(last_event_id) + 1, len(self._events)):
            event_stream, message = self._events[index]
            if event_stream == stream_id and message is not None:
                await send_callback(EventMessage(message, str(index)))
        return stream_id


mcp = MCPServer("http-probe", version="0.1.0")
outcomes: dict[str, str] = {}


@mcp.tool()
async def echo(text: str) -> str:
    return text


@mcp.tool()
async def slow(steps: int, delay: float, ctx: Context, label: str = "slow") -> str:
    outcomes[label] = "running"
    step = 0
    try:
        for step in range(1, steps + 1):
            await anyio.sleep(delay)
            await ctx.report_progress(step, steps, f"step {step}")
    except anyio.get_cancelled_exc_class():
        outcomes[label] = f"cancelled at step {step}"
        raise
    outcomes[label] = "finished"
    return f"done {steps} steps"


@mcp.tool()
async def outcome(label: str) -> str:
    return outcomes.get(label, "unknown")


@mcp.tool()
async def stream_closer(steps: int, delay: float, ctx: Context) -> str:
    for step in range(1, steps + 1):
        await anyio.sleep(delay)
        await ctx.report_progress(step, steps, f"step {step}")
        if step == 1:
            await ctx.close_sse_stream()
    return f"survived {steps} steps"


@mcp.tool()
async def announce(ctx: Context) -> str:
    await ctx.session.send_tool_list_changed()
    return "announced"


if __name__ == "__main__":
    mcp.run(
        "streamable-http", host="127.0.0.1", port=int(sys.argv[1]), event_store=MemoryEventStore(), retry_interval=300
    )
