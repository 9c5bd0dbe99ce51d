"""Gateway-hosted tasks: Tasks for an upstream that has none, in both dialects.

A legacy (2025-11-25, SEP-1686) client asks for a task with `params.task` on `tools/call`; a modern
(2026-07-28, SEP-2663) client declares the tasks extension and the gateway decides per tool whether and
when the call becomes a task (`gateway.tasks.policy`). Either way the upstream call runs in the
background on a channel the task holds until it ends, so the task outlives the client's connection and
session. Its notifications go through capture into the task's log; its outcome is
kept for `tasks/result` / `tasks/get`.

Input mid-task: in 2025-11-25 the upstream sends server-to-client requests (elicitation, sampling) on
the call; the task goes `input_required` and each request reaches the client with the related-task
`_meta` on an open `tasks/result` stream, else on the owning session's GET stream, and the client's
response goes back upstream. In 2026-07-28 the call ends with `resultType: "input_required"` (before the
task exists that round goes to the client as it is; see the policy); once the task exists, the task
shows the `inputRequests`, collects answers through `tasks/update`, and retries the call upstream with
`inputResponses` and the echoed `requestState`. Every step is an event in the task's log.

This module answers the task methods as plain messages; HTTP, SSE and keep-alives stay in the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from gateway.config import RetentionConfig, TasksConfig, ToolTaskPolicy
from gateway.events.capture import RELATED_TASK_KEY, TaskEvent
from gateway.protocol import jsonrpc
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, TASKS_EXTENSION, Era
from gateway.protocol.jsonrpc import Message, Overloaded, ProtocolError, RequestId
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import (
    InputListener,
    InputRound,
    PendingRequest,
    StatusListener,
    Task,
    TaskLimitReached,
    TaskRegistry,
    legacy_view,
)
from gateway.tasks.store import InvalidCursor
from gateway.upstream.base import Exchange, UpstreamChannel

log = logging.getLogger("gateway.tasks.hosted")

LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
LEGACY_TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
MODERN_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
MAX_INPUT_ROUNDS = 32
"""How many times a 2026-07-28 task's call may answer `input_required` before the task fails."""
STATE_ONLY_RETRY_S = 0.2
"""Pause before retrying an `input_required` round that asks for nothing (only `requestState`)."""
SUMMARY_TEXT_CHARS = 200
"""Request texts (an elicitation's message) are cut to this many characters in input events."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the owner tasks are bound to, and the era that fixes the dialect."""

    owner: str
    era: Era


