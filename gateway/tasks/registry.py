"""The task registry: every task the gateway knows, its owner, status and outcome, and its lifetime.

A task belongs to the caller that created it (`owner`), never to a transport session, so any later
session of the same caller can get, stream, fetch and cancel it, and another caller cannot even learn
that it exists. Status changes go through `set_status`, which records the lifecycle event in the
task's log before anyone can observe the new status, and keeps a terminal outcome within
`[retention] max_result_bytes`. All kept outcomes together stay within `results_budget_bytes`: the
oldest are evicted first, each eviction recorded in its task's log. Tasks are dropped when their TTL
runs out; their event logs `terminal_retention_s` after they end (whichever comes first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.config import RetentionConfig, TasksConfig
from gateway.events.capture import Capture, TaskEvent
from gateway.events.log import EventLog, LogBounds
from gateway.events.summaries import summarize_outcome
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId

log = logging.getLogger("gateway.tasks")

RESULT_TOO_LARGE = "result_too_large"
"""`data.reason` of the error kept instead of a result larger than `[retention] max_result_bytes`."""
RESULT_EVICTED = "result_evicted"
"""`data.reason` of the error kept instead of a result evicted to stay within `results_budget_bytes`."""

ANONYMOUS = "anonymous"
"""The caller until authentication exists: every task carries an owner so auth only fills it in."""


class TaskStatus(enum.StrEnum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
    request_state: Any = None
    responses: dict[str, Any] = field(default_factory=dict)
    """Answers so far, by client-facing key."""
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every request of the round has an answer: the gateway retries the call upstream."""

    @property
    def outstanding(self) -> dict[str, Any]:
        return {key: request for key, request in self.requests.items() if key not in self.responses}


