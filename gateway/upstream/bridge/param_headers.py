"""SEP-2243 `Mcp-Param-*` headers, checked by the modern bridge as a 2026-07-28 server must check them.

A 2026-07-28 server compares each `Mcp-Param-{Name}` header of a `tools/call` with the argument its
tool's `inputSchema` annotates `x-mcp-header: "{Name}"`, and refuses a mismatch (or a missing or
malformed header) with -32020 and HTTP 400. A legacy upstream knows nothing of these headers, so the
bridge checks them, with the SDK's own comparison (`mcp.shared.inbound`), against the schemas of the
session's tools: asked once per session (`tools/list`, every page) and asked again after the session
says its tool list changed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp.shared.inbound import validate_mcp_param_headers

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, ProtocolError

MAX_PAGES = 100
"""tools/list pages read at most (a server that pages forever is cut off)."""

Ask = Callable[[str, dict[str, Any]], Awaitable[Message]]
"""Sends one request on the session (method, params) and returns its final message."""


class ToolSchemas:
    """The input schemas of one session's tools, by name, as the upstream lists them."""

    def __init__(self) -> None:
        self._schemas: dict[str, Any] | None = None

    def forget(self) -> None:
        """The tool list changed: ask again before the next check."""
        self._schemas = None

    async def check(self, ask: Ask, message: Message, headers: Mapping[str, str]) -> None:
        """Raise -32020 (HTTP 400) when the `tools/call` in `message` carries `Mcp-Param-*` headers that
        disagree with its arguments as its tool's schema annotates them."""
        params = jsonrpc.params_of(message)
        if self._schemas is None:
            self._schemas = await _list(ask)
        schema = self._schemas.get(str(params.get("name")))
        arguments = params.get("arguments")
        if schema is None:
            return  # an unknown tool: the upstream's own answer says so
        rejection = validate_mcp_param_headers(schema, arguments if isinstance(arguments, dict) else {}, headers)
        if rejection is not None:
            raise ProtocolError(jsonrpc.HEADER_MISMATCH, f"Header mismatch: {rejection.message}", http_status=400)


async def _list(ask: Ask) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    cursor: object = None
    for _ in range(MAX_PAGES):
        final = await ask("tools/list", {} if cursor is None else {"cursor": cursor})
        result = final.get("result")
        if not isinstance(result, dict):
            break  # no list to check against: the calls go on unchecked
        for tool in result.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                schemas[tool["name"]] = tool.get("inputSchema")
        cursor = result.get("nextCursor")
        if not cursor:
            break
    return schemas
