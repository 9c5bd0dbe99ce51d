"""The stdio upstream: the configured command as subprocesses speaking newline-delimited JSON-RPC.

Process model: a legacy (handshake-era) client session gets a process of its own, because the
handshake binds a stdio process to one client. Modern (2026-07-28) requests carry everything in their
`_meta` envelope, so they share a pool of processes, each leased to one request at a time; that keeps
`notifications/message`, which carries no request id on stdio, attributable to its request. The total
number of processes is capped by `max_processes`, of which sessions may hold all but `idle_processes`
(so the pool always serves); an idle session may give its process back (`park`) until its next request.

On one process several exchanges may be in flight, so ids are rewritten: each upstream request gets a
gateway-chosen integer id, which is also its progress token, and responses, progress notifications and
`notifications/cancelled` are mapped back. A process that dies fails its in-flight exchanges at once;
the next request respawns it and, for a session, replays the recorded handshake first. A command that
cannot be started, or a process that exits, fails the requests it had with the cause and is reported to
the upstream's failure listeners (readiness); the gateway itself keeps running. Each process leads a
process group of its own, and stopping it stops the whole group (`end_process_group`), so the server a
wrapper such as `npx` started does not outlive it.

A fresh process is warmed up before its first request: a `ping` (which the MCP spec allows before the
handshake), answered or not within `acquire_timeout_s`. A request's deadline then runs from when the
process reads, not from its spawn: a cold start can take seconds on a loaded host, and a deadline that
ran out during it would recycle the process and leave the next request a cold one again. A pooled
process that cannot serve again (a request on it was cancelled, e.g. at its deadline) is stopped in
the background, and, while fewer than `idle_processes` are idle, a warm one is started in its place,
so neither the cancelled request's answer nor the next request waits for a process to stop or start.

Stdout is read with a small read-ahead (`READ_AHEAD_BYTES`), whatever `line_limit_bytes` is; a longer
line is assembled from pieces (`next_line`). A line longer than `line_limit_bytes` is skipped without
being held: a response whose id its head or tail shows fails its request alone
(`gateway.protocol.oversized`); anything else is dropped, counted and logged. Neither stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache, TTLCache

from gateway import telemetry
from gateway.buffers import BufferBudget
from gateway.config import StdioConfig
from gateway.metrics import DEFAULT_UPSTREAM, Metrics
from gateway.protocol import jsonrpc, oversized
from gateway.protocol.dialect import TASK_EVENT, dialect_of
from gateway.protocol.era import SUBSCRIPTION_ID_KEY, Era
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.upstream.base import (
    DeadlineRule,
    Exchange,
    FailureListener,
    UnsolicitedHandler,
    Upstream,
    UpstreamBusy,
    UpstreamChannel,
)

log = logging.getLogger("gateway.upstream.stdio")


LATE_TOKENS = 1024
"""Progress tokens kept mapped after their request answered: a 2025-11-25 task's token stays valid for
the task's life, so its progress keeps arriving after the CreateTaskResult."""

PINNED_STATE_TTL_S = 600.0
"""How long a requestState keeps its process pinned (the SDK's own requestState lifetime)."""

STDERR_DRAIN_S = 0.5
"""How long an exited process's stderr is read on for its last line, which usually names the cause."""

READ_AHEAD_BYTES = 256 * 1024
"""The limit of each process's stdout StreamReader. asyncio reads ahead up to twice its limit (plus one
256 KiB pipe read) before it pauses the pipe, and a process whose client's stream is full (byte
backpressure) holds that much unread: with the limit at `line_limit_bytes` (64 MiB) that was 128 MiB
per process. So it is small and independent of the line limit; a longer line is assembled from pieces
(`next_line`)."""

WARM_UP_ID = "gateway-warm-up"
"""The client id of the `ping` that warms up a fresh process (`StdioProcess.warm_up`); never a client's."""

RESPONSE_TOO_LARGE = "response_too_large"
"""`data.reason` of the error a request gets when its response is longer than `line_limit_bytes`."""

MAX_CAUSE_CHARS = 300
"""Longest stderr line kept as an exit's detail (the log's and /readyz's reason; never a client's error)."""

