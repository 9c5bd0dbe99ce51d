"""Legacy (handshake-era) client sessions: the gateway's own Mcp-Session-Id and what hangs off it.

A session owns one upstream channel, its resumable SSE streams (the forwarded responses and the
standalone GET stream, `gateway.replay`), and the ids of the server-to-client requests relayed to it
(so the client's response POST can be checked and routed).
Sessions idle longer than the configured timeout, with no stream open, are closed by a sweeper; so,
much sooner, are sessions that made no request after their handshake (`session_handshake_timeout_s`),
which would otherwise hold an upstream process each for the whole idle timeout.

Fair shares: the registry counts each principal's sessions (`held_by`, for `[auth.limits] max_sessions`,
counted before any await so the cap holds exactly), and when no upstream process is free for a new
session or a parked one's next request, the least recently used idle session gives its process back
(`park`) before the caller is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TypeVar

from gateway.buffers import BufferBudget
from gateway.config import ResumeConfig
from gateway.metrics import Metrics
from gateway.protocol.era import primes_streams
from gateway.protocol.jsonrpc import Message, Overloaded, RequestId
from gateway.replay import SessionStreams
from gateway.upstream.base import Upstream, UpstreamBusy, UpstreamChannel
from gateway.upstream.capabilities import Capabilities

log = logging.getLogger("gateway.sessions")

T = TypeVar("T")

ResponseRoute = Callable[[Message, Mapping[str, str]], Awaitable[None]]
"""Where the client's response to a relayed server request goes instead of this session's channel."""


class Session:
    def __init__(self, session_id: str, channel: UpstreamChannel, metrics: Metrics, streams: SessionStreams) -> None:
        self.id = session_id
        self.channel = channel
        self.last_seen = time.monotonic()
        self.open_streams = 0
        self.owner = ""
        """The principal that initialized it (set by the edge); another principal gets 404 for it."""
        self.engaged = False
        """Made a request (or opened its GET stream) after the handshake; until then it expires soon."""
        self._upstream_capabilities = Capabilities(tasks=False)
        self._pending_server_requests: set[RequestId] = set()
        """Server-to-client requests relayed to this client and not yet answered."""
        self._task_streams: set[str] = set()
        """Tasks with an active tasks/stream on this session (SEP-2694 allows one per task)."""
        self._local_requests: dict[RequestId, asyncio.Event] = {}
        """Requests the gateway answers itself, by id, so notifications/cancelled can stop them."""
        self._running_tasks = 0
        """Hosted tasks running on this session's upstream channel: it stays open until they end."""
        self._response_routes: dict[RequestId, ResponseRoute] = {}
        """Responses the gateway takes itself, by request id: a hosted task's requests (`respond`)."""
        self._closing = False
        self._metrics = metrics
        self.streams = streams
        channel.set_unsolicited_handler(self.deliver_unsolicited)

    @property
    def parkable(self) -> bool:
        """Nothing needs the upstream conversation as it is now: no hosted or pass-through task runs on
        it and no server request or gateway-answered request waits (open streams are checked apart)."""
        return not (
            self._running_tasks or self._pending_server_requests or self._response_routes or self._local_requests
        )

    @property
    def upstream_capabilities(self) -> Capabilities:
        """What the upstream's initialize result declared: without Tasks the gateway hosts them; with
        `eventStreams` it serves `tasks/stream` itself (SEP-2694 native), and the gateway forwards them."""
        return self._upstream_capabilities

    def learn_upstream(self, capabilities: Capabilities) -> None:
        self._upstream_capabilities = capabilities

    def agreed_version(self, protocol_version: str) -> None:
        """The protocol version the handshake agreed on: its SSE streams open with a priming event only
        where the version knows them."""
        self.streams.priming = primes_streams(protocol_version)

    def engage(self) -> None:
        """A request (or the GET stream) after the handshake: the session is in use, no longer expired soon."""
        self.engaged = True

    def touch(self) -> None:
        self.last_seen = time.monotonic()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Hold the session open (no idle sweep) while one of its HTTP requests or streams runs."""
        self.open_streams += 1
        try:
            yield
        finally:
            self.open_streams -= 1
            self.touch()

    def note_outgoing(self, message: Message, route: ResponseRoute | None = None) -> None:
        """`message` goes to this client: if it is a server-to-client request, expect its response."""
        if "method" in message and "id" in message:
            self.expect_response(message["id"], route)

    def expect_response(self, request_id: RequestId, route: ResponseRoute | None = None) -> None:
        """A server-to-client request `request_id` was relayed to this client: its response is accepted,
        and goes to `route` (a hosted task, another conversation) instead of this session's channel."""
        self._pending_server_requests.add(request_id)
        if route is not None:
            self._response_routes[request_id] = route

    def forget_response(self, request_id: RequestId, route: ResponseRoute) -> None:
        """The request `route` waited for is settled elsewhere: a late response is no longer accepted."""
        if self._response_routes.get(request_id) is route:
            del self._response_routes[request_id]
            self._pending_server_requests.discard(request_id)

    def claim_response(self, request_id: RequestId) -> bool:
        """Whether a response with this id answers a request relayed here; it is claimed (answered once)."""
        if request_id not in self._pending_server_requests:
            return False
        self._pending_server_requests.discard(request_id)
        return True

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        """Route the client's response to a server request: to a hosted task that asked, else upstream."""
        route = self._response_routes.pop(message["id"], None)
        if route is not None:
            await route(message, headers)
        else:
            await self.channel.respond(message, headers)

    async def deliver_unsolicited(self, message: Message, size: int = 0) -> None:
        """To the GET stream, kept there for a resume also while its connection is away. Never waits:
        the stream keeps what `[server.resume]` bounds (`size`, the size on the wire, is not needed)."""
        stream = self.streams.standalone
        method = str(message.get("method"))
        if stream is None:
            reason = "session_closed" if self._closing else "no_get_stream"
            self._metrics.notifications_undelivered.labels(method=method, reason=reason).inc()
            return
        self.note_outgoing(message)
        self._metrics.count_forwarded(method)
        stream.record([message])

    async def close(self) -> None:
        """End the session; the upstream channel follows once no hosted task runs on it."""
        self._closing = True
        await self.streams.close()
        for stop in self._local_requests.values():
            stop.set()
        if self._running_tasks == 0:
            await self.channel.close()

    def task_started(self) -> None:
        self._running_tasks += 1

    async def task_ended(self) -> None:
        self._running_tasks -= 1
        if self._closing and self._running_tasks == 0:
            await self.channel.close()

    @contextlib.contextmanager
    def local_request(self, request_id: RequestId) -> Iterator[asyncio.Event]:
        """A request the gateway answers itself: the event is set when the client cancels it
        (`cancel_local`) or the session closes."""
        stop = asyncio.Event()
        self._local_requests[request_id] = stop
        try:
            yield stop
        finally:
            self._local_requests.pop(request_id, None)

    def cancel_local(self, request_id: object) -> bool:
        """Stop the local request `request_id`; False when the gateway serves no such request."""
        stop = self._local_requests.get(request_id)  # type: ignore[call-overload]
        if stop is None:
            return False
        stop.set()
        return True

    @contextlib.contextmanager
    def task_stream(self, task_id: str) -> Iterator[None]:
        """Hold this session's one tasks/stream of `task_id` (SEP-2694 allows one per task and session)."""
        self._task_streams.add(task_id)
        try:
            yield
        finally:
            self._task_streams.discard(task_id)

    def has_task_stream(self, task_id: str) -> bool:
        return task_id in self._task_streams


