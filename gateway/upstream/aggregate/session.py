"""A 2025-11-25 client session on the aggregate: at most one upstream session per upstream it uses.

Upstream sessions open on first use, each with the client's own handshake replayed (`initialize`,
`notifications/initialized`, and the log level it set); `initialize` asks only the upstreams whose
answer the aggregate has not learnt yet. An upstream that ends its session is dropped alone and opened
again on next use; an idle session parks them all (their stdio processes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.protocol import jsonrpc
from gateway.protocol.era import LATEST_HANDSHAKE_VERSION
from gateway.protocol.jsonrpc import Message, ProtocolError
from gateway.upstream.aggregate.channel import LIST_CHANGED, SERVER_INFO, AggregateChannel, result_of
from gateway.upstream.aggregate.naming import merge_instructions
from gateway.upstream.base import UpstreamChannel

if TYPE_CHECKING:
    from gateway.upstream.aggregate.link import AggregateUpstream

log = logging.getLogger("gateway.upstream.aggregate")


class SessionChannel(AggregateChannel):
    """A 2025-11-25 client session: one upstream session per upstream it uses, opened lazily."""

    def __init__(self, link: AggregateUpstream) -> None:
        super().__init__(link)
        self._children: dict[str, UpstreamChannel] = {}
        self._handshake: Message | None = None
        self._handshake_headers: Mapping[str, str] = {}
        self._initialized: Message | None = None
        self._log_level: Message | None = None
        self._child_results: dict[str, dict[str, Any]] = {}
        """Each opened upstream session's initialize result."""
        self.capabilities: dict[str, Any] = {}
        """What the merged initialize result declared (list_changed announcements follow it)."""
        self._closed = False

    def _opened(self) -> dict[str, UpstreamChannel]:
        return self._children

    async def _open_child(self, upstream: str, headers: Mapping[str, str]) -> UpstreamChannel:
        if self._closed:
            raise ProtocolError(jsonrpc.INTERNAL_ERROR, "upstream session closed")
        if self._handshake is None:
            raise ProtocolError(jsonrpc.INVALID_REQUEST, "Invalid request: the session is not initialized")
        channel = await self._link.served(upstream).open_session()
        channel.set_unsolicited_handler(functools.partial(self._unsolicited, upstream))
        channel.on_loss(functools.partial(self._child_lost, upstream, channel))
        try:
            async with asyncio.timeout(self._link.timeout_s):
                initialize = {**self._handshake, "id": self._own_id("initialize")}
                final = (await (await channel.request(initialize, self._handshake_headers)).collect())[-1]
                if "result" not in final:
                    error = final.get("error")
                    text = error.get("message") if isinstance(error, dict) else None
                    raise ProtocolError(jsonrpc.INTERNAL_ERROR, f"upstream {upstream!r} is unavailable: {text}")
                self._child_results[upstream] = final["result"]
                if self._initialized is not None:
                    await channel.notify(self._initialized, self._handshake_headers)
                if self._log_level is not None:
                    level = {**self._log_level, "id": self._own_id("setLevel")}
                    await (await channel.request(level, self._handshake_headers)).collect()
        except TimeoutError:
            await channel.close()
            raise ProtocolError(jsonrpc.INTERNAL_ERROR, f"upstream {upstream!r} did not answer initialize") from None
        except BaseException:
            await channel.close()
            raise
        return channel

    @property
    def upstream_sessions(self) -> list[str]:
        """The upstreams this session has opened a session of its own with."""
        return list(self._children)

    async def _initialize(self, message: Message, headers: Mapping[str, str]) -> Message:
        """The upstreams' answers merged. Only an upstream whose answer to this protocol version the
        aggregate has not learnt yet is asked now (so gets its session now); the others are asked on
        their first use in this session, by the same handshake."""
        self._handshake, self._handshake_headers = message, dict(headers)
        version = jsonrpc.params_of(message).get("protocolVersion")
        upstreams = self._link.usable_upstreams()
        learnt = self._link.handshakes

        async def one(upstream: str) -> None:
            try:
                await self._child(upstream, headers)
            except ProtocolError as error:
                log.info("upstream %s left out of initialize: %s", upstream, error.message)
                return
            learnt[(upstream, str(version))] = self._child_results[upstream]

        await asyncio.gather(*(one(name) for name in upstreams if (name, str(version)) not in learnt))
        results = {name: learnt[(name, str(version))] for name in upstreams if (name, str(version)) in learnt}
        self.capabilities = self._merged_capabilities(results)
        merged: dict[str, Any] = {
            "protocolVersion": version if isinstance(version, str) else LATEST_HANDSHAKE_VERSION,
            "capabilities": self.capabilities,
            "serverInfo": SERVER_INFO,
        }
        instructions = merge_instructions([(name, result.get("instructions")) for name, result in results.items()])
        if instructions is not None:
            merged["instructions"] = instructions
        return result_of(message, merged)

    async def _discover(self, message: Message, headers: Mapping[str, str]) -> Message:
        raise ProtocolError(jsonrpc.METHOD_NOT_FOUND, "Method not found: server/discover")

    async def _set_level(self, message: Message, headers: Mapping[str, str]) -> None:
        self._log_level = message
        await self._fan_out("logging/setLevel", message, headers, list(self._children))

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        if message.get("method") == "notifications/initialized":
            self._initialized = message
        await super().notify(message, headers)

    async def _unsolicited(self, upstream: str, message: Message, size: int) -> None:
        message = await self.tapped(None, self._up(upstream, None, message))
        if self._handler is not None:
            await self._handler(message, size)

    async def announce_lists(self) -> None:
        """One `list_changed` for each list the merged capabilities say may change."""
        for key, method in LIST_CHANGED.items():
            declared = self.capabilities.get(key)
            if key == "tools" or (isinstance(declared, dict) and declared.get("listChanged")):
                notification = await self.tapped(None, {"jsonrpc": "2.0", "method": method})
                if self._handler is not None:
                    await self._handler(notification, 0)

    async def park(self) -> bool:
        """An idle session gives back what its upstream sessions hold (their stdio processes)."""
        if self._relays:
            return False
        parked = [await child.park() for child in list(self._children.values())]
        return any(parked)

    async def resume(self) -> None:
        for child in list(self._children.values()):
            await child.resume()

    async def _child_lost(self, upstream: str, channel: UpstreamChannel, cause: str) -> None:
        """One upstream ended its session: only that one is dropped (opened again on next use)."""
        if self._children.get(upstream) is channel:
            log.info("upstream %s ended its session of an aggregate session: %s", upstream, cause)
            self.drop_child(upstream)

    def drop_child(self, upstream: str) -> None:
        """Forget (and close) the session on `upstream`, if one is open: the next use opens another.
        For an upstream found unusable: a server that restarted has forgotten its sessions, and not
        every server answers 404 for one it forgot (server-everything answers 400)."""
        channel = self._children.pop(upstream, None)
        if channel is not None:
            self._link.own(asyncio.create_task(channel.close()))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._link.forget(self)
        await self._cancel_relays()
        children, self._children = list(self._children.values()), {}
        await asyncio.gather(*(child.close() for child in children), return_exceptions=True)