# Notifications and server requests that belong to whatever request is running; on stdio nothing says
# which, so they go to the only exchange in flight, or to the unsolicited handler when there are several.
_REQUEST_SCOPED = frozenset(
    {"notifications/message", "sampling/createMessage", "elicitation/create", "roots/list", "ping"}
)


@dataclass(slots=True, frozen=True)
class OversizedLine:
    """A line longer than the limit, read and dropped: its first `oversized.HEAD_BYTES`, its last
    `oversized.TAIL_BYTES` and its size, the newline not counted."""

    head: bytes
    tail: bytes
    size: int


class _Pieces:
    """A line read in pieces: held whole while it is at most `limit` bytes (the newline not counted),
    past that only its head, tail and size. Only the last piece may end with the newline."""

    __slots__ = ("_head", "_limit", "_pieces", "_tail", "size")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pieces: list[bytes] = []
        self._head = b""
        self._tail = b""
        self.size = 0

    def add(self, data: bytes) -> None:
        end = len(data) - data.endswith(b"\n")
        if len(self._head) < oversized.HEAD_BYTES:
            self._head += data[: min(end, oversized.HEAD_BYTES - len(self._head))]
        self._tail = (self._tail + data[max(0, end - oversized.TAIL_BYTES) : end])[-oversized.TAIL_BYTES :]
        self.size += end
        if self.size <= self._limit:
            self._pieces.append(data)
        else:
            self._pieces.clear()

    def line(self) -> bytes | OversizedLine:
        if self.size > self._limit:
            return OversizedLine(self._head, self._tail, self.size)
        return b"".join(self._pieces)


async def next_line(reader: asyncio.StreamReader, limit: int) -> bytes | OversizedLine | None:
    """The next line of `reader`, its newline included (a last line without one counts too); an
    `OversizedLine` for one longer than `limit` bytes, which is read through without being held; None
    at the end.

    A line longer than the reader's own limit (its read-ahead) is assembled from the pieces the reader
    gives up: asyncio's `LimitOverrunError` says how many buffered bytes hold no newline."""
    pieces = _Pieces(limit)
    while True:
        try:
            end = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            pieces.add(await reader.readexactly(exc.consumed))
            continue
        except asyncio.IncompleteReadError as exc:  # the end of the stream
            if not exc.partial and not pieces.size:
                return None
            end = exc.partial
        if not pieces.size and len(end) <= limit:  # the usual case: the line fit in the read-ahead
            return end
        pieces.add(end)
        return pieces.line()


GROUP_POLL_S = 0.05
"""How often a process group whose leader has exited is checked for members left (nothing signals it)."""


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group (0: only check it); whether any process of it was there."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its credentials: still there, and out of reach
        return True
    return True


async def _group_gone(proc: asyncio.subprocess.Process, within_s: float) -> bool:
    """Wait up to `within_s` for the leader to exit and then for its group to empty."""
    deadline = asyncio.get_running_loop().time() + within_s
    try:
        await asyncio.wait_for(proc.wait(), timeout=within_s)
    except TimeoutError:
        return False
    while _signal_group(proc.pid, 0):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(GROUP_POLL_S)
    return True


async def end_process_group(proc: asyncio.subprocess.Process, grace_s: float) -> int:
    """Stop `proc` and every process of the group it leads (it was started in a session of its own, so
    its group is its pid): close its stdin and wait up to `grace_s`, as the MCP stdio transport
    prescribes; then SIGTERM the whole group and wait again; then SIGKILL it. A wrapper (`npx`, `uvx`,
    a shell script) and what it started end together. Returns the leader's exit code.

    Every stop of an upstream process goes through here: a session's end, a parked or recycled
    process, a probe, the gateway's shutdown, and a process whose stdout ended."""
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if await _group_gone(proc, grace_s):
            break
        _signal_group(proc.pid, sig)
    return await proc.wait()


@dataclass(slots=True)
class _Route:
    exchange: Exchange
    client_id: RequestId
    client_token: Any
    streamed_task: Any = None
    """The `taskId` of a tasks/stream request: its task events carry it (nothing else ties them to it)."""


