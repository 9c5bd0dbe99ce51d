"""What the task service hands the edge: the parsed call it gets, the upstream facts it plans with,
and the plans it returns.

A plan says what to do with one client request, and nothing about HTTP: reply now (`Reply`), forward
upstream and relay the answer (`Forward`, with `RelayHooks` saying what to do with the final message and
what to observe on the way), stream a task's log from a cursor (`StreamEvents`), or wait for a legacy
task's result (`AwaitResult`). The edge carries plans out over HTTP and decides no task semantics;
what a plan holds (a stream slot, a pooled channel) sits in the call's `resources`, released once the
request's response is done unless a task took it over.

Plain types only: where the edge must call back into task logic, a plan holds a small interface the
task side implements (`CallHandoff`: `gateway.tasks.handoff`; `ResultWait`: `gateway.tasks.result_wait`).
Sessions, the hosted runner, the registry and the stores are named here as types, never imported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.principal import ANONYMOUS
from gateway.protocol.dialect import Dialect, dialect_of
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.tasks.policy import UpstreamSupport

if TYPE_CHECKING:
    from gateway.events.log import EventLog
    from gateway.sessions import ResponseRoute, Session
    from gateway.upstream.base import Exchange, UpstreamChannel

Transform = Callable[[Message], Awaitable[Message]]
"""What becomes of the upstream's final message before the client gets it."""
ChannelSource = Callable[[], Awaitable["UpstreamChannel"]]
"""How a request gets its upstream channel, only once it needs one."""


@dataclass(frozen=True, slots=True)
class UpstreamFacts:
    """What the upstream declares that a call's plan depends on, gathered before planning
    (`gateway.tasks.facts.FactGatherer`): the planner does no I/O to learn it."""

    has_tasks: bool
    """It has Tasks in the call's era (else the gateway hosts them all)."""
    serves_streams: bool = False
    """It serves `tasks/stream` itself (its tasks capability has `eventStreams`, SEP-2694 native)."""
    tool_support: UpstreamSupport = UpstreamSupport.UNKNOWN
    """What it says of the tasks of the tool a tools/call names (a 2025-11-25 upstream's tools/list
    mark), where the plan depends on it; else UNKNOWN (the upstream decides)."""


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
    def dialect(self) -> Dialect:
        return dialect_of(self.era)


class CallHandoff(Protocol):
    """A forwarded call that becomes a task the gateway hosts if it runs past `deadline` (a 2026-07-28
    tools/call under a task policy). The relay calls it back as the call runs; the task side implements
    it (`gateway.tasks.handoff.TaskHandoff`)."""

    @property
    def deadline(self) -> float:
        """When (time.monotonic()) a call still running becomes a task; math.inf once none can be."""
        ...

    def observe(self, messages: list[Message]) -> list[Message]:
        """Keep what the upstream sent before its answer (the task's first events); returns the
        messages the client sees now (the notifications it asked for)."""
        ...

    async def take_over(self, exchange: Exchange) -> Message | None:
        """At the deadline: a task takes the exchange over; the client's answer. None (decided without
        waiting): no task can be made, the call carries on as a plain call and its deadline is gone."""
        ...


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
    handoff: CallHandoff | None = None
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
    """tasks/stream: deliver the task's log from `first_seq` on, replay then live, then the final message
    (`gateway.edge.task_routes.stream_events`)."""

    log: EventLog
    task_id: str
    first_seq: int
    stop: asyncio.Event
    """Set when the client cancels the stream (or its session ends)."""
    request: Message
    era: Era
    keepalive_s: float
    replay_batch: int
    """Events read (and written) at once."""
    flush_interval_s: float
    """A live stream writes at most once per interval."""
    recorded_end: asyncio.Event | None = None
    """Set once the task's record shows its end (the task's `done`, when this process runs it): the
    final message waits for it, so a client that reads the end and then asks `tasks/get` sees it."""
    draining: asyncio.Event | None = None
    """Set when this replica begins draining (`gateway.drain`): the stream ends with its normal empty
    result after its last complete event, for its reader to resume with `after` on another replica."""


class ResultWait(Protocol):
    """What the edge waits on for a legacy tasks/result (`gateway.tasks.result_wait.TaskResultWait`)."""

    async def next(self, wait_s: float) -> tuple[list[Message], Message | None]:
        """The task's requests to carry to the client now, or the final answer; ([], None) when
        `wait_s` passed with neither (time for a keep-alive)."""
        ...


@dataclass(frozen=True)
class AwaitResult:
    """Legacy tasks/result of a task still running: keep-alives while `wait` waits, the task's requests
    to the client as they come (only where it runs), then the exact outcome from the store."""

    wait: ResultWait


Plan = Reply | Forward | StreamEvents | AwaitResult
