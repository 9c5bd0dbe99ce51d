"""A native SEP-2694 server: an MCP server that implements Tasks and ``tasks/stream`` itself.

It is written with the official ``mcp`` SDK (``MCPServer``) alone, imports nothing of the gateway,
and keeps its own in-memory event log per task with bounded retention. It shows what an upstream
that implements "Resumable Task Event Streams" looks like, and is the target the conformance kit
is proven on (``tests/servers/broken_native_server.py`` runs it with one deliberate defect each).

Run it on Streamable HTTP at ``/mcp`` (the default) or on stdio::

    python examples/native_stream_server.py --port 8766 [--host 127.0.0.1]
    python examples/native_stream_server.py --stdio
    python examples/native_stream_server.py --port 8766 --max-events-per-task 5   # overrun it quickly
    python examples/native_stream_server.py --port 8766 --no-retention-fields     # eventStreams: {}

Tools (names and arguments as in ``examples/build_server.py``): ``slow_build(steps=3, delay=0.2)``,
a progress notification and an info log per step, and ``echo(text)``. Every tool may run as a task.

What it serves, per era:

* 2025-11-25 (SEP-1686): ``capabilities.tasks`` with ``eventStreams`` in ``initialize``;
  ``execution.taskSupport: "optional"`` on every tool; a ``tools/call`` with ``params.task`` answers
  ``{"task": Task}`` at once; ``tasks/get``, ``tasks/result``, ``tasks/list``, ``tasks/cancel``.
* 2026-07-28 (SEP-2663): the ``io.modelcontextprotocol/tasks`` extension, advertised with
  ``eventStreams``; a ``tools/call`` from a client that declares it is always a task
  (``resultType: "task"``); ``tasks/get`` (outcome inlined) and ``tasks/cancel``.
* Both: ``tasks/stream`` (SEP-2694). A task's events are ``com.example.native.*``: ``task.created``,
  ``progress`` and ``log`` (what the tool reported), ``task.status`` at every status change.

Who may see a task: the caller's ``Authorization: Bearer <name>`` header names its principal (no
header, or another scheme: ``anonymous``). A task belongs to the principal that created it; for any
other, every ``tasks/*`` request (``tasks/stream`` included) answers exactly as for an unknown id.

SDK hooks used (mcp 2.3 ships no Tasks): an ``Extension`` binds the ``tasks/*`` methods
(``MethodBinding``) and advertises the 2026-07-28 settings; a ``ServerMiddleware`` adds the
2025-11-25 capability and ``taskSupport`` and turns a task-augmented ``tools/call`` into a task,
running the SDK's own ``tools/call`` chain (``call_next``) in a task group the lifespan opened.

The SEP's rules live in ``NativeTasks.stream`` and the small methods it calls; each of those is a
seam the broken variants override, so a defect is one short method, never a copy.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, Extension, MCPServer, MethodBinding, require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, Notification, PaginatedRequestParams, RequestParams
from pydantic import BaseModel, Field
from starlette.requests import Request

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
EVENT_PREFIX = "com.example.native"
"""The vendor prefix of every event type (SEP-2694 reserves unprefixed types for MCP)."""
TERMINAL = frozenset({"completed", "failed", "cancelled"})
EVENTS_GONE = -32010
DEFAULT_TTL_MS = 60_000
MAX_TTL_MS = 3_600_000
POLL_INTERVAL_MS = 500
DISCONNECT_CHECK_S = 0.5
"""How often an idle stream checks whether its client is still there."""
ANONYMOUS = "anonymous"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the event log ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retention:
    """How long and how much of a task's event history is kept (advertised as ``eventStreams``)."""

    max_events_per_task: int = 10_000
    max_event_age_s: float = 3600.0
    terminal_retention_s: float = 600.0
    max_payload_bytes: int = 65_536

    def advertised(self) -> dict[str, int]:
        """The ``eventStreams`` capability: the same field names the gateway advertises."""
        return {
            "maxEventsPerTask": self.max_events_per_task,
            "maxEventAgeMs": round(self.max_event_age_s * 1000),
            "terminalRetentionMs": round(self.terminal_retention_s * 1000),
            "maxPayloadBytes": self.max_payload_bytes,
        }


