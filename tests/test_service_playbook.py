"""Playbook tests of the task service: era (legacy, modern) x upstream kind (task-less, SEP-1686,
SEP-2663) x call kind (plain, task, tasks/get|result|cancel|update|list|stream), in process.

Each case hands the service a parsed call, asserts the plan it returns, carries the plan out the way the
edge does (the real `relay` and `stream_events`, writing to a recorder instead of an HTTP response) and
asserts the exact messages the upstream got and the client gets. The upstream is `ScriptedUpstream`: it
answers from a script per kind, and holds a long tool call ("job") the gateway hosts until the test
releases it, so a hosted task is working while the case runs. No subprocess, no socket: the end-to-end
suites (test_hosted_tasks.py, test_upstream_*_tasks.py, test_tasks_stream.py) run the same flows for real.

Which side hosts the tasks: a legacy session learns it from the upstream's initialize (SEP-1686
declares `tasks`), a modern request from the upstream's `server/discover` (SEP-2663 declares the tasks
extension); every other pairing gets tasks hosted by the gateway.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import orjson
import pytest
from aiohttp import web

from gateway.app import Stores, build_stores
from gateway.buffers import BufferBudget
from gateway.config import Config, ResumeConfig
from gateway.edge.relay import RelaySettings, relay
from gateway.edge.responder import Responder
from gateway.edge.task_routes import stream_events
from gateway.events.capture import Capture
from gateway.metrics import Metrics
from gateway.principal import ANONYMOUS
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LEGACY, MODERN, TASK_TOOL_KEY, declares_tasks_extension, dialect_of
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, MODERN_VERSIONS, PROTOCOL_VERSION_KEY, TASKS_EXTENSION, Era
from gateway.protocol.jsonrpc import Message, ProtocolError
from gateway.protocol.names import RELATED_TASK_KEY
from gateway.protocol.sse import SseParser
from gateway.replay import SessionStreams
from gateway.sessions import Session
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.plans import AwaitResult, Forward, Plan, Reply, StreamEvents, TaskCall
from gateway.tasks.registry import Task, TaskRegistry
from gateway.tasks.service import TaskService
from gateway.upstream.base import Exchange, UpstreamChannel
from tests.fake_upstream import OneConversation

TASKLESS, SEP_1686, SEP_2663 = "task-less", "SEP-1686", "SEP-2663"
GATEWAY_OWN_IDS = "mcp-task-gateway-"
"""The ids of the gateway's own requests (its discover probe, its polls): not the client's traffic."""
ECHO = {"content": [{"type": "text", "text": "done"}]}
UPSTREAM_ID = "u1"
CREATED, LATER = "2026-12-01T10:00:00Z", "2026-12-01T10:00:05Z"
HOSTED_ID = re.compile(r"^[0-9a-f]{32}$")

TASK_METHODS = {
    SEP_1686: ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"),
    SEP_2663: ("tasks/get", "tasks/cancel", "tasks/update"),
}
"""The task methods each kind of upstream has."""

MATRIX = [(era, kind) for era in (Era.LEGACY, Era.MODERN) for kind in (TASKLESS, SEP_1686, SEP_2663)]
IDS = [f"{era.name.lower()}-{kind}" for era, kind in MATRIX]


def hosting(era: Era, kind: str) -> bool:
    """Whether the gateway hosts the tasks: the upstream has none in the client's era."""
    return (era, kind) not in ((Era.LEGACY, SEP_1686), (Era.MODERN, SEP_2663))


def upstream_view(era: Era, status: str, updated: str = CREATED, **extra: Any) -> dict[str, Any]:
    """The task as a SEP-1686 (legacy) or SEP-2663 (modern) upstream shows it."""
    times = {"createdAt": CREATED, "lastUpdatedAt": updated}
    if era is Era.LEGACY:
        return {"taskId": UPSTREAM_ID, "status": status, **times, "ttl": 60000, "pollInterval": 1000, **extra}
    return {"taskId": UPSTREAM_ID, "status": status, **times, "ttlMs": 60000, "pollIntervalMs": 1000, **extra}


