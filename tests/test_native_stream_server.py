"""The native SEP-2694 reference server (examples/native_stream_server.py) and its broken variants
(tests/servers/broken_native_server.py), each a real subprocess on Streamable HTTP.

The reference server runs once for the module with ``--max-events-per-task 8``, so a 5-step build (13
events) overruns its retention and a 2-step build (7 events) does not. It is driven with raw HTTP
(``tests.wire.Client``: exact requests, every message in order) in both eras, and with the official
``mcp`` SDK client. Each rule of the SEP gets a test. The scenarios those tests use also run against
every broken variant, where one parametrized test asserts that the variant's defect is really there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp
import mcp_types
import pytest
import pytest_asyncio
from mcp import Client as SdkClient
from mcp.client.extension import ClientExtension, NotificationBinding
from pydantic import BaseModel, ConfigDict

from examples.native_stream_server import Retention, TaskLog
from tests.conftest import ROOT, serve_http, stop_process
from tests.wire import LEGACY, MODERN, RELATED_TASK, TASKS_EXTENSION, Client, Message, Reply, seqs, task_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

NATIVE = [sys.executable, str(ROOT / "examples" / "native_stream_server.py")]
BROKEN = [sys.executable, str(ROOT / "tests" / "servers" / "broken_native_server.py")]
RETENTION = 8
"""--max-events-per-task of every server here."""
PREFIX = "com.example.native."
TEST_TIMEOUT = 15.0
"""Seconds any one test may take (each wraps its body in asyncio.timeout)."""

SHORT = {"steps": 2, "delay": 0.02}
"""7 events: created, log, (progress, log) x 2, status."""
SHORT_TYPES = ["task.created", "log", "progress", "log", "progress", "log", "task.status"]
LONG = {"steps": 5, "delay": 0.02}
"""13 events, more than RETENTION: seq 0-4 are dropped, the earliest retained is 5."""
LONG_EARLIEST = 13 - RETENTION
RUNNING = {"steps": 100, "delay": 0.1}
"""Runs far longer than any test; the test cancels it."""
EVENTS_GONE = {"code": -32010, "message": "Task events are no longer available"}


class Caller(Client):
    """A raw-protocol client acting for one principal (``Authorization: Bearer <name>``; None: anonymous)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, era: str = LEGACY, bearer: str | None = None) -> None:
        super().__init__(http, url, era)
        self.bearer = bearer

    def headers(self, message: Message) -> dict[str, str]:
        headers = super().headers(message)
        if self.bearer is not None:
            headers["Authorization"] = f"Bearer {self.bearer}"
        return headers


Connect = Callable[..., Awaitable[Caller]]
"""connect(bearer=None, era=LEGACY): a new session of a principal (initialized in the 2025-11-25 era)."""


def connector(http: aiohttp.ClientSession, url: str) -> Connect:
    async def connect(bearer: str | None = None, era: str = LEGACY) -> Caller:
        caller = Caller(http, url, era, bearer)
        if era == LEGACY:
            await caller.initialize()
        return caller

    return connect


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    log = tmp_path_factory.mktemp("native") / "server.log"
    async with serve_http(NATIVE, "--max-events-per-task", str(RETENTION), log=log, port_option="--port") as server:
        yield server


@pytest.fixture
def connect(http: aiohttp.ClientSession, url: str) -> Connect:
    return connector(http, url)


# --- scenarios (shared by the reference tests and the variant test) -----------------------------------


async def start(client: Client, arguments: dict[str, Any]) -> str:
    """slow_build as a task; its id."""
    params: dict[str, Any] = {"name": "slow_build", "arguments": arguments}
    if client.era == LEGACY:
        result = await client.result("tools/call", {**params, "task": {"ttl": 60_000}})
        task_id: str = result["task"]["taskId"]
    else:
        result = await client.result("tools/call", params)
        assert result["resultType"] == "task", result
        task_id = result["taskId"]
    return task_id


async def finished(client: Client, arguments: dict[str, Any]) -> str:
    """slow_build as a task that has completed (tasks/result waits for it); its id."""
    task_id = await start(client, arguments)
    assert "result" in (await client.request("tasks/result", {"taskId": task_id})).final
    return task_id


async def stream(client: Client, task_id: str, **params: Any) -> Reply:
    """A whole tasks/stream response (of a task that is terminal, or will be)."""
    return await client.request("tasks/stream", {"taskId": task_id, **params})