class StdioProcess:
    """One running subprocess and the routing of its messages to exchanges.

    `on_failure` hears a start failure or an unexpected exit. A readiness probe's process has none, logs
    at debug level only and counts no restart: a failing command is probed again and again."""

    def __init__(
        self,
        command: list[str],
        config: StdioConfig,
        metrics: Metrics,
        budget: BufferBudget,
        on_failure: FailureListener | None,
        deadlines: DeadlineRule | None = None,
        *,
        name: str,
    ) -> None:
        self._command = command
        self._name = name
        self._config = config
        self._metrics = metrics
        self._budget = budget
        self._on_failure = on_failure
        self._deadlines = deadlines
        self._stderr_level = logging.INFO if on_failure is not None else logging.DEBUG
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._routes: dict[int, _Route] = {}
        self._by_client_id: dict[RequestId, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._ending: asyncio.Task[int] | None = None
        self._stopping = False
        self._answered = False
        self._last_stderr = ""
        self.abandoned_requests = False
        self.exited = asyncio.Event()
        self.exit_cause: str | None = None
        """Why the process is not running: it could not be started, or it exited (with the code). Clients
        see it, so it names no path or command line."""
        self.exit_detail: str | None = None
        """The last stderr line of a process that exited before answering anything (the log and /readyz
        show it; clients do not: it may name paths)."""
        self.unsolicited: UnsolicitedHandler | None = None
        self.channel: UpstreamChannel | None = None
        """The conversation this process serves: its tap sees every message, its loss listeners the exit."""
        self._late_tokens: LRUCache[int, Any] = LRUCache(LATE_TOKENS)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self.exited.is_set()

    @property
    def in_flight(self) -> bool:
        """Whether a request sent to the process awaits its response."""
        return bool(self._routes)

    async def start(self) -> None:
        """Spawn the command. One that cannot be started leaves the process not alive, `exit_cause` set."""
        env = {**os.environ, **self._config.env}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self._config.cwd,
                limit=READ_AHEAD_BYTES,
                # A session, so a process group, of its own: `end_process_group` stops all it started.
                start_new_session=True,
            )
        except OSError as exc:
            # The OS error's text names the file; clients get only its reason.
            self.exit_cause = f"cannot start the upstream command: {exc.strerror or type(exc).__name__}"
            log.debug(
                "upstream command cannot start",
                extra={"upstream": self._name, "command": self._command, "cause": str(exc)},
            )
            if self._on_failure is not None:
                self._on_failure(self.exit_cause)
            return
        self._metrics.upstream_processes.labels(upstream=self._name).inc()
        log.debug(
            "upstream process started", extra={"upstream": self._name, "pid": self._proc.pid, "command": self._command}
        )
        self._tasks = [
            asyncio.create_task(self._read_stdout(), name=f"stdio-out-{self._proc.pid}"),
            asyncio.create_task(self._read_stderr(), name=f"stdio-err-{self._proc.pid}"),
        ]

    async def request(self, message: Message) -> Exchange:
        client_id = message["id"]
        deadline = self._deadlines(message) if self._deadlines is not None else None
        exchange = Exchange(client_id, message["method"], self._budget, self.channel, deadline)
        if not self.alive:
            exchange.fail(jsonrpc.INTERNAL_ERROR, self._not_running(), detail=self.exit_detail)
            return exchange
        upstream_id = next(self._ids)
        params = message.get("params")
        client_token = None
        if isinstance(params, dict):
            meta = params.get("_meta")
            if isinstance(meta, dict) and "progressToken" in meta:
                client_token = meta["progressToken"]
                params = {**params, "_meta": {**meta, "progressToken": upstream_id}}
        outgoing = {**message, "id": upstream_id}
        if params is not None:
            outgoing["params"] = params
        exchange.span = telemetry.start_span(
            telemetry.UPSTREAM_SPAN, **{telemetry.METHOD: exchange.method, telemetry.UPSTREAM: self._name}
        )
        with telemetry.current(exchange.span):
            outgoing = telemetry.with_trace_meta(outgoing, always=True)
        streamed = params.get("taskId") if message["method"] == "tasks/stream" and isinstance(params, dict) else None
        self._routes[upstream_id] = _Route(exchange, client_id, client_token, streamed)
        self._by_client_id[client_id] = upstream_id
        exchange.on_cancel(lambda reason: self._cancel(upstream_id, reason))
        if not await self._write(outgoing):
            self._forget(upstream_id)
            # The process is going away (a command that exits at once): its exit code says why.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.shutdown_timeout_s):
                    await self.exited.wait()
            exchange.fail(jsonrpc.INTERNAL_ERROR, self._not_running(), detail=self.exit_detail)
        return exchange

    def _not_running(self) -> str:
        return self.exit_cause or "upstream process is not running"

    async def warm_up(self, era: Era, wait_s: float) -> None:
        """Wait until the process answers a `ping` of `era` (any answer: it is reading), at most `wait_s`.
        The first message fixes a process's era in the SDK: a pooled process's is 2026-07-28. No
        deadline and no cancel: a late answer goes nowhere and marks nothing abandoned."""
        if not self.alive:
            return
        upstream_id = next(self._ids)
        exchange = Exchange(WARM_UP_ID, "ping", self._budget)
        self._routes[upstream_id] = _Route(exchange, WARM_UP_ID, None)
        ping, _ = dialect_of(era).gateway_request(upstream_id, "ping", {})
        try:
            if await self._write(ping):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await exchange.collect()
        finally:
            self._forget(upstream_id)
            exchange.detach()

    async def notify(self, message: Message) -> None:
        if message.get("method") == "notifications/cancelled":
            params = jsonrpc.params_of(message)
            upstream_id = self._by_client_id.get(params.get("requestId"))  # type: ignore[arg-type]
            if upstream_id is not None:
                route = self._routes.get(upstream_id)
                await self._cancel(upstream_id, params.get("reason"))
                if route is not None:
                    # The SDK's stdio servers send nothing for a cancelled request; end the client's
                    # stream the way its HTTP transport does, so clients see one behaviour.
                    route.exchange.fail(jsonrpc.REQUEST_CANCELLED, "Request cancelled")
            return
        await self._write(message)

    async def respond(self, message: Message) -> None:
        await self._write(message)

    async def _cancel(self, upstream_id: int, reason: object) -> None:
        route = self._forget(upstream_id)
        if route is None:
            return
        # What a cancelled call sends late could reach the process's next request; a tasks/stream's
        # late events name their task and reach no other request (so a pooled process holding tasks,
        # whose stream a client closed, is not recycled with them).
        self.abandoned_requests |= route.streamed_task is None
        cancel: Message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": upstream_id}}
        if isinstance(reason, str):
            cancel["params"]["reason"] = reason
        await self._write(cancel)

    def _forget(self, upstream_id: int) -> _Route | None:
        route = self._routes.pop(upstream_id, None)
        if route is not None and self._by_client_id.get(route.client_id) == upstream_id:
            del self._by_client_id[route.client_id]
        return route

    async def _write(self, message: Message) -> bool:
        proc = self._proc
        if proc is None or proc.stdin is None or self.exited.is_set():
            return False
        try:
            proc.stdin.write(orjson.dumps(message) + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        try:
            while (line := await next_line(stdout, self._config.line_limit_bytes)) is not None:
                if isinstance(line, OversizedLine):
                    self._skipped(line)
                    continue
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    text = line[:200].decode(errors="replace")
                    log.warning("upstream wrote a line that is not JSON", extra={"upstream": self._name, "line": text})
                    continue
                if isinstance(message, dict):
                    self._answered = True
                    # Held with its bytes: a message routed on unchanged is relayed as the upstream wrote it.
                    await self._route(jsonrpc.holding(message, line.rstrip(b"\r\n")), len(line))
        except Exception:
            log.exception("stdio reader failed", extra={"upstream": self._name})
        finally:
            await self._on_exit()

    def _skipped(self, line: OversizedLine) -> None:
        """A line longer than line_limit_bytes was skipped: a response whose id its head or tail shows
        fails its request alone; anything else is dropped. The process and its other requests go on."""
        size = line.size
        self._answered = True
        limit = self._config.line_limit_bytes
        upstream_id = oversized.response_id(line.head, line.tail)
        route = self._forget(upstream_id) if upstream_id is not None else None
        outcome = "request_failed" if route is not None else "dropped"
        self._metrics.upstream_oversized_lines.labels(outcome=outcome, upstream=self._name).inc()
        log.warning(
            "upstream wrote a line longer than line_limit_bytes; skipped it",
            extra={
                "upstream": self._name,
                "pid": self.pid,
                "bytes": size,
                "limit": limit,
                "outcome": outcome,
                "upstream_id": upstream_id,
            },
        )
        if route is not None:
            route.exchange.fail(
                jsonrpc.INTERNAL_ERROR,
                f"Response too large: the upstream's response ({size} bytes) exceeds {limit} bytes "
                "(upstream.stdio.line_limit_bytes) and was discarded",
                {"reason": RESPONSE_TOO_LARGE, "size": size, "limit": limit, "key": "upstream.stdio.line_limit_bytes"},
            )

    async def _route(self, message: Message, size: int) -> None:
        method = message.get("method")
        if method is None:
            upstream_id = message.get("id")
            route = self._forget(upstream_id) if isinstance(upstream_id, int) else None
            if route is not None:
                if route.client_token is not None:
                    self._late_tokens[upstream_id] = route.client_token  # type: ignore[index]
                await route.exchange.deliver({**message, "id": route.client_id}, size)
            return
        params = jsonrpc.params_of(message)
        if method == "notifications/progress":
            token = params.get("progressToken")
            route = self._routes.get(token) if isinstance(token, int) else None
            if route is not None:
                await route.exchange.deliver(
                    {**message, "params": {**params, "progressToken": route.client_token}}, size
                )
                return
            if isinstance(token, int) and token in self._late_tokens:
                late = {**params, "progressToken": self._late_tokens[token]}
                await self._deliver_unsolicited({**message, "params": late}, size)
                return
        subscription = jsonrpc.meta_of(message).get(SUBSCRIPTION_ID_KEY)
        route = self._routes.get(subscription) if isinstance(subscription, int) else None
        if route is not None:
            # A subscriptions/listen stream stamps every notification with the listen request's id.
            meta = {**params["_meta"], SUBSCRIPTION_ID_KEY: route.client_id}
            await route.exchange.deliver({**message, "params": {**params, "_meta": meta}}, size)
        elif method == TASK_EVENT and (stream := self._stream_of(params.get("taskId"))) is not None:
            # A native upstream allows one stream per task per connection (this process): it is that one.
            await stream.exchange.deliver(message, size)
        elif method in _REQUEST_SCOPED and len(self._routes) == 1:
            (route,) = self._routes.values()
            await route.exchange.deliver(message, size)
        else:
            await self._deliver_unsolicited(message, size)

    def _stream_of(self, task_id: object) -> _Route | None:
        """The tasks/stream request in flight for `task_id`, if any."""
        if not isinstance(task_id, str):
            return None
        return next((route for route in self._routes.values() if route.streamed_task == task_id), None)

    async def _deliver_unsolicited(self, message: Message, size: int) -> None:
        if self.channel is not None:
            message = await self.channel.tapped(None, message)
        if self.unsolicited is None:
            self._metrics.notifications_undelivered.labels(method=str(message.get("method")), reason="no_session").inc()
            return
        await self.unsolicited(message, size)

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stderr, pid = self._proc.stderr, self._proc.pid
        with contextlib.suppress(Exception):
            while line := await stderr.readline():
                text = line.decode(errors="replace").rstrip()
                self._last_stderr = text[:MAX_CAUSE_CHARS] or self._last_stderr
                log.log(self._stderr_level, "upstream: %s", text, extra={"upstream": self._name, "pid": pid})

    async def _on_exit(self) -> None:
        assert self._proc is not None
        # Its stdout ended: the process is ending or gone, and what it started must not outlive it.
        code = await self._end()
        await asyncio.wait(self._tasks[1:], timeout=STDERR_DRAIN_S)  # the stderr reader: its last line
        self.exit_cause = f"upstream process exited (code {code})"
        if not self._answered:
            # A start failure (a missing script, a bad argument): stderr usually says which.
            self.exit_cause += " before answering anything"
            self.exit_detail = self._last_stderr or None
        if not self.exited.is_set():
            self.exited.set()
            self._metrics.upstream_processes.labels(upstream=self._name).dec()
        routes = list(self._routes.values())
        if not self._stopping:
            # A process that was serving is a crash worth a warning; one that died before anything was
            # asked of it is a start failure, which readiness reports once.
            serving = (self._answered or bool(routes)) and self._on_failure is not None
            log.log(
                logging.WARNING if serving else logging.DEBUG,
                "upstream process exited",
                extra={
                    "upstream": self._name,
                    "pid": self._proc.pid,
                    "code": code,
                    "cause": self.exit_cause,
                    "stderr": self._last_stderr,
                },
            )
            if self._on_failure is not None:
                self._metrics.upstream_restarts.labels(upstream=self._name).inc()
                self._on_failure(self.exit_cause)
        self._routes.clear()
        self._by_client_id.clear()
        for route in routes:
            route.exchange.fail(jsonrpc.INTERNAL_ERROR, self.exit_cause, detail=self.exit_detail)
        if not self._stopping and self.channel is not None:
            await self.channel.report_loss(f"the upstream process exited (code {code})")

    async def stop(self) -> None:
        """Stop the process and every process it started (`end_process_group`), then its readers."""
        if self._proc is None:
            return
        self._stopping = True
        await self._end()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _end(self) -> int:
        """End the process's group once, however many ask (a stop, and its stdout's end); its exit code."""
        assert self._proc is not None
        if self._ending is None:
            self._ending = asyncio.create_task(
                end_process_group(self._proc, self._config.shutdown_timeout_s), name=f"stdio-end-{self._proc.pid}"
            )
        # Shielded: a cancelled caller must not leave the group half stopped.
        return await asyncio.shield(self._ending)


class StdioChannel(UpstreamChannel):
    """A conversation over one process at a time: spawned on first use, respawned after a crash.

    A session's handshake (`initialize` and `notifications/initialized`) is recorded and replayed to a
    respawned process, so the client's session survives an upstream crash.
    """

    def __init__(self, upstream: StdioUpstream, *, probe: bool = False, session: bool = False) -> None:
        self._upstream = upstream
        self._probe = probe
        self.session = session
        """A legacy session's conversation (not the pool's): its slot counts in the sessions' share."""
        self._process: StdioProcess | None = None
        self._spawn_lock = asyncio.Lock()
        self._handshake: list[Message] = []
        self._unsolicited: UnsolicitedHandler | None = None
        self._closed = False
        self._parked = False
        """The process was stopped and its slot given back while the session idles (see `park`)."""
        self.lease = asyncio.Lock()
        """Held by the one stateless request using this channel."""
        self.streams_beside = 0
        """Forwarded tasks/stream requests running on it beside the lease holder (see `stateless`)."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def ensure_started(self) -> None:
        await self._live_process()

    async def resume(self) -> None:
        if self._parked:
            await self._live_process()

    async def park(self) -> bool:
        async with self._spawn_lock:
            process = self._process
            if self._closed or self._parked or (process is not None and process.in_flight):
                return False
            self._process = None
            self._parked = True
            self._upstream.release_slot(session=self.session)
        if process is not None:
            await process.stop()
        return True

    async def _live_process(self) -> StdioProcess:
        async with self._spawn_lock:
            if self._process is not None and self._process.alive:
                return self._process
            if self._parked:
                await self._upstream.take_slot(self._upstream.acquire_timeout_s, session=self.session)
                self._parked = False
            process = self._upstream.new_process(probe=self._probe)
            process.unsolicited = self._unsolicited
            process.channel = self
            await process.start()
            # A session's (and the readiness probe's) conversation is a handshake one; the pool's are not.
            era = Era.LEGACY if self.session or self._probe else Era.MODERN
            await process.warm_up(era, self._upstream.acquire_timeout_s)
            self._process = process
            await self._replay_handshake(process)
            return process

    async def _replay_handshake(self, process: StdioProcess) -> None:
        for message in self._handshake:
            if "id" in message:
                exchange = await process.request(message)
                await exchange.collect()
            else:
                await process.notify(message)

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        if self._closed:
            exchange = Exchange(message["id"], message["method"])
            exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream session closed")
            return exchange
        process = await self._live_process()
        if message["method"] == "initialize":
            self._handshake = [message]
        return await process.request(message)

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        if message.get("method") == "notifications/initialized" and len(self._handshake) == 1:
            self._handshake.append(message)
        if self._process is not None and self._process.alive:
            await self._process.notify(message)

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        if self._process is not None and self._process.alive:
            await self._process.respond(message)

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        self._unsolicited = handler
        if self._process is not None:
            self._process.unsolicited = handler

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def reusable(self) -> bool:
        """Open, and no request was abandoned or is still in flight on it whose late output could reach
        the next one."""
        process = self._process
        return not self._closed and (process is None or not (process.abandoned_requests or process.in_flight))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        process, self._process = self._process, None
        if process is not None:
            await process.stop()
        if not self._probe:
            self._upstream.forget(self, holds_slot=not self._parked)


class StdioUpstream(Upstream):
    """Owns every stdio channel: per-session ones and the pool that serves modern requests."""

    def __init__(
        self,
        command: list[str],
        config: StdioConfig,
        metrics: Metrics,
        budget: BufferBudget | None = None,
        deadlines: DeadlineRule | None = None,
        *,
        name: str = DEFAULT_UPSTREAM,
    ):
        self.name = name
        """The upstream's configured name: the `upstream` label of its metrics and field of its log lines."""
        self._command = command
        self._config = config
        self._metrics = metrics
        self._budget = budget or BufferBudget()
        self._deadlines = deadlines
        self._slots = asyncio.Semaphore(config.max_processes)
        self._session_share = config.max_processes - min(config.idle_processes, config.max_processes - 1)
        """Slots legacy sessions may hold: the other `idle_processes` are kept for 2026-07-28 requests,
        so however many sessions are opened, the pool can always serve."""
        self._session_slots = 0
        self._idle: list[StdioChannel] = []
        self._channels: set[StdioChannel] = set()
        self._pinned: TTLCache[str, StdioChannel] = TTLCache(maxsize=4096, ttl=PINNED_STATE_TTL_S)
        self._background: set[asyncio.Task[None]] = set()
        """Recycled processes being stopped and replacements being started (`_settle`)."""
        # Exported at 0 from the start: a labelled metric has no sample until its label is used.
        metrics.upstream_processes.labels(upstream=name)
        metrics.upstream_restarts.labels(upstream=name)

    def new_process(self, *, probe: bool) -> StdioProcess:
        return StdioProcess(
            self._command,
            self._config,
            self._metrics,
            self._budget,
            None if probe else self.report_failure,
            self._deadlines,
            name=self.name,
        )

    @property
    def acquire_timeout_s(self) -> float:
        return self._config.acquire_timeout_s

    def forget(self, channel: StdioChannel, *, holds_slot: bool) -> None:
        """Called once by a closing channel: its process slot (unless parked) is free again."""
        self._channels.discard(channel)
        if holds_slot:
            self.release_slot(session=channel.session)

    def release_slot(self, *, session: bool) -> None:
        self._slots.release()
        if session:
            self._session_slots -= 1

    async def take_slot(self, wait_s: float, *, session: bool) -> None:
        """A process slot, waiting up to `wait_s` (idle pool processes are stopped first to make room);
        a session's slot only within the sessions' share, at once or not at all."""
        if session and self._session_slots >= self._session_share:
            raise UpstreamBusy(
                "upstream.stdio.max_processes",
                f"legacy sessions hold all {self._session_share} upstream processes they may use (the other "
                f"{self._config.max_processes - self._session_share} serve 2026-07-28 requests: idle_processes)",
                "retry later; sessions release theirs when they end (DELETE) or expire",
            )
        if self._slots.locked() and self._idle:
            await self._idle.pop().close()
        if self._slots.locked() and wait_s <= 0:
            raise self._busy()
        try:
            # An unlocked semaphore is acquired at once; only a full one needs the deadline.
            async with asyncio.timeout(wait_s if self._slots.locked() else None):
                await self._slots.acquire()
        except TimeoutError:
            raise self._busy() from None
        if session:
            self._session_slots += 1

    async def _new_channel(self, wait_s: float, *, session: bool = False) -> StdioChannel:
        await self.take_slot(wait_s, session=session)
        channel = StdioChannel(self, session=session)
        self._channels.add(channel)
        return channel

    def _busy(self) -> UpstreamBusy:
        return UpstreamBusy(
            "upstream.stdio.max_processes",
            f"all {self._config.max_processes} upstream processes are in use",
            "retry later; legacy sessions release theirs when they end (DELETE) or expire",
        )

    async def start(self) -> None:
        for _ in range(min(self._config.idle_processes, self._config.max_processes)):
            channel = await self._new_channel(0)
            await channel.ensure_started()
            self._idle.append(channel)

    async def open_session(self) -> UpstreamChannel:
        return await self._new_channel(0, session=True)

    @asynccontextmanager
    async def probe_session(self) -> AsyncIterator[UpstreamChannel]:
        # Outside max_processes: readiness runs one probe at a time, and a full pool must not hide a
        # command that no longer starts.
        channel = StdioChannel(self, probe=True)
        try:
            yield channel
        finally:
            await channel.close()

    @asynccontextmanager
    async def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AsyncIterator[UpstreamChannel]:
        channel = self._pinned.get(affinity) if affinity is not None else None
        if beside and channel is not None and not channel.closed:
            # A tasks/stream of a task this process holds runs beside its other requests (its events
            # name their task, see StdioProcess._route): leasing the process for the stream's whole life
            # would hold up every other request about its tasks, the gateway's own polls included.
            if channel in self._idle:
                self._idle.remove(channel)
            channel.streams_beside += 1
            try:
                yield channel
            finally:
                channel.streams_beside -= 1
                await self._settle(channel)
            return
        # A pinned process holds state only it knows (a task, a signed requestState): a request for it
        # waits its turn there even while another request is in flight on it; any other process would
        # answer "unknown".
        with telemetry.span(telemetry.STDIO_WAIT_SPAN, **{telemetry.UPSTREAM: self.name}):
            if channel is None or channel.closed:
                channel = self._idle.pop() if self._idle else await self._new_channel(self._config.acquire_timeout_s)
            elif channel in self._idle:
                self._idle.remove(channel)
            try:
                async with asyncio.timeout(self._config.acquire_timeout_s):
                    await channel.lease.acquire()
            except TimeoutError:
                raise UpstreamBusy(
                    "upstream.stdio.acquire_timeout_s",
                    "the upstream process that holds this task or requestState stayed busy",
                    "retry the same request later",
                ) from None
        try:
            yield channel
        finally:
            channel.lease.release()
            await self._settle(channel)

    async def _settle(self, channel: StdioChannel) -> None:
        """A request on `channel` ended: back to the idle processes, or closed, once nothing else runs on it."""
        if channel.lease.locked() or channel.streams_beside:
            return  # whatever still runs on it settles it when it ends
        pinned = channel in self._pinned.values()
        if channel.reusable and (pinned or len(self._idle) < self._config.idle_processes):
            if channel not in self._idle:
                self._idle.append(channel)
            return
        # Off the request's path: stopping a process can take shutdown_timeout_s, twice.
        self._in_background(channel.close())
        if not channel.reusable and len(self._idle) < self._config.idle_processes:
            self._in_background(self._add_idle())

    async def _add_idle(self) -> None:
        """One more warm idle process for the pool, if a slot is free at once."""
        try:
            channel = await self._new_channel(0)
        except UpstreamBusy:
            return
        self._idle.append(channel)  # a request may take it while it warms up: it waits for that
        await channel.ensure_started()

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        # The SDK signs requestState with a per-process key: only the issuing process accepts it.
        if isinstance(channel, StdioChannel):
            self._pinned[affinity] = channel

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        channels = list(self._channels)
        self._idle.clear()
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)