class ScriptedUpstream(OneConversation):
    """The upstream and its one conversation, answering from a script for its kind. A tools/call of
    "job" that the upstream is not asked to run as a task is held (answered only on `release`), and so
    is server/discover while `discover_held`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.received: list[Message] = []
        self.held: list[tuple[Exchange, dict[str, Any]]] = []
        self.discover_held = False
        self.holding = asyncio.Event()
        """Set once a request is held."""

    def forwarded(self) -> list[Message]:
        """What reached the upstream from clients (the gateway's own requests left out)."""
        return [message for message in self.received if not str(message["id"]).startswith(GATEWAY_OWN_IDS)]

    async def release(self) -> None:
        held, self.held = self.held, []
        for exchange, answer in held:
            await exchange.deliver({"jsonrpc": "2.0", "id": exchange.request_id, **answer})

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        self.received.append(message)
        exchange = Exchange(message["id"], message["method"], channel=self)
        answer = self._answer(message)
        if message["method"] == "tools/call" and answer is None:
            self.held.append((exchange, {"result": ECHO}))
            self.holding.set()
        elif message["method"] == "server/discover" and self.discover_held:
            assert answer is not None
            self.held.append((exchange, answer))
            self.holding.set()
        else:
            assert answer is not None
            await exchange.deliver({"jsonrpc": "2.0", "id": message["id"], **answer})
        return exchange

    def _answer(self, message: Message) -> dict[str, Any] | None:
        method, params = message["method"], jsonrpc.params_of(message)
        legacy, modern = self.kind == SEP_1686, self.kind == SEP_2663
        if method == "server/discover":
            extensions: dict[str, Any] = {TASKS_EXTENSION: {}} if modern else {}
            return {"result": {"resultType": "complete", "capabilities": {"tools": {}, "extensions": extensions}}}
        if method == "tools/call" and params.get("name") == "echo":
            return {"result": ECHO}
        if method == "tools/call" and legacy and "task" in params:
            return {"result": {"task": upstream_view(Era.LEGACY, "working")}}
        if method == "tools/call" and modern and declares_tasks_extension(message):
            return {"result": {"resultType": "task", **upstream_view(Era.MODERN, "working")}}
        if method == "tools/call":
            return None
        if method not in TASK_METHODS.get(self.kind, ()):
            return {"error": {"code": jsonrpc.METHOD_NOT_FOUND, "message": f"Method not found: {method}"}}
        if params.get("taskId") not in (None, UPSTREAM_ID):
            return {"error": {"code": jsonrpc.INVALID_PARAMS, "message": "Invalid params: unknown task"}}
        if legacy and method == "tasks/get":
            return {"result": upstream_view(Era.LEGACY, "working")}
        if legacy and method == "tasks/cancel":
            return {"result": upstream_view(Era.LEGACY, "cancelled", LATER)}
        if legacy and method == "tasks/result":
            return {"result": ECHO}
        if legacy and method == "tasks/list":
            return {"result": {"tasks": [upstream_view(Era.LEGACY, "working")]}}
        if modern and method == "tasks/get":
            return {"result": {"resultType": "complete", **upstream_view(Era.MODERN, "working")}}
        return {"result": {"resultType": "complete"}}  # SEP-2663 tasks/cancel, tasks/update

    def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AbstractAsyncContextManager[UpstreamChannel]:
        @asynccontextmanager
        async def channel() -> AsyncIterator[UpstreamChannel]:
            yield self

        return channel()


class Recorder:
    """Stands for the client's HTTP response: keeps what the edge writes to it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.sse = bytearray()

    async def send(self, messages: list[Message]) -> None:
        self.messages.extend(messages)

    async def write(self, data: bytes) -> None:
        self.sse += data

    def write_now(self, data: bytes) -> bool:
        self.sse += data
        return True

    async def keepalive(self) -> None:
        pass

    async def finish(self, final: Message, era: Era) -> web.StreamResponse:
        self.messages.append(final)
        return web.Response()

    def abandon(self) -> web.StreamResponse | None:
        return None

    def close(self) -> None:
        pass

    def events(self) -> list[dict[str, Any]]:
        """The `notifications/tasks/event` params written as SSE, in order."""
        frames = [orjson.loads(event.data) for event in SseParser().feed(bytes(self.sse))]
        return [frame["params"] for frame in frames if frame.get("method") == "notifications/tasks/event"]


class Gateway:
    """The task service with its real parts (registry, log, hosted runner, pass-through capture) over a
    scripted upstream, and one client: a legacy session, or modern requests."""

    def __init__(
        self,
        era: Era,
        kind: str,
        stores: Stores | None = None,
        retention: dict[str, Any] | None = None,
        upstream: ScriptedUpstream | None = None,
    ) -> None:
        """`stores`: shared with another gateway (a second replica); else its own, per `[store]`.
        `upstream`: a scripted upstream of `kind` with more to say (else the plain one)."""
        config = Config.model_validate(
            {
                "tasks": {
                    # A modern client's task call becomes a task at once; no poll runs while a case does.
                    "tools": [{"match": "*", "modern": "always", "input_window_ms": 0}],
                    "upstream_poll_min_ms": 3_600_000,
                    "upstream_poll_max_ms": 3_600_000,
                },
                "retention": retention or {},
                # In-process gateways built by the dozen: each keeps its own stores in memory (the
                # playbook is about the service; the stores have their contract suites).
                "store": {"kind": "memory"},
            }
        )
        self.config = config
        self.era = era
        metrics = Metrics()
        capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
        self.stores = stores = stores or build_stores(config)
        self.registry = TaskRegistry(config.tasks, config.retention, stores.tasks, stores.log, capture, metrics)
        self.upstream = upstream or ScriptedUpstream(kind)
        self.hosted = HostedTasks(self.registry, config.tasks, config.retention, True)
        self.passthrough = Passthrough(self.registry, self.upstream, config.tasks, metrics)
        self.service = TaskService(
            self.hosted, self.passthrough, self.upstream, config.server, config.tasks, metrics, events_enabled=True
        )
        self.relay = RelaySettings(metrics, keepalive_s=60.0, flush_interval_s=0.0)
        self.session: Session | None = None
        if era is Era.LEGACY:
            self.session = Session("session", self.upstream, metrics, SessionStreams(ResumeConfig(), BufferBudget()))
            capabilities: dict[str, Any] = {"tools": {}}
            if kind == SEP_1686:
                capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
            self.initialized = self.service.initialized(
                self.session, {"protocolVersion": era.value, "capabilities": capabilities}
            )
        self._ids = itertools.count(1)

    def message(self, method: str, params: dict[str, Any], *, extension: bool = True) -> Message:
        """A request as the edge hands it on (a modern one with its `_meta` envelope)."""
        if self.era is Era.MODERN:
            extensions: dict[str, Any] = {TASKS_EXTENSION: {}} if extension else {}
            meta = {PROTOCOL_VERSION_KEY: MODERN_VERSIONS[0], CLIENT_CAPABILITIES_KEY: {"extensions": extensions}}
            params = {**params, "_meta": meta}
        return {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}

    def call(self, message: Message, owner: str = ANONYMOUS) -> TaskCall:
        async def channel() -> UpstreamChannel:
            return self.upstream

        return TaskCall(message, self.era, {}, self.session, channel, owner)

    async def plan(self, message: Message, owner: str = ANONYMOUS) -> tuple[TaskCall, Plan]:
        call = self.call(message, owner)
        return call, await self.plan_call(call)

    async def plan_call(self, call: TaskCall) -> Plan:
        """Plan `call` as the edge does: the upstream's facts first, then the plan."""
        return await self.service.plan(call, await self.service.upstream_facts(call))

    async def forward(self, plan: Plan) -> Message:
        """Carry a Forward out as the edge does; the client's final message."""
        assert isinstance(plan, Forward)
        exchange = await plan.channel.request(plan.message, plan.headers)
        recorder = Recorder()
        await relay(exchange, cast(Responder, recorder), self.era, self.relay, plan.hooks)
        return recorder.messages[-1]

    async def start_task(self) -> Task:
        """The client calls "job" as a task; the task it gets, as the registry holds it."""
        params: dict[str, Any] = {"name": "job", "arguments": {}}
        if self.era is Era.LEGACY:
            params["task"] = {"ttl": 60000}
        _, plan = await self.plan(self.message("tools/call", params))
        final = plan.message if isinstance(plan, Reply) else await self.forward(plan)
        result = final["result"]
        task = self.registry.find(result["task"]["taskId"] if self.era is Era.LEGACY else result["taskId"])
        assert task is not None
        return task

    async def end_task(self, task: Task) -> None:
        """The task completes upstream: a hosted one's call answers, a pass-through one's status is pushed."""
        if task.upstream is None:
            await self.upstream.release()
        else:
            result = {"result": ECHO} if self.era is Era.MODERN else {}
            view = upstream_view(self.era, "completed", LATER, **result)
            await self.upstream.tapped(None, {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": view})
        async with asyncio.timeout(5):
            await task.done.wait()

    async def stop(self) -> None:
        await self.upstream.release()
        await self.hosted.stop()
        await self.passthrough.stop()


@pytest.fixture(params=MATRIX, ids=IDS)
async def gateway(request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    era, kind = request.param
    gateway = Gateway(era, kind)
    yield gateway
    await gateway.stop()


def hosted_by_gateway(gateway: Gateway) -> bool:
    return hosting(gateway.era, gateway.upstream.kind)


async def about_a_task(
    gateway: Gateway, method: str, params: dict[str, Any] | None = None, *, named: bool = True
) -> tuple[Task, list[Message], Message]:
    """A task the client started, what had reached the upstream by then, and a `method` request
    (naming the task unless not `named`)."""
    task = await gateway.start_task()
    named_task = {"taskId": task.id} if named else {}
    return task, gateway.upstream.forwarded(), gateway.message(method, {**named_task, **(params or {})})


async def refusal(gateway: Gateway, call: TaskCall) -> tuple[int, int]:
    """The JSON-RPC code and HTTP status the service refuses `call` with."""
    with pytest.raises(ProtocolError) as refused:
        await gateway.plan_call(call)
    return refused.value.code, refused.value.http_status


def answer(message: Message, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def error_code(message: Message) -> int:
    code: int = message["error"]["code"]
    return code


# -- plain calls and task calls -----------------------------------------------------------------------


async def test_a_plain_call_is_forwarded_as_it_is(gateway: Gateway) -> None:
    message = gateway.message("tools/call", {"name": "echo", "arguments": {}}, extension=False)
    _, plan = await gateway.plan(message)
    assert isinstance(plan, Forward)
    assert plan.message == message and plan.channel is gateway.upstream
    assert plan.hooks.session is gateway.session and plan.hooks.handoff is None
    assert await gateway.forward(plan) == answer(message, ECHO)
    assert gateway.upstream.forwarded() == [message]


async def test_a_task_call_makes_a_task_on_the_side_that_hosts_it(gateway: Gateway) -> None:
    params: dict[str, Any] = {"name": "job", "arguments": {}}
    if gateway.era is Era.LEGACY:
        params["task"] = {"ttl": 60000}
    message = gateway.message("tools/call", params)
    call, plan = await gateway.plan(message)
    upstream_params = {key: value for key, value in message["params"].items() if key != "task"}
    token = {"progressToken": f"gateway-task-{message['id']}"}
    if gateway.era is Era.LEGACY and hosted_by_gateway(gateway):
        # SEP-1686 hosted: CreateTaskResult at once; the call runs on without the task request.
        assert isinstance(plan, Reply) and call.resources_kept
        created = plan.message["result"]["task"]
        task = gateway.registry.find(created["taskId"])
        assert task is not None and HOSTED_ID.match(task.id) and task.owner == "anonymous"
        assert plan.message == answer(message, {"task": LEGACY.task(task)})
        assert (created["status"], created["ttl"]) == ("working", 60000)
        assert gateway.upstream.forwarded() == [{**message, "params": {**upstream_params, "_meta": token}}]
    elif hosted_by_gateway(gateway):
        # SEP-2663 hosted: forwarded with a handoff that makes the task at the policy's deadline (now).
        assert isinstance(plan, Forward) and plan.hooks.handoff is not None and plan.hooks.transform is not None
        meta = {**message["params"]["_meta"], **token, "io.modelcontextprotocol/logLevel": "info"}
        assert plan.message == {**message, "params": {**upstream_params, "_meta": meta}}
        final = await gateway.forward(plan)
        task = gateway.registry.find(final["result"]["taskId"])
        assert task is not None and HOSTED_ID.match(task.id) and call.resources_kept
        assert final == answer(message, {"resultType": "task", **MODERN.task(task)})
        assert task.ttl_ms == gateway.config.tasks.default_ttl_ms
        assert gateway.upstream.forwarded() == [plan.message]
    else:
        # Pass-through: forwarded as it is; the answer's task is learned under a namespaced id.
        assert isinstance(plan, Forward) and plan.message == message and plan.hooks.observed == []
        assert plan.hooks.handoff is None and plan.hooks.transform is not None and not call.resources_kept
        final = await gateway.forward(plan)
        task_id = f"{gateway.upstream.tag}.{UPSTREAM_ID}"
        view = upstream_view(gateway.era, "working") | {"taskId": task_id}
        assert final == answer(message, {"task": view} if gateway.era is Era.LEGACY else {"resultType": "task", **view})
        task = gateway.registry.get("anonymous", task_id)
        assert task is not None and task.upstream is not None and task.upstream.upstream_id == UPSTREAM_ID
        assert gateway.upstream.forwarded() == [message]


# -- requests naming a task ---------------------------------------------------------------------------


async def test_tasks_get(gateway: Gateway) -> None:
    task, before, message = await about_a_task(gateway, "tasks/get")
    _, plan = await gateway.plan(message)
    if hosted_by_gateway(gateway):
        assert isinstance(plan, Reply)
        view = (
            LEGACY.task(task) if gateway.era is Era.LEGACY else {"resultType": "complete", **MODERN.detailed_task(task)}
        )
        assert plan.message == answer(message, view) and view["status"] == "working"
        assert gateway.upstream.forwarded() == before
        return
    # Pass-through: on the task's conversation, in the upstream's id; the answer in the client's.
    assert isinstance(plan, Forward) and plan.channel is gateway.upstream
    assert plan.message == {**message, "params": {**message["params"], "taskId": UPSTREAM_ID}}
    view = upstream_view(gateway.era, "working") | {"taskId": task.id}
    final = await gateway.forward(plan)
    assert final == answer(message, view if gateway.era is Era.LEGACY else {"resultType": "complete", **view})
    assert gateway.upstream.forwarded() == [*before, plan.message]


async def test_tasks_result(gateway: Gateway) -> None:
    task, before, message = await about_a_task(gateway, "tasks/result")
    call = gateway.call(message)
    if gateway.era is Era.MODERN and hosted_by_gateway(gateway):  # not a method of the SEP-2663 extension
        assert await refusal(gateway, call) == (jsonrpc.METHOD_NOT_FOUND, 404)
        return
    plan = await gateway.plan_call(call)
    if gateway.era is Era.LEGACY and hosted_by_gateway(gateway):
        # Blocks while the task works (the edge sends keep-alives), then answers exactly the outcome.
        assert isinstance(plan, AwaitResult) and task.result_streams == 1
        assert await plan.wait.next(0.01) == ([], None)
        await gateway.upstream.release()
        related = {RELATED_TASK_KEY: {"taskId": task.id}}
        assert await plan.wait.next(5) == ([], answer(message, {**ECHO, "_meta": related}))
        await call.resources.aclose()
        assert task.result_streams == 0 and gateway.upstream.forwarded() == before
        return
    assert isinstance(plan, Forward)
    final = await gateway.forward(plan)
    if gateway.era is Era.LEGACY:  # SEP-1686: the upstream's own tasks/result, in its id
        assert plan.message == {**message, "params": {"taskId": UPSTREAM_ID}}
        assert final == answer(message, ECHO)
    else:  # SEP-2663 has no tasks/result: forwarded as it is, the upstream refuses it
        assert plan.message == message and error_code(final) == jsonrpc.METHOD_NOT_FOUND
    assert gateway.upstream.forwarded() == [*before, plan.message]


async def test_tasks_cancel(gateway: Gateway) -> None:
    task, before, message = await about_a_task(gateway, "tasks/cancel")
    _, plan = await gateway.plan(message)
    if hosted_by_gateway(gateway):
        assert isinstance(plan, Reply)
        assert (task.status, task.status_message) == ("cancelled", "cancelled by the client")
        view = LEGACY.task(task) if gateway.era is Era.LEGACY else {"resultType": "complete"}
        assert plan.message == answer(message, view)
        assert gateway.upstream.forwarded() == before
        return
    assert isinstance(plan, Forward)
    assert plan.message == {**message, "params": {**message["params"], "taskId": UPSTREAM_ID}}
    final = await gateway.forward(plan)
    if gateway.era is Era.LEGACY:
        assert final == answer(message, upstream_view(Era.LEGACY, "cancelled", LATER) | {"taskId": task.id})
    else:
        assert final == answer(message, {"resultType": "complete"})
    assert gateway.upstream.forwarded() == [*before, plan.message]


async def test_tasks_update(gateway: Gateway) -> None:
    _, before, message = await about_a_task(gateway, "tasks/update", {"inputResponses": {}})
    _, plan = await gateway.plan(message)
    if gateway.era is Era.MODERN and hosted_by_gateway(gateway):
        assert isinstance(plan, Reply) and plan.message == answer(message, {"resultType": "complete"})
        assert gateway.upstream.forwarded() == before
        return
    assert isinstance(plan, Forward)
    final = await gateway.forward(plan)
    if gateway.era is Era.MODERN:  # SEP-2663 pass-through: routed like every request naming a task
        assert plan.message == {**message, "params": {**message["params"], "taskId": UPSTREAM_ID}}
        assert final == answer(message, {"resultType": "complete"})
    else:  # no such method in 2025-11-25: forwarded as it is, in the client's id; the upstream refuses it
        has_update = "tasks/update" in TASK_METHODS.get(gateway.upstream.kind, ())
        assert plan.message == message
        assert error_code(final) == (jsonrpc.INVALID_PARAMS if has_update else jsonrpc.METHOD_NOT_FOUND)
    assert gateway.upstream.forwarded() == [*before, plan.message]


async def test_tasks_list(gateway: Gateway) -> None:
    """Answered from the gateway's records whoever hosts the tasks, never forwarded: the upstream's own
    list would show every caller behind the gateway's one upstream credential."""
    task, before, message = await about_a_task(gateway, "tasks/list", named=False)
    call = gateway.call(message)
    if gateway.era is Era.MODERN:  # not a method of the SEP-2663 extension, whatever the upstream has
        assert await refusal(gateway, call) == (jsonrpc.METHOD_NOT_FOUND, 404)
    else:
        plan = await gateway.plan_call(call)
        listed = {**LEGACY.task(task), "_meta": {TASK_TOOL_KEY: task.tool}}
        assert isinstance(plan, Reply) and plan.message == answer(message, {"tasks": [listed]})
    assert gateway.upstream.forwarded() == before


async def test_tasks_stream(gateway: Gateway) -> None:
    task = await gateway.start_task()
    await gateway.end_task(task)
    before = gateway.upstream.forwarded()
    message = gateway.message("tasks/stream", {"taskId": task.id})
    call, plan = await gateway.plan(message)
    # Served from the log, whoever hosts the task: the upstream never sees it.
    assert isinstance(plan, StreamEvents)
    assert (plan.task_id, plan.first_seq) == (task.id, 0)
    bounds = await plan.log.bounds(task.id)
    assert bounds is not None and bounds.sealed  # the ended task's log tells the stream it is over
    assert gateway.service.open_streams == 1 and gateway.service.task_streams[task.id] == 1
    if gateway.session is not None:
        assert gateway.session.has_task_stream(task.id)
    recorder = Recorder()
    await stream_events(plan, cast(Responder, recorder))
    await call.resources.aclose()
    assert gateway.service.open_streams == 0 and gateway.service.task_streams[task.id] == 0
    if gateway.session is not None:
        assert not gateway.session.has_task_stream(task.id)
    assert recorder.messages == [answer(message, dict(dialect_of(gateway.era).empty_result))]
    events = recorder.events()
    assert [event["seq"] for event in events] == list(range(len(events)))
    prefix = gateway.config.events.prefix + "."
    kinds = [(event["type"].removeprefix(prefix), event["payload"].get("status")) for event in events]
    assert kinds == [("task.created", "working"), ("task.status", "completed"), ("task.terminal", "completed")]
    assert all(event["taskId"] == task.id for event in events)
    assert gateway.upstream.forwarded() == before


# -- what the upstream declares ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [TASKLESS, SEP_1686, SEP_2663])
async def test_a_legacy_session_learns_from_initialize_who_hosts_tasks(kind: str) -> None:
    gateway = Gateway(Era.LEGACY, kind)
    assert gateway.session is not None
    passes_through = kind == SEP_1686
    assert gateway.session.upstream_capabilities.tasks is passes_through
    assert (gateway.upstream.tap == gateway.passthrough.observe) is passes_through  # ids mapped, tasks captured
    tasks = gateway.initialized["capabilities"]["tasks"]
    assert set(tasks) == {"list", "cancel", "requests", "eventStreams"}  # the upstream's, or the gateway's own
    await gateway.stop()


@pytest.mark.parametrize("kind", [TASKLESS, SEP_1686, SEP_2663])
async def test_the_upstream_is_probed_once_however_many_requests_ask_at_once(kind: str) -> None:
    gateway = Gateway(Era.MODERN, kind)
    gateway.upstream.discover_held = True
    messages = [gateway.message("tools/call", {"name": "echo", "arguments": {}}, extension=False) for _ in range(5)]
    planning = [asyncio.ensure_future(gateway.plan(message)) for message in messages]
    async with asyncio.timeout(5):
        await gateway.upstream.holding.wait()  # the first request's probe is upstream; the rest wait for it
    await gateway.upstream.release()
    plans = [plan for _, plan in await asyncio.gather(*planning)]
    probes = [message for message in gateway.upstream.received if message["method"] == "server/discover"]
    assert [probe["id"] for probe in probes] == [GATEWAY_OWN_IDS + "discover"]
    assert all(
        isinstance(plan, Forward) and plan.message == message for plan, message in zip(plans, messages, strict=True)
    )
    assert (await gateway.upstream.capabilities(1.0)).tasks is (kind == SEP_2663)
    await gateway.stop()


async def test_a_forwarded_discover_teaches_the_gateway_what_the_upstream_declares() -> None:
    gateway = Gateway(Era.MODERN, TASKLESS)
    assert not (await gateway.upstream.capabilities(1.0)).tasks
    gateway.upstream.kind = SEP_2663  # the upstream was upgraded behind the gateway's back
    message = gateway.message("server/discover", {})
    _, plan = await gateway.plan(message)
    final = await gateway.forward(plan)
    assert TASKS_EXTENSION in final["result"]["capabilities"]["extensions"]
    assert (await gateway.upstream.capabilities(1.0)).tasks
    _, task_call = await gateway.plan(gateway.message("tools/call", {"name": "job", "arguments": {}}))
    assert isinstance(task_call, Forward) and task_call.hooks.handoff is None  # passed through, not hosted
    probes = [message for message in gateway.upstream.received if message["method"] == "server/discover"]
    assert len(probes) == 2  # the gateway's one probe, and the client's discover
    await gateway.stop()