def error_of(reply: Reply) -> dict[str, Any]:
    assert "error" in reply.final, reply.messages
    error: dict[str, Any] = reply.final["error"]
    return error


@contextlib.asynccontextmanager
async def running(client: Client) -> AsyncIterator[str]:
    """A task that runs until the block exits, then is cancelled."""
    task_id = await start(client, RUNNING)
    try:
        yield task_id
    finally:
        await client.request("tasks/cancel", {"taskId": task_id})


async def first_event(reply: Reply) -> Message:
    message = await reply.next()
    assert message is not None and message.get("method") == "notifications/tasks/event", reply.messages
    return message


async def cancel_stream(client: Client, reply: Reply, request_id: str) -> Message:
    """notifications/cancelled for the stream's request; the stream's last message."""
    assert await client.notify("notifications/cancelled", {"requestId": request_id}) == 202
    await reply.rest()
    return reply.final


# --- the reference server, rule by rule --------------------------------------------------------------


async def test_capabilities_advertise_event_streams_with_retention(connect: Connect) -> None:
    retention = {
        "maxEventsPerTask": RETENTION,
        "maxEventAgeMs": 3_600_000,
        "terminalRetentionMs": 600_000,
        "maxPayloadBytes": 65_536,
    }
    async with asyncio.timeout(TEST_TIMEOUT):
        legacy = await connect()
        response = await legacy.initialize()
        tasks = response["result"]["capabilities"]["tasks"]
        assert tasks == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}, "eventStreams": retention}
        tools = (await legacy.result("tools/list"))["tools"]
        assert {t["name"]: t["execution"] for t in tools} == {
            "echo": {"taskSupport": "optional"},
            "slow_build": {"taskSupport": "optional"},
        }
        discovered = await (await connect(era=MODERN)).result("server/discover")
        assert discovered["capabilities"]["extensions"][TASKS_EXTENSION] == {"eventStreams": retention}


async def test_live_stream_and_late_joiner_get_the_same_history(connect: Connect) -> None:
    """seq from 0 by 1, in order; every event well formed; the late joiner sees exactly what the live one saw."""
    async with asyncio.timeout(TEST_TIMEOUT):
        live_client, late_client = await connect(), await connect()
        task_id = await start(live_client, {"steps": 2, "delay": 0.2})
        live = await stream(live_client, task_id)
        late = await stream(late_client, task_id)
    assert live.final["result"] == {} and late.final["result"] == {}
    assert live.notifications == late.notifications
    events = task_events(live.messages)
    assert [e["seq"] for e in events] == list(range(len(SHORT_TYPES)))
    assert [e["type"] for e in events] == [PREFIX + t for t in SHORT_TYPES]
    for event in events:
        assert set(event) == {"seq", "taskId", "type", "payload", "_meta"}
        assert event["taskId"] == task_id and event["_meta"][RELATED_TASK] == {"taskId": task_id}
        assert isinstance(event["payload"], dict)
    assert events[2]["payload"] == {"progress": 1, "total": 2, "message": "step 1/2"}
    assert events[-1]["payload"] == {"status": "completed"}


