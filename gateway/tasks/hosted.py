"""Gateway-hosted tasks: Tasks for an upstream that has none, in both dialects.

A legacy (2025-11-25, SEP-1686) client asks for a task with `params.task` on `tools/call`; a modern
(2026-07-28, SEP-2663) client declares the tasks extension and the gateway decides per tool (`never`,
`always`, or `after_ms`: a task only if the call outlives N ms). Either way the upstream call runs in
the background on a channel the task holds until it ends, so the task outlives the client's
connection and session. Its notifications go through capture into the task's log; its outcome is
kept for `tasks/result` / `tasks/get`.

This module answers the task methods as plain messages; HTTP, SSE and keep-alives stay in the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from gateway.config import RetentionConfig, TasksConfig, ToolTaskPolicy
from gateway.events.capture import RELATED_TASK_KEY
from gateway.protocol import jsonrpc
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, Era
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.tasks.registry import StatusListener, Task, TaskLimitReached, TaskRegistry, TaskStatus
from gateway.upstream.base import Exchange, UpstreamChannel

log = logging.getLogger("gateway.tasks.hosted")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
LEGACY_TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
MODERN_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the owner tasks are bound to, and the era that fixes the dialect."""

    owner: str
    era: Era


def declares_tasks_extension(message: Message) -> bool:
    capabilities = jsonrpc.meta_of(message).get(CLIENT_CAPABILITIES_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def missing_extension(request_id: RequestId | None) -> ProtocolError:
    return ProtocolError(
        jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"Missing required client capability: declare the {TASKS_EXTENSION} extension in clientCapabilities",
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        request_id=request_id,
    )


def unknown_task(request_id: RequestId | None) -> ProtocolError:
    # One message for unknown and foreign tasks, so ids cannot be probed.
    return ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: no such task", request_id=request_id)


def result_message(request_id: RequestId, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class HostedTasks:
    def __init__(self, registry: TaskRegistry, config: TasksConfig, retention: RetentionConfig, events: bool):
        self.registry = registry
        self._config = config
        self._retention = retention
        self._events = events
        self._runners: set[asyncio.Task[None]] = set()

    # -- what the gateway advertises ----------------------------------------------------------

    def event_streams_capability(self) -> dict[str, int]:
        return {
            "maxEventsPerTask": self._retention.max_events_per_task,
            "maxEventAgeMs": int(self._retention.max_event_age_s * 1000),
            "terminalRetentionMs": int(self._retention.terminal_retention_s * 1000),
            "maxPayloadBytes": self._retention.max_payload_bytes,
        }

    def advertise_legacy(self, result: dict[str, Any], upstream_has_tasks: bool) -> dict[str, Any]:
        """The initialize result with the gateway's task capability (and eventStreams) in it."""
        capabilities = dict(result.get("capabilities") or {})
        tasks = dict(capabilities.get("tasks") or {})
        if not upstream_has_tasks:
            tasks = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        if self._events:
            tasks["eventStreams"] = self.event_streams_capability()
        capabilities["tasks"] = tasks
        return {**result, "capabilities": capabilities}

    def advertise_modern(self, result: dict[str, Any]) -> dict[str, Any]:
        """The server/discover result with the tasks extension (and eventStreams) in it."""
        capabilities = dict(result.get("capabilities") or {})
        extensions = dict(capabilities.get("extensions") or {})
        settings = dict(extensions.get(TASKS_EXTENSION) or {})
        if self._events:
            settings["eventStreams"] = self.event_streams_capability()
        extensions[TASKS_EXTENSION] = settings
        capabilities["extensions"] = extensions
        return {**result, "capabilities": capabilities}

    def policy(self, tool: object) -> ToolTaskPolicy:
        name = tool if isinstance(tool, str) else ""
        for policy in self._config.tools:
            if fnmatch.fnmatchcase(name, policy.match):
                return policy
        return ToolTaskPolicy(task_support="forbidden", modern="never")

    def annotate_tools(self, result: dict[str, Any]) -> dict[str, Any]:
        """tools/list for legacy clients: each tool's execution.taskSupport from the policy."""
        tools = result.get("tools")
        if not isinstance(tools, list):
            return result
        annotated = []
        for tool in tools:
            if isinstance(tool, dict):
                execution = {**(tool.get("execution") or {}), "taskSupport": self.policy(tool.get("name")).task_support}
                tool = {**tool, "execution": execution}
            annotated.append(tool)
        return {**result, "tools": annotated}

    # -- creating and running tasks -------------------------------------------------------------

    def upstream_call(self, message: Message, era: Era) -> Message:
        """The tools/call as the upstream sees it: without the task request it cannot honour, and with
        a progress token (and, in 2026-07-28, a log level) so the call's notifications can be captured.
        The client's own token and level are kept when it sent them."""
        params = {key: value for key, value in jsonrpc.params_of(message).items() if key != "task"}
        meta = dict(params.get("_meta") or {})
        meta.setdefault("progressToken", f"gateway-task-{message['id']}")
        if era is Era.MODERN:
            meta.setdefault(LOG_LEVEL_KEY, "info")
        return {**message, "params": {**params, "_meta": meta}}

    async def create(self, caller: Caller, message: Message) -> Task:
        params = jsonrpc.params_of(message)
        requested = params.get("task", {}).get("ttl") if isinstance(params.get("task"), dict) else None
        try:
            return await self.registry.create(caller.owner, str(params.get("name")), requested, era=caller.era.value)
        except TaskLimitReached as exc:
            raise ProtocolError(jsonrpc.INTERNAL_ERROR, f"Too many tasks: {exc}", request_id=message["id"]) from None

    def run(self, task: Task, caller: Caller, exchange: Exchange, resources: AsyncExitStack) -> None:
        """Consume the upstream call in the background; `resources` (the channel lease) close with it."""
        task.cancel = exchange.cancel
        runner = asyncio.create_task(self._run(task, caller, exchange, resources), name=f"task-{task.id}")
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)

    async def _run(self, task: Task, caller: Caller, exchange: Exchange, resources: AsyncExitStack) -> None:
        outcome: Message | None = None
        try:
            async with resources:
                while (batch := await exchange.next_batch()) is not None:
                    events = []
                    for message in batch:
                        if jsonrpc.is_final(message):
                            outcome = message
                        elif (event := self.registry.capture.from_notification(message)) is not None:
                            events.append(event)
                    if events:
                        await self.registry.record(task, *events)
        except Exception:
            log.exception("hosted task runner failed", extra={"task": task.id})
            outcome = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, "gateway task runner failed")
        await self.finish(task, caller, outcome)

    async def finish(self, task: Task, caller: Caller, outcome: Message | None) -> None:
        if task.terminal:
            return
        if outcome is None:
            outcome = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "the upstream call ended without a response")
        error = outcome.get("error")
        result = outcome.get("result")
        if isinstance(error, dict):
            status, message = TaskStatus.FAILED, str(error.get("message", "error"))
        elif caller.era is Era.LEGACY and isinstance(result, dict) and result.get("isError"):
            status, message = TaskStatus.FAILED, "the tool reported an error (isError)"
        else:
            status, message = TaskStatus.COMPLETED, None
        await self.registry.set_status(task, status, message, outcome=outcome)

    async def stop(self) -> None:
        for runner in list(self._runners):
            runner.cancel()
        for runner in list(self._runners):
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    # -- legacy (SEP-1686) ---------------------------------------------------------------------

    async def start_legacy(
        self,
        caller: Caller,
        channel: UpstreamChannel,
        message: Message,
        resources: AsyncExitStack,
        on_status: StatusListener | None = None,
    ) -> Message:
        """Create the task, start the upstream call, and answer with CreateTaskResult at once."""
        task = await self.create(caller, message)
        task.on_status = on_status
        exchange = await channel.request(self.upstream_call(message, Era.LEGACY), {})
        self.run(task, caller, exchange, resources)
        return result_message(message["id"], {"task": task.legacy_view()})

    async def legacy_method(self, caller: Caller, message: Message) -> Message:
        """tasks/get, tasks/list and tasks/cancel (tasks/result blocks: see `legacy_result`)."""
        method, request_id = message["method"], message["id"]
        params = jsonrpc.params_of(message)
        if method == "tasks/list":
            return result_message(request_id, self._list(caller, params.get("cursor"), request_id))
        task = self.registry.get(caller.owner, params.get("taskId"))
        if task is None:
            raise unknown_task(request_id)
        if method == "tasks/cancel":
            await self.cancel(task, caller, request_id)
        return result_message(request_id, task.legacy_view())

    async def legacy_result(self, caller: Caller, message: Message) -> Message:
        task = self.registry.get(caller.owner, jsonrpc.params_of(message).get("taskId"))
        if task is None:
            raise unknown_task(message["id"])
        await task.done.wait()
        return related_outcome(task, message["id"])

    def _list(self, caller: Caller, cursor: object, request_id: RequestId) -> dict[str, Any]:
        tasks = self.registry.owned_by(caller.owner)
        start = 0
        if cursor is not None:
            if not isinstance(cursor, str) or not cursor.isdigit() or int(cursor) > len(tasks):
                raise ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: unknown cursor", request_id=request_id)
            start = int(cursor)
        page = tasks[start : start + self._config.page_size]
        result: dict[str, Any] = {"tasks": [task.legacy_view() for task in page]}
        if start + len(page) < len(tasks):
            result["nextCursor"] = str(start + len(page))
        return result

    async def cancel(self, task: Task, caller: Caller, request_id: RequestId) -> None:
        if task.terminal:
            raise ProtocolError(
                jsonrpc.INVALID_PARAMS,
                f"Invalid params: task is already {task.status.value} and cannot be cancelled",
                request_id=request_id,
            )
        hook, task.cancel = task.cancel, None
        await self.registry.set_status(task, TaskStatus.CANCELLED, "cancelled by the client")
        if hook is not None:
            await hook()

    # -- modern (SEP-2663) ---------------------------------------------------------------------

    async def modern_method(self, caller: Caller, message: Message) -> Message:
        """tasks/get, tasks/update and tasks/cancel."""
        method, request_id = message["method"], message["id"]
        task = self.registry.get(caller.owner, jsonrpc.params_of(message).get("taskId"))
        if task is None:
            raise unknown_task(request_id)
        if method == "tasks/get":
            return result_message(request_id, {"resultType": "complete", **task.modern_view()})
        if method == "tasks/cancel" and not task.terminal:
            await self.cancel(task, caller, request_id)
        return result_message(request_id, {"resultType": "complete"})

    def modern_created(self, task: Task, request_id: RequestId) -> Message:
        return result_message(request_id, {"resultType": "task", **task.modern_view()})


def related_outcome(task: Task, request_id: RequestId) -> Message:
    """What tasks/result returns: exactly the upstream's result or error, tagged with related-task."""
    related = {RELATED_TASK_KEY: {"taskId": task.id}}
    outcome = task.outcome
    if outcome is not None and isinstance(outcome.get("result"), dict):
        result = outcome["result"]
        return result_message(request_id, {**result, "_meta": {**(result.get("_meta") or {}), **related}})
    if outcome is not None and isinstance(outcome.get("error"), dict):
        return {"jsonrpc": "2.0", "id": request_id, "error": outcome["error"]}
    error = jsonrpc.error_response(request_id, jsonrpc.REQUEST_CANCELLED, f"Task {task.status.value}")
    error["error"]["data"] = {"_meta": related}
    return error