@dataclass(frozen=True)
class TaskEvent:
    """One immutable entry of a task's event stream."""

    seq: int
    type: str
    payload: dict[str, Any]
    at: float
    """time.monotonic() when recorded, for age-based retention."""


class TaskLog:
    """A task's events: seq from 0 by 1, the oldest dropped by retention, readers woken on growth."""

    def __init__(self, retention: Retention, *, advertise_retention: bool = True) -> None:
        self.retention = retention
        self.advertise_retention = advertise_retention
        self.events: deque[TaskEvent] = deque()
        self.next_seq = 0
        self.ended_at: float | None = None
        """time.monotonic() when the task became terminal (its terminal retention starts)."""
        self.grown = anyio.Event()
        """Set (and replaced) at every append: what a caught-up stream waits on."""

    def append(self, type_: str, payload: dict[str, Any]) -> None:
        size = len(json.dumps(payload, separators=(",", ":")).encode())
        if size > self.retention.max_payload_bytes:  # keep seq gap-free: record that it was left out
            limit = self.retention.max_payload_bytes
            type_, payload = f"{EVENT_PREFIX}.payload.omitted", {"originalType": type_, "size": size, "limit": limit}
        self.events.append(TaskEvent(self.next_seq, type_, payload, time.monotonic()))
        self.next_seq += 1
        self.trim()
        self.grown.set()
        self.grown = anyio.Event()

    def trim(self) -> None:
        """Drop what retention no longer covers (called on every append and read, so no sweeper is needed)."""
        now = time.monotonic()
        if self.ended_at is not None and now - self.ended_at > self.retention.terminal_retention_s:
            self.events.clear()
        while self.events and (
            len(self.events) > self.retention.max_events_per_task
            or now - self.events[0].at > self.retention.max_event_age_s
        ):
            self.events.popleft()

    @property
    def earliest_seq(self) -> int:
        """The oldest retained seq; when nothing is retained, the next seq to be written."""
        self.trim()
        return self.events[0].seq if self.events else self.next_seq

    def read_from(self, seq: int) -> list[TaskEvent]:
        """The retained events with seq >= `seq`, in order."""
        self.trim()
        return [event for event in self.events if event.seq >= seq]


# --- tasks ------------------------------------------------------------------------------------------


@dataclass
class Task:
    """One task: who owns it, its wire state, its outcome and its event log."""

    owner: str
    tool: str
    ttl_ms: int
    log: TaskLog
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: str = "working"
    status_message: str | None = None
    created_at: str = field(default_factory=_now)
    last_updated_at: str = ""
    created: float = field(default_factory=time.monotonic)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at
        self.record("task.created", {"tool": self.tool, "status": self.status})

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def expired(self) -> bool:
        return time.monotonic() - self.created > self.ttl_ms / 1000

    def record(self, name: str, payload: dict[str, Any]) -> None:
        self.log.append(f"{EVENT_PREFIX}.{name}", payload)

    def update(self, status: str, message: str | None = None) -> None:
        """Change status (a terminal task never changes again) and record it as an event."""
        if self.terminal:
            return
        self.status, self.status_message, self.last_updated_at = status, message, _now()
        if self.terminal:
            self.log.ended_at = time.monotonic()
            self.done.set()
        self.record("task.status", {"status": status} | ({"statusMessage": message} if message else {}))

    def cancel(self, message: str) -> None:
        """Stop the tool and end the task ``cancelled``."""
        self.scope.cancel()
        self.update("cancelled", message)

    def wire(self, era: str) -> dict[str, Any]:
        """The Task object: SEP-1686 fields at 2025-11-25; SEP-2663's, with the outcome inlined, at 2026-07-28."""
        out: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        out |= {"createdAt": self.created_at, "lastUpdatedAt": self.last_updated_at}
        if era == LEGACY:
            return out | {"ttl": self.ttl_ms, "pollInterval": POLL_INTERVAL_MS}
        out |= {"ttlMs": self.ttl_ms, "pollIntervalMs": POLL_INTERVAL_MS}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out


