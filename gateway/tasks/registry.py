"""The task registry: the tasks this process runs or watches, their records, and their lifetime.

A task's record (`TaskRecord`: owner, status, times, outcome summary) lives in a `TaskStore`; the
registry writes every change through it and keeps, per task, only what this process needs to drive
it (`Task`: the record as last written here, asyncio primitives, pending input, the upstream call).
A task belongs to the caller that created it (`owner`), never to a transport session, so any later
session of the same caller can get, stream, fetch and cancel it, and another caller cannot even learn
that it exists. What happens to a task is fed to `feed`: the lifecycle table (`gateway.tasks.lifecycle`)
decides, and the registry carries out its record and log commands: the lifecycle events in one log
call (sealing the log when the status is terminal), then the status by compare-and-set on the store,
so no reader sees the new status without its events; a terminal outcome is kept within `[retention]
max_result_bytes`. All outcomes this process kept together stay within `results_budget_bytes`: the
oldest are evicted first, each eviction recorded in its task's log. Tasks are dropped when their TTL
runs out; their event logs `terminal_retention_s` after they end (whichever comes first), leaving the
log's tombstone. The log trims itself per task (count and age). A process starting on a durable store
rebuilds this bookkeeping from the store's live records (`rebuild`): the task counts, the kept
outcomes in the order their tasks ended, and when each ended task's log goes.

Store faults are events of a task's life too. A write the store cannot take (`StoreUnavailable`) is
held and retried (`gateway.tasks.outage`) while the task runs on; a task whose writes cannot be held
until the store returns is failed (`store_unavailable`), and that end is written when it does. A
gateway-hosted task left without a live runner (`Task.runner`) is failed (`runner_lost`) by the
periodic orphan check. Every task that fails logs one line saying why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from gateway import telemetry
from gateway.config import RetentionConfig, StoreConfig, TasksConfig
from gateway.events.capture import Capture, TaskEvent
from gateway.events.log import EventLog, LogSealed, StoreUnavailable
from gateway.events.summaries import call_audit, summarize_outcome
from gateway.metrics import Metrics
from gateway.principal import ANONYMOUS as ANONYMOUS  # the owner of every call without auth
from gateway.principal import route_of
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.lifecycle import Command, Event, Kind, LifecycleError, Phase, Transition, phase_of, step
from gateway.tasks.outage import HeldWrites, Step
from gateway.tasks.records import RecordView, TaskRecord, TaskStatus, UpstreamTaskRef, iso_now
from gateway.tasks.store import InvalidCursor, LiveRecord, TaskPage, TaskStore

if TYPE_CHECKING:
    from gateway.tasks.watch import UpstreamTask

log = logging.getLogger("gateway.tasks")

RESULT_TOO_LARGE = "result_too_large"
"""`data.reason` of the error kept instead of a result larger than `[retention] max_result_bytes`."""
RESULT_EVICTED = "result_evicted"
"""`data.reason` of the error kept instead of a result evicted to stay within `results_budget_bytes`."""
OUTCOME_OVERHEAD_BYTES = 1024
"""What a kept outcome may add to `max_result_bytes`: the `{"result": …}` wrapper, or the error kept
instead of a result too large or evicted."""
SUMMARY_LIMIT_BYTES = 1024
"""The largest outcome summary a record keeps (bytes of JSON): a record lives as long as its task, and
a summary grows with the result's content blocks and error message."""

MAX_CURSOR_DIGITS = 19
"""A `tasks/list` cursor is a decimal number of at most this many digits (any signed 64-bit number)."""
STORE_UNAVAILABLE = "store_unavailable"
"""`data.reason` of a task failed because the store could not take its writes in time; also of the
503 answered to requests that need the store while it is down."""
RUNNER_LOST = "runner_lost"
"""`data.reason` of a gateway-hosted task failed by the orphan check: nothing in this process ran it."""
ORPHAN_CHECK_S = 5.0
"""How often the orphan check looks at this process's tasks; a task is failed when two checks in a
row found it without a live runner (so one just created, its run about to start, is never taken)."""

StatusListener = Callable[["Task"], Awaitable[None]]
InputListener = Callable[["Task", "PendingRequest"], Awaitable[None]]
"""Offers a legacy task's server-to-client request to the client on the owning session's GET stream,
if it has one (setting `carried_by`); otherwise the request waits for a `tasks/result` stream."""


