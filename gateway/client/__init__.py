"""A small SEP-2694 consumer over Streamable HTTP: `GatewayClient` opens task event streams, resumes
them after a seq, and follows a task to its end across dropped connections (`follow`).

Used by `mcp-task-gateway tail` (`tail.py`), `call`, `tasks` and `tools` (`commands.py`, with the
progress display `progress.py` and the answers to elicitation `elicit.py`) and `demo` (`demo.py`);
usable by any asyncio program.
The client (`stream.py`) speaks to any MCP endpoint that serves `tasks/stream`, in either era. This
package and `gateway.conformance` import nothing of the gateway but `gateway.protocol` (the era, shapes
and wire names); `demo.py` starts the gateway as a process (`tests/test_client_imports.py` holds it).
"""

from __future__ import annotations

from gateway.client.stream import (
    EndpointNotFound,
    EventsGone,
    GatewayClient,
    GatewayError,
    JsonRpcError,
    StreamDropped,
    StreamGap,
    TransportError,
    recorded_at,
)

__all__ = [
    "EndpointNotFound",
    "EventsGone",
    "GatewayClient",
    "GatewayError",
    "JsonRpcError",
    "StreamDropped",
    "StreamGap",
    "TransportError",
    "recorded_at",
]