CURRENT_TASK: ContextVar[Task | None] = ContextVar("CURRENT_TASK", default=None)
"""The task the running tool belongs to (None when the call runs synchronously)."""


class TaskRef(RequestParams):
    task_id: str


class StreamParams(TaskRef):
    after: Any = Field(default=None)
    """Validated by hand (`_cursor`), so every bad value gets the same clear -32602."""


class EventNotification(Notification[dict[str, Any], str]):
    """``notifications/tasks/event`` (the SDK has no type for it)."""


def principal(ctx: ServerRequestContext[Any, Any]) -> str:
    """The caller: the name in ``Authorization: Bearer <name>``, else anonymous (also on stdio)."""
    headers = getattr(ctx.request, "headers", None)
    scheme, _, name = (headers.get("authorization", "") if headers is not None else "").partition(" ")
    return name.strip() if scheme.lower() == "bearer" and name.strip() else ANONYMOUS


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Hashable:
    """What SEP-2694 calls the connection: the MCP session at 2025-11-25 (the process on stdio);
    at 2026-07-28 on HTTP each POST is its own connection, so the one-stream rule holds by construction."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return "stdio"
    return headers.get("mcp-session-id") or object()


async def client_gone(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the HTTP client of this request has dropped the connection. At 2025-11-25 the SDK neither
    cancels the handler nor fails its writes then, so without this check a dropped stream would stay
    active (and refuse the client's resume on the same session) until its task ended."""
    request = ctx.request
    return isinstance(request, Request) and await request.is_disconnected()


def _cursor(params: StreamParams, task: Task) -> int | None:
    """The validated ``after``: absent is None; present, it must be a non-negative integer (null included)."""
    if "after" not in params.model_fields_set:
        return None
    after = params.after
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise MCPError(INVALID_PARAMS, f"after must be a non-negative integer, got {json.dumps(after)}")
    if after >= task.log.next_seq:
        raise MCPError(INVALID_PARAMS, f"after={after} is beyond the task's last event ({task.log.next_seq - 1})")
    return after


def _requested_ttl(task: Any) -> int:
    if not isinstance(task, dict):
        raise MCPError(INVALID_PARAMS, "params.task must be an object")
    ttl = task.get("ttl", DEFAULT_TTL_MS)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
        raise MCPError(INVALID_PARAMS, "params.task.ttl must be a non-negative integer")
    return min(ttl, MAX_TTL_MS)


def _declares_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return EXTENSION in ((capabilities and capabilities.extensions) or {})


# --- the server's Tasks and tasks/stream -------------------------------------------------------------


