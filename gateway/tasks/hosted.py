"""Gateway-hosted tasks: Tasks for an upstream that has none, in both dialects.

A legacy (2025-11-25, SEP-1686) client asks for a task with `params.task` on `tools/call`; a modern
(2026-07-28, SEP-2663) client declares the tasks extension and the gateway decides per tool whether and
when the call becomes a task (`gateway.tasks.policy`). Either way the upstream call runs in the
background on a channel the task holds until it ends, so the task outlives the client's connection and
session. Its notifications go through capture into the task's log; its outcome is kept for
`tasks/result` / `tasks/get`. Input the call asks for on the way is `gateway.tasks.input`'s.

This module answers the task methods as plain messages, in the shapes of the caller's dialect; HTTP,
SSE and keep-alives stay in the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from gateway.config import RetentionConfig, TasksConfig
from gateway.events.capture import TaskEvent
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LEGACY, TASK_TOOL_KEY, TASK_UPSTREAM_KEY, Dialect, dialect_of, unknown_task
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.tasks.answers import (
    already_ended,
    outcome_status,
    related_outcome,
    result_message,
    task_elsewhere,
    task_limit_error,
)
from gateway.tasks.input import MAX_INPUT_ROUNDS, TaskInput, UpstreamCall, input_required, input_responses
from gateway.tasks.lease_store import LeaseStore
from gateway.tasks.lifecycle import Event
from gateway.tasks.reads import StoredTask, TaskReads
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.registry import InputListener, StatusListener, Task, TaskLimitReached, TaskRegistry
from gateway.tasks.store import InvalidCursor
from gateway.upstream.base import CLIENT_CANCEL_REASON, Exchange, UpstreamChannel

__all__ = ["Caller", "HostedTasks", "related_outcome", "task_elsewhere"]

log = logging.getLogger("gateway.tasks.hosted")

SEALED_POLL_S = 0.02
"""How often a cancel waiting on another replica reads a record whose log is sealed (status due)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the owner tasks are bound to, and the era that fixes the dialect."""

    owner: str
    era: Era

    @property
    def dialect(self) -> Dialect:
        return dialect_of(self.era)


class HostedTasks:
    def __init__(self, registry: TaskRegistry, config: TasksConfig, retention: RetentionConfig, events: bool):
        self.registry = registry
        self.input = TaskInput(registry)
        self.reads = TaskReads(registry.store, registry.log)
        self._config = config
        self.retention = retention
        """`[retention]`, as advertised in `eventStreams` (replaced on a config reload)."""
        self._events = events
        self._runners: set[asyncio.Task[None]] = set()
        self.leases: LeaseStore | None = None
        """Shared stores: where a cancel or input answers for a task another replica runs are recorded."""

    # -- what the gateway advertises ----------------------------------------------------------

    def event_streams_capability(self) -> dict[str, int]:
        return {
            "maxEventsPerTask": self.retention.max_events_per_task,
            "maxEventAgeMs": int(self.retention.max_event_age_s * 1000),
            "terminalRetentionMs": int(self.retention.terminal_retention_s * 1000),
            "maxPayloadBytes": self.retention.max_payload_bytes,
        }

    def advertise(self, result: dict[str, Any], dialect: Dialect) -> dict[str, Any]:
        """The initialize / server/discover result with the gateway's task capability (and eventStreams)."""
        return dialect.advertise(result, self.event_streams_capability() if self._events else None)

    # -- creating and running tasks -------------------------------------------------------------

    def upstream_call(self, message: Message, dialect: Dialect) -> Message:
        """The tools/call as the upstream sees it: without the task request it cannot honour, and with
        a progress token (and, in 2026-07-28, a log level) so the call's notifications can be captured.
        The client's own token and level are kept when it sent them."""
        params = {key: value for key, value in jsonrpc.params_of(message).items() if key != "task"}
        meta = dict(params.get("_meta") or {})
        meta.setdefault("progressToken", f"gateway-task-{message['id']}")
        for key, value in dialect.upstream_call_meta.items():
            meta.setdefault(key, value)
        return {**message, "params": {**params, "_meta": meta}}

    async def create(self, caller: Caller, message: Message) -> Task:
        params = jsonrpc.params_of(message)
        requested = params.get("task", {}).get("ttl") if isinstance(params.get("task"), dict) else None
        try:
            return await self.registry.create(
                caller.owner,
                str(params.get("name")),
                requested,
                dialect=caller.era.value,
                arguments=params.get("arguments"),
            )
        except TaskLimitReached as exc:
            raise task_limit_error(exc, message["id"]) from None

    def check_room(self, caller: Caller, message: Message) -> None:
        """Refuse a call that must become a task before it starts, when no task can be created."""
        try:
            self.registry.check_room(caller.owner)
        except TaskLimitReached as exc:
            raise task_limit_error(exc, message["id"]) from None

    def created(self, caller: Caller, task: Task, request_id: RequestId) -> Message:
        """CreateTaskResult: the Task as it is now, without what tasks/get adds (the outcome, inputRequests)."""
        return result_message(request_id, caller.dialect.created_result(task))

    def run(
        self, task: Task, caller: Caller, call: UpstreamCall, exchange: Exchange, resources: AsyncExitStack
    ) -> None:
        """Consume the upstream call in the background; `resources` (the channel lease) close with it."""
        task.cancel = exchange.cancel
        self.input.running(task, call)
        runner = asyncio.create_task(self._run(task, caller, call, exchange, resources), name=f"task-{task.id}")
        task.runner = runner
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
                    # Only a 2026-07-28 call ends asking for input (MRTR) and is retried; a 2025-11-25
                    # call asks with requests on the way (see `_server_request`).
                    if not caller.dialect.input_by_retry or not input_required(outcome) or task.terminal:
                        break
                    rounds += 1
                    if rounds > MAX_INPUT_ROUNDS:
                        text = f"the upstream asked for input more than {MAX_INPUT_ROUNDS} times"
                        outcome = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, text)
                        break
                    assert outcome is not None
                    retry = await self.input.round(task, call, outcome, rounds)
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
            self.input.ended(task)
        await self.finish(task, caller, outcome)

    async def _consume(self, task: Task, caller: Caller, call: UpstreamCall, exchange: Exchange) -> Message | None:
        """Record the call's notifications, handle its server-to-client requests; the response."""
        outcome: Message | None = None
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
                elif (event := self.registry.capture_from(task, message)) is not None:
                    events.append(event)
            if events:
                await self.registry.record(task, *events)
        return outcome

    async def _server_request(self, task: Task, caller: Caller, call: UpstreamCall, message: Message) -> None:
        """A request the upstream sends on the task's call (legacy: elicitation, sampling, roots)."""
        method = str(message.get("method"))
        if method == "ping":
            await call.channel.respond(result_message(message["id"], {}), call.headers)
            return
        # A 2026-07-28 client cannot be asked mid-call (MRTR replaced these requests); never hang.
        if caller.dialect.input_by_retry or task.terminal:
            text = f"Method not found: {method} cannot reach the client of this task"
            await call.channel.respond(
                jsonrpc.error_response(message["id"], jsonrpc.METHOD_NOT_FOUND, text), call.headers
            )
            return
        await self.input.request(task, message)

    async def finish(self, task: Task, caller: Caller, outcome: Message | None) -> None:
        """The upstream call's outcome arrived (None: the call ended without one): the task ends with it."""
        if outcome is None:
            outcome = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "the upstream call ended without a response")
        status, message = outcome_status(outcome, caller.dialect)
        await self.registry.feed(task, Event.OUTCOME_ARRIVED, status, message, outcome=outcome)

    async def stop(self) -> None:
        for runner in list(self._runners):
            runner.cancel()
        for runner in list(self._runners):
            with contextlib.suppress(asyncio.CancelledError):
                await runner

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
        """A task-augmented tools/call (SEP-1686): create the task, start the upstream call, and answer
        with CreateTaskResult at once."""
        task = await self.create(caller, message)
        task.on_status = on_status
        task.on_input = on_input
        call = UpstreamCall(channel, self.upstream_call(message, LEGACY), headers or {})
        try:
            exchange = await channel.request(call.message, call.headers)
        except Exception:  # the call never started: the task must not stay working without a runner
            await self.finish(
                task,
                caller,
                jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "the upstream call could not be sent"),
            )
            raise
        self.run(task, caller, call, exchange, resources)
        return self.created(caller, task, message["id"])

    # -- the task methods --------------------------------------------------------------------------

    async def method(self, caller: Caller, message: Message) -> Message:
        """tasks/get, tasks/cancel, and tasks/list (2025-11-25) or tasks/update (2026-07-28), in the
        caller's dialect (tasks/result: `result` once ended, else `plans.AwaitResult`), read from the
        stores so that a task another process runs answers like one this process runs."""
        method, request_id = message["method"], message["id"]
        params = jsonrpc.params_of(message)
        dialect = caller.dialect
        if method == "tasks/list":
            return result_message(request_id, await self._list(caller, params.get("cursor"), request_id))
        record = await self.record_named(caller, message)
        task = self.registry.find(record.id)  # None: another process runs it (only that one can drive it)
        if method == "tasks/get":
            requests = task.input_requests if task is not None else None
            details = await self.reads.stored(record, with_outcome=dialect.detailed_views, input_requests=requests)
            return result_message(request_id, dialect.get_result(details))
        if method == "tasks/update":
            responses = input_responses(params, request_id)
            if task is not None:
                await self.input.update(task, responses)
            elif not record.terminal:
                await self._owner_of(record, request_id).request_input(record.id, responses)
            return result_message(request_id, dict(dialect.empty_result))
        if task is not None:  # tasks/cancel
            if not task.terminal or dialect.ended_cancel_is_error:
                await self.cancel(task, request_id)
            return result_message(request_id, dialect.cancel_result(task))
        if not record.terminal:
            if await self._owner_of(record, request_id).request_cancel(record.id):
                record = await self._until_ended(record)
            else:  # it ended meanwhile
                record = await self.reads.record(caller.owner, record.id) or record
            if not record.terminal or record.status is TaskStatus.CANCELLED:
                return result_message(request_id, dialect.cancel_result(record))
        if dialect.ended_cancel_is_error:
            raise already_ended(record, request_id)
        return result_message(request_id, dialect.cancel_result(record))

    def _owner_of(self, record: TaskRecord, request_id: RequestId) -> LeaseStore:
        """Where requests for a task another replica runs are recorded; `task_elsewhere` on an exclusive
        store (no replica runs the task: a process there finds it before it serves)."""
        if self.leases is None:
            raise task_elsewhere(record, request_id)
        return self.leases

    async def _until_ended(self, record: TaskRecord) -> TaskRecord:
        """The record once it is terminal (its owner carrying out a cancel), waiting on its log; as it is
        after two lease TTLs and a second (time for a takeover, if its owner died)."""
        loop = asyncio.get_running_loop()
        assert self.leases is not None
        deadline = loop.time() + 2 * self.leases.ttl_s + 1.0
        while not record.terminal and (left := deadline - loop.time()) > 0:
            bounds = await self.reads.bounds(record)
            if bounds.sealed:  # the terminal events are in: the status follows at once
                await asyncio.sleep(min(left, SEALED_POLL_S))
            else:
                await self.registry.log.wait(record.id, bounds.next_seq - 1, min(left, 1.0))
            record = await self.reads.record(record.owner, record.id) or record
        return record

    async def record_named(self, caller: Caller, message: Message) -> TaskRecord:
        """The caller's record of the task a request names; -32602 for an unknown or foreign id."""
        record = await self.reads.record(caller.owner, jsonrpc.params_of(message).get("taskId"))
        if record is None:
            raise unknown_task(message["id"])
        return record

    async def result(self, record: TaskRecord, request_id: RequestId) -> Message:
        """What tasks/result answers for an ended task: the outcome the store keeps."""
        return related_outcome(StoredTask(record, await self.reads.outcome(record)), request_id)

    async def _list(self, caller: Caller, cursor: object, request_id: RequestId) -> dict[str, Any]:
        """A page of the caller's tasks, from the task store (so records this process does not run count)."""
        page = None
        if cursor is None or isinstance(cursor, str):
            with contextlib.suppress(InvalidCursor):
                page = await self.registry.list_owned(caller.owner, cursor)
        if page is None:
            raise ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: unknown cursor", request_id=request_id)
        tasks = [{**caller.dialect.task(record), "_meta": self._list_meta(record)} for record in page.records]
        result: dict[str, Any] = {"tasks": tasks}
        if page.next_cursor is not None:
            result["nextCursor"] = page.next_cursor
        return result

    def _list_meta(self, record: TaskRecord) -> dict[str, str]:
        """A listed task's tool, and with several upstreams the one that runs it (the /ui list shows both)."""
        meta = {TASK_TOOL_KEY: record.tool}
        if (upstream := self.registry.upstream_of(record)) is not None:
            meta[TASK_UPSTREAM_KEY] = upstream
        return meta

    async def cancel(self, task: Task, request_id: RequestId) -> None:
        if task.terminal:
            raise already_ended(task.record, request_id)
        await self.registry.feed(task, Event.CANCEL_REQUESTED, None, CLIENT_CANCEL_REASON)  # stops the call too
