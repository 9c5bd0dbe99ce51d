"""The HTTP side of gateway-served task methods: hosted tasks in both dialects, and tasks/stream.

Which requests come here is decided once, in the endpoint. These handlers turn HostedTasks' answers
into responses, keep a blocked `tasks/result` alive with keep-alives (and carry the task's requests to
the client on it), and run the tasks/stream cursor against an SSE response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from aiohttp import web

from gateway import sse
from gateway.config import ServerConfig, TasksConfig
from gateway.edge.relay import Handoff, relay
from gateway.edge.responder import Responder, SlowClient
from gateway.events.stream import parse_stream_params, plan_stream, run_stream
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, Overloaded, ProtocolError
from gateway.sessions import Session
from gateway.tasks.hosted import (
    LEGACY_TASK_METHODS,
    LOG_LEVEL_KEY,
    MODERN_TASK_METHODS,
    Caller,
    HostedTasks,
    UpstreamCall,
    declares_tasks_extension,
    input_required,
    missing_extension,
    related_outcome,
    unknown_task,
    wait_any,
)
from gateway.tasks.policy import Hosting, plan_tool_call
from gateway.tasks.registry import PendingRequest, Task, TaskLimitReached
from gateway.upstream.base import UpstreamChannel


@dataclass
class Call:
    """One client request on its way through the gateway."""

    request: web.Request
    message: Message
    era: Era
    session: Session | None
    headers: dict[str, str]
    caller: Caller
    resources: AsyncExitStack = field(default_factory=AsyncExitStack)
    """What the request holds (a pooled upstream channel); a task that takes the call over keeps it."""
    resources_kept: bool = False

    def keep_resources(self) -> AsyncExitStack:
        """Hand the request's resources to a background task; the endpoint will not release them."""
        self.resources_kept = True
        return self.resources

    @property
    def method(self) -> str:
        method: str = self.message["method"]
        return method


