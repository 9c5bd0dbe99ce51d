"""The wire names (`_meta` keys, HTTP headers) the gateway writes and its client reads, defined once so
the client (`gateway.client`, `gateway.conformance`) needs nothing from the server side. Plain constants.
"""

from __future__ import annotations

RELATED_TASK_KEY = "io.modelcontextprotocol/related-task"
"""`_meta` key naming the task a message belongs to (`{"taskId": ...}`)."""
RECORDED_AT_KEY = "io.github.mcp-task-gateway/recordedAt"
"""`_meta` key of every task event the gateway serves: when the event was recorded (UTC ISO 8601, milliseconds)."""
SESSION_HEADER = "Mcp-Session-Id"
"""The HTTP header of a 2025-11-25 session (Streamable HTTP), both towards the client and the upstream."""