async def test_resume_delivers_only_what_follows_the_cursor(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect()
        task_id = await finished(client, SHORT)
        resumed = await stream(client, task_id, after=3)
        at_the_end = await stream(client, task_id, after=len(SHORT_TYPES) - 1)
    assert seqs(resumed.messages) == list(range(4, len(SHORT_TYPES))) and resumed.final["result"] == {}
    assert at_the_end.messages == [at_the_end.final] and at_the_end.final["result"] == {}


@pytest.mark.parametrize("after", [-1, 1.5, "2", True, None, len(SHORT_TYPES)])
async def test_an_invalid_cursor_is_invalid_params(connect: Connect, after: Any) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect()
        task_id = await finished(client, SHORT)
        error = error_of(await stream(client, task_id, after=after))
    assert error["code"] == -32602 and "after" in error["message"], error


async def test_events_gone_names_the_earliest_retained_event_and_resuming_from_it_works(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect()
        task_id = await finished(client, LONG)
        gone = error_of(await stream(client, task_id, after=0))
        recovered = await stream(client, task_id, after=gone["data"]["earliestSeq"] - 1)
        from_the_start = await stream(client, task_id)
    assert gone == EVENTS_GONE | {"data": {"reason": "events_gone", "taskId": task_id, "earliestSeq": LONG_EARLIEST}}
    assert seqs(recovered.messages) == list(range(LONG_EARLIEST, 13)) and recovered.final["result"] == {}
    assert from_the_start.notifications == recovered.notifications and from_the_start.final["result"] == {}


async def test_one_stream_per_task_per_session_and_cancelling_it_leaves_the_task_running(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client, other_session = await connect(), await connect()
        async with running(client) as task_id:
            first = await client.open("tasks/stream", {"taskId": task_id}, request_id="first")
            await first_event(first)
            second = error_of(await stream(client, task_id))
            elsewhere = await other_session.open("tasks/stream", {"taskId": task_id})
            await first_event(elsewhere)
            elsewhere.close()
            cancelled = await cancel_stream(client, first, "first")
            status = (await client.result("tasks/get", {"taskId": task_id}))["status"]
            again = await client.open("tasks/stream", {"taskId": task_id})
            await first_event(again)
            again.close()
    assert second["code"] == -32602 and "already has an active tasks/stream" in second["message"]
    assert cancelled["error"]["code"] == -32800
    assert status == "working"


async def test_a_dropped_stream_frees_its_slot_and_resumes_on_the_same_session(connect: Connect) -> None:
    """A 2025-11-25 client that just drops the connection (no cancel) can resume on the same session."""
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect()
        async with running(client) as task_id:
            dropped = await client.open("tasks/stream", {"taskId": task_id})
            await first_event(dropped)
            dropped.close()  # closes the TCP connection, sends nothing
            while True:  # the server notices the drop at its next check; until then the slot is taken
                resumed = await client.open("tasks/stream", {"taskId": task_id, "after": 0})
                first = await resumed.next()
                if first is not None and first.get("method") == "notifications/tasks/event":
                    break
                assert first is not None and "already has an active" in first["error"]["message"], first
                await asyncio.sleep(0.1)
            resumed.close()
            status = (await client.result("tasks/get", {"taskId": task_id}))["status"]
    assert first["params"]["seq"] == 1
    assert status == "working"


async def test_progress_on_the_streams_own_token_is_not_a_task_event(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect()
        task_id = await finished(client, SHORT)
        reply = await stream(client, task_id, _meta={"progressToken": "tok"})
    progress = [m["params"] for m in reply.notifications if m["method"] == "notifications/progress"]
    assert seqs(reply.messages) == list(range(len(SHORT_TYPES)))
    assert [p["progressToken"] for p in progress] == ["tok"] * len(SHORT_TYPES)
    assert [p["progress"] for p in progress] == list(range(1, len(SHORT_TYPES) + 1))


async def test_a_foreign_task_is_answered_exactly_like_an_unknown_one(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        alice, bob, anonymous = await connect("alice"), await connect("bob"), await connect()
        task_id = await finished(alice, SHORT)
        unknown = "0" * 32
        for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/stream"):
            expected = error_of(await bob.request(method, {"taskId": unknown}))
            for stranger in (bob, anonymous):
                error = error_of(await stranger.request(method, {"taskId": task_id}))
                assert error == {**expected, "message": expected["message"].replace(unknown, task_id)}, method
        assert (await bob.result("tasks/list"))["tasks"] == []
        assert [t["taskId"] for t in (await alice.result("tasks/list"))["tasks"]] == [task_id]
        assert seqs((await stream(await connect("alice"), task_id)).messages) == list(range(len(SHORT_TYPES)))


async def test_the_2026_era_streams_the_same_way_and_needs_the_extension(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect(era=MODERN)
        task_id = await start(client, SHORT)
        reply = await stream(client, task_id)
        undeclared = await connect(era=MODERN)
        undeclared.tasks = False
        refused = error_of(await stream(undeclared, task_id))
    assert seqs(reply.messages) == list(range(len(SHORT_TYPES)))
    assert reply.final["result"]["resultType"] == "complete"
    assert refused["code"] == -32021


async def test_closing_a_2026_stream_stops_it_and_the_task_runs_on(connect: Connect) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        client = await connect(era=MODERN)
        async with running(client) as task_id:
            first = await client.open("tasks/stream", {"taskId": task_id})
            await first_event(first)
            first.close()  # the 2026-07-28 cancel: the POST goes away
            again = await client.open("tasks/stream", {"taskId": task_id, "after": 0})
            second = await first_event(again)
            again.close()
            status = (await client.result("tasks/get", {"taskId": task_id}))["status"]
    assert second["params"]["seq"] == 1
    assert status == "working"


class EventParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    seq: int
    taskId: str
    type: str
    payload: dict[str, Any]


class StreamParams(mcp_types.RequestParams):
    task_id: str
    after: int | None = None


class StreamRequest(mcp_types.Request[StreamParams, Literal["tasks/stream"]]):
    method: Literal["tasks/stream"] = "tasks/stream"
    params: StreamParams
    name_param = "taskId"


class EventCollector(ClientExtension):
    """Declares the tasks extension and binds ``notifications/tasks/event`` (unbound ones the SDK drops)."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.events: list[EventParams] = []

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks/event", params_type=EventParams, handler=self.on_event)]

    async def on_event(self, params: EventParams) -> None:
        self.events.append(params)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_official_sdk_client_streams_a_task(connect: Connect, url: str, mode: str) -> None:
    collector = EventCollector()
    async with asyncio.timeout(TEST_TIMEOUT):
        task_id = await finished(await connect(), SHORT)  # tasks belong to the caller (anonymous), not the session
        async with SdkClient(url, mode=mode, extensions=[collector]) as client:
            result = await client.session.send_request(
                StreamRequest(params=StreamParams(task_id=task_id)), mcp_types.EmptyResult
            )
    assert isinstance(result, mcp_types.EmptyResult)
    # The SDK dispatches bound notifications independently, so only the set (not the order) is its to keep.
    assert sorted(e.seq for e in collector.events) == list(range(len(SHORT_TYPES)))
    assert {e.taskId for e in collector.events} == {task_id}


async def test_stdio_serves_tasks_and_streams() -> None:
    """One task and its stream over stdio (raw JSON lines; the SDK client cannot send a 2025-11-25 task)."""
    proc = await asyncio.create_subprocess_exec(
        *NATIVE, "--stdio", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def call(request_id: int, method: str, params: dict[str, Any]) -> list[Message]:
        """Send a request; every message up to and including its response."""
        stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode())
        stdin.write(b"\n")
        messages = [json.loads(await stdout.readline())]
        while messages[-1].get("id") != request_id:
            messages.append(json.loads(await stdout.readline()))
        return messages

    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            hello = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
            assert "tasks" in (await call(1, "initialize", hello))[-1]["result"]["capabilities"]
            stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            created = await call(2, "tools/call", {"name": "slow_build", "arguments": SHORT, "task": {}})
            task_id = created[-1]["result"]["task"]["taskId"]
            streamed = await call(3, "tasks/stream", {"taskId": task_id})
    finally:
        await stop_process(proc)
    assert seqs(streamed) == list(range(len(SHORT_TYPES))) and streamed[-1]["result"] == {}


async def test_retention_drops_the_oldest_by_count_age_and_terminal_time() -> None:
    by_count = TaskLog(Retention(max_events_per_task=3))
    for i in range(5):
        by_count.append(f"{PREFIX}n", {"i": i})
    assert (by_count.earliest_seq, [e.seq for e in by_count.read_from(0)]) == (2, [2, 3, 4])

    by_age = TaskLog(Retention(max_event_age_s=0.05))
    by_age.append(f"{PREFIX}n", {})
    await asyncio.sleep(0.1)
    assert (by_age.earliest_seq, by_age.read_from(0)) == (1, [])

    after_the_end = TaskLog(Retention(terminal_retention_s=1.0))
    after_the_end.append(f"{PREFIX}n", {})
    after_the_end.ended_at = time.monotonic() - 2.0
    assert (after_the_end.earliest_seq, after_the_end.read_from(0)) == (1, [])


async def test_an_oversized_payload_is_recorded_as_omitted_keeping_seq_gap_free() -> None:
    log = TaskLog(Retention(max_payload_bytes=20))
    log.append(f"{PREFIX}log", {"data": "x" * 30})
    log.append(f"{PREFIX}log", {"data": "ok"})
    first, second = log.read_from(0)
    assert (first.seq, first.type) == (0, f"{PREFIX}payload.omitted")
    assert first.payload == {"originalType": f"{PREFIX}log", "size": 41, "limit": 20}
    assert (second.seq, second.payload) == (1, {"data": "ok"})


# --- the broken variants: each really has its defect -------------------------------------------------


async def first_seq_1(connect: Connect) -> None:
    client = await connect()
    assert seqs((await stream(client, await finished(client, SHORT))).messages)[0] == 1


async def skipped_seq(connect: Connect) -> None:
    client = await connect()
    numbers = seqs((await stream(client, await finished(client, SHORT))).messages)
    assert numbers[0] == 0 and 2 not in numbers and numbers[-1] == len(SHORT_TYPES)


async def duplicates_after_resume(connect: Connect) -> None:
    client = await connect()
    assert seqs((await stream(client, await finished(client, SHORT), after=3)).messages)[0] == 3


async def events_gone_wrong_code(connect: Connect) -> None:
    client = await connect()
    error = error_of(await stream(client, await finished(client, LONG), after=0))
    assert error["code"] != EVENTS_GONE["code"] and error["data"]["reason"] == "events_gone"


async def events_gone_no_earliest(connect: Connect) -> None:
    client = await connect()
    error = error_of(await stream(client, await finished(client, LONG), after=0))
    assert error["code"] == EVENTS_GONE["code"] and "earliestSeq" not in error["data"]


async def events_gone_silent_skip(connect: Connect) -> None:
    client = await connect()
    reply = await stream(client, await finished(client, LONG), after=0)
    assert "result" in reply.final and seqs(reply.messages)[0] == LONG_EARLIEST


async def no_terminal_result(connect: Connect) -> None:
    client = await connect()
    reply = await client.open("tasks/stream", {"taskId": await finished(client, SHORT)})
    try:
        for _ in SHORT_TYPES:
            await first_event(reply)
        with pytest.raises(TimeoutError):  # the stream stays open after the terminal task's last event
            async with asyncio.timeout(1.0):
                await reply.next()
    finally:
        reply.close()


async def stream_never_ends(connect: Connect) -> None:
    client = await connect()
    reply = await client.open("tasks/stream", {"taskId": await finished(client, SHORT)})
    try:
        for _ in SHORT_TYPES[:-1]:
            await first_event(reply)
        with pytest.raises(TimeoutError):  # neither the terminal task.status event nor the result comes
            async with asyncio.timeout(1.0):
                await reply.next()
    finally:
        reply.close()


async def cancel_cancels_task(connect: Connect) -> None:
    client = await connect()
    task_id = await start(client, RUNNING)
    reply = await client.open("tasks/stream", {"taskId": task_id}, request_id="s")
    await first_event(reply)
    await cancel_stream(client, reply, "s")
    assert (await client.result("tasks/get", {"taskId": task_id}))["status"] == "cancelled"


async def unprefixed_types(connect: Connect) -> None:
    client = await connect()
    events = task_events((await stream(client, await finished(client, SHORT))).messages)
    assert [e["type"] for e in events] == SHORT_TYPES


async def payload_not_object(connect: Connect) -> None:
    client = await connect()
    events = task_events((await stream(client, await finished(client, SHORT))).messages)
    assert all(isinstance(e["payload"], str) for e in events)


async def concurrent_streams_allowed(connect: Connect) -> None:
    client = await connect()
    async with running(client) as task_id:
        first = await client.open("tasks/stream", {"taskId": task_id})
        await first_event(first)
        second = await client.open("tasks/stream", {"taskId": task_id})
        await first_event(second)
        first.close()
        second.close()


async def foreign_caller_allowed(connect: Connect) -> None:
    alice, bob = await connect("alice"), await connect("bob")
    task_id = await finished(alice, SHORT)
    assert error_of(await bob.request("tasks/get", {"taskId": task_id}))["code"] == -32602
    assert seqs((await stream(bob, task_id)).messages) == list(range(len(SHORT_TYPES)))


DEFECTS: dict[str, Callable[[Connect], Awaitable[None]]] = {
    check.__name__: check
    for check in (
        first_seq_1,
        skipped_seq,
        duplicates_after_resume,
        events_gone_wrong_code,
        events_gone_no_earliest,
        events_gone_silent_skip,
        no_terminal_result,
        stream_never_ends,
        cancel_cancels_task,
        unprefixed_types,
        payload_not_object,
        concurrent_streams_allowed,
        foreign_caller_allowed,
    )
}


async def test_every_variant_has_a_defect_check() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "servers"))
    try:
        from broken_native_server import VARIANTS
    finally:
        sys.path.remove(str(ROOT / "tests" / "servers"))
    assert sorted(DEFECTS) == sorted(VARIANTS)


@pytest.mark.parametrize("variant", sorted(DEFECTS))
async def test_the_broken_variant_has_its_defect(http: aiohttp.ClientSession, tmp_path: Path, variant: str) -> None:
    log = tmp_path / "server.log"
    args = ("--variant", variant, "--max-events-per-task", str(RETENTION))
    async with asyncio.timeout(TEST_TIMEOUT), serve_http(BROKEN, *args, log=log, port_option="--port") as url:
        await DEFECTS[variant](connector(http, url))
