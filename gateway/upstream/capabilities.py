"""What a 2026-07-28 upstream declares about itself (its `server/discover` result), learned once.

The gateway asks with its own `server/discover` the first time a request needs to know, once however
many requests arrive before the answer, and re-learns from every `server/discover` a client forwards.
An upstream that cannot be asked (no process starts, no HTTP answer) is asked again by the next request.
A legacy session learns the same `Capabilities` from its upstream's `initialize` result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.protocol.dialect import MODERN, Dialect

if TYPE_CHECKING:
    from gateway.upstream.base import UpstreamChannel

log = logging.getLogger("gateway.upstream")

DISCOVER_ID = "mcp-task-gateway-discover"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The upstream's capabilities as far as the gateway cares."""

    tasks: bool
    """Declares Tasks (the 2026-07-28 tasks extension, SEP-2663; the 2025-11-25 `tasks` capability,
    SEP-1686): it hosts tasks, the gateway passes them through."""
    event_streams: bool = False
    """Its tasks capability has `eventStreams`: it serves `tasks/stream` itself (SEP-2694 native), and the
    gateway forwards the streams of its tasks."""

    @classmethod
    def of(cls, result: Mapping[str, Any], dialect: Dialect = MODERN) -> Capabilities:
        """What a `server/discover` result declares (or, in the LEGACY dialect, an `initialize` result)."""
        return cls(dialect.declared_tasks(result) is not None, dialect.declares_event_streams(result))


NOT_KNOWN = Capabilities(tasks=False)
"""What the gateway assumes while the upstream cannot be asked."""


class Discovery:
    """The cached answer to "what does the upstream declare?" for one upstream."""

    def __init__(self, stateless: Callable[[], AbstractAsyncContextManager[UpstreamChannel]]) -> None:
        self._stateless = stateless
        self._known: Capabilities | None = None
        self._lock = asyncio.Lock()

    async def get(self, timeout_s: float) -> Capabilities:
        if self._known is not None:
            return self._known
        async with self._lock:  # one probe, however many requests arrive before it answers
            if self._known is None:
                learned = await self._probe(timeout_s)
                if learned is None:  # the upstream is not usable (yet): learn once it is
                    return NOT_KNOWN
                self._known = learned
        return self._known

    def learn(self, discover_result: dict[str, Any]) -> None:
        """A `server/discover` result the upstream gave a client."""
        self._known = Capabilities.of(discover_result)

    async def _probe(self, timeout_s: float) -> Capabilities | None:
        """Ask the upstream with the gateway's own server/discover; None when it could not be asked."""
        probe, probe_headers = MODERN.gateway_request(DISCOVER_ID, "server/discover", {})
        async with self._stateless() as channel:
            exchange = await channel.request(probe, probe_headers)
            try:
                async with asyncio.timeout(timeout_s):
                    final = (await exchange.collect())[-1]
            except TimeoutError:
                await exchange.cancel()
                log.warning("the upstream did not answer server/discover; assuming it has no tasks")
                return NOT_KNOWN
        if exchange.failure is not None:
            return None
        result = final.get("result")
        # An upstream that cannot answer discover has no 2026 tasks either; a later discover re-learns.
        return Capabilities.of(result) if isinstance(result, dict) else NOT_KNOWN