class SessionRegistry:
    def __init__(
        self,
        upstream: Upstream,
        metrics: Metrics,
        max_sessions: int,
        idle_timeout_s: float,
        budget: BufferBudget,
        handshake_timeout_s: float,
        process_idle_s: float,
        resume: ResumeConfig,
    ):
        self._upstream = upstream
        self._metrics = metrics
        self._max_sessions = max_sessions
        self._idle_timeout_s = idle_timeout_s
        self._handshake_timeout_s = handshake_timeout_s
        self._process_idle_s = process_idle_s
        self._budget = budget
        self._resume = resume
        self._sessions: dict[str, Session] = {}
        self._per_owner: Counter[str] = Counter()
        """Principal -> its sessions, open or being opened (`[auth.limits] max_sessions`)."""
        self._sweeper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def held_by(self, owner: str) -> int:
        """How many sessions `owner` holds, counting those being opened."""
        return self._per_owner[owner]

    async def create(self, owner: str) -> Session:
        """A new session of `owner`, counted for it before the first await."""
        if len(self._sessions) >= self._max_sessions:
            raise Overloaded(
                "server.max_sessions",
                f"the gateway holds its maximum of {self._max_sessions} sessions",
                "retry later; end sessions you no longer use with DELETE",
            )
        self._per_owner[owner] += 1
        try:
            channel = await self.with_process(self._upstream.open_session)
        except BaseException:
            self._uncount(owner)
            raise
        streams = SessionStreams(self._resume, self._budget)
        session = Session(secrets.token_hex(16), channel, self._metrics, streams)
        session.owner = owner
        self._sessions[session.id] = session
        self._metrics.sessions.set(len(self._sessions))
        return session

    async def resume(self, session: Session) -> None:
        """Before a request of `session`: its process back if it was parked (see `with_process`)."""
        await self.with_process(session.channel.resume)

    async def with_process(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt` (which takes an upstream process); while no process is free, the least recently
        used idle session gives its own back and `attempt` is tried again, until none is left to."""
        while True:
            try:
                return await attempt()
            except UpstreamBusy:
                if not await self._park_least_recent():
                    raise

    async def _park_least_recent(self) -> bool:
        idle = [session for session in self._sessions.values() if not session.open_streams and session.parkable]
        for session in sorted(idle, key=lambda session: session.last_seen):
            if await session.channel.park():
                log.debug("least recently used session gave its process back", extra={"session": session.id})
                self._metrics.sessions_parked.inc()
                return True
        return False

    def _uncount(self, owner: str) -> None:
        self._per_owner[owner] -= 1
        if not self._per_owner[owner]:
            del self._per_owner[owner]

    def get(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.touch()
        return session

    async def close(self, session_id: str) -> bool:
        session = self._sessions.pop(session_id, None)
        self._metrics.sessions.set(len(self._sessions))
        if session is None:
            return False
        self._uncount(session.owner)
        await session.close()
        return True

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="session-sweeper")

    async def _sweep(self) -> None:
        timeouts = [self._idle_timeout_s, self._handshake_timeout_s]
        if self._process_idle_s:
            timeouts.append(self._process_idle_s)
        interval = min(60.0, *(timeout / 2 for timeout in timeouts))
        while True:
            await asyncio.sleep(interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        now = time.monotonic()
        ending: list[Awaitable[None]] = []
        for session in list(self._sessions.values()):
            if session.open_streams:
                continue
            if not session.engaged and session.last_seen < now - self._handshake_timeout_s:
                # Debug only: a flood of bare initialize calls must not flood the log as well.
                log.debug("closing session that made no request after initialize", extra={"session": session.id})
                ending.append(self._expire(session, "handshake"))
            elif session.last_seen < now - self._idle_timeout_s:
                log.info("closing idle session", extra={"session": session.id})
                ending.append(self._expire(session, "idle"))
            elif self._process_idle_s and session.parkable and session.last_seen < now - self._process_idle_s:
                ending.append(self._park(session))
        # Together: stopping a process can take shutdown_timeout_s, and a flood ends many at once.
        for failure in await asyncio.gather(*ending, return_exceptions=True):
            if isinstance(failure, Exception):
                log.error("ending a session failed", exc_info=failure)

    async def _expire(self, session: Session, reason: str) -> None:
        self._metrics.sessions_expired.labels(reason=reason).inc()
        await self.close(session.id)

    async def _park(self, session: Session) -> None:
        if await session.channel.park():
            log.debug("idle session gave its upstream process back", extra={"session": session.id})
            self._metrics.sessions_parked.inc()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for session_id in list(self._sessions):
            await self.close(session_id)