class NativeTasks(Extension):
    """Tasks (both eras) and SEP-2694 ``tasks/stream``, with an in-memory log per task."""

    identifier = EXTENSION

    def __init__(self, retention: Retention, *, advertise_retention: bool = True) -> None:
        self.retention = retention
        self.advertise_retention = advertise_retention
        self.tasks: dict[str, Task] = {}
        self.active_streams: set[tuple[Hashable, str]] = set()
        self.group: anyio.abc.TaskGroup | None = None  # set by the server lifespan

    def settings(self) -> dict[str, Any]:
        return {"eventStreams": self.event_streams()}

    def event_streams(self) -> dict[str, Any]:
        """The ``eventStreams`` sub-capability: the retention limits, or nothing (SEP-2694 names no field)."""
        return self.retention.advertised() if self.advertise_retention else {}

    def methods(self) -> Sequence[MethodBinding]:
        legacy, modern = frozenset({LEGACY}), frozenset({MODERN})
        return [
            MethodBinding("tasks/get", TaskRef, self.get),
            MethodBinding("tasks/cancel", TaskRef, self.cancel),
            MethodBinding("tasks/stream", StreamParams, self.stream),
            MethodBinding("tasks/result", TaskRef, self.result, legacy),
            MethodBinding("tasks/list", PaginatedRequestParams, self.list_tasks, legacy),
            MethodBinding("tasks/update", TaskRef, self.update, modern),
        ]

    # --- creating tasks (middleware) ---------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Advertise Tasks at 2025-11-25 and turn a task-augmented ``tools/call`` into a task."""
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if isinstance(result, dict) and result.get("protocolVersion") == LEGACY:
                tasks: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
                tasks["eventStreams"] = self.event_streams()
                result = {**result, "capabilities": {**result.get("capabilities", {}), "tasks": tasks}}
            return result
        if ctx.method == "tools/list" and ctx.protocol_version == LEGACY:
            result = await call_next(ctx)
            if isinstance(result, dict) and isinstance(result.get("tools"), list):
                result = {**result, "tools": [{**t, "execution": {"taskSupport": "optional"}} for t in result["tools"]]}
            return result
        if ctx.method == "tools/call":
            params = ctx.params or {}
            if ctx.protocol_version == LEGACY and params.get("task") is not None:
                task = self._start(ctx, call_next, _requested_ttl(params["task"]))
                return {"task": task.wire(LEGACY)}
            if ctx.protocol_version == MODERN and _declares_extension(ctx):
                task = self._start(ctx, call_next, DEFAULT_TTL_MS)
                return {"resultType": "task", **task.wire(MODERN)}
        return await call_next(ctx)

    def _start(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext, ttl_ms: int) -> Task:
        if self.group is None:
            raise MCPError(INTERNAL_ERROR, "the server is shutting down")
        for expired in [t for t in self.tasks.values() if t.expired]:
            del self.tasks[expired.task_id]
        tool = str((ctx.params or {}).get("name"))
        task = Task(owner=principal(ctx), tool=tool, ttl_ms=ttl_ms, log=TaskLog(self.retention))
        self.tasks[task.task_id] = task
        self.group.start_soon(self._run, task, call_next, ctx)
        return task

    async def _run(self, task: Task, call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> None:
        CURRENT_TASK.set(task)
        with task.scope:  # tasks/cancel cancels it
            try:
                result = await call_next(ctx)  # the SDK's tools/call: validation, the tool, the result sieve
            except MCPError as exc:
                task.error = {"code": exc.code, "message": exc.message}
                task.update("failed", exc.message)
            except Exception as exc:
                task.error = {"code": INTERNAL_ERROR, "message": str(exc)}
                task.update("failed", str(exc))
            else:
                if isinstance(result, BaseModel):
                    result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                task.result = {k: v for k, v in (result or {}).items() if k not in ("resultType", "_meta")}
                # isError fails a task at 2025-11-25 only; SEP-2663 reports it as a completed result.
                failed = ctx.protocol_version == LEGACY and task.result.get("isError")
                task.update("failed" if failed else "completed")

    # --- tasks/* -----------------------------------------------------------------------------------

    def find_task(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        """The caller's task; a foreign task is answered exactly like an unknown one."""
        if ctx.protocol_version == MODERN:
            require_client_extension(ctx, EXTENSION)
        task = self.tasks.get(task_id)
        if task is None or task.expired or task.owner != principal(ctx):
            raise MCPError(INVALID_PARAMS, f"Unknown taskId: {task_id}")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self.find_task(ctx, params.task_id)
        return task.wire(ctx.protocol_version)

    async def result(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self.find_task(ctx, params.task_id)
        await task.done.wait()
        if task.status == "cancelled":
            raise MCPError(INTERNAL_ERROR, f"Task {task.task_id} was cancelled")
        if task.error is not None:
            raise MCPError(task.error["code"], task.error["message"])
        assert task.result is not None
        return {**task.result, "_meta": {RELATED_TASK: {"taskId": task.task_id}}}

    async def list_tasks(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
        if params.cursor is not None:
            raise MCPError(INVALID_PARAMS, f"Unknown cursor: {params.cursor}")
        caller = principal(ctx)
        return {"tasks": [t.wire(LEGACY) for t in self.tasks.values() if t.owner == caller and not t.expired]}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self.find_task(ctx, params.task_id)
        if ctx.protocol_version == LEGACY and task.terminal:
            raise MCPError(INVALID_PARAMS, f"Task {task.task_id} is already {task.status}")
        task.cancel("cancelled by the client")
        return task.wire(LEGACY) if ctx.protocol_version == LEGACY else {}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        """No tool here asks for input, so there is nothing to answer; the task must still be the caller's."""
        self.find_task(ctx, params.task_id)
        return {}

    # --- tasks/stream (SEP-2694) -------------------------------------------------------------------

    async def stream(self, ctx: ServerRequestContext[Any, Any], params: StreamParams) -> dict[str, Any]:
        """Replay the retained events after the cursor, then the live ones, then the empty result."""
        task = self.stream_task(ctx, params.task_id)
        after = _cursor(params, task)
        key = (connection_of(ctx), task.task_id)
        self.claim_stream(key)
        try:
            await self.deliver(ctx, task, self.first_seq(task, after))
        except anyio.get_cancelled_exc_class():  # notifications/cancelled (2025-11-25), a closed POST (2026-07-28)
            self.stream_cancelled(task)
            raise
        finally:
            self.active_streams.discard(key)
        return await self.stream_result()

    async def deliver(self, ctx: ServerRequestContext[Any, Any], task: Task, seq: int) -> None:
        """One cursor for replay and live tail: nothing is lost or doubled at the handover."""
        delivered = 0
        while True:
            grown = task.log.grown  # taken before reading, so no append between read and wait is missed
            if seq < task.log.earliest_seq:  # retention overtook the cursor, before or during the stream
                seq = self.events_gone(task)
            for event in self.events_from(task, seq):
                notification = EventNotification(
                    method="notifications/tasks/event", params=self.wire_event(task, event)
                )
                # send_notification is typed for the SDK's own notifications; any Notification works at run time.
                await ctx.session.send_notification(notification, related_request_id=ctx.request_id)  # type: ignore[arg-type]
                seq, delivered = event.seq + 1, delivered + 1
                # Progress for the stream's own token: request-local UX, not a task event, no seq.
                await ctx.session.report_progress(delivered, None, f"{delivered} events delivered")
            if task.terminal and seq >= task.log.next_seq:
                return
            with anyio.move_on_after(DISCONNECT_CHECK_S):
                await grown.wait()
            if await client_gone(ctx):
                return

    # The seams: each is one rule of SEP-2694, and each broken variant overrides exactly one of them.

    def stream_task(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        """Authorization equal to tasks/get."""
        return self.find_task(ctx, task_id)

    def claim_stream(self, key: tuple[Hashable, str]) -> None:
        """At most one active tasks/stream per task per connection."""
        if key in self.active_streams:
            raise MCPError(INVALID_PARAMS, f"Task {key[1]} already has an active tasks/stream on this connection")
        self.active_streams.add(key)

    def events_from(self, task: Task, seq: int) -> list[TaskEvent]:
        """What the stream delivers from `seq` on: every retained event (the stream ends after the last
        one of a terminal task)."""
        return task.log.read_from(seq)

    def first_seq(self, task: Task, after: int | None) -> int:
        """Resume strictly after the cursor; without one, from the earliest retained event."""
        return task.log.earliest_seq if after is None else after + 1

    def events_gone(self, task: Task) -> int:
        """A cursor before the retained range is an error, never a silent gap (returns where to go on instead)."""
        data = {"reason": "events_gone", "taskId": task.task_id, "earliestSeq": task.log.earliest_seq}
        raise MCPError(EVENTS_GONE, "Task events are no longer available", data)

    def wire_event(self, task: Task, event: TaskEvent) -> dict[str, Any]:
        """The ``notifications/tasks/event`` params: the envelope with the related-task ``_meta``."""
        return {
            "seq": event.seq,
            "taskId": task.task_id,
            "type": event.type,
            "payload": event.payload,
            "_meta": {RELATED_TASK: {"taskId": task.task_id}},
        }

    def stream_cancelled(self, task: Task) -> None:
        """Cancelling a stream stops delivery only; the task runs on."""

    async def stream_result(self) -> dict[str, Any]:
        """The empty TaskStreamResult (the SDK adds ``resultType: "complete"`` at 2026-07-28)."""
        return {}


# --- the tools --------------------------------------------------------------------------------------


async def report_progress(ctx: Context, progress: int, total: int, message: str) -> None:
    """As a task: a ``progress`` event in its log; otherwise a progress notification on the call."""
    task = CURRENT_TASK.get()
    if task is None:
        await ctx.report_progress(progress, total, message)
    else:
        task.record("progress", {"progress": progress, "total": total, "message": message})


async def log_info(ctx: Context, text: str) -> None:
    """As a task: a ``log`` event in its log; otherwise an info notification on the call."""
    task = CURRENT_TASK.get()
    if task is None:
        await ctx.info(text, logger_name="builder")
    else:
        task.record("log", {"level": "info", "logger": "builder", "data": text})


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


async def slow_build(ctx: Context, steps: int = 3, delay: float = 0.2) -> str:
    """Run a build of `steps` steps, `delay` seconds each, reporting progress and logs per step."""
    await log_info(ctx, f"build started: {steps} steps")
    for i in range(1, steps + 1):
        await anyio.sleep(delay)
        await report_progress(ctx, i, steps, f"step {i}/{steps}")
        await log_info(ctx, f"finished step {i}")
    return f"built {steps} steps"


# --- running it -------------------------------------------------------------------------------------


def build_server(tasks: NativeTasks) -> MCPServer[None]:
    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            tasks.group = group
            yield
            tasks.group = None
            group.cancel_scope.cancel()

    server: MCPServer[None] = MCPServer(
        "native-stream-server",
        version="0.1.0",
        instructions="A build runner that implements Tasks and SEP-2694 tasks/stream natively.",
        extensions=[tasks],
        lifespan=lifespan,
        middleware=[tasks.middleware],
        log_level="WARNING",
    )
    for fn in (echo, slow_build):
        server.add_tool(fn, structured_output=False)
    return server


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766, help="Streamable HTTP port (default 8766)")
    parser.add_argument("--stdio", action="store_true", help="serve stdio instead of Streamable HTTP")
    defaults = Retention()
    parser.add_argument("--max-events-per-task", type=int, default=defaults.max_events_per_task, metavar="N")
    parser.add_argument("--max-event-age-s", type=float, default=defaults.max_event_age_s, metavar="S")
    parser.add_argument("--terminal-retention-s", type=float, default=defaults.terminal_retention_s, metavar="S")
    parser.add_argument("--max-payload-bytes", type=int, default=defaults.max_payload_bytes, metavar="N")
    parser.add_argument(
        "--no-retention-fields",
        action="store_true",
        help="advertise eventStreams as {} (the limits apply all the same; SEP-2694 names no retention field)",
    )
    return parser


def serve(args: argparse.Namespace, tasks_class: type[NativeTasks] = NativeTasks) -> None:
    """Run a server whose Tasks are `tasks_class` (the broken variants pass a subclass)."""
    for name in ("max_events_per_task", "max_payload_bytes", "max_event_age_s", "terminal_retention_s"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, got {value}")
    retention = Retention(
        args.max_events_per_task, args.max_event_age_s, args.terminal_retention_s, args.max_payload_bytes
    )
    server = build_server(tasks_class(retention, advertise_retention=not args.no_retention_fields))
    where = "stdio" if args.stdio else f"http://{args.host}:{args.port}/mcp"
    print(f"native_stream_server ready on {where}", file=sys.stderr, flush=True)
    if args.stdio:
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    serve(argument_parser().parse_args())
