"""The legacy upstream sessions the modern bridge holds for 2026-07-28 clients.

One session per (principal, declared client capabilities as canonical JSON), opened on first use with
the link's `open_session()` and the gateway's own handshake (`initialize` with the client's legacy
capabilities, `notifications/initialized`, and `logging/setLevel debug` where the upstream declares
logging: 2026 asks for logs per request, and the bridge filters them per request). A session is shared
by its key's requests; it is closed after `session_idle_s` without one (a background task the pool
owns), dropped when the upstream loses it (the next request opens a new one), and the least recently
used idle one makes room at `max_sessions`; with none idle a new key gets `UpstreamBusy` (503).

What arrives on a session outside any request goes to `BridgeSession.unsolicited`: a server request or
log line that the link could not attribute (a stdio process with several requests in flight) goes to
the one call in flight that can take it, else it is answered (ping) or refused; list changes and
resource updates go to the session's `subscriptions/listen` streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from gateway.config.upstream import BridgeConfig
from gateway.protocol import jsonrpc
from gateway.protocol.era import LATEST_HANDSHAKE_VERSION
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.upstream.base import Exchange, Upstream, UpstreamBusy, UpstreamChannel
from gateway.upstream.bridge import translate
from gateway.upstream.bridge.param_headers import ToolSchemas

log = logging.getLogger("gateway.upstream.bridge")

SessionKey = tuple[str | None, bytes]
REAP_INTERVAL_MAX_S = 30.0


class SessionFailed(Exception):
    """The session could not be opened; `str()` is what the client is told (the link's own words)."""


class InFlight(Protocol):
    """A bridged request in flight on a session: where what the link could not attribute may go."""

    upstream: Exchange
    takes_input: bool
    pending: dict[str, RequestId]
    """Input requests a held call waits on (it takes no other)."""


class Listener(Protocol):
    """A subscriptions/listen stream on a session."""

    async def deliver(self, notification: Message) -> None:
        """An unsolicited notification of the session (the listener filters)."""

    async def end(self) -> None:
        """The session is gone: close the stream gracefully (its client listens again)."""


class BridgeSession:
    """One legacy upstream session and what the bridge knows of it."""

    def __init__(self, key: SessionKey, channel: UpstreamChannel) -> None:
        self.key = key
        self.channel = channel
        self.initialized: dict[str, Any] = {}
        """The upstream's `initialize` result."""
        self.headers: dict[str, str] = {}
        """The headers of every request on the session (its negotiated protocol version, and the caller
        of its latest request: `gateway.principal.caller_entries`)."""
        self.users = 0
        """Requests (a held call and a listen stream included) using the session now."""
        self.last_used = time.monotonic()
        self.lost = False
        self.calls: dict[RequestId, InFlight] = {}
        """Requests in flight by their upstream id."""
        self.listeners: set[Listener] = set()
        """The session's subscriptions/listen streams."""
        self.subscribed: set[str] = set()
        """Resource URIs the session sent `resources/subscribe` for."""
        self.tool_schemas = ToolSchemas()
        """Its tools' input schemas, for the `Mcp-Param-*` headers of a `tools/call`."""
        self._ids = itertools.count(1)

    def next_id(self) -> str:
        """An upstream request id unique on this session (concurrent clients never collide)."""
        return f"bridge-{next(self._ids)}"

    @property
    def server_info(self) -> Any:
        return self.initialized.get("serverInfo")

    def declares(self, capability: str) -> bool:
        return isinstance((self.initialized.get("capabilities") or {}).get(capability), dict)

    @property
    def subscribes(self) -> bool:
        """Whether the upstream takes `resources/subscribe`."""
        resources = (self.initialized.get("capabilities") or {}).get("resources")
        return isinstance(resources, dict) and resources.get("subscribe") is True

    async def unsolicited(self, message: Message, _size: int) -> None:
        method = message.get("method")
        if method is None:
            return  # a late response: its request is gone
        if "id" in message:
            await self._server_request(message)
        elif method == "notifications/message":
            (call,) = self.calls.values() if len(self.calls) == 1 else (None,)
            if call is not None:
                await call.upstream.deliver(message)
        else:
            if method == "notifications/tools/list_changed":
                self.tool_schemas.forget()
            for listener in list(self.listeners):
                await listener.deliver(message)

    async def _server_request(self, message: Message) -> None:
        """A server request no request's stream carried (stdio attributes one only with one request in
        flight): the one call in flight that may ask for input gets it; otherwise it is answered here."""
        takers = [call for call in self.calls.values() if call.takes_input and not call.pending]
        if len(takers) == 1:
            await takers[0].upstream.deliver(message)
            return
        if message["method"] == "ping":
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        else:
            text = f"{message['method']} cannot be attributed to one call of this session: it is refused"
            answer = jsonrpc.error_response(message["id"], jsonrpc.METHOD_NOT_FOUND, text)
        await self.channel.respond(answer, self.headers)


def session_key(owner: str | None, message: Message) -> SessionKey:
    declared = translate.client_capabilities(message)
    return owner, orjson.dumps(declared, option=orjson.OPT_SORT_KEYS)


class SessionPool:
    """The bridge's sessions, by key (see the module docstring)."""

    def __init__(self, link: Upstream, config: BridgeConfig, open_timeout_s: float) -> None:
        self._link = link
        self._config = config
        self._open_timeout_s = open_timeout_s
        self._sessions: dict[SessionKey, BridgeSession] = {}
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    async def acquire(self, owner: str | None, message: Message, caller: Mapping[str, str]) -> BridgeSession:
        """The session for `message`'s client, opened if need be, counted as used until `release`; its
        requests carry `caller` (the request's caller entries: one owner's session, its freshest token).
        Raises `UpstreamBusy` when none can be had, `SessionFailed` when the upstream refuses one."""
        key = session_key(owner, message)
        session = self._sessions.get(key)
        if session is None or session.lost:
            async with self._lock:
                session = self._sessions.get(key)
                if session is None or session.lost:
                    session = await self._open(key, message, caller)
        session.headers.update(caller)
        session.users += 1
        session.last_used = time.monotonic()
        return session

    def release(self, session: BridgeSession) -> None:
        session.users -= 1
        session.last_used = time.monotonic()

    def drop(self, session: BridgeSession, cause: str) -> None:
        """The upstream lost `session`: the next request of its key opens a new one."""
        if session.lost:
            return
        session.lost = True
        log.info("bridged upstream session lost: %s", cause)
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        self._close_later(session)

    def _close_later(self, session: BridgeSession) -> None:
        closing = asyncio.create_task(self._end(session), name="bridge-session-close")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _end(self, session: BridgeSession) -> None:
        for listener in list(session.listeners):
            await listener.end()
        await session.channel.close()

    async def _open(self, key: SessionKey, message: Message, caller: Mapping[str, str]) -> BridgeSession:
        self._start_reaper()
        if len(self._sessions) >= self._config.max_sessions:
            await self._evict(message.get("id"))
        try:
            channel = await self._link.open_session()
        except UpstreamBusy:
            # The link's own ceiling (stdio processes): an idle session of another key makes room.
            await self._evict(message.get("id"), busy=True)
            channel = await self._link.open_session()
        session = BridgeSession(key, channel)
        try:
            await self._handshake(session, message, caller)
        except BaseException:
            await channel.close()
            raise

        async def lost(cause: str) -> None:
            self.drop(session, cause)

        channel.on_loss(lost)
        channel.set_unsolicited_handler(session.unsolicited)
        self._sessions[key] = session
        return session

    async def _evict(self, request_id: object, *, busy: bool = False) -> None:
        """Close the least recently used idle session (and wait: its slot is needed now)."""
        idle = [session for session in self._sessions.values() if session.users == 0]
        if not idle:
            if busy:
                raise UpstreamBusy(
                    "upstream.stdio.max_processes",
                    "every upstream process the gateway may start holds a bridged session in use",
                    "retry later",
                    request_id=request_id,  # type: ignore[arg-type]
                )
            raise UpstreamBusy(
                "upstream.bridge.max_sessions",
                f"every one of the {self._config.max_sessions} bridged upstream sessions is in use",
                "retry later",
                request_id=request_id,  # type: ignore[arg-type]
            )
        oldest = min(idle, key=lambda session: session.last_used)
        del self._sessions[oldest.key]
        await self._end(oldest)

    async def _handshake(self, session: BridgeSession, message: Message, caller: Mapping[str, str]) -> None:
        channel = session.channel
        initialize = translate.initialize_request(session.next_id(), message, LATEST_HANDSHAKE_VERSION)
        final = await self._ask(channel, initialize, dict(caller))
        result = final.get("result")
        if not isinstance(result, dict):
            error = final.get("error")
            said = error.get("message") if isinstance(error, dict) else None
            raise SessionFailed(f"the upstream refused a session: {said or 'no result'}")
        session.initialized = result
        version = result.get("protocolVersion")
        session.headers = {
            "MCP-Protocol-Version": version if isinstance(version, str) else LATEST_HANDSHAKE_VERSION,
            **caller,
        }
        await channel.notify({"jsonrpc": "2.0", "method": "notifications/initialized"}, session.headers)
        if session.declares("logging"):
            # Every level upstream: each 2026 request says (logLevel) which of them it wants.
            set_level = {
                "jsonrpc": "2.0",
                "id": session.next_id(),
                "method": "logging/setLevel",
                "params": {"level": "debug"},
            }
            await self._ask(channel, set_level, session.headers)

    async def _ask(self, channel: UpstreamChannel, message: Message, headers: dict[str, str]) -> Message:
        exchange = await channel.request(message, headers)
        try:
            async with asyncio.timeout(self._open_timeout_s):
                final = (await exchange.collect())[-1]
        except TimeoutError:
            await exchange.cancel()
            raise SessionFailed(f"the upstream did not answer {message['method']} in time") from None
        if exchange.failure is not None:
            raise SessionFailed(exchange.failure)
        return final

    async def ask(self, session: BridgeSession, method: str, params: dict[str, Any]) -> Message:
        """One request of the bridge's own on `session`: its final message (raises `SessionFailed`)."""
        request = {"jsonrpc": "2.0", "id": session.next_id(), "method": method, "params": params}
        return await self._ask(session.channel, request, session.headers)

    async def subscribe(self, session: BridgeSession, uri: str) -> None:
        """`resources/subscribe` on the session, once per URI (a listen stream wants its updates)."""
        if uri in session.subscribed:
            return
        session.subscribed.add(uri)
        with contextlib.suppress(SessionFailed):
            await self.ask(session, "resources/subscribe", {"uri": uri})

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap(), name="bridge-session-reaper")

    async def _reap(self) -> None:
        idle_s = self._config.session_idle_s
        while True:
            await asyncio.sleep(max(0.05, min(idle_s / 4, REAP_INTERVAL_MAX_S)))
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if session.users == 0 and now - session.last_used >= idle_s:
                    del self._sessions[session.key]
                    self._close_later(session)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(self._end(session) for session in sessions), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
