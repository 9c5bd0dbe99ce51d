"""What the task service hands the edge: the parsed call it gets, and the plans it returns.

A plan says what to do with one client request, and nothing about HTTP: reply now (`Reply`), forward
upstream and relay the answer (`Forward`, with `RelayHooks` saying what to do with the final message and
what to observe on the way), stream a task's log from a cursor (`StreamEvents`), or wait for a legacy
task's result (`AwaitResult`). The edge carries plans out over HTTP and decides no task semantics;
what a plan holds (a stream slot, a pooled channel) sits in the call's `resources`, released once the
request's response is done unless a task took it over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from gateway.config import ServerConfig, TasksConfig
from gateway.events.log import EventLog, StoreUnavailable
from gateway.events.stream import STORE_RETRY_MAX_S, Write, run_stream
from gateway.principal import ANONYMOUS
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import dialect_of, unknown_task
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.sessions import ResponseRoute, Session
from gateway.tasks.hosted import Caller, HostedTasks
from gateway.tasks.records import TaskRecord
from gateway.tasks.registry import PendingRequest, Task
from gateway.upstream.base import Exchange, UpstreamChannel
from gateway.waiting import wait_any

Transform = Callable[[Message], Awaitable[Message]]
"""What becomes of the upstream's final message before the client gets it."""
ChannelSource = Callable[[], Awaitable[UpstreamChannel]]
"""How a request gets its upstream channel, only once it needs one."""


@dataclass
class TaskCall:
    """One client request, checked and parsed by the edge, on its way through the task service."""

    message: Message
    era: Era
    headers: dict[str, str]
    """The client's forwardable MCP headers."""
    session: Session | None
    """The legacy session it came on; None in 2026-07-28."""
    channel: ChannelSource
    owner: str = ANONYMOUS
    """Who is asking (the principal, once the edge authenticates): the tasks it sees are its own."""
    resources: AsyncExitStack = field(default_factory=AsyncExitStack)
    """What the request holds (a pooled upstream channel, a stream slot); a task that takes the call
    over keeps it, else the edge releases it once the response is done."""
    resources_kept: bool = False

    def keep_resources(self) -> AsyncExitStack:
        """Hand the request's resources to a background task; the edge will not release them."""
        self.resources_kept = True
        return self.resources

    @property
    def method(self) -> str:
        method: str = self.message["method"]
        return method

    @property
    def caller(self) -> Caller:
        return Caller(self.owner, self.era)


@dataclass
class Handoff:
    """Turn the call into a task if it is still running at `deadline` (time.monotonic())."""

    deadline: float
    take_over: Callable[[Exchange, list[Message]], Awaitable[Message]]
    """Gets the exchange and the notifications seen so far; creates the task, takes the exchange over,
    returns the answer."""
    forward: Callable[[Message], bool] = field(default=lambda message: True)
    """Which notifications the client asked for and may see live before the handoff."""
    possible: Callable[[], bool] = field(default=lambda: True)
    """Whether a task can be made at the deadline; if not, the call carries on as a plain call."""
    taken: bool = False


@dataclass(frozen=True)
class RelayHooks:
    """What relaying one exchange does besides writing what comes, as it comes."""

    session: Session | None = None
    """Legacy: the server requests relayed are expected back on this session."""
    answer_route: ResponseRoute | None = None
    """Where the client's answers to those requests go instead of the session's own upstream channel."""
    transform: Transform | None = None
    observed: list[Message] | None = None
    """Collects what was relayed before the final message."""
    handoff: Handoff | None = None
    cancel_when_gone: bool = False
    """The request is worth nothing without its client (a forwarded tasks/stream): a client that goes
    away cancels it upstream in 2025-11-25 too, where a call otherwise runs on."""


@dataclass(frozen=True)
class Reply:
    """Answer at once with `message`."""

    message: Message


@dataclass(frozen=True)
class Forward:
    """Send `message` on `channel` and relay what comes back, with `hooks`."""

    channel: UpstreamChannel
    message: Message
    headers: Mapping[str, str]
    hooks: RelayHooks


