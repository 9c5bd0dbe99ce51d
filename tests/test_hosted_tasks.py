"""Gateway-hosted Tasks in front of the example server (which has none), in both dialects, over real HTTP.

2025-11-25 (SEP-1686): the gateway advertises `capabilities.tasks` (+ `eventStreams`), annotates
`tools/list` with `execution.taskSupport` from `[[tasks.tools]]`, answers a task-augmented `tools/call`
with CreateTaskResult at once and serves `tasks/get|result|list|cancel`.
2026-07-28 (SEP-2663): a client that declares the tasks extension gets a task when a call outlives
`after_ms`; `tasks/get` inlines the outcome, `tasks/cancel` is an ack, `tasks/result` does not exist.

One gateway serves the whole module; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import (
    MODERN,
    RELATED_TASK,
    TASKS_EXTENSION,
    Client,
    Message,
    marker_lines,
    task_events,
    wait_for_marker,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX = "com.example.hosted"
MAX_TTL_MS = 120_000
CONFIG = f"""
[events]
prefix = "{PREFIX}"

[tasks]
page_size = 2
default_ttl_ms = 60000
max_ttl_ms = {MAX_TTL_MS}

[[tasks.tools]]
match = "who*"
task_support = "forbidden"
modern = "never"

[[tasks.tools]]
match = "run_tests"
task_support = "required"

