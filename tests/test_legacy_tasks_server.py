"""Direct tests of tests/servers/legacy_tasks_server.py (no gateway): 2025-11-25 core Tasks (SEP-1686).

Two servers per module on Streamable HTTP (one default, one ``--no-status --poll-interval 50``), spoken to with raw
aiohttp through ``tests.wire.Client`` in the handshake era (``initialize``, then ``Mcp-Session-Id``), plus the
session's standalone GET stream for what the server sends unasked (status pushes, a task's late progress and
logs); one stdio round trip over raw pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import ROOT, serve_http, stop_process
from tests.test_modern_tasks_server import ISO, error_of, next_message
from tests.wire import LEGACY, RELATED_TASK, Client, Message, Reply

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "legacy_tasks_server.py")]
TEST_TIMEOUT = 15.0
"""Seconds any one test may take (each wraps its body in asyncio.timeout)."""

TASKS_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
TASK_KEYS = {"taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"}
TERMINAL = ("completed", "failed", "cancelled")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with serve_http(SERVER, log=tmp_path_factory.mktemp("legacy-tasks") / "server.log") as server_url:
        yield server_url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def quiet_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    log = tmp_path_factory.mktemp("legacy-tasks-quiet") / "server.log"
    async with serve_http(SERVER, "--no-status", "--poll-interval", "50", log=log) as server_url:
        yield server_url


async def connect(http: aiohttp.ClientSession, url: str) -> tuple[Client, Message]:
    """A new initialized 2025-11-25 session; the client and the initialize response."""
    client = Client(http, url, LEGACY)
    async with asyncio.timeout(TEST_TIMEOUT):
        response = await client.initialize()
    return client, response


@pytest_asyncio.fixture(loop_scope="module")
async def client(http: aiohttp.ClientSession, url: str) -> AsyncIterator[Client]:
    session, _ = await connect(http, url)
    yield session
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(TEST_TIMEOUT):
            await session.delete()


@contextlib.asynccontextmanager
async def standalone(client: Client) -> AsyncIterator[Reply]:
    """The session's standalone GET stream (read it with `next()`), closed when the block exits."""
    headers = {**client.headers({"method": "-"}), "Accept": "text/event-stream"}
    del headers["Content-Type"]
    stream = Reply(await client.http.get(client.url, headers=headers))
    try:
        assert stream.status == 200 and stream.is_sse, stream.status
        await asyncio.sleep(0.05)  # the SDK registers the stream just after it has sent the headers
        yield stream
    finally:
        stream.close()


async def until_terminal(stream: Reply, task_id: str) -> list[Message]:
    """Messages of `stream` up to and including the terminal status push of `task_id`."""
    seen: list[Message] = []
    while True:
        message = await next_message(stream)
        seen.append(message)
        params = message.get("params", {})
        is_push = message.get("method") == "notifications/tasks/status" and params.get("taskId") == task_id
        if is_push and params["status"] in TERMINAL:
            return seen


def pushes(messages: list[Message], task_id: str) -> list[tuple[str, str | None]]:
    """(status, statusMessage) of every status push of `task_id` among `messages`."""
    return [
        (m["params"]["status"], m["params"].get("statusMessage"))
        for m in messages
        if m.get("method") == "notifications/tasks/status" and m["params"]["taskId"] == task_id
    ]