@dataclass(eq=False)
class PendingRequest:
    """A server-to-client request (elicitation, sampling, ...) a legacy task's upstream call waits on."""

    request: Message
    """As the client receives it: the upstream's id, with the related-task `_meta` added."""
    carried_by: Callable[[], bool] | None = None
    """Whether the stream that carried it to the client is still open (None: not delivered yet)."""
    forget: list[Callable[[], None]] = field(default_factory=list)
    """Undo what delivering it registered (the response routes on sessions), once it is settled."""

    @property
    def id(self) -> RequestId:
        request_id: RequestId = self.request["id"]
        return request_id

    @property
    def delivered(self) -> bool:
        return self.carried_by is not None and self.carried_by()

    def settle(self) -> None:
        for forget in self.forget:
            forget()
        self.forget.clear()


@dataclass(eq=False)
class InputRound:
    """One 2026-07-28 `input_required` round of a task's upstream call, answered with `tasks/update`."""

    requests: dict[str, Any]
    """The upstream's `inputRequests` under the keys the client sees (unique over the task's life)."""
    upstream_keys: dict[str, str]
    """Client-facing key -> the upstream's key for this round."""
    responses: dict[str, Any] = field(default_factory=dict)
    """Answers so far, by client-facing key."""
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every request of the round has an answer: the gateway retries the call upstream."""

    @property
    def outstanding(self) -> dict[str, Any]:
        return {key: request for key, request in self.requests.items() if key not in self.responses}


@dataclass(eq=False, kw_only=True)
class TaskRuntime:
    """What only the process driving a task holds: waiters, hooks, pending input, the upstream side.
    Nothing here is persisted, and nothing here is a status: that is the task's `phase`."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the task is terminal here (the lifecycle's `WAKE_WAITERS`)."""
    cancel: Callable[[], Awaitable[None]] | None = None
    """Stops what runs the task here (the lifecycle's `CANCEL_UPSTREAM`), taken once."""
    on_status: StatusListener | None = None
    on_input: InputListener | None = None
    pending_requests: dict[RequestId, PendingRequest] = field(default_factory=dict)
    """Legacy: the upstream's server-to-client requests still waiting for the client's response."""
    undelivered: asyncio.Event = field(default_factory=asyncio.Event)
    """Legacy: set while a pending request waits for a `tasks/result` stream to carry it."""
    result_streams: int = 0
    """Legacy: open `tasks/result` requests for this task (they carry its requests to the client)."""
    input_round: InputRound | None = None
    """Modern: the current `input_required` round, if any."""
    input_keys: set[str] = field(default_factory=set)
    """Modern: every input key the task has shown a client, so a later round never reuses one."""
    upstream: UpstreamTask | None = None
    """For a task the upstream hosts: the pass-through watcher's state (its conversation, what was
    last observed); the record's `upstream` says where it lives."""
    runner: asyncio.Future[None] | None = None
    """For a gateway-hosted task: what runs it here (the hosted runner); the orphan check fails a
    running task whose runner is missing or done."""


@dataclass(eq=False)
class Task(TaskRuntime, RecordView):
    """This process's handle on a task it runs or watches: the record as last written here (through
    the registry, the only writer), its lifecycle phase, and the runtime that drives it."""

    record: TaskRecord
    phase: Phase = Phase.NEW
    """Where the task stands in the lifecycle table (its record shows the status of the phase, or
    the status before an in-between pass-through phase)."""
    kept_outcome: bytes | None = None
    """Once terminal, the outcome as this process stored it (the upstream's final answer for the call
    as the JSON `{"result": …}` or `{"error": …}`, the same bytes the store keeps)."""

    @property
    def kind(self) -> Kind:
        return Kind.HOSTED if self.record.upstream is None else Kind.PASSTHROUGH

    @property
    def outcome(self) -> Message | None:
        """The kept outcome (`{"result": …}` or `{"error": …}`), decoded afresh for each use."""
        return None if self.kept_outcome is None else orjson.loads(self.kept_outcome)

    def settle_input(self) -> None:
        """The task ended: its pending requests will never be answered upstream."""
        for pending in self.pending_requests.values():
            pending.settle()
        self.pending_requests.clear()
        self.undelivered.clear()

    @property
    def input_requests(self) -> dict[str, Any]:
        """Modern: the current round's requests still waiting for an answer."""
        return self.input_round.outstanding if self.input_round is not None else {}


def failure_reason(outcome: Message | None) -> str:
    """A failed task's reason for the log: its error's `data.reason` (e.g. "request_timeout",
    "owner_lost"), else "error" for an error outcome, "tool_error" for a result (isError)."""
    error = outcome.get("error") if outcome is not None else None
    if not isinstance(error, dict):
        return "tool_error" if outcome is not None and "result" in outcome else "error"
    data = error.get("data")
    reason = data.get("reason") if isinstance(data, dict) else None
    return reason if isinstance(reason, str) else "error"


class TaskLimitReached(Exception):
    """No task can be created: the caller holds `max_tasks_per_owner`, or (`total`) the gateway holds
    `max_tasks_total`."""

    def __init__(self, message: str, *, total: bool) -> None:
        super().__init__(message)
        self.total = total


class TaskRegistry:
    def __init__(
        self,
        config: TasksConfig,
        retention: RetentionConfig,
        store: TaskStore,
        event_log: EventLog,
        capture: Capture,
        metrics: Metrics,
        *,
        record_events: bool = True,
        outage: StoreConfig | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._record_events = record_events
        self.retention = retention
        """`[retention]`: what outcomes and ended tasks' logs are kept (replaced on a config reload)."""
        self.store = store
        self.log = event_log
        self.capture = capture
        self._tasks: dict[str, Task] = {}
        """The tasks this process runs or watches, by id."""
        self._counted: dict[str, str] = {}
        """Every live record this process counts (created, taken over, or found at start), id -> owner:
        `max_tasks_total` bounds them, and only these are uncounted when their record expires."""
        self._per_owner: collections.Counter[str] = collections.Counter()
        """Owner -> how many of `_counted` are theirs (`max_tasks_per_owner`)."""
        self._log_expiry: dict[str, float] = {}
        """Ended task id -> when (monotonic) its log is deleted."""
        self._kept: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Tasks whose record keeps an outcome, in the order they ended, and each outcome's size (bytes)."""
        self.kept_bytes = 0
        """The bytes of every kept outcome together: at most `[retention] results_budget_bytes`."""
        self._orphans: set[str] = set()
        """Running hosted tasks the last orphan check found without a live runner here."""
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        outage = outage or StoreConfig()
        self.writes = HeldWrites(outage.outage_buffer_bytes, outage.outage_hold_s, metrics, self._fail_held)
        """The writes of tasks the store could not take yet, retried until it does."""
        self.upstream_of_tool: Callable[[str], str | None] = lambda _tool: None
        """The upstream a tool of the aggregate endpoint is (set with several upstreams)."""

    def __len__(self) -> int:
        """The tasks this process holds: every live record it counts against `max_tasks_total`."""
        return len(self._counted)

    async def create(
        self,
        owner: str,
        tool: str,
        requested_ttl_ms: object,
        *,
        dialect: str,
        task_id: str | None = None,
        poll_interval_ms: int | None = None,
        created_at: str | None = None,
        upstream: UpstreamTaskRef | None = None,
        arguments: object = None,
        **created: Any,
    ) -> Task:
        """A new task in `dialect` (an era's protocol version; id minted here unless the upstream's
        namespaced `task_id` is given, times now unless the upstream's `created_at`), and its log,
        whose `task.created` event records `owner` and a digest of the tool call's `arguments`."""
        self.check_room(owner)
        ttl = self._config.default_ttl_ms
        if isinstance(requested_ttl_ms, int) and not isinstance(requested_ttl_ms, bool) and requested_ttl_ms > 0:
            ttl = min(requested_ttl_ms, self._config.max_ttl_ms)
        created_at = created_at or iso_now()
        record = TaskRecord(
            id=task_id or secrets.token_hex(16),
            owner=owner,
            tool=tool,
            dialect=dialect,
            ttl_ms=ttl,
            poll_interval_ms=poll_interval_ms or self._config.poll_interval_ms,
            created_at=created_at,
            last_updated_at=created_at,
            expires_at=time.time() + ttl / 1000,
            upstream=upstream,
        )
        # Counted before the first await, so that concurrent creations cannot all pass `check_room`.
        self._count(record)
        try:
            await self.store.create(record)  # StoreUnavailable: no task was made (the caller gets 503)
        except BaseException:
            self._uncount(record.id)
            raise
        # Known here before the next await: a shared store leases the task as `create` returns, and a
        # lease tick releases the leases of tasks the registry does not know.
        task = Task(record)
        task.phase = step(task.phase, Event.CREATED, task.kind).phase
        self._tasks[task.id] = task
        telemetry.task_started(task.id, tool, task.status.value)
        # The record exists: from here on the store's faults are held like any write of a running task.
        await self.writes.write(task.id, 0, lambda: self.log.create(task.id))
        payload = {"tool": tool, "status": task.status.value, "era": dialect, **created}
        if (named := self.upstream_of(record)) is not None:
            payload["upstream"] = named
        lifecycle = TaskEvent(self.capture.event_type("task.created"), payload, call_audit(owner, arguments))
        await self.record(task, lifecycle)
        return task

    def upstream_of(self, record: TaskRecord) -> str | None:
        """The upstream whose tool the task runs, with several upstreams (None with one): the one whose
        own endpoint made it, or the one the aggregate's prefixed tool name names. Its events say so,
        and only its `upstream`-scoped capture rules apply."""
        return route_of(record.owner) or self.upstream_of_tool(record.tool)

    def runs_on(self, upstream: str, upstream_of_tool: Callable[[str], str | None]) -> bool:
        """Whether a task this process holds runs on `upstream` unfinished: one its own endpoint made, or
        one of the aggregate whose tool `upstream_of_tool` says is its (a removed upstream waits for them)."""
        return any(
            not task.terminal and (route_of(task.record.owner) or upstream_of_tool(task.record.tool)) == upstream
            for task in self._tasks.values()
        )

    def capture_from(self, task: Task, message: Message) -> TaskEvent | None:
        """The event an upstream notification of `task` maps to (`Capture.from_notification`)."""
        return self.capture.from_notification(message, self.upstream_of(task.record))

    async def adopt_unfinished(self) -> list[Task]:
        """The tasks a previous process on these stores left unfinished, each now this process's
        `Task` (counted for its owner), for the caller to fail or watch again. Once, before serving."""
        return [self.adopt(record) for record in await self.store.unfinished()]

    def adopt(self, record: TaskRecord) -> Task:
        """A task another process left unfinished, now this process's (counted for its owner)."""
        task = self._tasks[record.id] = Task(record, phase_of(record.status))
        self._count(record)
        return task

    def release(self, task_id: str) -> Task | None:
        """Stop holding a task here without writing anything (another replica took it over)."""
        task = self._tasks.pop(task_id, None)
        if task is not None:
            self._uncount(task_id)
            self._log_expiry.pop(task_id, None)
            self._forget_outcome(task_id)
            self._orphans.discard(task_id)
            task.settle_input()
        return task

    async def rebuild(self) -> None:
        """Count what a previous process on these stores left, as that process would have counted it:
        every live record towards the task limits, the outcomes kept by ended tasks (oldest ended
        first) towards the results budget, and each ended task's log to be deleted
        `terminal_retention_s` after it ended. Once, before serving, on a store this process alone uses."""
        ended: list[tuple[float, LiveRecord]] = []
        for live in await self.store.live():
            self._count(live.record)
            if live.record.terminal:
                ended.append((ended_at(live.record), live))
        wall, monotonic = time.time(), time.monotonic()
        evicted: list[tuple[str, int]] = []
        for at, live in sorted(ended, key=lambda pair: pair[0]):
            retention_left = at + self.retention.terminal_retention_s - wall
            self._log_expiry[live.record.id] = monotonic + max(retention_left, 0.0)
            if live.outcome_bytes is not None:
                evicted += await self._keep(live.record.id, live.outcome_bytes)
        await self._record_evictions(evicted)

    def _count(self, record: TaskRecord) -> None:
        if record.id not in self._counted:
            self._counted[record.id] = record.owner
            self._per_owner[record.owner] += 1

    def _uncount(self, task_id: str) -> None:
        owner = self._counted.pop(task_id, None)
        if owner is not None:
            self._per_owner[owner] -= 1
            if not self._per_owner[owner]:
                del self._per_owner[owner]

    def check_room(self, owner: str) -> None:
        """Raise TaskLimitReached unless `owner` may create one more task."""
        if len(self._counted) >= self._config.max_tasks_total:
            raise TaskLimitReached(f"the gateway holds its maximum of {self._config.max_tasks_total} tasks", total=True)
        if self._per_owner[owner] >= self._config.max_tasks_per_owner:
            raise TaskLimitReached(f"the caller already holds {self._config.max_tasks_per_owner} tasks", total=False)

    def get(self, owner: str, task_id: object) -> Task | None:
        """The caller's task, or None: unknown and foreign ids look the same."""
        task = self.find(task_id)
        return task if task is not None and task.owner == owner else None

    def find(self, task_id: object) -> Task | None:
        """Any caller's task: only for the gateway's own bookkeeping, never to answer a client."""
        return self._tasks.get(task_id) if isinstance(task_id, str) else None

    async def list_owned(self, owner: str, cursor: str | None) -> TaskPage:
        """A page of the caller's task records from the store (InvalidCursor for a cursor it never gave)."""
        # Every store's cursors are decimal numbers of a few digits: anything else is refused here, before
        # int() would raise on a Unicode digit or a number past its 4,300-digit limit.
        if cursor is not None and not (cursor.isascii() and cursor.isdigit() and len(cursor) <= MAX_CURSOR_DIGITS):
            raise InvalidCursor("not a cursor of this gateway")
        return await self.store.list_owned(owner, cursor, self._config.page_size)

    async def record(self, task: Task, *events: TaskEvent, epilogue: bool = False) -> None:
        """Append `events` to the task's log; dropped once the log is sealed (the task ended: the stream
        is over) or deleted, unless an `epilogue` (the gateway's note on an ended task's kept result)."""
        await self._record(task.id, events, epilogue=epilogue)

    async def _record(self, task_id: str, events: tuple[TaskEvent, ...], *, epilogue: bool) -> None:
        if not self._record_events:  # [events] enabled = false: nothing is kept
            return
        try:
            await self._append(task_id, [self.capture.encode(event) for event in events], epilogue=epilogue)
        except LogSealed:
            log.debug("event not recorded: the task's log is sealed", extra={"task": task_id})

    async def _append(self, task_id: str, bodies: list[bytes], *, seal: bool = False, epilogue: bool = False) -> None:
        """Append now, or hold the append while the store takes no writes (LogSealed only if now)."""
        size = sum(len(body) for body in bodies)
        await self.writes.write(task_id, size, self._append_step(task_id, bodies, seal=seal, epilogue=epilogue))

    def _append_step(self, task_id: str, bodies: list[bytes], *, seal: bool, epilogue: bool) -> Step:
        """The append and the record's `next_seq` after it, as one step that resumes where it failed. Its
        key makes a retry after an unknown outcome (a Redis command run after the client gave up) answer
        the first append's seq instead of appending twice."""
        key = secrets.token_hex(8)
        first: int | None = None

        async def step() -> None:
            nonlocal first
            if first is None:
                first = await self.log.append(task_id, bodies, seal=seal, epilogue=epilogue, key=key)
            await self.store.advance_next_seq(task_id, first + len(bodies))

        return step

    def _held_append(self, task_id: str, bodies: list[bytes], *, seal: bool) -> Step:
        """`_append_step` for a write that may be held: a log sealed or deleted meanwhile drops it."""
        append = self._append_step(task_id, bodies, seal=seal, epilogue=False)

        async def step() -> None:
            with contextlib.suppress(LogSealed):
                await append()

        return step

    async def feed(
        self,
        task: Task,
        event: Event,
        told: TaskStatus | None = None,
        message: str | None = None,
        *,
        outcome: Message | None = None,
        updated_at: str | None = None,
        reason: str | None = None,
        note: TaskEvent | None = None,
    ) -> Transition | None:
        """`event` happened to `task` (`told`: the status it tells): the lifecycle table decides, and
        the registry carries out the record and log commands (the driver the others, such as
        `FETCH_OUTCOME`). The transition made; None when nothing changed (the table ignores the event
        there, or refuses it: logged; or another writer changed the status first).

        A status change is written at `updated_at` (the upstream's time for a task it hosts, else now).
        A terminal `outcome` is kept within `max_result_bytes` and, evicting the oldest kept outcomes,
        `results_budget_bytes`. `reason` (why the gateway failed it) goes into the `task.status` event,
        after `note` (the event's own entry, `APPEND_EVENT`). While the store takes no writes the
        change is held (`writes`): this process sees the new status at once, the store when it takes
        writes again."""
        transition = self._decide(task, event, told)
        if transition is None or not transition.changes:
            return None
        status = (transition.phase.status or told) if Command.WRITE_RECORD in transition.commands else None
        task.phase = transition.phase  # decided before any await: of two racing events, one wins
        if status is None:
            return transition
        hook = task.cancel if Command.CANCEL_UPSTREAM in transition.commands else None
        notes = [note] if note is not None and Command.APPEND_EVENT in transition.commands else []
        written = await self._write_status(task, status, message, outcome, updated_at, reason, notes)
        if hook is not None:  # decided: stopped even when another writer ended the task first
            await hook()
        return transition if written else None

    def _decide(self, task: Task, event: Event, told: TaskStatus | None = None) -> Transition | None:
        """The table's transition; None (logged and counted, nothing changes) when it does not allow the event."""
        try:
            return step(task.phase, event, task.kind, told)
        except LifecycleError as error:
            log.warning("lifecycle: event refused", extra={"task": task.id, "error": str(error)})
            self._metrics.lifecycle_refusals.labels(event=event.value).inc()
            return None

    async def _write_status(
        self,
        task: Task,
        status: TaskStatus,
        message: str | None,
        outcome: Message | None,
        updated_at: str | None,
        reason: str | None,
        notes: list[TaskEvent],
    ) -> bool:
        """The status change the table decided: its events, the record, and once terminal the kept
        outcome and the task's waiters. False when another writer changed the status first."""
        kept, encoded = None, None
        if status.terminal and outcome is not None:
            kept, encoded = bounded(outcome, self.retention.max_result_bytes)
        summary = summarize_outcome(status.value, kept) if status.terminal else None
        bodies = [self.capture.encode(note) for note in notes] if self._record_events else []
        bodies += self._status_bodies(status, message, summary, reason)
        # The events (and, once terminal, the seal) in one log call, before the status changes: no
        # reader sees the new status without its events, or the stream's end without the last event.
        # A log that retention deleted takes none: the record still changes.
        append = self._held_append(task.id, bodies, seal=status.terminal)
        await self.writes.write(task.id, sum(map(len, bodies)), append)
        updated_at = updated_at or iso_now()
        kept_summary = summary if summary is None else bounded_summary(summary)
        update = self._update_step(task, task.status, status, message, updated_at, encoded, kept_summary)
        previous = task.record
        if await self.writes.write(task.id, len(encoded or b""), update):  # held too if the append was
            if task.record is previous:
                return False  # another writer changed the status first
        else:  # held: this process goes on from the status the store will have
            task.record = dataclasses.replace(
                task.record,
                status=status,
                status_message=message,
                last_updated_at=updated_at,
                outcome_summary=kept_summary,
            )
        if status is TaskStatus.FAILED:
            log.warning(
                "task failed", extra={"task": task.id, "reason": reason or failure_reason(outcome), "detail": message}
            )
        evicted: list[tuple[str, int]] = []
        if summary is not None:  # terminal
            task.cancel = None  # nothing left to cancel; and it must not hold the finished call alive
            if encoded is not None:
                if kept is not outcome:
                    self._metrics.results_dropped.labels(reason=RESULT_TOO_LARGE).inc()
                task.kept_outcome = encoded
                evicted = await self._keep(task.id, len(encoded))
            self._wind_down(task)
        telemetry.task_status(task.id, status.value, terminal=status.terminal)
        if task.on_status is not None:
            await task.on_status(task)
        await self._record_evictions(evicted)
        return True

    def _wind_down(self, task: Task) -> None:
        """`WAKE_WAITERS`: the task ended here; its input is settled, its log's deletion is due."""
        task.settle_input()
        self._log_expiry[task.id] = time.monotonic() + self.retention.terminal_retention_s
        task.done.set()

    def _status_bodies(
        self, status: TaskStatus, message: str | None, summary: dict[str, Any] | None, reason: str | None
    ) -> list[bytes]:
        """The events of a status change: `task.status`, and `task.terminal` once terminal."""
        if not self._record_events:
            return []
        detail: dict[str, Any] = {"statusMessage": message} if message is not None else {}
        if reason is not None:
            detail["reason"] = reason
        events = [self.capture.lifecycle("task.status", status=status.value, **detail)]
        if summary is not None:
            events.append(self.capture.lifecycle("task.terminal", **summary))
        return [self.capture.encode(event) for event in events]

    def _update_step(
        self,
        task: Task,
        expected: TaskStatus,
        status: TaskStatus,
        message: str | None,
        updated_at: str,
        outcome: bytes | None,
        summary: dict[str, Any] | None,
    ) -> Step:
        """The status change in the store (compare-and-set on `expected`); the task's record as written."""

        async def step() -> None:
            record = await self.store.update_status(
                task.id, expected, status, message, updated_at, outcome=outcome, outcome_summary=summary
            )
            if record is not None:
                task.record = record
            elif self.writes.holds(task.id):
                log.warning("a held status change was refused: the task changed meanwhile", extra={"task": task.id})

        return step

    def _fail_held(self, task_id: str, why: str) -> list[tuple[Step, int]]:
        """The store could not take a task's writes in time (`HeldWrites`): it ends `failed` here now,
        and the steps returned write that end (after whatever status the store has) once it takes
        writes again; the run is cancelled."""
        task = self._tasks.get(task_id)
        if task is None:
            return []
        transition = self._decide(task, Event.STORE_FAULT)
        if transition is None:
            return []
        task.phase = transition.phase
        cause = f"the task store could not take the task's writes: {why}"
        kept, encoded = bounded(store_unavailable_outcome(cause), self.retention.max_result_bytes)
        summary = summarize_outcome(TaskStatus.FAILED.value, kept)
        bodies = self._status_bodies(TaskStatus.FAILED, cause, summary, STORE_UNAVAILABLE)
        kept_summary = bounded_summary(summary)
        updated_at = iso_now()

        async def fail_in_store() -> None:
            stored = await self.store.find(task_id)
            if stored is None or stored.terminal:
                return
            await self._update_step(task, stored.status, TaskStatus.FAILED, cause, updated_at, encoded, kept_summary)()

        hook, task.cancel = task.cancel, None
        task.record = dataclasses.replace(
            task.record,
            status=TaskStatus.FAILED,
            status_message=cause,
            last_updated_at=updated_at,
            outcome_summary=kept_summary,
        )
        task.kept_outcome = encoded
        self._wind_down(task)
        self._metrics.tasks_failed.labels(reason=STORE_UNAVAILABLE).inc()
        log.warning("task failed", extra={"task": task_id, "reason": STORE_UNAVAILABLE, "cause": cause})
        if hook is not None:
            self._spawn(hook())
        if task.on_status is not None:
            self._spawn(task.on_status(task))
        size = sum(map(len, bodies)) + len(encoded)
        return [(self._held_append(task_id, bodies, seal=True), size), (fail_in_store, len(encoded))]

    def _spawn(self, work: Awaitable[None]) -> None:
        """Work started outside any request (a cancel hook), kept until done; its failure is logged."""
        future = asyncio.ensure_future(work)
        self._background.add(future)
        future.add_done_callback(self._background_done)

    def _background_done(self, future: asyncio.Future[None]) -> None:
        self._background.discard(future)
        if not future.cancelled() and (error := future.exception()) is not None:
            log.warning("task registry: background work failed", extra={"error": repr(error)})

    async def check_orphans(self) -> None:
        """Fail (`runner_lost`) every running gateway-hosted task found without a live runner here by
        this check and the one before."""
        for task in list(self._tasks.values()):
            if task.terminal or task.record.upstream is not None or self.writes.holds(task.id):
                continue
            alive = task.runner is not None and not task.runner.done()
            if alive or task.id not in self._orphans:
                (self._orphans.discard if alive else self._orphans.add)(task.id)
                continue
            self._orphans.discard(task.id)
            cause = "no runner of the task is left in the gateway process that holds it"
            self._metrics.tasks_failed.labels(reason=RUNNER_LOST).inc()
            await self.feed(
                task, Event.RUNNER_LOST, None, cause, outcome=lost_runner_outcome(cause), reason=RUNNER_LOST
            )

    def orphaned(self, task_id: str) -> bool:
        """The last orphan check found the task without a live runner: this process can no longer run
        it (its lease is no longer renewed, and the next check fails it)."""
        return task_id in self._orphans

    async def _record_evictions(self, evicted: list[tuple[str, int]]) -> None:
        """Note in each evicted task's log that its result was evicted, and how large it was."""
        budget = self.retention.results_budget_bytes
        for victim_id, size in evicted:
            evicted_event = self.capture.lifecycle("result.evicted", size=size, budget=budget)
            await self._record(victim_id, (evicted_event,), epilogue=True)

    async def _keep(self, task_id: str, size: int) -> list[tuple[str, int]]:
        """Count the task's kept outcome (`size` bytes) against the budget, first evicting the oldest
        kept outcomes until it fits; the ids of the tasks evicted, with the bytes each gave up. The
        budget's bookkeeping is done before the first await, so it is never seen half done."""
        budget = self.retention.results_budget_bytes
        evicted: list[tuple[str, int]] = []
        replaced: list[tuple[str, bytes]] = []
        while self._kept and self.kept_bytes + size > budget:
            victim_id, victim_size = self._kept.popitem(last=False)
            self.kept_bytes -= victim_size
            outcome = orjson.dumps(evicted_outcome(victim_size, budget))
            victim = self._tasks.get(victim_id)  # None: a task that ended before this process started
            if victim is not None and self._decide(victim, Event.RESULT_EVICTED) is not None:
                victim.kept_outcome = outcome
            evicted.append((victim_id, victim_size))
            replaced.append((victim_id, outcome))
            self._metrics.results_dropped.labels(reason=RESULT_EVICTED).inc()
        self._kept[task_id] = size
        self.kept_bytes += size
        self._metrics.kept_result_bytes.set(self.kept_bytes)
        for victim_id, outcome in replaced:
            try:
                await self.store.replace_outcome(victim_id, outcome)
            except StoreUnavailable:  # the store keeps the victim's result a while longer: no harm
                log.warning("an evicted result stays in the store: it takes no writes", extra={"task": victim_id})
        return evicted

    def _forget_outcome(self, task_id: str) -> None:
        size = self._kept.pop(task_id, None)
        if size is not None:
            self.kept_bytes -= size
            self._metrics.kept_result_bytes.set(self.kept_bytes)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="task-sweeper")

    async def _sweep(self) -> None:
        checked = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.sweep_once()
                if time.monotonic() - checked >= ORPHAN_CHECK_S:
                    checked = time.monotonic()
                    await self.check_orphans()
            except StoreUnavailable:  # the next sweep tries again; held writes are retried on their own
                continue

    async def sweep_once(self) -> None:
        now = time.monotonic()
        for task_id, at in list(self._log_expiry.items()):
            if at <= now:
                del self._log_expiry[task_id]
                await self.log.delete(task_id)
        for record in await self.store.expire(time.time()):
            # A shared store hands over records other replicas created too: only ours were counted.
            self._uncount(record.id)
            self._log_expiry.pop(record.id, None)
            self._forget_outcome(record.id)
            task = self._tasks.pop(record.id, None)
            self._orphans.discard(record.id)
            if task is not None:
                task.settle_input()
                if task.cancel is not None and not task.terminal:
                    await task.cancel()
            await self.log.delete(record.id)
            log.info("task expired", extra={"task": record.id})

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.writes.stop()
        for future in list(self._background):
            future.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


def ended_at(record: TaskRecord) -> float:
    """When a terminal record's task ended, in wall-clock seconds: its `last_updated_at` (for a task an
    upstream hosts, the upstream's time); now if that is not an ISO 8601 time."""
    try:
        ended = datetime.fromisoformat(record.last_updated_at)
    except ValueError:
        return time.time()
    return (ended if ended.tzinfo is not None else ended.replace(tzinfo=UTC)).timestamp()


def bounded(outcome: Message, limit: int) -> tuple[Message, bytes]:
    """What a record keeps of `outcome`, and its JSON: `{"result": …}` (or `{"error": …}`) if that
    result (or error) serializes to at most `limit` bytes, else an error saying that it exceeded the cap
    (`data.reason` "result_too_large")."""
    key = "error" if "error" in outcome and "result" not in outcome else "result"
    value = orjson.dumps(outcome.get(key))
    if len(value) <= limit:
        return outcome, b'{"%s":%s}' % (key.encode(), value)
    text = f"the task's result ({len(value)} bytes) exceeded the gateway's cap of {limit} bytes and was not kept"
    data = {"reason": RESULT_TOO_LARGE, "size": len(value), "limit": limit}
    kept = {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": text, "data": data}}
    return kept, orjson.dumps(kept)


def store_unavailable_outcome(cause: str) -> Message:
    """The outcome kept for a task failed because the store could not take its writes in time."""
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": cause, "data": {"reason": STORE_UNAVAILABLE}}}


def lost_runner_outcome(cause: str) -> Message:
    """The outcome kept for a task the orphan check failed (`data.reason` "runner_lost")."""
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": cause, "data": {"reason": RUNNER_LOST}}}


def outcome_cap(retention: RetentionConfig) -> int:
    """The largest outcome a `TaskStore` must keep: what `bounded` can produce at most."""
    return retention.max_result_bytes + OUTCOME_OVERHEAD_BYTES


def evicted_outcome(size: int, budget: int) -> Message:
    """The error kept instead of a result evicted to make room for newer ones (`data.reason` "result_evicted")."""
    text = (
        f"the task's result ({size} bytes) was evicted: the gateway keeps at most {budget} bytes of task "
        "results, and this was among the oldest"
    )
    data = {"reason": RESULT_EVICTED, "size": size, "budget": budget}
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": text, "data": data}}


def bounded_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of a terminal summary: all of it within `SUMMARY_LIMIT_BYTES` of JSON, else
    its status and how large it was."""
    size = len(orjson.dumps(summary))
    if size <= SUMMARY_LIMIT_BYTES:
        return summary
    return {"status": summary["status"], "omitted": {"size": size, "limit": SUMMARY_LIMIT_BYTES}}