[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "after_ms"
after_ms = 1000

[retention]
max_events_per_task = 777
max_event_age_s = 1234.5
terminal_retention_s = 321
max_payload_bytes = 4096
"""
TERMINAL = ("finished", "cancelled")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def legacy_session(gw: RunningGateway, http: aiohttp.ClientSession) -> AsyncIterator[tuple[Client, Message]]:
    """One legacy session for the module (each session costs an upstream process) and its initialize."""
    client = Client(http, gw.url)
    initialized = await client.initialize()
    yield client, initialized
    await client.delete()


@pytest.fixture
def legacy(legacy_session: tuple[Client, Message]) -> Client:
    return legacy_session[0]


def modern(gw: RunningGateway, http: aiohttp.ClientSession, *, tasks: bool = True) -> Client:
    return Client(http, gw.url, MODERN, tasks=tasks)


def error_of(reply_final: dict[str, Any]) -> dict[str, Any]:
    assert "error" in reply_final, reply_final
    error: dict[str, Any] = reply_final["error"]
    return error


async def start_task(client: Client, tool: str, arguments: dict[str, Any], ttl: int = 60_000) -> dict[str, Any]:
    """A legacy task-augmented tools/call; the Task object of its CreateTaskResult."""
    result = await client.result("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": ttl}})
    assert set(result) <= {"task", "_meta"}, result
    task: dict[str, Any] = result["task"]
    return task


# -- 2025-11-25 -----------------------------------------------------------------------------------


async def test_initialize_advertises_tasks_and_event_streams(legacy_session: tuple[Client, Message]) -> None:
    client, initialized = legacy_session
    result = initialized["result"]
    tasks = result["capabilities"]["tasks"]
    assert tasks["list"] == {} and tasks["cancel"] == {}, tasks
    assert tasks["requests"] == {"tools": {"call": {}}}, tasks
    assert tasks["eventStreams"] == {
        "maxEventsPerTask": 777,
        "maxEventAgeMs": 1_234_500,
        "terminalRetentionMs": 321_000,
        "maxPayloadBytes": 4096,
    }, tasks
    assert client.session_id


async def test_tools_list_task_support_follows_the_policy(legacy: Client) -> None:
    async with asyncio.timeout(30):
        tools = {tool["name"]: tool for tool in (await legacy.result("tools/list"))["tools"]}
        support = {name: tool.get("execution", {}).get("taskSupport") for name, tool in tools.items()}
        assert support["whoami"] == "forbidden", support
        assert support["run_tests"] == "required", support
        assert support["slow_build"] == support["echo"] == support["burst"] == "optional", support

        # A forbidden tool called as a task, and a required one called without: -32601.
        reply = await legacy.request("tools/call", {"name": "whoami", "arguments": {}, "task": {"ttl": 1000}})
        assert reply.status == 200 and error_of(reply.final)["code"] == -32601, reply.messages
        reply = await legacy.request("tools/call", {"name": "run_tests", "arguments": {"count": 1, "delay": 0}})
        assert reply.status == 200 and error_of(reply.final)["code"] == -32601, reply.messages
        # The same tools in the allowed way work.
        assert "content" in await legacy.result("tools/call", {"name": "whoami", "arguments": {}})
        task = await start_task(legacy, "run_tests", {"count": 1, "delay": 0})
        assert task["status"] == "working", task


async def test_task_is_created_at_once_and_its_result_is_the_direct_one(legacy: Client, tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        arguments = {"steps": 8, "delay": 0.25, "marker": str(marker)}
        task = await start_task(legacy, "slow_build", arguments, ttl=45_000)
        assert "finished" not in marker_lines(marker), "the tool finished before CreateTaskResult came back"
        assert task["status"] == "working" and task["ttl"] == 45_000, task
        assert {"taskId", "createdAt", "lastUpdatedAt", "pollInterval"} <= set(task), task

        got = await legacy.result("tasks/get", {"taskId": task["taskId"]})
        assert got["taskId"] == task["taskId"] and got["status"] == "working", got

        # tasks/result blocks until the task is terminal, then returns exactly the tool's result.
        reply = await legacy.request("tasks/result", {"taskId": task["taskId"]})
        assert marker_lines(marker)[-1:] == ["finished"], marker_lines(marker)
        result = reply.final["result"]
        assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}, result

        direct = await legacy.result("tools/call", {"name": "slow_build", "arguments": {"steps": 8, "delay": 0.01}})
        without_meta = {key: value for key, value in result.items() if key != "_meta"}
        assert without_meta == {key: value for key, value in direct.items() if key != "_meta"}, (result, direct)
        assert (await legacy.result("tasks/get", {"taskId": task["taskId"]}))["status"] == "completed"


async def test_tasks_list_is_per_caller_and_paginates(
    gw: RunningGateway, http: aiohttp.ClientSession, legacy: Client
) -> None:
    async with asyncio.timeout(60):
        created = [(await start_task(legacy, "echo", {"text": f"t{i}"}))["taskId"] for i in range(3)]
        # Tasks belong to the caller, not the session: a second session of the same caller lists them.
        other = Client(http, gw.url)
        await other.initialize()
        try:
            listed: list[str] = []
            cursor: str | None = None
            for _ in range(100):
                result = await other.result("tasks/list", {"cursor": cursor} if cursor is not None else {})
                assert len(result["tasks"]) <= 2, result
                assert all({"taskId", "status", "createdAt", "ttl"} <= set(task) for task in result["tasks"]), result
                listed += [task["taskId"] for task in result["tasks"]]
                cursor = result.get("nextCursor")
                if cursor is None:
                    break
                assert len(result["tasks"]) == 2, result  # only the last page is short
            assert cursor is None, "the nextCursor walk did not end"
            assert len(listed) == len(set(listed)), f"a task listed twice: {listed}"
            assert set(created) <= set(listed), (created, listed)
            for bad in ("not-a-cursor", "99999", "-1", "9" * 5000, "\u00b2"):  # a digit int() refuses
                reply = await other.request("tasks/list", {"cursor": bad})
                assert error_of(reply.final)["code"] == -32602, (bad, reply.messages)
        finally:
            await other.delete()


async def test_cancel_stops_the_upstream_tool(legacy: Client, tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        task = await start_task(legacy, "slow_build", {"steps": 60, "delay": 0.1, "marker": str(marker)})
        assert (await wait_for_marker(marker, ("step 2",), 20))[-1:] == ["step 2"], marker_lines(marker)
        cancelled = await legacy.result("tasks/cancel", {"taskId": task["taskId"]})
        assert cancelled["taskId"] == task["taskId"] and cancelled["status"] == "cancelled", cancelled
        lines = await wait_for_marker(marker, TERMINAL, 10)
        assert lines[-1:] == ["cancelled"], f"the upstream tool was not stopped: {lines}"
        assert (await legacy.result("tasks/get", {"taskId": task["taskId"]}))["status"] == "cancelled"
        again = await legacy.request("tasks/cancel", {"taskId": task["taskId"]})
        assert error_of(again.final)["code"] == -32602, again.messages
        await asyncio.sleep(0.3)
        assert (await legacy.result("tasks/get", {"taskId": task["taskId"]}))["status"] == "cancelled"


async def test_requested_ttl_is_capped_and_reported(legacy: Client) -> None:
    async with asyncio.timeout(30):
        task = await start_task(legacy, "echo", {"text": "ttl"}, ttl=10 * MAX_TTL_MS)
        assert task["ttl"] == MAX_TTL_MS, task
        assert (await legacy.result("tasks/get", {"taskId": task["taskId"]}))["ttl"] == MAX_TTL_MS


async def test_is_error_result_makes_a_legacy_task_failed(legacy: Client) -> None:
    async with asyncio.timeout(30):
        task = await start_task(legacy, "slow_build", {"steps": "not a number"})
        result = (await legacy.request("tasks/result", {"taskId": task["taskId"]})).final["result"]
        assert result["isError"] is True and result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}, result
        assert (await legacy.result("tasks/get", {"taskId": task["taskId"]}))["status"] == "failed"


async def test_unknown_task_is_invalid_params(legacy: Client) -> None:
    async with asyncio.timeout(30):
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            reply = await legacy.request(method, {"taskId": "0" * 32})
            assert reply.status == 200 and error_of(reply.final)["code"] == -32602, (method, reply.messages)


# -- 2026-07-28 -----------------------------------------------------------------------------------


async def test_modern_fast_call_is_a_plain_result(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with asyncio.timeout(30):
        result = await modern(gw, http).result("tools/call", {"name": "echo", "arguments": {"text": "quick"}})
        assert result.get("resultType") == "complete" and "taskId" not in result, result
        assert result["content"] == [{"type": "text", "text": "quick"}], result


async def test_modern_slow_call_becomes_a_task_whose_log_keeps_everything(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        client = modern(gw, http)
        marker = tmp_path / "marker"
        arguments = {"steps": 5, "delay": 0.5, "marker": str(marker)}
        started = time.monotonic()
        reply = await client.request("tools/call", {"name": "slow_build", "arguments": arguments})
        elapsed = time.monotonic() - started
        assert "finished" not in marker_lines(marker), "the call was answered only when the tool had finished"
        created = reply.final["result"]
        assert created["resultType"] == "task" and created["status"] == "working", created
        assert elapsed >= 0.9, f"the call became a task after {elapsed:.2f} s, before after_ms = 1000"
        assert {"taskId", "createdAt", "lastUpdatedAt", "ttlMs"} <= set(created), created
        task_id = created["taskId"]
        got = await client.result("tasks/get", {"taskId": task_id})
        assert got["resultType"] == "complete" and got["status"] == "working", got

        # The log: the created event, the notifications the call produced before the handoff, then
        # the live ones, in the upstream's order, then the status change and the terminal summary.
        stream = await client.request("tasks/stream", {"taskId": task_id})
        events = task_events(stream.messages)
        assert [event["seq"] for event in events] == list(range(len(events))), events
        names = [event["type"].removeprefix(PREFIX + ".") for event in events]
        assert names == ["task.created", "log", *["progress", "log"] * 5, "task.status", "task.terminal"], names
        assert [event["payload"]["progress"] for event in events if event["type"].endswith(".progress")] == [
            1,
            2,
            3,
            4,
            5,
        ]
        logs = [event["payload"]["data"] for event in events if event["type"].endswith(".log")]
        assert logs == ["build started: 5 steps", *[f"finished step {i}" for i in range(1, 6)]], logs
        assert stream.final["result"] == {"resultType": "complete"}, stream.final

        done = await client.result("tasks/get", {"taskId": task_id})
        assert done["status"] == "completed", done
        assert done["result"]["content"] == [{"type": "text", "text": "built 5 steps"}], done
        assert done["result"].get("isError") is False, done


async def test_modern_cancel_is_an_ack_and_stops_the_tool(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        client = modern(gw, http)
        arguments = {"steps": 60, "delay": 0.1, "marker": str(marker)}
        created = (await client.result("tools/call", {"name": "slow_build", "arguments": arguments}))["taskId"]
        ack = await client.result("tasks/cancel", {"taskId": created})
        assert ack == {"resultType": "complete"}, ack
        lines = await wait_for_marker(marker, TERMINAL, 10)
        assert lines[-1:] == ["cancelled"], f"the upstream tool was not stopped: {lines}"
        assert (await client.result("tasks/get", {"taskId": created}))["status"] == "cancelled"


async def test_modern_has_no_tasks_result_and_checks_the_extension_and_name(
    gw: RunningGateway, http: aiohttp.ClientSession, legacy: Client
) -> None:
    async with asyncio.timeout(60):
        client = modern(gw, http)
        task_id = (await start_task(legacy, "echo", {"text": "x"}))["taskId"]
        # A dual-stack gateway lets the caller read a legacy-created task with the 2026 methods.
        assert (await client.result("tasks/get", {"taskId": task_id}))["taskId"] == task_id

        for method in ("tasks/result", "tasks/list"):
            reply = await client.request(method, {"taskId": task_id})
            assert reply.status == 404 and error_of(reply.final)["code"] == -32601, (method, reply.messages)

        mismatch = await client.request("tasks/get", {"taskId": task_id}, headers={"Mcp-Name": "someone-else"})
        assert mismatch.status == 400 and error_of(mismatch.final)["code"] == -32020, mismatch.messages

        # A client that did not declare the extension never gets a task, and no task methods.
        plain = modern(gw, http, tasks=False)
        started = time.monotonic()
        result = await plain.result("tools/call", {"name": "slow_build", "arguments": {"steps": 3, "delay": 0.5}})
        assert result.get("resultType") == "complete" and "taskId" not in result, result
        assert result["content"] == [{"type": "text", "text": "built 3 steps"}], result
        assert time.monotonic() - started >= 1.4
        reply = await plain.request("tasks/get", {"taskId": task_id})
        assert reply.status == 400 and error_of(reply.final)["code"] == -32021, reply.messages
        assert error_of(reply.final)["data"]["requiredCapabilities"]["extensions"] == {TASKS_EXTENSION: {}}