@dataclass(eq=False)
class Task:
    id: str
    owner: str
    tool: str
    ttl_ms: int
    poll_interval_ms: int
    status: TaskStatus = TaskStatus.WORKING
    status_message: str | None = None
    created_at: str = field(default_factory=iso_now)
    last_updated_at: str = ""
    kept_outcome: bytes | None = None
    """Once terminal, the upstream's final answer for the call as the JSON `{"result": …}` or
    `{"error": …}`: kept encoded, so what the results budget counts is what it costs."""
    expires_at: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel: Callable[[], Awaitable[None]] | None = None
    on_status: StatusListener | None = None
    deleted_log_next_seq: int = 0
    log_deleted: bool = False
    open_streams: int = 0
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
    upstream: Any = None
    """For a task the upstream hosts: what the gateway knows of it there (a `passthrough.UpstreamTask`)."""

    def __post_init__(self) -> None:
        self.last_updated_at = self.last_updated_at or self.created_at
        self.expires_at = time.monotonic() + self.ttl_ms / 1000

    @property
    def terminal(self) -> bool:
        return self.status.terminal

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
        event_log: EventLog,
        capture: Capture,
        metrics: Metrics,
        *,
        record_events: bool = True,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._record_events = record_events
        self._retention = retention
        self.log = event_log
        self.capture = capture
        self._tasks: dict[str, Task] = {}
        self._per_owner: collections.Counter[str] = collections.Counter()
        self._log_expiry: dict[str, float] = {}
        self._kept: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Tasks whose record keeps an outcome, in the order they ended, and each outcome's size (bytes)."""
        self.kept_bytes = 0
        """The bytes of every kept outcome together: at most `[retention] results_budget_bytes`."""
        self._sweeper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    async def create(
        self,
        owner: str,
        tool: str,
        requested_ttl_ms: object,
        *,
        task_id: str | None = None,
        poll_interval_ms: int | None = None,
        **created: Any,
    ) -> Task:
        """A new task (id minted here unless the upstream's namespaced `task_id` is given) and its log."""
        self.check_room(owner)
        ttl = self._config.default_ttl_ms
        if isinstance(requested_ttl_ms, int) and not isinstance(requested_ttl_ms, bool) and requested_ttl_ms > 0:
            ttl = min(requested_ttl_ms, self._config.max_ttl_ms)
        task = Task(
            task_id or secrets.token_hex(16), owner, tool, ttl, poll_interval_ms or self._config.poll_interval_ms
        )
        self._tasks[task.id] = task
        self._per_owner[owner] += 1
        await self.log.create(task.id)
        await self.record(task, self.capture.lifecycle("task.created", tool=tool, status=task.status.value, **created))
        return task

    def check_room(self, owner: str) -> None:
        """Raise TaskLimitReached unless `owner` may create one more task."""
        if len(self._tasks) >= self._config.max_tasks_total:
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

    async def bounds(self, task: Task) -> LogBounds:
        """The task's log bounds; after retention deleted the log, empty but still counting."""
        bounds = await self.log.bounds(task.id)
        return bounds if bounds is not None else LogBounds(None, task.deleted_log_next_seq)

    def owned_by(self, owner: str) -> list[Task]:
        return [task for task in self._tasks.values() if task.owner == owner]

    async def record(self, task: Task, *events: TaskEvent) -> None:
        # With [events] enabled = false nothing is kept; and a deleted log must not restart at seq 0.
        if not self._record_events or task.log_deleted:
            return
        await self.log.append(task.id, [self.capture.encode(event) for event in events])

    async def set_status(
        self,
        task: Task,
        status: TaskStatus,
        message: str | None = None,
        *,
        outcome: Message | None = None,
        updated_at: str | None = None,
    ) -> bool:
        """Move a task to `status` (at `updated_at`, the upstream's time for a task it hosts, else now);
        False when it is already terminal (terminal states never change). A terminal `outcome` is kept
        within `max_result_bytes` and, evicting the oldest kept outcomes, `results_budget_bytes`."""
        if task.terminal:
            return False
        task.status = status
        task.status_message = message
        task.last_updated_at = updated_at or iso_now()
        detail = {"statusMessage": message} if message is not None else {}
        events = [self.capture.lifecycle("task.status", status=status.value, **detail)]
        evicted: list[tuple[Task, int]] = []
        if status.terminal:
            task.cancel = None  # nothing left to cancel; and it must not hold the finished call alive
            kept, evicted = self._keep(task, outcome)
            task.settle_input()
            events.append(self.capture.lifecycle("task.terminal", **summarize_outcome(status.value, kept)))
            self._log_expiry[task.id] = time.monotonic() + self._retention.terminal_retention_s
        # Status first, then the events: a stream that wakes on the append already sees it terminal.
        await self.record(task, *events)
        if status.terminal:
            task.done.set()
        if task.on_status is not None:
            await task.on_status(task)
        budget = self._retention.results_budget_bytes
        for victim, size in evicted:
            await self.record(victim, self.capture.lifecycle("result.evicted", size=size, budget=budget))
        return True

    def _keep(self, task: Task, outcome: Message | None) -> tuple[Message | None, list[tuple[Task, int]]]:
        """Keep `task`'s outcome (within `max_result_bytes`), first evicting the oldest kept outcomes
        until it fits the budget; what is kept, and the tasks evicted with the bytes each gave up. No
        await: the budget's bookkeeping is never seen half done."""
        if outcome is None:
            return None, []
        kept, task.kept_outcome = bounded(outcome, self._retention.max_result_bytes)
        if kept is not outcome:
            self._metrics.results_dropped.labels(reason=RESULT_TOO_LARGE).inc()
        size = len(task.kept_outcome)
        budget = self._retention.results_budget_bytes
        evicted: list[tuple[Task, int]] = []
        while self._kept and self.kept_bytes + size > budget:
            victim_id, victim_size = self._kept.popitem(last=False)
            self.kept_bytes -= victim_size
            victim = self._tasks[victim_id]  # expiry forgets a task's kept outcome with the task
            victim.kept_outcome = orjson.dumps(evicted_outcome(victim_size, budget))
            evicted.append((victim, victim_size))
            self._metrics.results_dropped.labels(reason=RESULT_EVICTED).inc()
        self._kept[task.id] = size
        self.kept_bytes += size
        self._metrics.kept_result_bytes.set(self.kept_bytes)
        return kept, evicted

    def _forget_outcome(self, task_id: str) -> None:
        size = self._kept.pop(task_id, None)
        if size is not None:
            self.kept_bytes -= size
            self._metrics.kept_result_bytes.set(self.kept_bytes)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="task-sweeper")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        now = time.monotonic()
        await self.log.trim_older_than(time.time() - self._retention.max_event_age_s)
        for task_id, at in list(self._log_expiry.items()):
            if at <= now:
                del self._log_expiry[task_id]
                await self._delete_log(task_id)
        for task in [task for task in self._tasks.values() if task.expires_at <= now]:
            del self._tasks[task.id]
            self._per_owner[task.owner] -= 1
            self._log_expiry.pop(task.id, None)
            self._forget_outcome(task.id)
            task.log_deleted = True
            task.settle_input()
            if task.cancel is not None and not task.terminal:
                await task.cancel()
            await self.log.delete(task.id)
            log.info("task expired", extra={"task": task.id})

    async def _delete_log(self, task_id: str) -> None:
        task = self._tasks.get(task_id)
        bounds = await self.log.bounds(task_id)
        if task is not None:
            task.log_deleted = True
            task.deleted_log_next_seq = bounds.next_seq if bounds is not None else 0
        await self.log.delete(task_id)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper


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


def evicted_outcome(size: int, budget: int) -> Message:
    """The error kept instead of a result evicted to make room for newer ones (`data.reason` "result_evicted")."""
    text = (
        f"the task's result ({size} bytes) was evicted: the gateway keeps at most {budget} bytes of task "
        "results, and this was among the oldest"
    )
    data = {"reason": RESULT_EVICTED, "size": size, "budget": budget}
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": text, "data": data}}