async def start(client: Client, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A task-augmented tools/call (ttl 60 s unless `task=` says otherwise); the nested Task it answers."""
    params = {"name": tool, "arguments": arguments, "task": {"ttl": 60000}} | extra
    reply = await client.request("tools/call", params)
    assert reply.messages == [reply.final], reply.messages  # nothing before the CreateTaskResult
    result: dict[str, Any] = reply.final["result"]
    assert set(result) == {"task"}, result
    task: dict[str, Any] = result["task"]
    return task


async def get(client: Client, task_id: str) -> dict[str, Any]:
    return await client.result("tasks/get", {"taskId": task_id})


async def poll(client: Client, task_id: str, until: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """tasks/get every 50 ms until `until(result)`; every result seen, in order."""
    seen: list[dict[str, Any]] = []
    while not seen or not until(seen[-1]):
        if seen:
            await asyncio.sleep(0.05)
        seen.append(await get(client, task_id))
    return seen


async def tasks_get_count(client: Client) -> int:
    result = await client.result("tools/call", {"name": "stats", "arguments": {}})
    count: int = json.loads(result["content"][0]["text"])["tasks_get"]
    return count


def related(task_id: str) -> dict[str, Any]:
    return {RELATED_TASK: {"taskId": task_id}}


async def test_initialize_advertises_tasks(http: aiohttp.ClientSession, url: str) -> None:
    _, response = await connect(http, url)
    result = response["result"]
    assert result["protocolVersion"] == LEGACY
    assert result["capabilities"]["tasks"] == TASKS_CAPABILITY
    assert "extensions" not in result["capabilities"]


async def test_tools_list_declares_task_support(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        tools = (await client.result("tools/list"))["tools"]
    support = {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in tools}
    assert support == {
        "echo": "forbidden",
        "stats": "forbidden",
        "slow_job": "optional",
        "chatty_job": "optional",
        "fail_job": "optional",
    }


async def test_slow_job_task_pushes_each_step_then_its_result(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT), standalone(client) as stream:
        task = await start(client, "slow_job", {"steps": 3, "delay": 0.2})
        task_id = task["taskId"]
        messages = await until_terminal(stream, task_id)
        got = await get(client, task_id)
        result = await client.result("tasks/result", {"taskId": task_id})
        listed = await client.result("tasks/list")

    assert set(task) == TASK_KEYS
    assert re.fullmatch(r"[0-9a-f]{32}", task_id)
    assert (task["status"], task["statusMessage"], task["ttl"], task["pollInterval"]) == (
        "working",
        "started",
        60000,
        200,
    )
    assert ISO.match(task["createdAt"]) and task["lastUpdatedAt"] == task["createdAt"]

    assert [m["method"] for m in messages] == ["notifications/tasks/status"] * 4
    assert pushes(messages, task_id) == [
        ("working", "step 1/3"),
        ("working", "step 2/3"),
        ("working", "step 3/3"),
        ("completed", None),
    ]
    final = messages[-1]["params"]
    assert set(final) == TASK_KEYS - {"statusMessage"}  # the full Task, no related-task _meta
    assert final["createdAt"] == task["createdAt"] and final["lastUpdatedAt"] > task["createdAt"]
    assert got == final
    assert result == {
        "content": [{"type": "text", "text": "done after 3 steps"}],
        "isError": False,
        "_meta": related(task_id),
    }
    assert final in listed["tasks"]


async def test_ttl_is_honoured_up_to_an_hour_and_defaults_to_a_minute(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        short = await start(client, "slow_job", {"steps": 1, "delay": 0}, task={"ttl": 1234})
        long = await start(client, "slow_job", {"steps": 1, "delay": 0}, task={"ttl": 10**9})
        default = await start(client, "slow_job", {"steps": 1, "delay": 0}, task={})
    assert (short["ttl"], long["ttl"], default["ttl"]) == (1234, 3_600_000, 60_000)


async def test_chatty_job_sends_late_progress_and_related_task_logs(client: Client) -> None:
    token = "chatty-1"
    async with asyncio.timeout(TEST_TIMEOUT), standalone(client) as stream:
        task = await start(client, "chatty_job", {"steps": 3, "delay": 0.1}, _meta={"progressToken": token})
        task_id = task["taskId"]
        messages = await until_terminal(stream, task_id)
        result = await client.result("tasks/result", {"taskId": task_id})

    progress = [m["params"] for m in messages if m["method"] == "notifications/progress"]
    logs = [m["params"] for m in messages if m["method"] == "notifications/message"]
    assert progress == [
        {"progressToken": token, "progress": i, "total": 3, "message": f"step {i}", "_meta": related(task_id)}
        for i in (1, 2, 3)
    ]
    assert logs == [{"level": "info", "data": f"chatty step {i}", "_meta": related(task_id)} for i in (1, 2, 3)]
    # Per step: the status push, then the progress, then the log; the terminal push last.
    assert [m["method"].rsplit("/", 1)[-1] for m in messages] == ["status", "progress", "message"] * 3 + ["status"]
    assert pushes(messages, task_id)[-1] == ("completed", None)
    assert result["content"] == [{"type": "text", "text": "done after 3 steps"}]
    assert result["_meta"] == related(task_id)


async def test_chatty_job_without_a_task_notifies_on_its_own_stream(client: Client) -> None:
    params = {"name": "chatty_job", "arguments": {"steps": 2, "delay": 0}, "_meta": {"progressToken": 7}}
    async with asyncio.timeout(TEST_TIMEOUT):
        reply = await client.request("tools/call", params)
    assert [(m["method"], m["params"]) for m in reply.notifications] == [
        ("notifications/progress", {"progressToken": 7, "progress": 1, "total": 2, "message": "step 1"}),
        ("notifications/message", {"level": "info", "data": "chatty step 1"}),
        ("notifications/progress", {"progressToken": 7, "progress": 2, "total": 2, "message": "step 2"}),
        ("notifications/message", {"level": "info", "data": "chatty step 2"}),
    ]
    assert reply.final["result"] == {"content": [{"type": "text", "text": "done after 2 steps"}], "isError": False}


async def test_fail_job_task_ends_failed_and_its_result_is_the_error_result(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT), standalone(client) as stream:
        task_id = (await start(client, "fail_job", {}))["taskId"]
        messages = await until_terminal(stream, task_id)
        got = await get(client, task_id)
        result = await client.result("tasks/result", {"taskId": task_id})
        cancel = await client.request("tasks/cancel", {"taskId": task_id})
        after = await get(client, task_id)
    assert pushes(messages, task_id) == [("failed", None)]
    assert got["status"] == "failed" and after == got
    assert result == {
        "content": [{"type": "text", "text": "fail_job failed on purpose"}],
        "isError": True,
        "_meta": related(task_id),
    }
    assert error_of(cancel)["code"] == -32602


async def test_cancel_stops_the_job(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT), standalone(client) as stream:
        task_id = (await start(client, "slow_job", {"steps": 100, "delay": 0.05}))["taskId"]
        first = await next_message(stream)
        cancelled = await client.result("tasks/cancel", {"taskId": task_id})
        seen = [first, *await until_terminal(stream, task_id)]
        await asyncio.sleep(0.5)  # ten more steps' worth: a job still running would change the task
        later = await get(client, task_id)
        result = await client.request("tasks/result", {"taskId": task_id})
        again = await client.request("tasks/cancel", {"taskId": task_id})
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await stream.next()

    assert pushes([first], task_id) == [("working", "step 1/100")]
    assert set(cancelled) == TASK_KEYS and cancelled["status"] == "cancelled"
    assert pushes(seen, task_id)[-1] == ("cancelled", cancelled["statusMessage"])
    assert later == cancelled
    assert error_of(result) == {"code": -32603, "message": f"Task {task_id} was cancelled"}
    assert error_of(again)["code"] == -32602


async def test_unknown_task_ids_and_forbidden_task_augmentation(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            reply = await client.request(method, {"taskId": "no-such-task"})
            assert error_of(reply)["code"] == -32602, (method, reply.messages)
        bad_cursor = await client.request("tasks/list", {"cursor": "nope"})
        echo = {"name": "echo", "arguments": {"text": "hi"}}
        forbidden = await client.request("tools/call", {**echo, "task": {"ttl": 1000}})
        plain = await client.result("tools/call", echo)
        sync = await client.result("tools/call", {"name": "slow_job", "arguments": {"steps": 1, "delay": 0}})
    assert error_of(bad_cursor)["code"] == -32602
    assert error_of(forbidden)["code"] == -32601
    assert plain == {"content": [{"type": "text", "text": "hi"}], "isError": False}
    assert sync == {"content": [{"type": "text", "text": "done after 1 steps"}], "isError": False}


async def test_tasks_list_holds_the_sessions_own_tasks(http: aiohttp.ClientSession, url: str, client: Client) -> None:
    other, _ = await connect(http, url)
    async with asyncio.timeout(TEST_TIMEOUT):
        mine = (await start(client, "slow_job", {"steps": 1, "delay": 0}))["taskId"]
        theirs = (await start(other, "slow_job", {"steps": 1, "delay": 0}))["taskId"]
        my_list = {t["taskId"] for t in (await client.result("tasks/list"))["tasks"]}
        their_list = {t["taskId"] for t in (await other.result("tasks/list"))["tasks"]}
        shared = await get(other, mine)  # tasks themselves belong to the server
        await other.delete()
    assert mine in my_list and theirs not in my_list
    assert theirs in their_list and mine not in their_list
    assert shared["taskId"] == mine


async def test_no_status_sends_no_pushes_and_polling_shows_the_steps(
    http: aiohttp.ClientSession, quiet_url: str
) -> None:
    quiet, response = await connect(http, quiet_url)
    assert response["result"]["capabilities"]["tasks"] == TASKS_CAPABILITY
    async with asyncio.timeout(TEST_TIMEOUT), standalone(quiet) as stream:
        gets_before = await tasks_get_count(quiet)
        task = await start(quiet, "chatty_job", {"steps": 3, "delay": 0.3}, _meta={"progressToken": "q"})
        seen = await poll(quiet, task["taskId"], lambda r: r["status"] != "working")
        gets_after = await tasks_get_count(quiet)
        result = await quiet.result("tasks/result", {"taskId": task["taskId"]})
        # Progress and logs still flow (only status pushes are off): exactly 3 of each, nothing else.
        late: list[Message] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                while True:
                    late.append(await next_message(stream))
    assert task["pollInterval"] == 50
    assert {"step 1/3", "step 2/3"} <= {r.get("statusMessage") for r in seen}
    assert seen[-1]["status"] == "completed" and all(set(r) <= TASK_KEYS for r in seen)
    assert gets_after - gets_before == len(seen)
    assert result["content"] == [{"type": "text", "text": "done after 3 steps"}]
    assert sorted(m["method"] for m in late) == ["notifications/message"] * 3 + ["notifications/progress"] * 3


async def test_stdio_task_round_trip() -> None:
    """initialize → task-augmented tools/call → status pushes on stdout → tasks/result, newline-delimited JSON."""
    proc = await asyncio.create_subprocess_exec(
        *SERVER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
        limit=1 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    unsolicited: list[Message] = []

    async def send(message: Message) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()

    async def call(request_id: int, method: str, params: dict[str, Any]) -> Message:
        assert proc.stdout is not None
        await send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            line = await proc.stdout.readline()
            assert line, "the server closed stdout"
            message: Message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message
            unsolicited.append(message)

    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            init = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
            initialized = await call(1, "initialize", init)
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            arguments = {"steps": 2, "delay": 0.1}
            params = {
                "name": "chatty_job",
                "arguments": arguments,
                "task": {"ttl": 5000},
                "_meta": {"progressToken": 1},
            }
            created = await call(2, "tools/call", params)
            task_id = created["result"]["task"]["taskId"]
            result = await call(3, "tasks/result", {"taskId": task_id})  # blocks until completed
    finally:
        proc.stdin.close()
        await stop_process(proc)
    assert initialized["result"]["capabilities"]["tasks"] == TASKS_CAPABILITY
    assert created["result"]["task"]["ttl"] == 5000
    assert pushes(unsolicited, task_id) == [("working", "step 1/2"), ("working", "step 2/2"), ("completed", None)]
    progress = [m["params"] for m in unsolicited if m["method"] == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p["_meta"]) for p in progress] == [
        (1, 1, related(task_id)),
        (1, 2, related(task_id)),
    ]
    assert result["result"] == {
        "content": [{"type": "text", "text": "done after 2 steps"}],
        "isError": False,
        "_meta": related(task_id),
    }
