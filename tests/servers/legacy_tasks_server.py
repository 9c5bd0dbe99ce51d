"""A real MCP server (official ``mcp`` SDK, ``MCPServer``) that serves the 2025-11-25 core Tasks (SEP-1686) to
clients that negotiated 2025-11-25 in ``initialize``, as an upstream for the gateway's tests.

Usage::

    python tests/servers/legacy_tasks_server.py [--http PORT] [--no-status] [--poll-interval MS] [--result-delay S]

stdio without ``--http``; otherwise Streamable HTTP on ``http://127.0.0.1:PORT/mcp`` (handshake era: ``initialize``
opens a session, ``Mcp-Session-Id`` names it, a GET opens its standalone stream).

Tools: ``echo(text)`` and ``stats()`` (text JSON ``{"tasks_get": N}``, the tasks/get calls served) are
``taskSupport: "forbidden"``; three are ``"optional"``:

* ``slow_job(steps=3, delay=0.2)``: statusMessage ``step i/steps`` after each step, then ``done after N steps``;
* ``chatty_job(steps=3, delay=0.2)``: the same, and after each step a ``notifications/progress`` for the call's
  ``_meta.progressToken`` (progress i, total steps, message ``step i``) and an ``info`` log ``chatty step i``. As a
  task both go on the session's standalone channel (the GET stream; stdout on stdio) - the tools/call has been
  answered by then - each with ``_meta["io.modelcontextprotocol/related-task"] = {"taskId": ...}``; run
  synchronously they ride the request's own stream;
* ``fail_job()``: returns ``isError: true`` after 0.1 s, which makes its task ``failed`` (the 2025-11-25 rule).

A 2025-11-25 ``tools/call`` of one of those three with ``params.task`` (``{"ttl": MS}``) is answered at once with the
nested ``CreateTaskResult`` ``{"task": {taskId, status: "working", statusMessage: "started", createdAt,
lastUpdatedAt, ttl, pollInterval}}`` (ttl as requested, at most one hour, 60 s when absent; pollInterval from
``--poll-interval``, default 200) and the tool runs in the background. It starts 50 ms later: the SDK offers no
hook for "the response has been written", and that delay keeps every notification of the task behind the answer.
``params.task`` on ``echo``/``stats`` is -32601 (their taskSupport is forbidden); without ``params.task`` every
tool runs synchronously, and so does every call of a 2026-07-28 client (for which tasks/* are -32601). Then:

* ``tasks/get {taskId}`` -> the flat Task; ``tasks/list`` -> ``{"tasks": [...]}`` (the tasks this session created);
* ``tasks/result {taskId}`` blocks until the task is terminal, then answers exactly what the tools/call would
  have (its ``CallToolResult``, or its JSON-RPC error), with ``_meta["io.modelcontextprotocol/related-task"]``;
  a cancelled task's is -32603 ``Task <id> was cancelled``; ``--result-delay S`` answers S seconds later still
  (a slow result store: it widens the moment a client knows of an end its gateway has yet to record);
* ``tasks/cancel {taskId}`` stops the job and answers the flat Task (``cancelled``); a terminal task is -32602;
* an unknown taskId is -32602 everywhere.

Unless ``--no-status``, every change of status or statusMessage is pushed to the creating session as
``notifications/tasks/status`` (params: the full Task) on its standalone channel; with it none is ever sent and
clients must poll. On HTTP the SDK drops what is sent on the standalone channel while the session has no GET stream
open (no event store here). Tasks live as long as the process (no ttl expiry) and are shared by every session
(tasks/list aside).

mcp 2.3 implements no tasks; this uses these SDK hooks:

* a ``ServerMiddleware`` (``LegacyTasks.middleware``), outermost of the user middleware, which
  - adds ``capabilities.tasks`` to a 2025-11-25 ``initialize`` result (an ``Extension``'s settings can only land
    under ``capabilities.extensions``, which the SDK's 2025-11-25 result sieve drops anyway; the placeholder
    extension id is also taken out of a 2026-07-28 ``server/discover``, whose clients get no tasks here);
  - adds ``execution.taskSupport`` to every tool of a 2025-11-25 ``tools/list`` result (``add_tool`` has no
    such parameter);
  - short-circuits a 2025-11-25 ``tools/call`` that carries ``params.task``: it answers the ``CreateTaskResult``
    dict itself (middleware output is not checked against ``CallToolResult``, whereas an
    ``Extension.intercept_tool_call`` answer is, and fails with -32603) and runs ``call_next`` - the rest of the
    SDK chain: params validation, the tool handler, the result sieve - in a task group the server lifespan opened;
* ``Extension.methods()`` (``LegacyTasks``): ``MethodBinding`` s for tasks/get, tasks/result, tasks/list and
  tasks/cancel, limited to 2025-11-25 (other versions get -32601);
* ``ServerSession.send_notification`` without ``related_request_id``, which the SDK sends on the connection's
  standalone channel: that is how status pushes and a task's late progress/log notifications reach the client.
  The tool learns it runs as a task through the ``CURRENT_TASK`` context variable.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, Extension, MCPServer, MethodBinding
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolResult,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    Notification,
    PaginatedRequestParams,
    RequestParams,
    TextContent,
)
from pydantic import BaseModel

LEGACY = "2025-11-25"
IDENTIFIER = "com.example/legacy-tasks"
"""The `Extension` identifier the SDK requires; never advertised (see the module docstring)."""
RELATED_TASK = "io.modelcontextprotocol/related-task"
TASK_TOOLS = frozenset({"slow_job", "chatty_job", "fail_job"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TTL_MS = 60_000
MAX_TTL_MS = 3_600_000
START_DELAY = 0.05
"""Seconds a task's job waits before it starts, so the CreateTaskResult goes out before anything else of it."""
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RawNotification(Notification[dict[str, Any], str]):
    """A notification sent exactly as built (the SDK has no type for ``notifications/tasks/status``)."""


