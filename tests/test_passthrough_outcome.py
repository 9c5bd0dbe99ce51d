"""A task the upstream hosts keeps its outcome in the gateway's record: it outlives the upstream
conversation that held it, and a result over `[retention] max_result_bytes` is kept as an error.

2026-07-28 (tests/servers/modern_tasks_server.py, on stdio and Streamable HTTP): the task is created by
a request whose connection then closes; once it ended, its upstream conversation goes away (the pooled
stdio process is killed, the HTTP server stopped), and a new client still gets `tasks/get` (completed,
the result inlined as a direct run's), the whole `tasks/stream`, and `tail` exits 0. The 2025-11-25
counterpart, with server-everything and a deleted session, is in test_upstream_with_tasks.py.

The cap is checked against both SDK upstreams on stdio (tests/servers/legacy_tasks_server.py and
modern_tasks_server.py): their slow_job result is larger than the configured 40 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.client import GatewayClient
from gateway.client.tail import main as tail_main
from gateway.config import EventsConfig
from gateway.protocol.era import Era
from tests import test_legacy_tasks_server, test_modern_tasks_server
from tests.conftest import serve_http, start_gateway
from tests.test_upstream_crash import descendants, kill_all
from tests.test_upstream_with_tasks import Call, StdioDirect, client_call, normalized
from tests.wire import LEGACY, MODERN, Client, Message, envelope

WAIT = 20.0
JOB = {"name": "slow_job", "arguments": {"steps": 2, "delay": 0.3}}
CAP_CONFIG = "[retention]\nmax_result_bytes = 40\n"


async def run_to_completion(call: Call) -> dict[str, Any]:
    """Start the job as a 2026-07-28 task and poll tasks/get until it completed; the last view."""
    created = (await call("tools/call", JOB))["result"]
    assert created["resultType"] == "task", created
    while True:
        view: dict[str, Any] = (await call("tasks/get", {"taskId": created["taskId"]}))["result"]
        if view["status"] != "working":
            return view
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def direct_stdio(tmp: Path) -> Any:
    """The modern server on raw stdio pipes (2026-07-28 needs no handshake: each request has the envelope)."""
    with (tmp / "direct.log").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *test_modern_tasks_server.SERVER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    direct = StdioDirect(proc)

    async def call(method: str, params: dict[str, Any] | None = None) -> Message:
        return await direct.call(method, {**(params or {}), "_meta": envelope()})

    try:
        yield call
    finally:
        proc.kill()
        await proc.wait()


def without_meta(view: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get result without the response's own `_meta` (the SDK's serverInfo on every answer)."""
    return normalized({key: value for key, value in view.items() if key != "_meta"})


async def whole_stream(url: str, task_id: str, era: str) -> list[dict[str, Any]]:
    async with GatewayClient(url, era=Era.parse(era)) as reader:
        async with asyncio.timeout(WAIT):
            return [event async for event in reader.stream(task_id)]


def kind(event: dict[str, Any]) -> str:
    return str(event["type"]).removeprefix(EventsConfig().prefix + ".")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_modern_task_outlives_its_request_and_upstream_conversation(transport: str, tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio.timeout(90))
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)))
        upstream = contextlib.AsyncExitStack()
        stack.push_async_callback(upstream.aclose)
        if transport == "stdio":
            gateway = await stack.enter_async_context(start_gateway(upstream_cmd=test_modern_tasks_server.SERVER))
            direct = await stack.enter_async_context(direct_stdio(tmp_path))
        else:
            server = serve_http(test_modern_tasks_server.SERVER, log=tmp_path / "upstream.log")
            url = await upstream.enter_async_context(server)
            gateway = await stack.enter_async_context(start_gateway(upstream_url=url))
            direct = client_call(Client(http, url, MODERN))
        expected = await run_to_completion(direct)

        # The creating request's connection closes with its answer (its own aiohttp session ends).
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as creator:
            created = await Client(creator, gateway.url, MODERN).result("tools/call", JOB)
        task_id = created["taskId"]
        events = await whole_stream(gateway.url, task_id, MODERN)  # ends once the record is terminal
        assert kind(events[-1]) == "task.terminal" and events[-1]["payload"]["status"] == "completed"

        # The upstream conversation that held the task goes away.
        if transport == "stdio":
            kill_all(descendants(gateway.proc.pid))
        else:
            await upstream.aclose()

        later = Client(http, gateway.url, MODERN)
        view = await later.result("tasks/get", {"taskId": task_id})
        assert view["taskId"] == task_id and view["status"] == "completed", view
        assert (
            view["result"]
            == expected["result"]
            == {"content": [{"type": "text", "text": "done after 2 steps"}], "isError": False}
        )
        assert without_meta(view) == without_meta(expected)
        assert await whole_stream(gateway.url, task_id, MODERN) == events
        assert [event["seq"] for event in events] == list(range(len(events))) and kind(events[0]) == "task.created"

        # `mcp-task-gateway tail`: follows the whole log, then tasks/get says completed.
        assert await asyncio.to_thread(tail_main, gateway.url, task_id, era="modern") == 0


async def test_a_legacy_result_over_the_cap_is_an_error_and_the_task_still_completes() -> None:
    async with (
        asyncio.timeout(60),
        start_gateway(upstream_cmd=test_legacy_tasks_server.SERVER, config_text=CAP_CONFIG) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
    ):
        client = Client(http, gateway.url, LEGACY)
        await client.initialize()
        created = await client.result("tools/call", {**JOB, "task": {"ttl": 60000}})
        task_id = created["task"]["taskId"]
        await whole_stream(gateway.url, task_id, LEGACY)  # until the record is terminal

        assert (await client.result("tasks/get", {"taskId": task_id}))["status"] == "completed"
        error = (await client.request("tasks/result", {"taskId": task_id})).final["error"]
        assert error["code"] == -32603 and error["data"]["reason"] == "result_too_large", error
        assert error["data"]["limit"] == 40 and error["data"]["size"] > 40
        assert "exceeded the gateway's cap of 40 bytes" in error["message"]


async def test_a_modern_result_over_the_cap_is_an_error_and_the_task_still_completes() -> None:
    async with (
        asyncio.timeout(60),
        start_gateway(upstream_cmd=test_modern_tasks_server.SERVER, config_text=CAP_CONFIG) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
    ):
        client = Client(http, gateway.url, MODERN)
        task_id = (await client.result("tools/call", JOB))["taskId"]
        await whole_stream(gateway.url, task_id, MODERN)

        view = await client.result("tasks/get", {"taskId": task_id})
        assert view["status"] == "completed" and "result" not in view, view
        assert view["error"]["code"] == -32603 and view["error"]["data"]["reason"] == "result_too_large"
        assert "exceeded the gateway's cap of 40 bytes" in view["error"]["message"]