class TaskRoutes:
    def __init__(self, hosted: HostedTasks, server: ServerConfig, tasks: TasksConfig, metrics: Metrics) -> None:
        self.hosted = hosted
        self._server = server
        self._tasks = tasks
        self._metrics = metrics
        self.open_streams = 0
        """tasks/stream requests open on this gateway, bounded by `max_streams_total`."""

    def _responder(self, call: Call, *, write_timeout: bool = False) -> Responder:
        timeout = self._tasks.stream_write_timeout_s if write_timeout else None
        return Responder(call.request, self._metrics, write_timeout_s=timeout)

    # -- hosted task methods ---------------------------------------------------------------------

    def serves(self, call: Call) -> bool:
        """Task methods the gateway answers for an upstream without Tasks."""
        methods = (
            LEGACY_TASK_METHODS if call.era is Era.LEGACY else MODERN_TASK_METHODS | {"tasks/result", "tasks/list"}
        )
        return call.method in methods

    async def task_method(self, call: Call) -> web.StreamResponse:
        if call.era is Era.MODERN:
            if call.method not in MODERN_TASK_METHODS:
                raise ProtocolError(
                    jsonrpc.METHOD_NOT_FOUND,
                    f"Method not found: {call.method} does not exist in the 2026-07-28 tasks extension",
                    http_status=404,
                    request_id=call.message["id"],
                )
            if not declares_tasks_extension(call.message):
                raise missing_extension(call.message["id"])
            answer = await self.hosted.modern_method(call.caller, call.message)
            return await self._responder(call).finish(answer, call.era)
        if call.method == "tasks/result":
            return await self._legacy_result(call)
        answer = await self.hosted.legacy_method(call.caller, call.message)
        return await self._responder(call).finish(answer, call.era)

    async def _legacy_result(self, call: Call) -> web.StreamResponse:
        """tasks/result: block until the task is terminal (keep-alives meanwhile), carrying the task's
        server-to-client requests to the client as they come (SEP-1686 input_required), then answer
        exactly what the upstream returned."""
        task = self.hosted.legacy_task(call.caller, call.message)
        session = call.session
        assert session is not None
        responder = self._responder(call)
        carrying = True

        def carries() -> bool:
            return carrying

        claimed = False
        task.result_streams += 1
        try:
            while True:
                for pending in self.hosted.claim_undelivered(task):
                    self._route_answer(session, task, pending)
                    pending.carried_by = carries
                    claimed = True
                    await responder.send([pending.request])
                if task.done.is_set():
                    return await responder.finish(related_outcome(task, call.message["id"]), call.era)
                if not await wait_any((task.done, task.undelivered), self._server.keepalive_s):
                    await responder.keepalive()
        except (asyncio.CancelledError, ConnectionResetError):
            stream = responder.abandon()
            if stream is None:
                raise
            return stream
        finally:
            carrying = False
            task.result_streams -= 1
            if claimed and any(not pending.delivered for pending in task.pending_requests.values()):
                task.undelivered.set()  # unanswered: another (or the next) tasks/result carries them
            responder.close()

    def _route_answer(self, session: Session, task: Task, pending: PendingRequest) -> None:
        """The client's response to `pending`, POSTed on `session`, goes to the task (and on upstream)."""

        async def route(message: Message, headers: Mapping[str, str]) -> None:
            await self.hosted.answer_legacy(task, message, headers)

        session.response_routes[pending.id] = route
        session.note_outgoing(pending.request)

        def forget() -> None:
            if session.response_routes.get(pending.id) is route:
                del session.response_routes[pending.id]
                session.pending_server_requests.discard(pending.id)

        pending.forget.append(forget)

    # -- tools/call as a task --------------------------------------------------------------------

    async def legacy_tool_call(self, call: Call, channel: UpstreamChannel) -> web.StreamResponse | None:
        """A task-augmented tools/call: answered with CreateTaskResult. None: not a task, forward it."""
        if self._plan(call) is None:
            return None
        self.hosted.check_room(call.caller, call.message)
        session = call.session
        assert session is not None
        # The session's upstream channel must outlive the session while the task runs on it.
        resources = call.keep_resources()
        session.task_started()
        resources.push_async_callback(session.task_ended)

        async def notify_status(task: Task) -> None:
            status = {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task.legacy_view()}
            await session.deliver_unsolicited(status)

        async def deliver_input(task: Task, pending: PendingRequest) -> None:
            # No tasks/result is open for the task: the creating session's GET stream, if it has one.
            stream = session.streams.standalone
            if stream is None:
                return
            self._route_answer(session, task, pending)
            pending.carried_by = lambda: session.streams.standalone is stream
            await session.deliver_unsolicited(pending.request)

        answer = await self.hosted.start_legacy(
            call.caller, channel, call.message, resources, notify_status, deliver_input, call.headers
        )
        return await self._responder(call).finish(answer, call.era)

    async def modern_tool_call(self, call: Call, channel: UpstreamChannel) -> web.StreamResponse | None:
        """tools/call from a 2026-07-28 client: maybe a task, per the tool policy (see gateway.tasks.policy).
        Until the plan's deadline the upstream's answer reaches the client as it is; an MRTR round
        (`InputRequiredResult`) always does, so the task is made on the final round."""
        hosting = self._plan(call)
        if hosting is None:
            return None
        if hosting.result_is_task:
            self.hosted.check_room(call.caller, call.message)
        meta = jsonrpc.meta_of(call.message)
        client_progress, client_logs = "progressToken" in meta, LOG_LEVEL_KEY in meta
        upstream = UpstreamCall(channel, self.hosted.upstream_call(call.message, Era.MODERN), call.headers)
        exchange = await channel.request(upstream.message, call.headers)
        observed: list[Message] = []

        async def adopt(observed: list[Message]) -> Task:
            """The call's task, with the notifications relayed so far as its first events."""
            task = await self.hosted.create(call.caller, call.message)
            capture = self.hosted.registry.capture
            events = [event for message in observed if (event := capture.from_notification(message)) is not None]
            if events:
                await self.hosted.registry.record(task, *events)
            return task

        async def take_over(observed: list[Message]) -> Message:
            task = await adopt(observed)
            self.hosted.run(task, call.caller, upstream, exchange, call.keep_resources())
            return self.hosted.modern_created(task, call.message["id"])

        def room_for_task() -> bool:
            try:
                self.hosted.registry.check_room(call.caller.owner)
            except TaskLimitReached:
                return False
            return True

        async def result_as_task(final: Message) -> Message:
            # Checked when the call came in; tasks made since may have filled the room: answer as is.
            if "result" not in final or input_required(final) or not room_for_task():
                return final
            task = await adopt(observed)
            await self.hosted.finish(task, call.caller, final)
            return self.hosted.modern_created(task, call.message["id"])

        def client_asked(message: Message) -> bool:
            method = message.get("method")
            return (method != "notifications/progress" or client_progress) and (
                method != "notifications/message" or client_logs
            )

        handoff = Handoff(time.monotonic() + hosting.wait_s, take_over, client_asked, room_for_task)
        return await relay(
            exchange,
            Responder(call.request, self._metrics, write_timeout_s=self._server.write_timeout_s),
            call.era,
            self._metrics,
            self._server.keepalive_s,
            transform=result_as_task if hosting.result_is_task else None,
            handoff=handoff,
            observed=observed,
            flush_interval_s=self._server.flush_interval_ms / 1000,
        )

    def _plan(self, call: Call) -> Hosting | None:
        policy = self.hosted.policy(jsonrpc.params_of(call.message).get("name"))
        return plan_tool_call(policy, call.message, call.era)

    # -- tasks/stream ----------------------------------------------------------------------------

    async def stream(self, call: Call, events_enabled: bool) -> web.StreamResponse:
        request_id = call.message["id"]
        if not events_enabled:
            raise ProtocolError(
                jsonrpc.METHOD_NOT_FOUND,
                "Method not found: task event streams are disabled on this gateway",
                http_status=404 if call.era is Era.MODERN else 200,
                request_id=request_id,
            )
        if call.era is Era.MODERN and not declares_tasks_extension(call.message):
            raise missing_extension(request_id)
        try:
            task_id, after = parse_stream_params(call.message)
            task = self.hosted.registry.get(call.caller.owner, task_id)
            if task is None:
                raise unknown_task(request_id)
            bounds = await self.hosted.registry.bounds(task)
            start = plan_stream(task.id, after, bounds, task.done.is_set())
        except ProtocolError as error:
            error.request_id = request_id
            raise
        if start.first_seq is None:
            return await self._responder(call).finish(
                {"jsonrpc": "2.0", "id": request_id, "result": call.era.empty_result}, call.era
            )
        if self.open_streams >= self._tasks.max_streams_total:
            raise Overloaded(
                "tasks.max_streams_total",
                f"the gateway holds its maximum of {self._tasks.max_streams_total} tasks/stream requests",
                "retry later, resuming with `after`; close streams you no longer read",
                request_id=request_id,
            )
        if task.open_streams >= self._tasks.max_streams_per_task:
            raise Overloaded(
                "tasks.max_streams_per_task",
                f"the task already has {task.open_streams} streams",
                "retry later, resuming with `after`; close streams of this task you no longer read",
                request_id=request_id,
            )
        session = call.session
        if session is not None:
            if task.id in session.task_streams:
                raise ProtocolError(
                    jsonrpc.INVALID_PARAMS,
                    "Invalid params: a tasks/stream for this task is already active on this session; cancel it first",
                    data={"reason": "stream_active", "taskId": task.id},
                    request_id=request_id,
                )
            session.task_streams.add(task.id)
        stop = asyncio.Event()
        if session is not None:
            session.local_requests[request_id] = stop
        task.open_streams += 1
        self.open_streams += 1
        self._metrics.task_streams.inc()
        try:
            return await self._run_stream(call, task, start.first_seq, stop)
        finally:
            task.open_streams -= 1
            self.open_streams -= 1
            self._metrics.task_streams.dec()
            if session is not None:
                session.task_streams.discard(task.id)
                session.local_requests.pop(request_id, None)

    async def _run_stream(self, call: Call, task: Task, first_seq: int, stop: asyncio.Event) -> web.StreamResponse:
        responder = self._responder(call, write_timeout=True)
        request_id = call.message["id"]
        token = jsonrpc.meta_of(call.message).get("progressToken")

        async def progress(delivered: int) -> None:
            # Progress on the stream request's own token: request-local UX, never a task event (no seq).
            note = {"progressToken": token, "progress": delivered, "message": f"{delivered} events delivered"}
            await responder.send([{"jsonrpc": "2.0", "method": "notifications/progress", "params": note}])

        try:
            await responder.write(sse.encode_comment("stream"))
            outcome = await run_stream(
                self.hosted.registry.log,
                task.id,
                first_seq,
                task.done,
                responder.write,
                stop=stop,
                keepalive_s=self._server.keepalive_s,
                batch=self._tasks.replay_batch,
                on_batch=progress if token is not None else None,
                flush_interval_s=self._tasks.stream_flush_interval_ms / 1000,
            )
            if stop.is_set():
                final = jsonrpc.error_response(request_id, jsonrpc.REQUEST_CANCELLED, "Request cancelled")
            elif isinstance(outcome, ProtocolError):
                outcome.request_id = request_id
                final = outcome.to_message()
            else:
                final = {"jsonrpc": "2.0", "id": request_id, "result": call.era.empty_result}
            return await responder.finish(final, call.era)
        except (asyncio.CancelledError, ConnectionResetError, SlowClient):
            # The stream's client is gone (or too slow): delivery stops, the task carries on.
            response = responder.abandon()
            if response is None:
                raise
            return response
        finally:
            responder.close()
