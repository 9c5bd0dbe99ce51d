"""A 2026-07-28 request on the aggregate (the upstreams' stateless channels it needs, for its
lifetime), and the readiness probe's conversation, which the aggregate answers itself.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.protocol import jsonrpc
from gateway.protocol.era import LATEST_HANDSHAKE_VERSION
from gateway.protocol.jsonrpc import Message
from gateway.upstream.aggregate.channel import SERVER_INFO, AggregateChannel, result_of
from gateway.upstream.base import Exchange, UnsolicitedHandler, UpstreamChannel

if TYPE_CHECKING:
    from gateway.upstream.aggregate.link import AggregateUpstream


class RequestChannel(AggregateChannel):
    """One 2026-07-28 request: the upstreams' stateless channels it needs, left when it ends."""

    def __init__(
        self,
        link: AggregateUpstream,
        affinity: tuple[str, str] | None,
        beside: bool,
        owner: str | None,
    ) -> None:
        super().__init__(link)
        self._affinity = affinity
        self._beside = beside
        self._owner = owner
        self._children: dict[str, UpstreamChannel] = {}
        self._stack = contextlib.AsyncExitStack()

    @functools.cached_property
    def tag(self) -> str:
        # One tag for every 2026-07-28 request, as the one shared channel of an HTTP upstream has: the
        # task ids clients see (`tag.upstream__id`) must read the same on the next request's channel.
        return self._link.modern_tag

    def _opened(self) -> dict[str, UpstreamChannel]:
        return self._children

    async def _open_child(self, upstream: str, headers: Mapping[str, str]) -> UpstreamChannel:
        affinity = self._affinity[1] if self._affinity is not None and self._affinity[0] == upstream else None
        stateless = self._link.served(upstream).stateless(affinity, beside=self._beside, owner=self._owner)
        return await self._stack.enter_async_context(stateless)

    async def close(self) -> None:
        await self._cancel_relays()
        await self._stack.aclose()


class ProbeChannel(UpstreamChannel):
    """The readiness probe's conversation: the aggregate answers it (its upstreams are probed apart)."""

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        exchange = Exchange(message["id"], message["method"])
        params = jsonrpc.params_of(message)
        if message["method"] == "initialize":
            version = params.get("protocolVersion")
            result = {
                "protocolVersion": version if isinstance(version, str) else LATEST_HANDSHAKE_VERSION,
                "capabilities": {},
                "serverInfo": SERVER_INFO,
            }
            await exchange.deliver(result_of(message, result))
        elif message["method"] == "ping":
            await exchange.deliver(result_of(message, {}))
        else:
            exchange.fail(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {message['method']}")
        return exchange

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        return None

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        return None

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        return None

    async def close(self) -> None:
        return None