@dataclass
class Task:
    """One task: its wire state, the session that created it (where pushes go) and what it ended with."""

    session: ServerSession
    owner: str | None
    """The creating session's Mcp-Session-Id (None on stdio); tasks/list lists only the caller's."""
    ttl_ms: int
    poll_interval_ms: int
    push: bool
    progress_token: str | int | None = None
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: str = "working"
    status_message: str | None = "started"
    created_at: str = field(default_factory=_now)
    last_updated_at: str = ""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    def wire(self) -> dict[str, Any]:
        """The Task object (what CreateTaskResult nests, tasks/get answers flat, and a status push carries)."""
        out: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        return out | {
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttl": self.ttl_ms,
            "pollInterval": self.poll_interval_ms,
        }

    @property
    def related(self) -> dict[str, Any]:
        return {RELATED_TASK: {"taskId": self.task_id}}

    async def update(self, status: str | None = None, status_message: str | None = None) -> None:
        """Change status and/or statusMessage (a terminal task never changes again); push it unless quiet."""
        if self.status in TERMINAL:
            return
        if status is not None:
            self.status = status
        self.status_message = status_message
        self.last_updated_at = _now()
        if self.status in TERMINAL:
            self.done.set()
        if self.push:
            await self.notify("notifications/tasks/status", self.wire())

    async def progress(self, progress: int, total: int, message: str) -> None:
        """A late notifications/progress for the tools/call's progressToken (when it had one)."""
        if self.progress_token is not None:
            params = {"progressToken": self.progress_token, "progress": progress, "total": total, "message": message}
            await self.notify("notifications/progress", {**params, "_meta": self.related})

    async def log(self, data: str) -> None:
        """An info notifications/message about this task."""
        await self.notify("notifications/message", {"level": "info", "data": data, "_meta": self.related})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send on the creating session's standalone channel (no related_request_id): its GET stream, or stdout."""
        await self.session.send_notification(RawNotification(method=method, params=params))  # type: ignore[arg-type]


CURRENT_TASK: ContextVar[Task | None] = ContextVar("CURRENT_TASK", default=None)
"""The task the running tool belongs to (None when the call runs synchronously)."""


class TaskRef(RequestParams):
    task_id: str


def _session_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The caller's Mcp-Session-Id (HTTP), or None (stdio: one session per process)."""
    headers = getattr(ctx.request, "headers", None)
    return None if headers is None else headers.get("mcp-session-id")


