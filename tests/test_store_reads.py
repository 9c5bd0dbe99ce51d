"""Task reads come from the stores: a task another gateway process runs (or ran) answers exactly like a
local one, in process.

Two gateways (`A`, `B`), each with its own registry, hosted runner, pass-through, service and
upstream, built as the playbook builds them, share one task store and one event log, as two replicas
(or a process and its restart) sharing a durable store will. A task created on A is asked about on B,
which has no runtime for it: `tasks/get`, `tasks/result`, `tasks/list` and `tasks/stream` (replay
and end, `after`, `events_gone` after a trim) answer with the same bytes as on A, in both eras; a
foreign caller's answers equal those for an id that never existed; what needs the running call
(cancel, input answers) is refused as running elsewhere, never as unknown.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any, cast

import orjson
import pytest

from gateway.edge.endpoint import error_response
from gateway.edge.responder import Responder
from gateway.edge.task_routes import await_result, stream_events
from gateway.principal import ANONYMOUS
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import dialect_of
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import EVENTS_GONE, Message, ProtocolError
from gateway.tasks.plans import AwaitResult, Reply, StreamEvents
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import Task
from tests.test_service_playbook import ECHO, TASKLESS, Gateway, Recorder

ERAS = [Era.LEGACY, Era.MODERN]
MALLORY = "mallory"
"""Another caller: the tasks it sees are its own, and it has none."""


async def pair(era: Era, retention: dict[str, Any] | None = None) -> tuple[Gateway, Gateway]:
    """Gateway A, and gateway B sharing A's task store and event log (the gateway hosts the tasks)."""
    a = Gateway(era, TASKLESS, retention=retention)
    return a, Gateway(era, TASKLESS, a.stores, retention=retention)


@pytest.fixture(params=ERAS, ids=[era.name.lower() for era in ERAS])
async def gateways(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Gateway, Gateway]]:
    a, b = await pair(request.param)
    yield a, b
    await a.stop()
    await b.stop()


async def response(gateway: Gateway, message: Message, owner: str = ANONYMOUS) -> tuple[int, bytes, bytes]:
    """What the client gets, carried out as the edge does: the HTTP status (of a refusal, as the edge
    renders it; 200 when planned), the SSE bytes written before the final message, and the final
    message's JSON."""
    call = gateway.call(message, owner)
    try:
        plan = await gateway.plan_call(call)
    except ProtocolError as error:
        error.request_id = message["id"]
        refused = error_response(error, gateway.era, retry_after_s=1)
        assert isinstance(refused.body, bytes)
        return refused.status, b"", refused.body
    recorder = Recorder()
    try:
        if isinstance(plan, Reply):
            recorder.messages.append(plan.message)
        elif isinstance(plan, StreamEvents):
            await stream_events(plan, cast(Responder, recorder))
        else:
            assert isinstance(plan, AwaitResult)
            async with asyncio.timeout(5):
                await await_result(plan, cast(Responder, recorder), gateway.era, 0.05)
    finally:
        await call.resources.aclose()
    return 200, bytes(recorder.sse), orjson.dumps(recorder.messages[-1])


def final(answered: tuple[int, bytes, bytes]) -> Message:
    message: Message = orjson.loads(answered[2])
    return message


def events(answered: tuple[int, bytes, bytes]) -> list[dict[str, Any]]:
    recorder = Recorder()
    recorder.sse += answered[1]
    return recorder.events()