def declares_tasks_extension(message: Message) -> bool:
    capabilities = jsonrpc.meta_of(message).get(CLIENT_CAPABILITIES_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def missing_extension(request_id: RequestId | None, why: str = "") -> ProtocolError:
    """-32021 for a client that did not declare the tasks extension; `why` (a clause) says what needs it."""
    return ProtocolError(
        jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"Missing required client capability: {why}declare the {TASKS_EXTENSION} extension in clientCapabilities",
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        request_id=request_id,
    )


def task_limit_error(exc: TaskLimitReached, request_id: RequestId) -> ProtocolError:
    """The gateway-wide ceiling is an overload (503, Retry-After); the per-caller one stays a plain error."""
    if exc.total:
        remedy = "retry later: tasks leave the count when their ttl runs out; ask for a shorter ttl"
        return Overloaded("tasks.max_tasks_total", str(exc), remedy, request_id=request_id)
    return ProtocolError(jsonrpc.INTERNAL_ERROR, f"Too many tasks: {exc}", request_id=request_id)


def unknown_task(request_id: RequestId | None) -> ProtocolError:
    # One message for unknown and foreign tasks, so ids cannot be probed.
    return ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: no such task", request_id=request_id)


def result_message(request_id: RequestId, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A task's tools/call as the upstream first got it, and the channel it runs on.

    The task holds the channel until it ends, so an `input_required` retry goes to the same upstream:
    the SDK's default `requestState` key lives in one process, and another pooled process would refuse
    the echoed state."""

    channel: UpstreamChannel
    message: Message
    headers: Mapping[str, str]


class HostedTasks:
    def __init__(self, registry: TaskRegistry, config: TasksConfig, retention: RetentionConfig, events: bool):
        self.registry = registry
        self._config = config
        self._retention = retention
        self._events = events
        self._runners: set[asyncio.Task[None]] = set()
        self._calls: dict[str, UpstreamCall] = {}

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
        return self._config.policy_for(tool)

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
            return await self.registry.create(
                caller.owner, str(params.get("name")), requested, dialect=caller.era.value
            )
        except TaskLimitReached as exc:
            raise task_limit_error(exc, message["id"]) from None

    def check_room(self, caller: Caller, message: Message) -> None:
        """Refuse a call that must become a task before it starts, when no task can be created."""
        try:
            self.registry.check_room(caller.owner)
        except TaskLimitReached as exc:
            raise task_limit_error(exc, message["id"]) from None

    def run(
        self, task: Task, caller: Caller, call: UpstreamCall, exchange: Exchange, resources: AsyncExitStack
    ) -> None:
        """Consume the upstream call in the background; `resources` (the channel lease) close with it."""
        task.cancel = exchange.cancel
        self._calls[task.id] = call
        runner = asyncio.create_task(self._run(task, caller, call, exchange, resources), name=f"task-{task.id}")
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)

    async def _run(
        self, task: Task, caller: Caller, call: UpstreamCall, exchange: Exchange, resources: AsyncExitStack
    ) -> None:
        outcome: Message | None = None
        try:
            async with resources:
                rounds = 0
                while True:
                    outcome = await self._consume(task, caller, call, exchange)
                    if caller.era is not Era.MODERN or not input_required(outcome) or task.terminal:
                        break
                    rounds += 1
                    if rounds > MAX_INPUT_ROUNDS:
                        text = f"the upstream asked for input more than {MAX_INPUT_ROUNDS} times"
                        outcome = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, text)
                        break
                    assert outcome is not None
                    retry = await self._input_round(task, call, outcome, rounds)
                    if retry is None or task.terminal:
                        outcome = None
                        break
                    exchange = await call.channel.request(retry, call.headers)
                    if task.terminal:  # cancelled while the retry was being sent
                        await exchange.cancel()
                        break
                    task.cancel = exchange.cancel
        except Exception:
            log.exception("hosted task runner failed", extra={"task": task.id})
            outcome = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, "gateway task runner failed")
        finally:
            self._calls.pop(task.id, None)
        await self.finish(task, caller, outcome)

    async def _consume(self, task: Task, caller: Caller, call: UpstreamCall, exchange: Exchange) -> Message | None:
        """Record the call's notifications, handle its server-to-client requests; the response."""
        outcome: Message | None = None
        capture = self.registry.capture
        while (batch := await exchange.next_batch()) is not None:
            events: list[TaskEvent] = []
            for message in batch:
                if jsonrpc.is_final(message):
                    outcome = message
                elif "id" in message:
                    if events:  # keep the log in arrival order
                        await self.registry.record(task, *events)
                        events = []
                    await self._server_request(task, caller, call, message)
                elif (event := capture.from_notification(message)) is not None:
                    events.append(event)
            if events:
                await self.registry.record(task, *events)
        return outcome

    # -- input mid-task ------------------------------------------------------------------------

    async def _server_request(self, task: Task, caller: Caller, call: UpstreamCall, message: Message) -> None:
        """A request the upstream sends on the task's call (legacy: elicitation, sampling, roots)."""
        method = str(message.get("method"))
        if method == "ping":
            await call.channel.respond(result_message(message["id"], {}), call.headers)
            return
        if caller.era is Era.MODERN or task.terminal:
            # A 2026-07-28 client cannot be asked mid-call (MRTR replaced these requests); never hang.
            text = f"Method not found: {method} cannot reach the client of this task"
            await call.channel.respond(
                jsonrpc.error_response(message["id"], jsonrpc.METHOD_NOT_FOUND, text), call.headers
            )
            return
        pending = PendingRequest(with_related_task(message, task.id))
        task.pending_requests[pending.id] = pending
        if task.status is not TaskStatus.INPUT_REQUIRED:
            await self.registry.set_status(
                task, TaskStatus.INPUT_REQUIRED, f"waiting for the client to answer {method}"
            )
        requested = self.registry.capture.lifecycle(
            "input.requested", method=method, requestId=pending.id, **summarize_request(message)
        )
        await self.registry.record(task, requested)
        if task.result_streams == 0 and task.on_input is not None:
            await task.on_input(task, pending)
        if not pending.delivered:
            task.undelivered.set()  # an open (or the next) tasks/result stream carries it

    def claim_undelivered(self, task: Task) -> list[PendingRequest]:
        """Legacy: the task's pending requests no open stream carries; the caller delivers them."""
        task.undelivered.clear()
        return [pending for pending in task.pending_requests.values() if not pending.delivered]

    async def answer_legacy(self, task: Task, response: Message, headers: Mapping[str, str]) -> None:
        """The client's JSON-RPC response to one of the task's requests: record it, send it upstream."""
        pending = task.pending_requests.pop(response["id"], None)
        call = self._calls.get(task.id)
        if pending is None or call is None:
            log.info("dropping a response for a settled task request", extra={"task": task.id})
            return
        pending.settle()
        method = str(pending.request.get("method"))
        answered = self.registry.capture.lifecycle(
            "input.answered", method=method, requestId=pending.id, **summarize_answer(response)
        )
        await self.registry.record(task, answered)
        if not task.pending_requests and task.status is TaskStatus.INPUT_REQUIRED:
            await self.registry.set_status(task, TaskStatus.WORKING)
        await call.channel.respond(response, headers)

    async def _input_round(self, task: Task, call: UpstreamCall, outcome: Message, number: int) -> Message | None:
        """Modern: show the round's `inputRequests`, wait for `tasks/update` to answer them all, and
        return the retry of the call; None when the task ended meanwhile."""
        result = outcome["result"]
        requests = result.get("inputRequests")
        state = result.get("requestState")
        answers: dict[str, Any] = {}
        if isinstance(requests, dict) and requests:
            shown: dict[str, Any] = {}
            upstream_keys: dict[str, str] = {}
            for key, request in requests.items():
                fresh = fresh_key(key, number, task.input_keys)
                task.input_keys.add(fresh)
                shown[fresh], upstream_keys[fresh] = request, key
            round_ = InputRound(shown, upstream_keys, state)
            task.input_round = round_
            stopped = asyncio.Event()

            async def stop() -> None:
                stopped.set()

            task.cancel = stop
            await self.registry.set_status(
                task, TaskStatus.INPUT_REQUIRED, "waiting for input: answer inputRequests with tasks/update"
            )
            capture = self.registry.capture
            await self.registry.record(
                task,
                *(
                    capture.lifecycle(
                        "input.requested", key=key, method=method_of(request), **summarize_request(request)
                    )
                    for key, request in shown.items()
                ),
            )
            await wait_any((round_.answered, task.done, stopped))
            task.input_round = None
            if not round_.answered.is_set() or task.terminal:
                return None
            answers = {upstream_keys[key]: response for key, response in round_.responses.items()}
        else:
            await asyncio.sleep(STATE_ONLY_RETRY_S)
            if task.terminal:
                return None
        params = {
            key: value
            for key, value in jsonrpc.params_of(call.message).items()
            if key not in ("inputResponses", "requestState")
        }
        if answers:
            params["inputResponses"] = answers
        if state is not None:
            params["requestState"] = state
        return {**call.message, "id": f"gateway-task-{task.id}-{number}", "params": params}

    async def update(self, task: Task, params: dict[str, Any], request_id: RequestId) -> None:
        """Modern tasks/update: store answers to outstanding input requests; unknown and already-answered
        keys are ignored. The answer that completes the round sends the task back to working."""
        responses = params.get("inputResponses")
        if responses is None:
            return
        if not isinstance(responses, dict) or not all(isinstance(value, dict) for value in responses.values()):
            raise ProtocolError(
                jsonrpc.INVALID_PARAMS,
                "Invalid params: inputResponses must map input keys to response objects",
                request_id=request_id,
            )
        round_ = task.input_round
        if round_ is None or task.terminal or round_.answered.is_set():
            return
        fresh = {key: value for key, value in responses.items() if key in round_.outstanding}
        round_.responses.update(fresh)
        complete = bool(fresh) and not round_.outstanding  # decided before any await: exactly one update
        capture = self.registry.capture
        events = [
            capture.lifecycle(
                "input.answered", key=key, method=method_of(round_.requests[key]), **summarize_answer(value)
            )
            for key, value in fresh.items()
        ]
        if events:
            await self.registry.record(task, *events)
        if complete:
            await self.registry.set_status(task, TaskStatus.WORKING)
            round_.answered.set()

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
        on_input: InputListener | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Create the task, start the upstream call, and answer with CreateTaskResult at once."""
        task = await self.create(caller, message)
        task.on_status = on_status
        task.on_input = on_input
        call = UpstreamCall(channel, self.upstream_call(message, Era.LEGACY), headers or {})
        exchange = await channel.request(call.message, {})
        self.run(task, caller, call, exchange, resources)
        return result_message(message["id"], {"task": task.legacy_view()})

    async def legacy_method(self, caller: Caller, message: Message) -> Message:
        """tasks/get, tasks/list and tasks/cancel (tasks/result blocks: see `legacy_result`)."""
        method, request_id = message["method"], message["id"]
        params = jsonrpc.params_of(message)
        if method == "tasks/list":
            return result_message(request_id, await self._list(caller, params.get("cursor"), request_id))
        task = self.registry.get(caller.owner, params.get("taskId"))
        if task is None:
            raise unknown_task(request_id)
        if method == "tasks/cancel":
            await self.cancel(task, caller, request_id)
        return result_message(request_id, task.legacy_view())

    def legacy_task(self, caller: Caller, message: Message) -> Task:
        """The task a tasks/result asks for (it blocks, relaying the task's requests: see the edge)."""
        task = self.registry.get(caller.owner, jsonrpc.params_of(message).get("taskId"))
        if task is None:
            raise unknown_task(message["id"])
        return task

    async def _list(self, caller: Caller, cursor: object, request_id: RequestId) -> dict[str, Any]:
        """A page of the caller's tasks, from the task store (so records this process does not run count)."""
        page = None
        if cursor is None or isinstance(cursor, str):
            with contextlib.suppress(InvalidCursor):
                page = await self.registry.list_owned(caller.owner, cursor)
        if page is None:
            raise ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: unknown cursor", request_id=request_id)
        result: dict[str, Any] = {"tasks": [legacy_view(record) for record in page.records]}
        if page.next_cursor is not None:
            result["nextCursor"] = page.next_cursor
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
        if method == "tasks/update":
            await self.update(task, jsonrpc.params_of(message), request_id)
        if method == "tasks/cancel" and not task.terminal:
            await self.cancel(task, caller, request_id)
        return result_message(request_id, {"resultType": "complete"})

    def modern_created(self, task: Task, request_id: RequestId) -> Message:
        """CreateTaskResult: the Task as it is now, without what tasks/get adds (the outcome, inputRequests)."""
        return result_message(request_id, {"resultType": "task", **task.modern_task()})


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


def input_required(outcome: Message | None) -> bool:
    """Whether a 2026-07-28 response asks for input (MRTR) rather than ending the call."""
    result = outcome.get("result") if outcome is not None else None
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def with_related_task(message: Message, task_id: str) -> Message:
    params = jsonrpc.params_of(message)
    meta = {**jsonrpc.meta_of(message), RELATED_TASK_KEY: {"taskId": task_id}}
    return {**message, "params": {**params, "_meta": meta}}


def fresh_key(key: str, number: int, used: set[str]) -> str:
    """An input key the task has not used yet: the upstream's, else namespaced by round (`r2.<key>`)."""
    candidate, n = key, 1
    while candidate in used:
        candidate = f"r{number}.{key}" if n == 1 else f"r{number}.{n}.{key}"
        n += 1
    return candidate


def method_of(request: object) -> str | None:
    method = request.get("method") if isinstance(request, dict) else None
    return method if isinstance(method, str) else None


def summarize_request(request: object) -> dict[str, Any]:
    """What an input event says about a request besides its method: its shape, never a large payload."""
    params = jsonrpc.params_of(request) if isinstance(request, dict) else {}
    summary: dict[str, Any] = {}
    method = method_of(request)
    if method == "elicitation/create":
        summary["mode"] = params.get("mode", "form")
        if isinstance(params.get("message"), str):
            summary["message"] = params["message"][:SUMMARY_TEXT_CHARS]
        schema = params.get("requestedSchema")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict):
            summary["fields"] = list(properties)
        if isinstance(params.get("url"), str):
            summary["url"] = params["url"][:SUMMARY_TEXT_CHARS]
    elif method == "sampling/createMessage":
        messages = params.get("messages")
        summary["messages"] = len(messages) if isinstance(messages, list) else 0
        if "maxTokens" in params:
            summary["maxTokens"] = params["maxTokens"]
    else:
        summary["params"] = sorted(key for key in params if key != "_meta")
    return summary


def summarize_answer(answer: Message) -> dict[str, Any]:
    """What an input event says about an answer (a JSON-RPC response, or a modern input response):
    the action or outcome, never the content's values."""
    error = answer.get("error")
    if isinstance(error, dict):
        return {"error": {"code": error.get("code"), "message": error.get("message")}}
    result = answer.get("result", answer)
    if not isinstance(result, dict):
        return {}
    summary: dict[str, Any] = {}
    if isinstance(result.get("action"), str):
        summary["action"] = result["action"]
        if isinstance(result.get("content"), dict):
            summary["fields"] = sorted(result["content"])
    for key in ("model", "stopReason"):
        if isinstance(result.get(key), str):
            summary[key] = result[key]
    if not summary:
        summary["keys"] = sorted(key for key in result if key != "_meta")
    return summary


async def wait_any(events: tuple[asyncio.Event, ...], timeout: float | None = None) -> bool:
    """Wait until one of `events` is set (True) or `timeout` seconds pass (False)."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return bool(done)
