"""A real MCP server (official ``mcp`` SDK, ``MCPServer``) that serves the 2026-07-28 Tasks extension
``io.modelcontextprotocol/tasks`` (SEP-2663), as an upstream for the gateway's tests.

Usage::

    python tests/servers/modern_tasks_server.py [--http PORT] [--no-notify] [--poll-interval MS] [--ttl MS]

stdio without ``--http``; otherwise Streamable HTTP on ``http://127.0.0.1:PORT/mcp``.

Tools: ``echo(text)`` (always plain), ``stats()`` (text JSON ``{"tasks_get": N}``, the tasks/get calls served),
and three task-eligible tools:

* ``slow_job(steps=3, delay=0.2)``: statusMessage ``step i/steps`` after each step, then ``done after N steps``;
* ``ask_job(question="Your name?", delay=0)``: after ``delay`` s, ``input_required`` with an ``elicitation/create``
  form under the key ``name``, answered by ``tasks/update``; then ``Hello, X!``;
* ``fail_job()``: ends ``failed`` with JSON-RPC error -32603.

A 2026-07-28 ``tools/call`` of one of those three from a client that declares the extension in its
``clientCapabilities`` gets a flat ``CreateTaskResult`` (``resultType: "task"``) at once, the tool running in the
background; any other call runs synchronously (``ask_job`` cannot: it answers -32021 asking for the extension).
Before that result, a call that asked for them gets a progress notification (``queued``) and an ``info``
log. ``tasks/get`` / ``tasks/update`` / ``tasks/cancel`` follow SEP-2663; ``tasks/result`` is -32601. Unless
``--no-notify``, ``subscriptions/listen`` with ``notifications.taskIds`` streams ``notifications/tasks`` (the full
DetailedTask) on every later change of status, statusMessage or inputRequests of those tasks.

mcp 2.3 has no tasks of its own; this uses these SDK hooks:

* ``Extension`` (``TasksExtension``): its settings ``{}`` are advertised by the SDK under
  ``capabilities.extensions["io.modelcontextprotocol/tasks"]`` in ``server/discover``; ``methods()`` binds
  tasks/get, tasks/update and tasks/cancel (``MethodBinding`` limited to 2026-07-28; tasks/result stays unbound,
  so the SDK answers -32601); ``intercept_tool_call`` answers with the ``CreateTaskResult`` dict (the runner lets
  a non-core ``resultType`` through unchecked at 2026-07-28) and runs ``call_next`` - the SDK's own tools/call
  handler, so argument validation and the tool function are the SDK's - in a task group the server lifespan
  opened. The tool learns it runs as a task through the ``CURRENT_TASK`` context variable.
* ``require_client_extension`` for the -32021 answers.
* A ``ServerMiddleware`` (``TasksExtension.listen_middleware``) serves a 2026-07-28 ``subscriptions/listen``
  whose filter has ``taskIds``; every other listen goes on to the SDK's ``ListenHandler``. That handler cannot be
  extended: its ack is rebuilt from the four core filter keys (an extra ``taskIds`` is dropped) and its bus only
  carries the core list-changed/resource events. The middleware's stream follows the SDK's shape: the
  ``notifications/subscriptions/acknowledged`` frame first (honouring ``taskIds`` only: this server never changes
  its lists), then ``notifications/tasks``, each stamped with ``_meta["io.modelcontextprotocol/subscriptionId"]``
  (the listen request's id), until the client goes away. With ``--no-notify`` the middleware is not installed:
  the SDK's handler acks without ``taskIds`` and no task notification is ever sent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Extension, MCPServer, MethodBinding, require_client_extension
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    Notification,
    RequestParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import BaseModel, Field

EXTENSION = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"
TASK_TOOLS = frozenset({"slow_job", "ask_job", "fail_job"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TTL_MS = 60_000


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Task:
    """One task's state; `update` stamps lastUpdatedAt and tells `on_change` (the listen streams)."""

    poll_interval_ms: int
    ttl_ms: int
    on_change: Callable[[Task], None]
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: str = "working"
    status_message: str | None = "The operation is now in progress."
    created_at: str = field(default_factory=_now)
    last_updated_at: str = ""
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    answers: dict[str, Any] = field(default_factory=dict)
    waiting: dict[str, anyio.Event] = field(default_factory=dict)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    def wire(self) -> dict[str, Any]:
        """The DetailedTask (what tasks/get and notifications/tasks carry, without resultType/_meta)."""
        out: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.status_message is not None:
            out["statusMessage"] = self.status_message
        out |= {
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.status == "input_required":
            out["inputRequests"] = self.input_requests
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out

    def update(self, **changes: Any) -> None:
        if self.status in TERMINAL:
            return  # a terminal task never changes again (e.g. a job finishing right after a cancel)
        for name, value in changes.items():
            setattr(self, name, value)
        self.last_updated_at = _now()
        self.on_change(self)

    async def ask(self, key: str, request: dict[str, Any]) -> Any:
        """Go input_required with `request` under `key` until tasks/update answers it; return the answer."""
        self.waiting[key] = anyio.Event()
        self.update(status="input_required", status_message="Waiting for input.", input_requests={key: request})
        await self.waiting[key].wait()
        self.update(status="working", status_message="Input received.", input_requests=None)
        return self.answers[key]


CURRENT_TASK: ContextVar[Task | None] = ContextVar("CURRENT_TASK", default=None)
"""The task the running tool belongs to (None when the call runs synchronously)."""


class TaskRef(RequestParams):
    task_id: str


class TaskUpdate(TaskRef):
    input_responses: dict[str, Any] = Field(default_factory=dict)


class TasksNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"


def _declares_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return ctx.protocol_version == MODERN and EXTENSION in ((capabilities and capabilities.extensions) or {})


class TasksExtension(Extension):
    identifier = EXTENSION

    def __init__(self, poll_interval_ms: int, ttl_ms: int) -> None:
        self.poll_interval_ms = poll_interval_ms
        self.ttl_ms = ttl_ms
        self.tasks: dict[str, Task] = {}
        self.watchers: set[Callable[[Task], None]] = set()
        self.tasks_get_served = 0
        self.group: anyio.abc.TaskGroup | None = None  # set by the server lifespan

    def methods(self) -> Sequence[MethodBinding]:
        modern = frozenset({MODERN})
        return [
            MethodBinding("tasks/get", TaskRef, self.get, modern),
            MethodBinding("tasks/update", TaskUpdate, self.update, modern),
            MethodBinding("tasks/cancel", TaskRef, self.cancel, modern),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not _declares_extension(ctx) or self.group is None:
            return await call_next(ctx)
        task = Task(self.poll_interval_ms, self.ttl_ms, self._changed)
        self.tasks[task.task_id] = task
        # What a client that asked for progress and logs hears before it gets the task handle.
        meta: dict[str, Any] = dict(ctx.meta or {})
        token = meta.get("progress_token", meta.get("progressToken"))
        if token is not None:
            await ctx.session.send_progress_notification(token, 0, message="queued", related_request_id=ctx.request_id)
        await ctx.session.send_log_message("info", f"{params.name} accepted", related_request_id=ctx.request_id)
        self.group.start_soon(self._run, task, call_next, ctx)
        return {"resultType": "task", **task.wire()}

    async def _run(self, task: Task, call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> None:
        CURRENT_TASK.set(task)
        with task.scope:  # tasks/cancel cancels it
            try:
                result = await call_next(ctx)  # the SDK's tools/call handler: validation, then the tool
            except MCPError as exc:
                task.update(status="failed", status_message=None, error={"code": exc.code, "message": exc.message})
            except Exception as exc:
                task.update(status="failed", status_message=None, error={"code": INTERNAL_ERROR, "message": str(exc)})
            else:
                if isinstance(result, BaseModel):
                    result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                outcome = {k: v for k, v in (result or {}).items() if k not in ("resultType", "_meta")}
                task.update(status="completed", status_message=None, result=outcome)

    def _changed(self, task: Task) -> None:
        for watcher in list(self.watchers):
            watcher(task)

    def _task(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> Task:
        require_client_extension(ctx, EXTENSION)
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Unknown taskId: {params.task_id}")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self._task(ctx, params)
        self.tasks_get_served += 1
        return {"resultType": "complete", **task.wire()}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdate) -> dict[str, Any]:
        task = self._task(ctx, params)
        for key, answer in params.input_responses.items():
            if key in task.waiting and key not in task.answers:  # unknown or already answered: ignored
                task.answers[key] = answer
                task.waiting[key].set()
        return {"resultType": "complete"}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskRef) -> dict[str, Any]:
        task = self._task(ctx, params)
        if task.status not in TERMINAL:
            task.update(status="cancelled", status_message="Cancelled by the client.", input_requests=None)
            task.scope.cancel()
        return {"resultType": "complete"}

    async def listen_middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Serve a 2026-07-28 subscriptions/listen that asks for taskIds; pass everything else on."""
        if ctx.method != "subscriptions/listen" or ctx.protocol_version != MODERN:
            return await call_next(ctx)
        requested = SubscriptionsListenRequestParams.model_validate(ctx.params or {}, by_name=False).notifications
        ids = (requested.model_extra or {}).get("taskIds")
        if ids is None:
            return await call_next(ctx)
        require_client_extension(ctx, EXTENSION)
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise MCPError(INVALID_PARAMS, "notifications.taskIds must be a list of task ids")
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](1024)

        def deliver(task: Task) -> None:
            if task.task_id in ids:
                with contextlib.suppress(anyio.WouldBlock):  # a client that stopped reading loses updates
                    send.send_nowait(task.wire())

        self.watchers.add(deliver)
        try:
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=SubscriptionFilter.model_validate({"taskIds": ids}), _meta=meta
                    )
                ),
                related_request_id=ctx.request_id,
            )
            async for detailed in receive:
                note = TasksNotification(params={**detailed, "_meta": meta})
                await ctx.session.send_notification(note, related_request_id=ctx.request_id)  # type: ignore[arg-type]
        finally:
            self.watchers.discard(deliver)
            send.close()
            receive.close()
        return SubscriptionsListenResult(_meta=meta)


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
            task.update(status_message=f"step {i}/{steps}")
    return f"done after {steps} steps"


async def ask_job(question: str = "Your name?", delay: float = 0.0) -> str:
    """After `delay` s, ask for a name (as a task only: input_required until tasks/update answers); greet it."""
    task = CURRENT_TASK.get()
    if task is None:
        raise MCPError(
            MISSING_REQUIRED_CLIENT_CAPABILITY,
            f"ask_job needs the {EXTENSION} extension",
            {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
        )
    await anyio.sleep(delay)
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    form = {"mode": "form", "message": question, "requestedSchema": schema}
    answer = await task.ask("name", {"method": "elicitation/create", "params": form})
    if answer.get("action") != "accept":
        return f"No name given ({answer.get('action')})."
    return f"Hello, {answer.get('content', {}).get('name')}!"


async def fail_job() -> str:
    """Fail with a JSON-RPC error after a short delay (as a task: status `failed`)."""
    await anyio.sleep(0.1)
    raise MCPError(INTERNAL_ERROR, "fail_job failed on purpose")


def build_server(*, notify: bool = True, poll_interval_ms: int = 200, ttl_ms: int = DEFAULT_TTL_MS) -> MCPServer[None]:
    tasks = TasksExtension(poll_interval_ms, ttl_ms)

    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            tasks.group = group
            yield
            group.cancel_scope.cancel()

    server: MCPServer[None] = MCPServer(
        "modern-tasks-server",
        version="0.1.0",
        extensions=[tasks],
        lifespan=lifespan,
        middleware=[tasks.listen_middleware] if notify else [],
        log_level="WARNING",
    )

    async def stats() -> str:
        """How many tasks/get requests this server has served, as JSON."""
        return json.dumps({"tasks_get": tasks.tasks_get_served})

    for fn in (echo, slow_job, ask_job, fail_job, stats):
        server.add_tool(fn, structured_output=False)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    parser.add_argument("--no-notify", action="store_true", help="do not honour taskIds on subscriptions/listen")
    parser.add_argument("--poll-interval", type=int, default=200, metavar="MS", help="pollIntervalMs (default 200)")
    parser.add_argument("--ttl", type=int, default=DEFAULT_TTL_MS, metavar="MS", help="ttlMs (default 60000)")
    args = parser.parse_args()
    server = build_server(notify=not args.no_notify, poll_interval_ms=args.poll_interval, ttl_ms=args.ttl)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
