"""What a 2025-11-25 upstream with Tasks says of each of its tools: the `execution.taskSupport` marks of
its tools/list, kept per session (a 2025-11-25 list may differ per connection).

Learned from every tools/list a client forwards on the session, and asked for with the gateway's own
tools/list (every page) when a call needs the mark of a tool not seen yet: a tool may appear later (a
server that registers it after `notifications/initialized`), so a miss asks again. What the marks mean
for who hosts the tool's tasks is `gateway.tasks.policy.who_hosts`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LEGACY
from gateway.tasks.policy import UpstreamSupport, listed_support
from gateway.upstream.base import UpstreamChannel

log = logging.getLogger("gateway.tasks.tool_marks")

LIST_ID_PREFIX = "mcp-task-gateway-tools-"
"""The ids of the gateway's own tools/list requests."""
ASK_TIMEOUT_S = 10.0
"""How long the gateway's own tools/list may take, all pages together."""
MAX_PAGES = 100
"""Pages of one tools/list the gateway follows; a longer list's later tools stay unknown (pass-through)."""

_list_ids = itertools.count(1)


class ToolMarks:
    """One session's marks: tool name -> what the upstream's tools/list says of its tasks."""

    def __init__(self) -> None:
        self._marks: dict[str, UpstreamSupport] = {}

    def learn(self, result: Mapping[str, Any]) -> None:
        """A tools/list result (one page) the upstream gave."""
        tools = result.get("tools")
        for tool in tools if isinstance(tools, list) else ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._marks[tool["name"]] = listed_support(tool)

    def of(self, tool: str) -> UpstreamSupport | None:
        """The tool's mark; None: not listed yet."""
        return self._marks.get(tool)

    async def ask(self, channel: UpstreamChannel, headers: Mapping[str, str], timeout_s: float) -> None:
        """Learn the upstream's whole tools/list on `channel`, within `timeout_s`; an error or no answer
        leaves the marks as they were (the tools it would have shown stay unknown)."""
        cursor: object = None
        try:
            async with asyncio.timeout(timeout_s):
                for _ in range(MAX_PAGES):
                    params = {} if cursor is None else {"cursor": cursor}
                    message, extra = LEGACY.gateway_request(f"{LIST_ID_PREFIX}{next(_list_ids)}", "tools/list", params)
                    exchange = await channel.request(message, {**headers, **extra})
                    try:
                        answer = await exchange.collect()
                    except asyncio.CancelledError:
                        await exchange.cancel()
                        raise
                    result = answer[-1].get("result") if answer and jsonrpc.is_final(answer[-1]) else None
                    if not isinstance(result, dict):
                        log.info("the upstream gave no tools/list: its tools' task marks stay unknown")
                        return
                    self.learn(result)
                    cursor = result.get("nextCursor")
                    if not isinstance(cursor, str):
                        return
        except TimeoutError:
            log.warning("the upstream did not answer tools/list within %g s", timeout_s)
