"""The gateway in front of an upstream with the 2026-07-28 Tasks extension (SEP-2663): it forwards the
extension's tasks and records each one's timeline, served by tasks/stream.

The upstream is tests/servers/modern_tasks_server.py (the `mcp` SDK plus the extension), on stdio and on
Streamable HTTP, with `notifications/tasks` support and without it (`--no-notify`). The gateway learns
each task from the CreateTaskResult it forwards and observes it through the upstream's pushes on a
`subscriptions/listen` where it offers them (HTTP with notifications), else by polling `tasks/get`
(see docs/tasks-stream.md §9): every status or statusMessage change becomes one event, never two.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
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
from tests.test_modern_tasks_server import SERVER
from tests.wire import MODERN, Client, Reply

WAIT = 15.0
STEP_S = 0.6
"""slow_job's step delay: well over the gateway's 250 ms poll floor, so polling sees every step."""


def kind(event: dict[str, Any]) -> str:
    return str(event["type"]).removeprefix(EventsConfig().prefix + ".")


def statuses(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["payload"]["status"], e["payload"].get("statusMessage")) for e in events if kind(e) == "task.status"]


@dataclass
class Upstream:
    variant: str
    """stdio (pooled processes: polling), http (pushes on a listen), http-no-notify (polling)."""
    gateway: RunningGateway

    @property
    def pushes(self) -> bool:
        return self.variant == "http"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["stdio", "http", "http-no-notify"])
async def upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Upstream]:
    variant: str = request.param
    async with contextlib.AsyncExitStack() as stack:
        if variant == "stdio":
            gw = await stack.enter_async_context(start_gateway(upstream_cmd=SERVER))
        else:
            flags = ["--no-notify"] if variant == "http-no-notify" else []
            log = tmp_path_factory.mktemp("modern-upstream") / "server.log"
            url = await stack.enter_async_context(serve_http(SERVER, *flags, log=log))
            gw = await stack.enter_async_context(start_gateway(upstream_url=url))
        yield Upstream(variant, gw)


@pytest.fixture
def gateway(upstream: Upstream) -> RunningGateway:
    return upstream.gateway


@pytest.fixture
def client(http: aiohttp.ClientSession, gateway: RunningGateway) -> Client:
    return Client(http, gateway.url, MODERN)


async def gateway_polls(http: aiohttp.ClientSession, gateway: RunningGateway) -> float:
    """The gateway's own tasks/get polls so far (its /metrics counter)."""
    async with http.get(f"{gateway.base}/metrics") as response:
        text = await response.text()
    match = re.search(r"^mcp_gateway_upstream_task_polls_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def start(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.result("tools/call", {"name": tool, "arguments": arguments})
    assert result["resultType"] == "task", result
    return result


async def get(client: Client, task_id: str) -> dict[str, Any]:
    return await client.result("tasks/get", {"taskId": task_id})


async def wait_status(client: Client, task_id: str, wanted: str) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        while True:
            view = await get(client, task_id)
            if view["status"] == wanted:
                return view
            await asyncio.sleep(0.1)


async def timeline(gateway: RunningGateway, task_id: str) -> list[dict[str, Any]]:
    """The whole retained log, read by a client of its own until the stream's end."""
    async with GatewayClient(gateway.url, era=Era.MODERN) as reader:
        async with asyncio.timeout(WAIT):
            return [event async for event in reader.stream(task_id)]


def check_log(events: list[dict[str, Any]], terminal: str) -> None:
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert kind(events[0]) == "task.created" and kind(events[-1]) == "task.terminal", [kind(e) for e in events]
    assert events[-1]["payload"]["status"] == terminal
    changes = statuses(events)
    assert all(a != b for a, b in itertools.pairwise(changes)), f"a status recorded twice: {changes}"


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_slow_job_timeline_has_each_step_once_and_result_through_tasks_get(
    client: Client, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    gateway = upstream.gateway
    polls_before = await gateway_polls(http, gateway)
    created = await start(client, "slow_job", {"steps": 3, "delay": STEP_S})
    task_id = created["taskId"]
    upstream_tag, _, upstream_id = task_id.partition(".")
    assert upstream_tag and len(upstream_id) == 32, task_id  # namespaced: <channel tag>.<upstream id>
    assert created["status"] == "working" and created["pollIntervalMs"] == 200

    done = await wait_status(client, task_id, "completed")
    assert done["taskId"] == task_id and done["resultType"] == "complete"
    assert done["result"]["content"] == [{"type": "text", "text": "done after 3 steps"}]

    events = await timeline(gateway, task_id)
    check_log(events, "completed")
    every_change = [
        ("working", "The operation is now in progress."),
        ("working", "step 1/3"),
        ("working", "step 2/3"),
        ("working", "step 3/3"),
        ("completed", None),
    ]
    polls = await gateway_polls(http, gateway) - polls_before
    if upstream.pushes:
        # Pushed: every change, the short-lived last step too; one poll after subscribing (and maybe
        # one racing the end) is all the gateway asked.
        assert statuses(events) == every_change
        assert polls <= 2, polls
    else:
        # The tool completes the instant after its last step: a poll sees "step 3/3" only by luck.
        assert statuses(events) in (every_change, every_change[:3] + every_change[4:]), statuses(events)
        assert polls >= 5, polls  # 1.8 s of task at a 250 ms floor (pollIntervalMs is 200)
    assert events[-1]["payload"]["content"] == [{"type": "text", "bytes": len("done after 3 steps")}]


async def test_input_required_round_through_tasks_update(client: Client, gateway: RunningGateway) -> None:
    task_id = (await start(client, "ask_job", {"question": "Who?"}))["taskId"]
    waiting = await wait_status(client, task_id, "input_required")
    assert list(waiting["inputRequests"]) == ["name"]
    assert waiting["inputRequests"]["name"]["params"]["message"] == "Who?"

    await client.result(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {"name": {"action": "accept", "content": {"name": "Ada"}}}},
    )
    done = await wait_status(client, task_id, "completed")
    assert done["result"]["content"] == [{"type": "text", "text": "Hello, Ada!"}]

    events = await timeline(gateway, task_id)
    check_log(events, "completed")
    kinds = [kind(event) for event in events]
    asked = kinds.index("input.requested")
    assert events[asked]["payload"] == {
        "key": "name",
        "method": "elicitation/create",
        "mode": "form",
        "message": "Who?",
        "fields": ["name"],
    }
    assert kinds.count("input.requested") == 1
    changes = statuses(events)
    assert changes.index(("input_required", "Waiting for input.")) < changes.index(("completed", None))
    assert statuses(events[:asked])[-1][0] == "input_required"


async def test_failed_task_records_the_error(client: Client, gateway: RunningGateway) -> None:
    task_id = (await start(client, "fail_job", {}))["taskId"]
    failed = await wait_status(client, task_id, "failed")
    assert failed["error"] == {"code": -32603, "message": "fail_job failed on purpose"}
    events = await timeline(gateway, task_id)
    check_log(events, "failed")
    assert events[-1]["payload"]["error"] == failed["error"]


async def test_cancel_is_forwarded_and_recorded(client: Client, gateway: RunningGateway) -> None:
    task_id = (await start(client, "slow_job", {"steps": 20, "delay": STEP_S}))["taskId"]
    assert await client.result("tasks/cancel", {"taskId": task_id}) == {
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "modern-tasks-server", "version": "0.1.0"}},
    }
    await wait_status(client, task_id, "cancelled")
    events = await timeline(gateway, task_id)
    check_log(events, "cancelled")


