"""The modern bridge's upstream sessions, in process over a scripted legacy link: opened lazily with
the gateway's handshake, shared per (principal, capabilities), bounded (the least recently used idle
one makes room, none idle is 503), closed when idle, dropped when the upstream loses them, and MRTR
held calls that time out cancelled upstream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from gateway.buffers import BufferBudget
from gateway.config.upstream import BridgeConfig
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY
from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import Exchange, UnsolicitedHandler, Upstream, UpstreamBusy, UpstreamChannel
from gateway.upstream.bridge.modern_over_legacy import ModernOverLegacy

pytestmark = pytest.mark.asyncio

WAIT = 5.0
INITIALIZED = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "s", "version": "1"},
}


class ScriptedSession(UpstreamChannel):
    """A legacy session: answers initialize and tools/list at once; a tools/call waits to be answered."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.closed = asyncio.Event()
        self.calls: dict[Any, Exchange] = {}
        self.cancelled: list[tuple[Any, str]] = []
        self.cancel_seen = asyncio.Event()

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        self.sent.append(message)
        exchange = Exchange(message["id"], message["method"])
        if message["method"] == "tools/call":
            self.calls[message["id"]] = exchange

            async def cancel(reason: str) -> None:
                self.cancelled.append((message["id"], reason))
                self.cancel_seen.set()

            exchange.on_cancel(cancel)
            return exchange
        result = INITIALIZED if message["method"] == "initialize" else {"tools": []}
        await exchange.deliver({"jsonrpc": "2.0", "id": message["id"], "result": result})
        return exchange

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        self.sent.append(message)

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        self.sent.append(message)

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        self.unsolicited = handler

    async def close(self) -> None:
        self.closed.set()


class ScriptedLink(Upstream):
    def __init__(self, processes: int = 100) -> None:
        self.sessions: list[ScriptedSession] = []
        self._processes = processes

    async def open_session(self) -> UpstreamChannel:
        if sum(not s.closed.is_set() for s in self.sessions) >= self._processes:
            raise UpstreamBusy("upstream.stdio.max_processes", "full", "later")
        self.sessions.append(ScriptedSession())
        return self.sessions[-1]

    @contextlib.asynccontextmanager
    async def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AsyncIterator[UpstreamChannel]:
        raise AssertionError("the bridge never asks the link for stateless channels")
        yield  # pragma: no cover

    def pin(self, affinity: str, channel: UpstreamChannel) -> None: ...

    def probe_session(self) -> contextlib.AbstractAsyncContextManager[UpstreamChannel]:
        raise AssertionError

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def request(method: str, params: dict[str, Any] | None = None, **capabilities: Any) -> Message:
    meta = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: capabilities}
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**(params or {}), "_meta": meta}}


def bridge(link: ScriptedLink, **config: Any) -> ModernOverLegacy:
    return ModernOverLegacy(link, BridgeConfig(**config), BufferBudget(), open_timeout_s=WAIT)


async def final(exchange: Exchange) -> Message:
    async with asyncio.timeout(WAIT):
        return (await exchange.collect())[-1]


async def test_a_session_is_opened_once_per_owner_and_capabilities_with_the_handshake() -> None:
    link = ScriptedLink()
    carrier = bridge(link)
    try:
        for owner in ("a", "a", "b"):
            answered = await final(await carrier.request(owner, request("tools/list"), {}))
            assert answered["result"]["resultType"] == "complete", answered
        await final(await carrier.request("a", request("tools/list", sampling={}), {}))
        assert len(link.sessions) == 3 and carrier.sessions == 3
        methods = [m["method"] for m in link.sessions[0].sent]
        assert methods == ["initialize", "notifications/initialized", "tools/list", "tools/list"], methods
        assert link.sessions[0].sent[2]["id"] != link.sessions[0].sent[3]["id"]
    finally:
        await carrier.close()
    assert all(session.closed.is_set() for session in link.sessions)


async def test_the_least_recently_used_idle_session_makes_room_and_none_idle_is_busy() -> None:
    link = ScriptedLink()
    carrier = bridge(link, max_sessions=2)
    try:
        await final(await carrier.request("a", request("tools/list"), {}))
        await final(await carrier.request("b", request("tools/list"), {}))
        await final(await carrier.request("c", request("tools/list"), {}))
        assert link.sessions[0].closed.is_set() and not link.sessions[1].closed.is_set()
        busy_b = await carrier.request("b", request("tools/call", {"name": "t"}), {})
        busy_c = await carrier.request("c", request("tools/call", {"name": "t"}), {})
        with pytest.raises(UpstreamBusy) as refused:
            await carrier.request("d", request("tools/list"), {})
        assert refused.value.http_status == 503 and refused.value.limit == "upstream.bridge.max_sessions"
        await busy_b.cancel()
        await busy_c.cancel()
    finally:
        await carrier.close()


async def test_the_links_own_ceiling_is_met_by_closing_an_idle_session() -> None:
    link = ScriptedLink(processes=1)
    carrier = bridge(link)
    try:
        await final(await carrier.request("a", request("tools/list"), {}))
        await final(await carrier.request("b", request("tools/list"), {}))
        assert link.sessions[0].closed.is_set() and carrier.sessions == 1
    finally:
        await carrier.close()


async def test_an_idle_session_is_closed() -> None:
    link = ScriptedLink()
    carrier = bridge(link, session_idle_s=0.05)
    try:
        await final(await carrier.request("a", request("tools/list"), {}))
        async with asyncio.timeout(WAIT):
            await link.sessions[0].closed.wait()
        assert carrier.sessions == 0
    finally:
        await carrier.close()


async def test_a_lost_session_is_replaced_by_the_next_request() -> None:
    link = ScriptedLink()
    carrier = bridge(link)
    try:
        await final(await carrier.request("a", request("tools/list"), {}))
        await link.sessions[0].report_loss("the upstream process exited (code 1)")
        await final(await carrier.request("a", request("tools/list"), {}))
        assert len(link.sessions) == 2 and link.sessions[0].closed.is_set()
        assert link.sessions[1].sent[0]["method"] == "initialize"
    finally:
        await carrier.close()


async def test_a_dropped_call_and_an_unanswered_input_request_are_cancelled_upstream() -> None:
    link = ScriptedLink()
    carrier = bridge(link, input_timeout_s=0.05)
    try:
        dropped = await carrier.request("a", request("tools/call", {"name": "t"}, elicitation={}), {})
        await dropped.cancel("cancelled by the client")
        session = link.sessions[0]
        ((call_id, _),) = session.calls.items()
        assert session.cancelled == [(call_id, "cancelled by the client")]
        session.cancel_seen.clear()

        asking = await carrier.request("a", request("tools/call", {"name": "t"}, elicitation={}), {})
        held_id = list(session.calls)[-1]
        elicit = {"jsonrpc": "2.0", "id": 9, "method": "elicitation/create", "params": {"message": "?"}}
        await session.calls[held_id].deliver(elicit)
        asked = await final(asking)
        assert asked["result"]["resultType"] == "input_required", asked
        async with asyncio.timeout(WAIT):
            await session.cancel_seen.wait()
        assert session.cancelled[1][0] == held_id and "input_timeout_s" in session.cancelled[1][1]
    finally:
        await carrier.close()
