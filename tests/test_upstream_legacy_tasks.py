"""The gateway in front of an `mcp`-SDK upstream with 2025-11-25 Tasks (SEP-1686) of its own.

The upstream is tests/servers/legacy_tasks_server.py, on stdio and on Streamable HTTP, pushing
`notifications/tasks/status` and not (`--no-status`: the gateway must poll `tasks/get`). Unlike
server-everything it sends progress for the creating request's token after the CreateTaskResult, and
logs with related-task `_meta`: both must reach the client (under its own token and the client's task
id) and the task's log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.client import GatewayClient
from gateway.config import EventsConfig
from gateway.protocol.era import Era
from tests.conftest import RunningGateway, serve_http, start_gateway
from tests.test_legacy_tasks_server import SERVER, standalone, until_terminal
from tests.wire import LEGACY, RELATED_TASK, Client

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 15.0
STEP_S = 0.6
"""A step outlasts the gateway's 250 ms poll floor (the server's pollInterval is 200 ms)."""


@dataclass
class Upstream:
    variant: str
    gateway: RunningGateway

    @property
    def pushes(self) -> bool:
        return not self.variant.endswith("no-status")


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=["stdio", "http", "stdio-no-status", "http-no-status"]
)
async def upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Upstream]:
    variant: str = request.param
    flags = ["--no-status"] if variant.endswith("no-status") else []
    async with contextlib.AsyncExitStack() as stack:
        if variant.startswith("stdio"):
            gw = await stack.enter_async_context(start_gateway(upstream_cmd=[*SERVER, *flags]))
        else:
            log = tmp_path_factory.mktemp("legacy-upstream") / "server.log"
            url = await stack.enter_async_context(serve_http(SERVER, *flags, log=log))
            gw = await stack.enter_async_context(start_gateway(upstream_url=url))
        yield Upstream(variant, gw)


@pytest_asyncio.fixture(loop_scope="module")
async def client(http: aiohttp.ClientSession, upstream: Upstream) -> AsyncIterator[Client]:
    session = Client(http, upstream.gateway.url, LEGACY)
    await asyncio.wait_for(session.initialize(), WAIT)
    yield session
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await asyncio.wait_for(session.delete(), WAIT)


def kind(event: dict[str, Any]) -> str:
    return str(event["type"]).removeprefix(EventsConfig().prefix + ".")


def statuses(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["payload"]["status"], e["payload"].get("statusMessage")) for e in events if kind(e) == "task.status"]


async def timeline(gateway: RunningGateway, task_id: str) -> list[dict[str, Any]]:
    async with GatewayClient(gateway.url, era=Era.LEGACY) as reader:
        async with asyncio.timeout(WAIT):
            return [event async for event in reader.stream(task_id)]


async def start(client: Client, tool: str, arguments: dict[str, Any], **meta: Any) -> str:
    params: dict[str, Any] = {"name": tool, "arguments": arguments, "task": {"ttl": 60000}}
    if meta:
        params["_meta"] = meta
    result = await client.result("tools/call", params)
    task_id: str = result["task"]["taskId"]
    return task_id


async def wait_terminal(client: Client, task_id: str) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        while True:
            view = await client.result("tasks/get", {"taskId": task_id})
            if view["status"] in ("completed", "failed", "cancelled"):
                return view
            await asyncio.sleep(0.1)


async def test_late_progress_and_related_logs_reach_the_client_and_the_log(client: Client, upstream: Upstream) -> None:
    async with standalone(client) as unsolicited:
        task_id = await start(client, "chatty_job", {"steps": 3, "delay": STEP_S}, progressToken="p-1")
        assert "." in task_id  # namespaced
        if upstream.pushes:
            async with asyncio.timeout(WAIT):
                seen = await until_terminal(unsolicited, task_id)
            # On the client's GET stream: progress under the client's own token, everything in the
            # client's task id (on stdio the token was the gateway's integer upstream).
            progress = [m["params"] for m in seen if m.get("method") == "notifications/progress"]
            assert [(p["progressToken"], p["progress"]) for p in progress] == [("p-1", 1), ("p-1", 2), ("p-1", 3)]
            assert all(p["_meta"][RELATED_TASK] == {"taskId": task_id} for p in progress)
    done = await wait_terminal(client, task_id)
    assert done["status"] == "completed"
    result = await client.result("tasks/result", {"taskId": task_id})
    assert result["content"] == [{"type": "text", "text": "done after 3 steps"}]
    assert result["_meta"][RELATED_TASK] == {"taskId": task_id}

    events = await timeline(upstream.gateway, task_id)
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert kind(events[0]) == "task.created" and kind(events[-1]) == "task.terminal"
    assert [e["payload"]["progress"] for e in events if kind(e) == "progress"] == [1, 2, 3]
    assert [e["payload"]["data"] for e in events if kind(e) == "log"] == [f"chatty step {i}" for i in (1, 2, 3)]
    every_change = [
        ("working", "started"),
        ("working", "step 1/3"),
        ("working", "step 2/3"),
        ("working", "step 3/3"),
        ("completed", None),
    ]
    if upstream.pushes:
        assert statuses(events) == every_change
    else:  # polled: the last step lives an instant before the end, so a poll sees it only by luck
        assert statuses(events) in (every_change, every_change[:3] + every_change[4:]), statuses(events)


async def test_fail_job_and_cancel_end_the_log(client: Client, upstream: Upstream) -> None:
    failed = await start(client, "fail_job", {})
    assert (await wait_terminal(client, failed))["status"] == "failed"
    assert (await client.result("tasks/result", {"taskId": failed}))["isError"] is True
    events = await timeline(upstream.gateway, failed)
    assert statuses(events)[-1] == ("failed", None)
    # The record keeps the upstream's tasks/result answer; the terminal event summarises it.
    summary = {"status": "failed", "isError": True, "content": [{"type": "text", "bytes": 26}]}
    assert kind(events[-1]) == "task.terminal" and events[-1]["payload"] == summary

    cancelled = await start(client, "slow_job", {"steps": 20, "delay": STEP_S})
    view = await client.result("tasks/cancel", {"taskId": cancelled})
    assert view["taskId"] == cancelled and view["status"] == "cancelled"
    events = await timeline(upstream.gateway, cancelled)
    assert statuses(events)[-1] == ("cancelled", "cancelled by the client")
    # Its tasks/result is the upstream's error (in the upstream's own words), kept and summarised.
    error = {"code": -32603, "message": f"Task {cancelled.partition('.')[2]} was cancelled"}
    assert kind(events[-1]) == "task.terminal" and events[-1]["payload"] == {"status": "cancelled", "error": error}
    assert (await client.request("tasks/result", {"taskId": cancelled})).final["error"] == error


async def test_an_end_a_forwarded_answer_told_of_is_in_the_records_before_that_answer_arrives(
    http: aiohttp.ClientSession,
) -> None:
    """The upstream answers tasks/result half a second late, so the outcome the gateway fetches when it
    learns of an end arrives well after the client's own forwarded answer did. The client's next request,
    a tasks/list answered from the gateway's records, must not show the task still working: neither after
    a forwarded tasks/result nor after a forwarded tasks/get that showed the end."""
    slow_results = [*SERVER, "--no-status", "--result-delay", "0.5"]
    async with start_gateway(upstream_cmd=slow_results) as gateway, asyncio.timeout(WAIT):
        client = Client(http, gateway.url, LEGACY)
        await client.initialize()

        async def listed(task_id: str) -> str:
            tasks = (await client.result("tasks/list"))["tasks"]
            status: str = next(task["status"] for task in tasks if task["taskId"] == task_id)
            return status

        after_result = await start(client, "slow_job", {"steps": 1, "delay": 0.05})
        result = await client.result("tasks/result", {"taskId": after_result})
        assert result["content"] == [{"type": "text", "text": "done after 1 steps"}], result
        assert await listed(after_result) == "completed"

        after_get = await start(client, "slow_job", {"steps": 1, "delay": 0.05})
        assert (await wait_terminal(client, after_get))["status"] == "completed"
        assert await listed(after_get) == "completed"
        await client.delete()