async def test_tasks_the_gateway_never_saw_are_unknown(client: Client, gateway: RunningGateway) -> None:
    for task_id in ("not-a-task", "deadbeef.0123456789abcdef0123456789abcdef"):
        for method in ("tasks/get", "tasks/stream"):
            reply: Reply = await client.request(method, {"taskId": task_id})
            error = reply.final["error"]
            assert error["code"] == -32602, (method, task_id, error)


@pytest.mark.parametrize("upstream", ["http"], indirect=True)
async def test_a_client_listen_names_tasks_in_its_own_ids(client: Client, upstream: Upstream) -> None:
    """A client's subscriptions/listen with taskIds reaches the upstream in its ids and comes back in
    the client's; ids the client does not own are left out of the upstream's filter. (Only the HTTP
    upstream with notifications pushes tasks on one shared conversation.)"""
    task_id = (await start(client, "slow_job", {"steps": 2, "delay": STEP_S}))["taskId"]
    filters = {"taskIds": [task_id, "f00d.not-mine"]}
    reply = await client.open("subscriptions/listen", {"notifications": filters})
    try:
        async with asyncio.timeout(WAIT):
            ack = await reply.next()
            assert ack is not None and ack["method"] == "notifications/subscriptions/acknowledged", ack
            assert ack["params"]["notifications"]["taskIds"] == [task_id]
            while (push := await reply.next()) is not None:
                assert push["method"] == "notifications/tasks" and push["params"]["taskId"] == task_id, push
                if push["params"]["status"] == "completed":
                    break
    finally:
        reply.close()
    assert push is not None and push["params"]["result"]["content"][0]["text"] == "done after 2 steps"


async def test_progress_and_logs_before_the_task_handle_are_in_its_log(client: Client, gateway: RunningGateway) -> None:
    """A client that asked for progress and logs on tools/call sees what the upstream sent before the
    CreateTaskResult, and the task's log starts with the same."""
    meta = {"progressToken": "p-early", "io.modelcontextprotocol/logLevel": "info"}
    reply = await client.request(
        "tools/call", {"name": "slow_job", "arguments": {"steps": 1, "delay": 0.1}, "_meta": meta}
    )
    methods = [message.get("method") for message in reply.notifications]
    assert methods == ["notifications/progress", "notifications/message"], reply.messages
    task_id = reply.final["result"]["taskId"]
    events = await timeline(gateway, task_id)
    check_log(events, "completed")
    assert [kind(event) for event in events[1:3]] == ["progress", "log"]
    assert events[1]["payload"] == {"progress": 0, "message": "queued"}
    assert events[2]["payload"]["data"] == "slow_job accepted"


async def test_discover_forwards_the_upstream_extension_declaration(client: Client) -> None:
    """server/discover keeps the upstream's tasks extension; the gateway only adds its eventStreams."""
    result = await client.result("server/discover", {})
    settings = dict(result["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"])
    assert set(settings.pop("eventStreams")) == {
        "maxEventsPerTask",
        "maxEventAgeMs",
        "terminalRetentionMs",
        "maxPayloadBytes",
    }
    assert settings == {}  # the upstream declares the extension with no settings
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "modern-tasks-server"