def _requested_ttl(task: Any) -> int:
    if not isinstance(task, Mapping):
        raise MCPError(INVALID_PARAMS, "params.task must be an object")
    ttl = task.get("ttl")
    if ttl is None:
        return DEFAULT_TTL_MS
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
        raise MCPError(INVALID_PARAMS, "params.task.ttl must be a non-negative integer")
    return min(ttl, MAX_TTL_MS)


class LegacyTasks(Extension):
    identifier = IDENTIFIER

    def __init__(self, *, push: bool, poll_interval_ms: int, result_delay_s: float) -> None:
        self.result_delay_s = result_delay_s
        self.push = push
        self.poll_interval_ms = poll_interval_ms
        self.tasks: dict[str, Task] = {}
        self.tasks_get_served = 0
        self.group: anyio.abc.TaskGroup | None = None  # set by the server lifespan

    def methods(self) -> Sequence[MethodBinding]:
        legacy = frozenset({LEGACY})
        return [
            MethodBinding("tasks/get", TaskRef, self.get, legacy),
            MethodBinding("tasks/result", TaskRef, self.result, legacy),
            MethodBinding("tasks/list", PaginatedRequestParams, self.list_tasks, legacy),
            MethodBinding("tasks/cancel", TaskRef, self.cancel, legacy),
        ]

    # --- the middleware ----------------------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method in ("initialize", "server/discover"):
            result = await call_next(ctx)
            if not isinstance(result, dict) or not isinstance(result.get("capabilities"), dict):
                return result
            capabilities = dict(result["capabilities"])
            extensions = {k: v for k, v in (capabilities.pop("extensions", None) or {}).items() if k != IDENTIFIER}
            if extensions:
                capabilities["extensions"] = extensions
            if ctx.method == "initialize" and result.get("protocolVersion") == LEGACY:
                capabilities["tasks"] = CAPABILITY
            return {**result, "capabilities": capabilities}
        if ctx.protocol_version != LEGACY:
            return await call_next(ctx)
        if ctx.method == "tools/list":
            result = await call_next(ctx)
            if isinstance(result, dict) and isinstance(result.get("tools"), list):
                support = {True: "optional", False: "forbidden"}
                tools = [
                    {**t, "execution": {"taskSupport": support[t.get("name") in TASK_TOOLS]}} for t in result["tools"]
                ]
                result = {**result, "tools": tools}
            return result
        params = ctx.params or {}
        if ctx.method == "tools/call" and params.get("task") is not None:
            return await self._start(ctx, params, call_next)
        return await call_next(ctx)

    async def _start(
        self, ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any], call_next: CallNext
    ) -> dict[str, Any]:
        name = params.get("name")
        if name not in TASK_TOOLS:
            raise MCPError(METHOD_NOT_FOUND, f"Tool {name!r} does not support task-augmented execution")
        if self.group is None:
            raise MCPError(INTERNAL_ERROR, "the server is shutting down")
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, Mapping) else None
        task = Task(
            session=ctx.session,
            owner=_session_key(ctx),
            ttl_ms=_requested_ttl(params["task"]),
            poll_interval_ms=self.poll_interval_ms,
            push=self.push,
            progress_token=token if isinstance(token, str | int) else None,
        )
        self.tasks[task.task_id] = task
        self.group.start_soon(self._run, task, call_next, ctx)
        return {"task": task.wire()}

    async def _run(self, task: Task, call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> None:
        CURRENT_TASK.set(task)
        with task.scope:  # tasks/cancel cancels it
            await anyio.sleep(START_DELAY)
            try:
                result = await call_next(ctx)  # the SDK's tools/call: validation, the tool, the result sieve
            except MCPError as exc:
                task.error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
                await task.update("failed", exc.message)
            except Exception as exc:
                task.error = {"code": INTERNAL_ERROR, "message": str(exc)}
                await task.update("failed", str(exc))
            else:
                if isinstance(result, BaseModel):
                    result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                task.result = dict(result or {})
                await task.update("failed" if task.result.get("isError") else "completed", None)

    # --- tasks/* ----------------------------------------------------------------------------------

    def _task(self, params: TaskRef) -> Task:
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Unknown taskId: {params.task_id}")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self._task(params)
        self.tasks_get_served += 1
        return task.wire()

    async def result(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self._task(params)
        await task.done.wait()
        await anyio.sleep(self.result_delay_s)
        if task.status == "cancelled":
            raise MCPError(INTERNAL_ERROR, f"Task {task.task_id} was cancelled")
        if task.error is not None:
            raise MCPError(task.error["code"], task.error["message"], task.error.get("data"))
        assert task.result is not None
        return {**task.result, "_meta": {**task.result.get("_meta", {}), **task.related}}

    async def list_tasks(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
        if params.cursor is not None:
            raise MCPError(INVALID_PARAMS, f"Unknown cursor: {params.cursor}")
        owner = _session_key(ctx)
        return {"tasks": [t.wire() for t in self.tasks.values() if t.owner == owner]}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self._task(params)
        if task.status in TERMINAL:
            raise MCPError(INVALID_PARAMS, f"Task {task.task_id} is already {task.status}")
        task.scope.cancel()
        await task.update("cancelled", "cancelled by the client")
        return task.wire()


# --- the tools ---------------------------------------------------------------------------------------


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


async def slow_job(steps: int = 3, delay: float = 0.2) -> str:
    """Run `steps` steps of `delay` seconds; as a task, statusMessage says `step i/steps` after each."""
    task = CURRENT_TASK.get()
    for i in range(1, steps + 1):
        await anyio.sleep(delay)
        if task is not None:
            await task.update(status_message=f"step {i}/{steps}")
    return f"done after {steps} steps"


async def chatty_job(ctx: Context, steps: int = 3, delay: float = 0.2) -> str:
    """Like slow_job, and after each step a progress notification (`step i`) and an info log (`chatty step i`)."""
    task = CURRENT_TASK.get()
    for i in range(1, steps + 1):
        await anyio.sleep(delay)
        if task is None:  # synchronous: on the request's own stream
            await ctx.report_progress(i, steps, f"step {i}")
            log = LoggingMessageNotification(
                params=LoggingMessageNotificationParams(level="info", data=f"chatty step {i}")
            )
            await ctx.request_context.session.send_notification(log, related_request_id=ctx.request_context.request_id)
            continue
        await task.update(status_message=f"step {i}/{steps}")
        await task.progress(i, steps, f"step {i}")
        await task.log(f"chatty step {i}")
    return f"done after {steps} steps"


async def fail_job() -> CallToolResult:
    """Return an error result (`isError: true`) after 0.1 s; as a task it ends `failed`."""
    await anyio.sleep(0.1)
    return CallToolResult(content=[TextContent(type="text", text="fail_job failed on purpose")], is_error=True)


def build_server(*, push: bool = True, poll_interval_ms: int = 200, result_delay_s: float = 0.0) -> MCPServer[None]:
    tasks = LegacyTasks(push=push, poll_interval_ms=poll_interval_ms, result_delay_s=result_delay_s)

    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            tasks.group = group
            yield
            tasks.group = None
            group.cancel_scope.cancel()

    server: MCPServer[None] = MCPServer(
        "legacy-tasks-server",
        version="0.1.0",
        extensions=[tasks],
        lifespan=lifespan,
        middleware=[tasks.middleware],
        log_level="WARNING",
    )

    async def stats() -> str:
        """How many tasks/get requests this server has served, as JSON."""
        return json.dumps({"tasks_get": tasks.tasks_get_served})

    for fn in (echo, slow_job, chatty_job, fail_job, stats):
        server.add_tool(fn, structured_output=False)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    parser.add_argument("--no-status", action="store_true", help="never send notifications/tasks/status")
    parser.add_argument("--poll-interval", type=int, default=200, metavar="MS", help="pollInterval (default 200)")
    parser.add_argument("--result-delay", type=float, default=0.0, metavar="S", help="answer tasks/result S s late")
    args = parser.parse_args()
    server = build_server(
        push=not args.no_status, poll_interval_ms=args.poll_interval, result_delay_s=args.result_delay
    )
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
