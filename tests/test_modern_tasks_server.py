"""Direct tests of tests/servers/modern_tasks_server.py (no gateway): the 2026-07-28 Tasks extension.

Two servers per module on Streamable HTTP (one default, one ``--no-notify``), spoken to with raw aiohttp
POSTs through ``tests.wire.Client`` (the 2026-07-28 envelope and headers); one stdio smoke test over raw pipes.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import ROOT, serve_http, stop_process
from tests.wire import MODERN, TASKS_EXTENSION, Client, Message, Reply, envelope

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "modern_tasks_server.py")]
TEST_TIMEOUT = 15.0
"""Seconds any one test may take (each wraps its body in asyncio.timeout)."""

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
NAME_FORM = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Who are you?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with serve_http(SERVER, log=tmp_path_factory.mktemp("modern-tasks") / "server.log") as server_url:
        yield server_url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def quiet_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    log = tmp_path_factory.mktemp("modern-tasks-quiet") / "server.log"
    async with serve_http(SERVER, "--no-notify", "--poll-interval", "50", log=log) as server_url:
        yield server_url


@pytest.fixture
def client(http: aiohttp.ClientSession, url: str) -> Client:
    return Client(http, url, MODERN)


async def start(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """tools/call that must come back as a task; the CreateTaskResult."""
    result = await client.result("tools/call", {"name": tool, "arguments": arguments or {}})
    assert result["resultType"] == "task", result
    return result


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


def error_of(reply: Reply) -> dict[str, Any]:
    final = reply.final
    assert "error" in final, final
    error: dict[str, Any] = final["error"]
    return error


async def tasks_get_count(client: Client) -> int:
    result = await client.result("tools/call", {"name": "stats", "arguments": {}})
    count: int = json.loads(result["content"][0]["text"])["tasks_get"]
    return count


async def test_discover_advertises_the_extension(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        result = await client.result("server/discover")
    assert result["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}
    assert MODERN in result["supportedVersions"]


async def test_slow_job_is_a_task_whose_steps_show_in_tasks_get(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        gets_before = await tasks_get_count(client)
        created = await start(client, "slow_job", {"steps": 3, "delay": 0.3})
        seen = await poll(client, created["taskId"], lambda r: r["status"] != "working")
        gets_after = await tasks_get_count(client)

    assert set(created) == {
        "resultType",
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
        "ttlMs",
        "pollIntervalMs",
        "_meta",
    }
    assert re.fullmatch(r"[0-9a-f]{32}", created["taskId"])
    assert (created["status"], created["ttlMs"], created["pollIntervalMs"]) == ("working", 60000, 200)
    assert ISO.match(created["createdAt"]) and created["lastUpdatedAt"] == created["createdAt"]

    assert all(r["resultType"] == "complete" and r["taskId"] == created["taskId"] for r in seen)
    messages = [r.get("statusMessage") for r in seen]
    assert {"step 1/3", "step 2/3"} <= set(messages), messages
    final = seen[-1]
    assert final["status"] == "completed"
    assert final["result"] == {"content": [{"type": "text", "text": "done after 3 steps"}], "isError": False}
    assert final["lastUpdatedAt"] > final["createdAt"]
    assert gets_after - gets_before == len(seen)


async def test_ask_job_waits_for_input_and_completes_after_tasks_update(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        task_id = (await start(client, "ask_job", {"question": "Who are you?"}))["taskId"]
        waiting = (await poll(client, task_id, lambda r: r["status"] != "working"))[-1]
        assert waiting["status"] == "input_required"
        assert waiting["inputRequests"] == {"name": NAME_FORM}

        answers = {
            "bogus": {"action": "accept", "content": {}},
            "name": {"action": "accept", "content": {"name": "Ada"}},
        }
        ack = await client.result("tasks/update", {"taskId": task_id, "inputResponses": answers})
        assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
        done = (await poll(client, task_id, lambda r: r["status"] not in ("working", "input_required")))[-1]
        # Answering again is ignored (the key was answered already).
        again = {"name": {"action": "accept", "content": {"name": "Bob"}}}
        await client.result("tasks/update", {"taskId": task_id, "inputResponses": again})
        after = await get(client, task_id)

    assert done["status"] == "completed" and "inputRequests" not in done
    assert done["result"] == {"content": [{"type": "text", "text": "Hello, Ada!"}], "isError": False}
    assert after == done


async def test_fail_job_ends_failed_with_the_json_rpc_error(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        task_id = (await start(client, "fail_job"))["taskId"]
        final = (await poll(client, task_id, lambda r: r["status"] != "working"))[-1]
        # Cancelling a terminal task is acknowledged and changes nothing.
        await client.result("tasks/cancel", {"taskId": task_id})
        after = await get(client, task_id)
    assert final["status"] == "failed"
    assert final["error"] == {"code": -32603, "message": "fail_job failed on purpose"}
    assert "result" not in final
    assert after == final


async def test_cancel_stops_the_task(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        task_id = (await start(client, "slow_job", {"steps": 100, "delay": 0.05}))["taskId"]
        await poll(client, task_id, lambda r: r.get("statusMessage", "").startswith("step "))
        ack = await client.result("tasks/cancel", {"taskId": task_id})
        cancelled = await get(client, task_id)
        await asyncio.sleep(0.5)  # ten more steps' worth: a job still running would change the task
        later = await get(client, task_id)
    assert ack["resultType"] == "complete"
    assert cancelled["status"] == "cancelled"
    assert later == cancelled


async def test_unknown_task_ids_and_tasks_result(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            reply = await client.request(method, {"taskId": "no-such-task"})
            assert error_of(reply)["code"] == -32602, (method, reply.messages)
        reply = await client.request("tasks/result", {"taskId": "no-such-task"}, headers={"Mcp-Name": "no-such-task"})
    assert error_of(reply)["code"] == -32601


async def test_a_client_without_the_extension_gets_plain_results(http: aiohttp.ClientSession, url: str) -> None:
    plain = Client(http, url, MODERN, tasks=False)
    required: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    async with asyncio.timeout(TEST_TIMEOUT):
        result = await plain.result("tools/call", {"name": "slow_job", "arguments": {"steps": 2, "delay": 0.05}})
        assert result["resultType"] == "complete"
        assert result["content"] == [{"type": "text", "text": "done after 2 steps"}] and result["isError"] is False

        failed = error_of(await plain.request("tools/call", {"name": "fail_job", "arguments": {}}))
        assert failed == {"code": -32603, "message": "fail_job failed on purpose"}
        asked = error_of(await plain.request("tools/call", {"name": "ask_job", "arguments": {}}))
        assert asked["code"] == -32021 and asked["data"] == required

        task_id = (await start(Client(http, url, MODERN), "slow_job", {"steps": 1, "delay": 0.05}))["taskId"]
        for method in ("tasks/get", "tasks/cancel"):
            refused = error_of(await plain.request(method, {"taskId": task_id}))
            assert refused["code"] == -32021 and refused["data"] == required, method
        listen = await plain.request("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
        assert error_of(listen)["code"] == -32021

        echoed = await Client(http, url, MODERN).result("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert echoed["resultType"] == "complete" and echoed["content"] == [{"type": "text", "text": "hi"}]


async def next_message(reply: Reply) -> Message:
    message = await reply.next()
    assert message is not None, reply.messages
    return message


async def test_listen_streams_task_notifications_to_the_terminal_one(client: Client) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        slow = (await start(client, "slow_job", {"steps": 2, "delay": 0.4}))["taskId"]
        # ask_job waits 0.4 s before it asks, so its input_required comes after the listen is set up.
        ask = (await start(client, "ask_job", {"question": "Who are you?", "delay": 0.4}))["taskId"]
        listen_id = "listen-1"
        stream = await client.open(
            "subscriptions/listen", {"notifications": {"taskIds": [slow, ask]}}, request_id=listen_id
        )
        try:
            ack = await next_message(stream)
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"] == {"notifications": {"taskIds": [slow, ask]}, "_meta": {SUBSCRIPTION_ID: listen_id}}

            events: list[dict[str, Any]] = []
            terminal: set[str] = set()
            while terminal != {slow, ask}:
                message = await next_message(stream)
                assert message["method"] == "notifications/tasks", message
                params: dict[str, Any] = message["params"]
                events.append(params)
                if params["status"] == "input_required":
                    answer = {"name": {"action": "accept", "content": {"name": "Lin"}}}
                    update = {"taskId": ask, "inputResponses": answer}
                    await client.result("tasks/update", update)
                if params["status"] in ("completed", "failed", "cancelled"):
                    terminal.add(params["taskId"])
        finally:
            stream.close()

    assert all(e["_meta"] == {SUBSCRIPTION_ID: listen_id} for e in events)
    assert all("resultType" not in e and {"createdAt", "lastUpdatedAt", "ttlMs"} <= set(e) for e in events)
    slow_events = [(e["status"], e.get("statusMessage")) for e in events if e["taskId"] == slow]
    assert slow_events == [("working", "step 1/2"), ("working", "step 2/2"), ("completed", None)]
    ask_events = [e for e in events if e["taskId"] == ask]
    assert [e["status"] for e in ask_events] == ["input_required", "working", "completed"]
    assert ask_events[0]["inputRequests"] == {"name": NAME_FORM}
    assert ask_events[-1]["result"]["content"] == [{"type": "text", "text": "Hello, Lin!"}]
    assert events[-1]["result"] == {"content": [{"type": "text", "text": "done after 2 steps"}], "isError": False}


async def test_no_notify_acks_without_task_ids_and_sends_no_task_notification(
    http: aiohttp.ClientSession, quiet_url: str
) -> None:
    quiet = Client(http, quiet_url, MODERN)
    async with asyncio.timeout(TEST_TIMEOUT):
        discovered = await quiet.result("server/discover")
        assert discovered["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}
        created = await start(quiet, "slow_job", {"steps": 2, "delay": 0.2})
        assert created["pollIntervalMs"] == 50  # --poll-interval
        task_id = created["taskId"]
        stream = await quiet.open(
            "subscriptions/listen", {"notifications": {"taskIds": [task_id], "toolsListChanged": True}}
        )
        try:
            ack = await next_message(stream)
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            final = (await poll(quiet, task_id, lambda r: r["status"] != "working"))[-1]
            assert final["status"] == "completed"
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stream.next()
        finally:
            stream.close()
    assert stream.messages == [ack]


async def test_stdio_task_round_trip() -> None:
    """tools/call → CreateTaskResult → tasks/get until completed, newline-delimited JSON over pipes."""
    proc = await asyncio.create_subprocess_exec(
        *SERVER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
        limit=1 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    ids = iter(range(1, 1000))

    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        request_id = next(ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": envelope()}}
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        while True:
            line = await proc.stdout.readline()
            assert line, "the server closed stdout"
            reply = json.loads(line)
            if reply.get("id") == request_id:
                assert "result" in reply, reply
                result: dict[str, Any] = reply["result"]
                return result

    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            created = await call("tools/call", {"name": "slow_job", "arguments": {"steps": 2, "delay": 0.1}})
            assert created["resultType"] == "task" and created["status"] == "working"
            got = await call("tasks/get", {"taskId": created["taskId"]})
            while got["status"] == "working":
                await asyncio.sleep(0.05)
                got = await call("tasks/get", {"taskId": created["taskId"]})
    finally:
        proc.stdin.close()
        await stop_process(proc)
    assert got["status"] == "completed"
    assert got["result"] == {"content": [{"type": "text", "text": "done after 2 steps"}], "isError": False}
