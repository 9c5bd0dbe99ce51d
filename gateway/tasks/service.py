"""The task service: what a client request means for tasks, decided once, returned as a plan.

Given a parsed call (era, caller, message, headers, session) and what the upstream declares, gathered
first (`upstream_facts`, `gateway.tasks.facts`: legacy sessions learn it from `initialize`, 2026-07-28
requests from the upstream's cached `server/discover`, a 2025-11-25 tool's marks from its tools/list),
the service decides whether the gateway hosts tasks (the upstream has none; or, per tool, the upstream
will not run this tool as a task: `gateway.tasks.policy.who_hosts`) or passes the upstream's tasks
through (ids mapped by the channel tap, the tasks a tools/call creates learned), and returns a plan
(`gateway.tasks.plans`): a gateway-hosted task method answered now, a forward with its relay hooks, a
tasks/stream cursor (or, for an upstream that serves tasks/stream itself, the stream forwarded), or a
legacy tasks/result wait. Planning asks the upstream nothing and touches no HTTP; the edge carries the
plan out.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gateway.config import ServerConfig, TasksConfig
from gateway.events.log import StoreUnavailable
from gateway.events.stream import parse_stream_params, plan_stream
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LEGACY, MODERN, unknown_task
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, Overloaded, ProtocolError, Unavailable
from gateway.sessions import ResponseRoute, Session
from gateway.tasks.facts import FactGatherer
from gateway.tasks.handoff import TaskHandoff
from gateway.tasks.hosted import Caller, HostedTasks, task_elsewhere
from gateway.tasks.input import UpstreamCall
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.plans import (
    AwaitResult,
    Forward,
    Plan,
    RelayHooks,
    Reply,
    StreamEvents,
    TaskCall,
    Transform,
    UpstreamFacts,
)
from gateway.tasks.policy import (
    Host,
    Hosting,
    ToolHosting,
    UpstreamSupport,
    listed_support,
    plan_tool_call,
    who_hosts,
    with_task_support,
)
from gateway.tasks.registry import STORE_UNAVAILABLE, PendingRequest, Task
from gateway.tasks.result_wait import TaskResultWait, route_answer
from gateway.tasks.watcher import watched
from gateway.upstream.base import Upstream, UpstreamChannel
from gateway.upstream.capabilities import Capabilities


def _caller(call: TaskCall) -> Caller:
    return Caller(call.owner, call.era)


class TaskService:
    def __init__(
        self,
        hosted: HostedTasks,
        passthrough: Passthrough,
        upstream: Upstream,
        server: ServerConfig,
        tasks: TasksConfig,
        metrics: Metrics,
        *,
        events_enabled: bool,
        draining: asyncio.Event | None = None,
    ) -> None:
        self._hosted = hosted
        self._passthrough = passthrough
        self._upstream = upstream
        self._server = server
        self._tasks = tasks
        self._metrics = metrics
        self._events_enabled = events_enabled
        self._draining = draining
        """Set when the replica begins draining: its hosted streams end (`StreamEvents.draining`)."""
        self.open_streams = 0
        """tasks/stream requests open on this gateway, bounded by `max_streams_total`."""
        self.store_failed: Callable[[BaseException], None] | None = None
        """Told each time a request finds the task store unusable (for /readyz)."""
        self.task_streams: collections.Counter[str] = collections.Counter()
        """Open tasks/stream requests per task id on this gateway, each bounded by `max_streams_per_task`
        (per process: a task's streams on other replicas are not counted)."""
        self._facts = FactGatherer(upstream, tasks, server.initialize_timeout_s)

    def use_policies(self, tasks: TasksConfig) -> None:
        """Plan the calls that come from now on by `tasks` (its `[[tasks.tools]]` policies: a config
        reload); calls and tasks under way keep the plan they were made with."""
        self._tasks = tasks
        self._facts.tasks = tasks

    # -- a legacy session's own messages ------------------------------------------------------------

    def initialized(self, session: Session, result: dict[str, Any]) -> dict[str, Any]:
        """The upstream's initialize result for `session`: learn whether it hosts Tasks, and answer
        with the gateway's task capability in it (initialize is a 2025-11-25 method)."""
        session.learn_upstream(Capabilities.of(result, LEGACY))
        if session.upstream_capabilities.tasks:
            session.channel.tap = self._passthrough.observe
        return self._hosted.advertise(result, LEGACY)

    async def client_notification(self, session: Session, message: Message, headers: Mapping[str, str]) -> None:
        """A notifications/cancelled for a request the gateway serves itself stops it there; the rest go on."""
        if message["method"] == "notifications/cancelled" and session.cancel_local(
            jsonrpc.params_of(message).get("requestId")
        ):
            return
        await session.channel.notify(message, headers)

    async def client_response(self, session: Session, message: Message, headers: Mapping[str, str]) -> None:
        """The client's response to a server-to-client request relayed on `session`."""
        if not session.claim_response(message["id"]):
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Invalid request: no server request with id {message['id']!r} is waiting for a response",
            )
        if session.upstream_capabilities.tasks:
            await self._passthrough.answered(session.channel, message)
        await session.respond(message, headers)

    # -- one classification per request ------------------------------------------------------------

    async def upstream_facts(self, call: TaskCall) -> UpstreamFacts:
        """What the upstream declares that `call`'s plan depends on; the one step before `plan` that may
        ask the upstream (its `server/discover`, a legacy session's tools/list)."""
        return await self._facts.gather(call)

    async def plan(self, call: TaskCall, facts: UpstreamFacts) -> Plan:
        """What to do with `call`, given what the upstream declares (`upstream_facts`); raises
        ProtocolError for a request that gets an error (503 `store_unavailable` when it needs the task
        store and the store cannot be used now)."""
        try:
            return await self._plan(call, facts)
        except StoreUnavailable as error:
            if self.store_failed is not None:
                self.store_failed(error)
            raise Unavailable(
                STORE_UNAVAILABLE, "the task store cannot be used now", request_id=call.message.get("id")
            ) from None

    async def _plan(self, call: TaskCall, facts: UpstreamFacts) -> Plan:
        hosting = not facts.has_tasks or self._gateway_hosts(call, facts)
        if call.method == "tasks/stream" and (hosting or not facts.serves_streams):
            return await self._stream(call)
        if not hosting:
            return await self._with_upstream_tasks(call)
        if self._serves(call):
            return await self._task_method(call)
        if call.method == "tools/call":
            # Era branch: who decides differs. SEP-1686: the client asked for a task (answered at once
            # with CreateTaskResult); SEP-2663: the gateway decides as the call runs (a forward with a handoff).
            tool_call = self._legacy_tool_call if call.era is Era.LEGACY else self._modern_tool_call
            planned = await tool_call(call, await call.channel())
            if planned is not None:
                return planned
        return self._forward(call, await call.channel(), self._transform_for(call, facts.has_tasks))

    def _gateway_hosts(self, call: TaskCall, facts: UpstreamFacts) -> bool:
        """Whether a call is the gateway's although the upstream has Tasks: a tools/call of a tool whose
        tasks the upstream will not run (the gateway hosts them, or refuses them), or a request naming a
        task the gateway hosts here."""
        if call.method == "tools/call":
            policy = self._tasks.policy_for(jsonrpc.params_of(call.message).get("name"))
            return who_hosts(facts.tool_support, policy, call.era).host is not Host.UPSTREAM
        if call.method == "tasks/stream" or call.method in call.dialect.task_requests:
            task = self._hosted.registry.get(call.owner, jsonrpc.params_of(call.message).get("taskId"))
            return task is not None and task.record.upstream is None
        return False

    # -- tasks the upstream hosts ----------------------------------------------------------------

    async def _with_upstream_tasks(self, call: TaskCall) -> Plan:
        """The upstream hosts Tasks: forward, on the task's own conversation for requests naming a
        task, with ids mapped (the channel tap) and the tasks a tools/call creates learned. A
        tasks/stream comes here only when the upstream serves it itself: its stream is the upstream's,
        relayed as it comes (the tap maps the ids in its events), and a dropped client cancels it.
        tasks/list is never forwarded: see `_task_method`."""
        if call.method == "tasks/list":
            # The upstream's own list shows the tasks of every caller behind the gateway's one upstream
            # credential (and names another conversation's tasks under this one's tag): the caller's own
            # come from the gateway's records, paged like hosted tasks, in every session; a 2026-07-28
            # client gets the -32601 of a method SEP-2663 removed, whatever the upstream would answer.
            return await self._task_method(call)
        answer_route: ResponseRoute | None = None
        task: Task | None = None
        streaming = call.method == "tasks/stream"
        if streaming:
            call.dialect.check_tasks_declared(call.message)
            parse_stream_params(call.message)  # the same -32602 for a bad taskId or after as a hosted stream
        if streaming or call.method in call.dialect.task_requests:
            named = jsonrpc.params_of(call.message).get("taskId")
            if self._passthrough.registry.get(call.owner, named) is None:
                return await self._watched_elsewhere(call)
            task, message, headers = self._passthrough.route(call.owner, call.message, call.headers)
            if streaming:
                self._claim_stream(call, task.id)
            elif task.terminal:
                # Its record holds how it ended (the outcome too) and answers, exactly and even once
                # the upstream conversation that held the task is gone.
                return await self._task_method(call)
            call = dataclasses.replace(call, message=message, headers=headers)
            # A task of a session lives in the conversation of the session that created it; a call without a
            # session leases the pooled channel pinned to the task's id.
            channel = watched(task).channel if call.session is not None else await call.channel()
            if call.session is not None and channel is not call.session.channel:
                # A task of another session of this caller: answers to its requests go back to it.
                answer_route = self._answering(channel)
        else:
            if call.method == "subscriptions/listen":
                listen = self._passthrough.route_listen(call.owner, call.message)
                call = dataclasses.replace(call, message=listen)
            channel = await call.channel()
        channel.tap = self._passthrough.observe
        if call.method == "tools/call" and call.dialect.may_create_task(call.message):
            observed: list[Message] = []
            return self._forward(call, channel, self._learning(call, channel, observed), observed=observed)
        transform = self._transform_for(call, upstream_tasks=True)
        if task is not None and not streaming:
            transform = self._catching_up(task)
        return self._forward(call, channel, transform, answer_route=answer_route, cancel_when_gone=streaming)

    def _catching_up(self, task: Task) -> Transform:
        """A forwarded answer about a pass-through task, written once its record shows what it says."""

        async def caught_up(final: Message) -> Message:
            await self._passthrough.caught_up(task)
            return final

        return caught_up

    def _answering(self, channel: UpstreamChannel) -> ResponseRoute:
        async def answer(message: Message, headers: Mapping[str, str]) -> None:
            await self._passthrough.answered(channel, message)
            await channel.respond(message, headers)

        return answer

    def _learning(self, call: TaskCall, channel: UpstreamChannel, observed: list[Message]) -> Transform:
        """Learn the task the upstream's answer creates (the answer itself passes unchanged)."""
        session = call.session

        async def learn(final: Message) -> Message:
            # A legacy session's upstream channel must outlive the session while the task runs on it.
            hold = session.task_ended if session is not None else None
            task = await self._passthrough.adopt(
                call.owner, channel, call.era, call.message, final, observed, call.headers, hold
            )
            if task is not None and session is not None:
                session.task_started()  # before the task's watcher can run, which releases it
            return final

        return learn

    # -- forwarding ------------------------------------------------------------------------------

    def _transform_for(self, call: TaskCall, upstream_tasks: bool) -> Transform | None:
        """Responses the gateway adds its own capabilities to."""
        hosted = self._hosted
        if call.method == "server/discover":

            async def discover(final: Message) -> Message:
                result = final.get("result")
                if not isinstance(result, dict):
                    return final
                self._upstream.learn_capabilities(result)
                return {**final, "result": hosted.advertise(result, MODERN)}  # a 2026-07-28 method

            return discover
        if call.method == "tools/list" and (call.session is not None or not upstream_tasks):
            # A 2026-07-28 upstream with Tasks marks no tool: its entries are shown as they are.
            return self._listing(call, upstream_tasks)
        return None

    def _listing(self, call: TaskCall, upstream_tasks: bool) -> Transform:
        """tools/list with each tool's effective `execution.taskSupport` (`who_hosts`), in both eras; a
        2025-11-25 session whose upstream has Tasks learns the upstream's marks from it first."""
        session = call.session
        marks = self._facts.marks(session) if upstream_tasks and session is not None else None

        def hosting_of(tool: Mapping[str, Any]) -> ToolHosting:
            upstream = listed_support(tool) if upstream_tasks else UpstreamSupport.NONE
            return who_hosts(upstream, self._tasks.policy_for(tool.get("name")), call.era)

        async def annotate(final: Message) -> Message:
            result = final.get("result")
            if not isinstance(result, dict):
                return final
            if marks is not None:
                marks.learn(result)
            return {**final, "result": with_task_support(result, hosting_of)}

        return annotate

    def _forward(
        self,
        call: TaskCall,
        channel: UpstreamChannel,
        transform: Transform | None,
        *,
        observed: list[Message] | None = None,
        answer_route: ResponseRoute | None = None,
        cancel_when_gone: bool = False,
    ) -> Forward:
        # A call without a session went to a pooled channel, where an MRTR retry must find its process again.
        if call.session is None:
            transform = self._pinning(channel, transform)
        hooks = RelayHooks(call.session, answer_route, transform, observed, cancel_when_gone=cancel_when_gone)
        return Forward(channel, call.message, call.headers, hooks)

    def _pinning(self, channel: UpstreamChannel, transform: Transform | None) -> Transform:
        """An input_required answer's retry must reach the channel that issued its requestState."""

        async def pin(final: Message) -> Message:
            result = final.get("result")
            if isinstance(result, dict) and result.get("resultType") == "input_required":
                state = result.get("requestState")
                if isinstance(state, str):
                    self._upstream.pin(state, channel)
            return await transform(final) if transform is not None else final

        return pin

    # -- hosted task methods ---------------------------------------------------------------------

    async def _watched_elsewhere(self, call: TaskCall) -> Plan:
        """A request naming an upstream-hosted task this process does not watch: another replica on the
        shared stores watches it (or the id is unknown, or another caller's). Reads come from the stores,
        as for a hosted task; a cancel or an input answer of a running one must reach the upstream
        conversation that holds the task, which only the watching replica has."""
        if call.method == "tasks/stream":
            return await self._stream(call)
        if call.method in ("tasks/cancel", "tasks/update"):
            record = await self._hosted.record_named(_caller(call), call.message)
            if not record.terminal:
                raise task_elsewhere(record, call.message["id"])
        return await self._task_method(call)

    def _serves(self, call: TaskCall) -> bool:
        """Task methods the gateway answers for an upstream without Tasks."""
        return call.method in call.dialect.task_methods | {"tasks/result", "tasks/list"}

    async def _task_method(self, call: TaskCall) -> Plan:
        dialect = call.dialect
        if call.method not in dialect.task_methods:
            raise ProtocolError(
                jsonrpc.METHOD_NOT_FOUND,
                f"Method not found: {call.method} does not exist in the {call.era.value} tasks extension",
                http_status=404,
                request_id=call.message["id"],
            )
        dialect.check_tasks_declared(call.message)
        if call.method == "tasks/result":
            request_id = call.message["id"]
            record = await self._hosted.record_named(_caller(call), call.message)
            if record.terminal:
                return Reply(await self._hosted.result(record, request_id))
            assert call.session is not None
            task = self._hosted.registry.find(record.id)
            wait = TaskResultWait(self._hosted, record, task, call.session, request_id)
            call.resources.callback(wait.close)
            return AwaitResult(wait)
        return Reply(await self._hosted.method(_caller(call), call.message))

    # -- tools/call as a task --------------------------------------------------------------------

    async def _legacy_tool_call(self, call: TaskCall, channel: UpstreamChannel) -> Plan | None:
        """A task-augmented tools/call: answered with CreateTaskResult. None: not a task, forward it."""
        if self._plan_tool_call(call) is None:
            return None
        self._hosted.check_room(_caller(call), call.message)
        session = call.session
        assert session is not None
        # The session's upstream channel must outlive the session while the task runs on it.
        resources = call.keep_resources()
        session.task_started()
        resources.push_async_callback(session.task_ended)

        async def notify_status(task: Task) -> None:
            status = {
                "jsonrpc": "2.0",
                "method": "notifications/tasks/status",
                "params": call.dialect.task(task),
            }
            await session.deliver_unsolicited(status)

        async def deliver_input(task: Task, pending: PendingRequest) -> None:
            # No tasks/result is open for the task: the creating session's GET stream, if it has one.
            stream = session.streams.standalone
            if stream is None:
                return
            route_answer(self._hosted, session, task, pending)
            pending.carried_by = lambda: session.streams.standalone is stream
            await session.deliver_unsolicited(pending.request)

        answer = await self._hosted.start_legacy(
            _caller(call), channel, call.message, resources, notify_status, deliver_input, call.headers
        )
        return Reply(answer)

    async def _modern_tool_call(self, call: TaskCall, channel: UpstreamChannel) -> Plan | None:
        """tools/call from a 2026-07-28 client: maybe a task, per the tool policy (see gateway.tasks.policy).
        Until the plan's deadline the upstream's answer reaches the client as it is; an MRTR round
        (`InputRequiredResult`) always does, so the task is made on the final round (`TaskHandoff`)."""
        hosting = self._plan_tool_call(call)
        if hosting is None:
            return None
        if hosting.result_is_task:
            self._hosted.check_room(_caller(call), call.message)
        upstream = UpstreamCall(channel, self._hosted.upstream_call(call.message, call.dialect), call.headers)
        handoff = TaskHandoff(self._hosted, call, upstream, hosting.wait_s)
        transform = handoff.result_as_task if hosting.result_is_task else None
        return Forward(channel, upstream.message, call.headers, RelayHooks(transform=transform, handoff=handoff))

    def _plan_tool_call(self, call: TaskCall) -> Hosting | None:
        policy = self._tasks.policy_for(jsonrpc.params_of(call.message).get("name"))
        return plan_tool_call(policy, call.message, call.era)

    # -- tasks/stream ----------------------------------------------------------------------------

    async def _stream(self, call: TaskCall) -> Plan:
        request_id = call.message["id"]
        if not self._events_enabled:
            raise ProtocolError(
                jsonrpc.METHOD_NOT_FOUND,
                "Method not found: task event streams are disabled on this gateway",
                request_id=request_id,
            )
        call.dialect.check_tasks_declared(call.message)
        try:
            task_id, after = parse_stream_params(call.message)
            # From the stores alone: a task another process runs (or ran) streams like a local one.
            record = await self._hosted.reads.record(call.owner, task_id)
            if record is None:
                raise unknown_task(request_id)
            start = plan_stream(record.id, after, await self._hosted.reads.bounds(record))
        except ProtocolError as error:
            error.request_id = request_id
            raise
        if start.first_seq is None:
            return Reply(call.dialect.stream_end(request_id))
        self._claim_stream(call, record.id)
        session = call.session
        stop = call.resources.enter_context(session.local_request(request_id)) if session else asyncio.Event()
        tasks = self._tasks
        return StreamEvents(
            self._hosted.reads.log,
            record.id,
            start.first_seq,
            stop,
            call.message,
            call.era,
            keepalive_s=self._server.keepalive_s,
            replay_batch=tasks.replay_batch,
            flush_interval_s=tasks.stream_flush_interval_ms / 1000,
            recorded_end=task.done if (task := self._hosted.registry.find(record.id)) is not None else None,
            draining=self._draining,
        )

    def _claim_stream(self, call: TaskCall, task_id: str) -> None:
        """Hold a tasks/stream of the task until the request ends, within the gateway's stream limits and,
        in 2025-11-25, as the session's one stream of the task (SEP-2694: one per task and connection)."""
        request_id = call.message["id"]
        if self.open_streams >= self._tasks.max_streams_total:
            raise Overloaded(
                "tasks.max_streams_total",
                f"the gateway holds its maximum of {self._tasks.max_streams_total} tasks/stream requests",
                "retry later, resuming with `after`; close streams you no longer read",
                request_id=request_id,
            )
        if self.task_streams[task_id] >= self._tasks.max_streams_per_task:
            raise Overloaded(
                "tasks.max_streams_per_task",
                f"the task already has {self.task_streams[task_id]} streams",
                "retry later, resuming with `after`; close streams of this task you no longer read",
                request_id=request_id,
            )
        session = call.session
        if session is not None:
            if session.has_task_stream(task_id):
                raise ProtocolError(
                    jsonrpc.INVALID_PARAMS,
                    "Invalid params: a tasks/stream for this task is already active on this session; cancel it first",
                    data={"reason": "stream_active", "taskId": task_id},
                    request_id=request_id,
                )
            call.resources.enter_context(session.task_stream(task_id))
        # Counted against the limits until the request ends.
        self.task_streams[task_id] += 1
        self.open_streams += 1
        self._metrics.task_streams.inc()

        def release() -> None:
            self.task_streams[task_id] -= 1
            if not self.task_streams[task_id]:
                del self.task_streams[task_id]
            self.open_streams -= 1
            self._metrics.task_streams.dec()

        call.resources.callback(release)