async def test_an_ended_task_answers_the_same_bytes_on_another_process(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    task = await a.start_task()
    await a.end_task(task)
    assert b.registry.find(task.id) is None  # B has no runtime for it: only the stores
    dialect = dialect_of(a.era)
    named = {"taskId": task.id}
    asked = {
        "get": a.message("tasks/get", named),
        "result": a.message("tasks/result", named),
        "list": a.message("tasks/list", {}),
        "stream": a.message("tasks/stream", named),
        "stream after 0": a.message("tasks/stream", {**named, "after": 0}),
        "stream at the end": a.message("tasks/stream", {**named, "after": 2}),
        "cancel": a.message("tasks/cancel", named),
    }
    if a.era is Era.MODERN:  # a 2025-11-25 tasks/update is no task method: forwarded upstream as it is
        asked["update"] = a.message("tasks/update", {**named, "inputResponses": {"k": {"action": "accept"}}})
    on_a = {name: await response(a, message) for name, message in asked.items()}
    on_b = {name: await response(b, message) for name, message in asked.items()}
    assert on_b == on_a
    # ... and they are the answers for an ended task, not errors alike on both.
    view = final(on_a["get"])["result"]
    assert (view["taskId"], view["status"]) == (task.id, "completed")
    assert ("result" in view) is (a.era is Era.MODERN) and view.get("result", ECHO) == ECHO
    streamed = [event["seq"] for event in events(on_a["stream"])]
    assert streamed == [0, 1, 2] and [event["seq"] for event in events(on_a["stream after 0"])] == [1, 2]
    for name in ("stream", "stream after 0", "stream at the end"):
        assert final(on_a[name]) == dialect.stream_end(asked[name]["id"])
    assert events(on_a["stream at the end"]) == []
    if a.era is Era.LEGACY:
        assert final(on_a["result"])["result"]["content"] == ECHO["content"]
        assert [listed["taskId"] for listed in final(on_a["list"])["result"]["tasks"]] == [task.id]
        assert (
            final(on_a["cancel"])["error"]["message"]
            == "Invalid params: task is already completed and cannot be cancelled"
        )
    else:  # SEP-2663 has no tasks/result nor tasks/list; cancel and update of an ended task do nothing
        assert on_a["result"][0] == on_a["list"][0] == 404
        assert final(on_a["cancel"])["result"] == final(on_a["update"])["result"] == {"resultType": "complete"}


async def test_a_trimmed_log_answers_events_gone_the_same_on_another_process() -> None:
    for era in ERAS:
        a, b = await pair(era, retention={"max_events_per_task": 3})
        task = await a.start_task()
        capture = a.registry.capture
        await a.registry.record(task, *(capture.lifecycle("test.tick", n=n) for n in range(2)))
        await a.end_task(task)  # seqs 0-4 written, the 3 newest retained
        for params in ({"taskId": task.id, "after": 0}, {"taskId": task.id}):
            message = a.message("tasks/stream", params)
            assert await response(b, message) == await response(a, message)
        gone = final(await response(b, a.message("tasks/stream", {"taskId": task.id, "after": 0})))
        assert gone["error"]["code"] == EVENTS_GONE and gone["error"]["data"]["earliestSeq"] == 2
        replayed = await response(b, a.message("tasks/stream", {"taskId": task.id}))
        assert [event["seq"] for event in events(replayed)] == [2, 3, 4]
        await a.stop()
        await b.stop()


async def test_a_running_task_reads_and_ends_the_same_on_another_process(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    task = await a.start_task()
    get = a.message("tasks/get", {"taskId": task.id})
    assert await response(b, get) == await response(a, get)
    assert final(await response(b, get))["result"]["status"] == "working"
    # B streams it live and (legacy) waits for its result; A ends it: B learns it from the stores.
    stream = a.message("tasks/stream", {"taskId": task.id})
    result = a.message("tasks/result", {"taskId": task.id})
    streaming = asyncio.ensure_future(response(b, stream))
    waiting = asyncio.ensure_future(response(b, result)) if a.era is Era.LEGACY else None
    await asyncio.sleep(0.1)
    assert not streaming.done() and (waiting is None or not waiting.done())
    await a.end_task(task)
    async with asyncio.timeout(5):
        assert await streaming == await response(a, stream)
        if waiting is not None:
            answered = await waiting
            assert answered == await response(a, result)
            assert final(answered)["result"]["content"] == ECHO["content"]
    assert b.service.task_streams[task.id] == 0  # the stream was counted on B, and released


async def test_what_needs_the_running_call_is_refused_as_running_elsewhere(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    task = await a.start_task()
    methods = ["tasks/cancel"] + (["tasks/update"] if a.era is Era.MODERN else [])
    for method in methods:
        message = a.message(method, {"taskId": task.id, "inputResponses": {}})
        status, _, body = await response(b, message)
        error = orjson.loads(body)["error"]
        assert (status, error["code"]) == (200, jsonrpc.INTERNAL_ERROR)
        assert error["data"] == {"reason": "task_elsewhere", "taskId": task.id}
    assert task.status is TaskStatus.WORKING  # B changed nothing; A still runs it
    cancel = a.message("tasks/cancel", {"taskId": task.id})
    assert final(await response(a, cancel)).get("result") is not None  # A, which runs it, cancels it
    assert task.status is TaskStatus.CANCELLED


async def test_a_foreign_task_reads_like_an_unknown_id_on_another_process(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    running = await a.start_task()
    ended = await a.start_task()
    await a.end_task(ended)
    dialect = dialect_of(a.era)
    for method in sorted(dialect.task_requests | {"tasks/stream"}):
        for task in (running, ended):
            foreign = a.message(method, {"taskId": task.id})
            unknown = {**foreign, "params": {**foreign["params"], "taskId": secrets.token_hex(16)}}
            answered = await response(b, foreign, MALLORY)
            assert answered == await response(b, unknown, MALLORY) == await response(b, unknown)
            assert final(answered)["error"] == {
                "code": jsonrpc.INVALID_PARAMS,
                "message": "Invalid params: no such task",
            }
    if a.era is Era.LEGACY:
        listed = final(await response(b, a.message("tasks/list", {}), MALLORY))
        assert listed["result"] == {"tasks": []}


async def test_a_task_waiting_for_input_elsewhere_shows_no_input_requests() -> None:
    a, b = await pair(Era.MODERN)
    task = await a.start_task()
    ((exchange, _),) = a.upstream.held
    a.upstream.held.clear()
    asks = {"name": {"method": "elicitation/create", "params": {"message": "Name?", "requestedSchema": {}}}}
    asked = {"resultType": "input_required", "inputRequests": asks, "requestState": "s1"}
    waiting = asyncio.Event()

    async def on_status(changed: Task) -> None:
        if changed.status is TaskStatus.INPUT_REQUIRED:
            waiting.set()

    task.on_status = on_status
    await exchange.deliver({"jsonrpc": "2.0", "id": exchange.request_id, "result": asked})
    async with asyncio.timeout(5):
        await waiting.wait()
    get = a.message("tasks/get", {"taskId": task.id})
    here, elsewhere = final(await response(a, get))["result"], final(await response(b, get))["result"]
    assert here["inputRequests"] == asks  # the process running it shows the round's requests
    assert elsewhere == {**here, "inputRequests": {}}  # another shows the status, and no requests
    await a.stop()
    await b.stop()