@dataclass(frozen=True)
class StreamEvents:
    """tasks/stream: deliver the task's log from `first_seq` on, replay then live, then the final message."""

    log: EventLog
    task_id: str
    first_seq: int
    stop: asyncio.Event
    """Set when the client cancels the stream (or its session ends)."""
    request: Message
    era: Era
    server: ServerConfig
    tasks: TasksConfig

    async def run(self, write: Write, send: Callable[[list[Message]], Awaitable[None]]) -> Message:
        """Write the events (SSE bytes) and progress notifications (`send`); the final message."""
        request_id = self.request["id"]
        token = jsonrpc.meta_of(self.request).get("progressToken")

        async def progress(delivered: int) -> None:
            # Progress on the stream request's own token: request-local UX, never a task event (no seq).
            note = {"progressToken": token, "progress": delivered, "message": f"{delivered} events delivered"}
            await send([{"jsonrpc": "2.0", "method": "notifications/progress", "params": note}])

        outcome = await run_stream(
            self.log,
            self.task_id,
            self.first_seq,
            write,
            stop=self.stop,
            keepalive_s=self.server.keepalive_s,
            batch=self.tasks.replay_batch,
            on_batch=progress if token is not None else None,
            flush_interval_s=self.tasks.stream_flush_interval_ms / 1000,
        )
        if self.stop.is_set():
            return jsonrpc.error_response(request_id, jsonrpc.REQUEST_CANCELLED, "Request cancelled")
        if isinstance(outcome, ProtocolError):
            outcome.request_id = request_id
            return outcome.to_message()
        return dialect_of(self.era).stream_end(request_id)


class AwaitResult:
    """Legacy tasks/result of a task still running: wait until it ends, then answer exactly the outcome
    the store keeps (`HostedTasks.result`).

    A task this process runs (`task`) wakes the wait when it ends, and its server-to-client requests
    are carried to the client as they come (SEP-1686 input_required); the plan holds the task's
    `result_streams` until `close`. A task another process runs (`task` None) is watched through its
    log, which that process seals when the task ends, then read again from the store; its requests
    reach the client only through that process."""

    def __init__(
        self, hosted: HostedTasks, record: TaskRecord, task: Task | None, session: Session, request_id: RequestId
    ) -> None:
        self._hosted = hosted
        self._record = record
        self._task = task
        self._session = session
        self._request_id = request_id
        self._carrying = True
        self._claimed = False
        if task is not None:
            task.result_streams += 1

    async def next(self, wait_s: float) -> tuple[list[Message], Message | None]:
        """The task's requests to carry to the client now, or the final answer; ([], None) when
        `wait_s` passed with neither (time for a keep-alive)."""
        task = self._task
        while True:
            claimed = self._hosted.input.claim_undelivered(task) if task is not None else []
            if claimed:
                assert task is not None
                for pending in claimed:
                    route_answer(self._hosted, self._session, task, pending)
                    pending.carried_by = self._carries
                self._claimed = True
                return [pending.request for pending in claimed], None
            try:
                record = await self._hosted.reads.record(self._record.owner, self._record.id)
            except StoreUnavailable:  # wait for the store, with keep-alives, as a stream does
                await asyncio.sleep(min(wait_s, STORE_RETRY_MAX_S))
                return [], None
            if record is None:  # its ttl ran out meanwhile
                return [], unknown_task(self._request_id).to_message()
            if record.terminal:
                return [], await self._hosted.result(record, self._request_id)
            self._record = record
            woken = await (wait_any((task.done, task.undelivered), wait_s) if task is not None else self._watch(wait_s))
            if not woken:
                return [], None

    async def _watch(self, wait_s: float) -> bool:
        """Wait for the log of a task another process runs to grow or be sealed."""
        log, record = self._hosted.reads.log, self._record
        with contextlib.suppress(StoreUnavailable):  # read again after the poll interval
            bounds = await log.bounds(record.id)
            if bounds is not None and not bounds.sealed:
                return await log.wait(record.id, bounds.next_seq - 1, wait_s)
        # Sealed a moment before the record turns terminal (the log is written first), or gone with the
        # record: read the store again after the task's poll interval, not in a busy loop.
        await asyncio.sleep(min(wait_s, record.poll_interval_ms / 1000))
        return False

    def _carries(self) -> bool:
        return self._carrying

    def close(self) -> None:
        task = self._task
        self._carrying = False
        if task is None:
            return
        task.result_streams -= 1
        if self._claimed and any(not pending.delivered for pending in task.pending_requests.values()):
            task.undelivered.set()  # unanswered: another (or the next) tasks/result carries them


Plan = Reply | Forward | StreamEvents | AwaitResult


def route_answer(hosted: HostedTasks, session: Session, task: Task, pending: PendingRequest) -> None:
    """The client's response to `pending`, POSTed on `session`, goes to the task (and on upstream)."""

    async def route(message: Message, headers: Mapping[str, str]) -> None:
        await hosted.input.answer(task, message, headers)

    session.note_outgoing(pending.request, route)
    pending.forget.append(lambda: session.forget_response(pending.id, route))
