"""Several upstreams behind one gateway (`[[upstreams]]`): each on its own path and all of them as one
server at `/mcp`, with tasks, streams, auth and readiness per upstream.

Three real servers at once: the example build server (stdio), `@modelcontextprotocol/server-everything`
(Streamable HTTP) and `mcp-server-time` (stdio, from PyPI). The tests that change state (auth keys, an
upstream that dies) run gateways of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, free_port, start_gateway
from tests.test_cli_tasks import cli, json_lines
from tests.test_upstream_with_tasks import http_upstream
from tests.wire import MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 60.0
TIME_SERVER = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
LONG = "trigger-long-running-operation"
RESEARCH = "simulate-research-query"


def toml_list(command: list[str]) -> str:
    return json.dumps(command)


def three_upstreams(everything_url: str) -> str:
    return f"""
[[upstreams]]
name = "build"
command = {toml_list(EXAMPLE_SERVER)}

[[upstreams]]
name = "everything"
url = "{everything_url}"

[[upstreams]]
name = "time"
command = {toml_list(TIME_SERVER)}

[[tasks.tools]]
upstream = "build"
match = "slow_build"
task_support = "optional"
"""


class Three:
    def __init__(self, gateway: RunningGateway) -> None:
        self.gateway = gateway
        self.aggregate = gateway.url
        self.path = {name: f"{gateway.base}/servers/{name}/mcp" for name in ("build", "everything", "time")}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def three(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Three]:
    async with (
        http_upstream(tmp_path_factory.mktemp("everything")) as (url, _),
        start_gateway(config_text=three_upstreams(url)) as gateway,
    ):
        await until_ready(gateway, {"build", "everything", "time"})
        yield Three(gateway)


async def readyz(gateway: RunningGateway) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.base}/readyz") as response:
        return response.status, await response.json()


async def until_ready(gateway: RunningGateway, names: set[str], *, ready: bool = True) -> dict[str, Any]:
    """/readyz once each upstream in `names` is (or, `ready` False, is not) ready (bounded)."""
    wanted = "ready" if ready else "unready"
    async with asyncio.timeout(WAIT):
        while True:
            _, body = await readyz(gateway)
            upstreams = body.get("upstreams", {})
            if all(upstreams.get(name, {}).get("status") == wanted for name in names):
                return body
            await asyncio.sleep(0.1)  # /readyz has no change feed to wait on


async def all_tools(client: Client) -> list[dict[str, Any]]:
    """Every page of tools/list."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += [tool.model_dump(by_alias=True, exclude_none=True) for tool in page.tools]
        cursor = page.next_cursor
        if not cursor:
            return tools


@contextlib.asynccontextmanager
async def legacy(url: str, **kw: Any) -> AsyncIterator[Client]:
    async with Client(streamable_http_client(url), mode="legacy", **kw) as client:
        yield client


@contextlib.asynccontextmanager
async def modern(url: str, **kw: Any) -> AsyncIterator[Client]:
    async with Client(streamable_http_client(url), **kw) as client:
        yield client


ERAS = pytest.mark.parametrize("connect", [legacy, modern], ids=["2025-11-25", "2026-07-28"])


# -- the aggregate ----------------------------------------------------------------------------------


@ERAS
async def test_the_aggregate_lists_every_upstreams_tools_prefixed(three: Three, connect: Any) -> None:
    async with asyncio.timeout(WAIT):
        expected: set[str] = set()
        for name, url in three.path.items():
            async with connect(url) as own:
                expected |= {f"{name}__{tool['name']}" for tool in await all_tools(own)}
        async with connect(three.aggregate) as client:
            listed = [tool["name"] for tool in await all_tools(client)]
    assert len(listed) == len(set(listed)) and set(listed) == expected, sorted(set(listed) ^ expected)
    assert {"build__slow_build", f"everything__{LONG}", "time__get_current_time"} <= set(listed)


@ERAS
async def test_a_call_to_each_upstreams_tool_is_routed_with_its_progress(three: Three, connect: Any) -> None:
    progress: dict[str, list[float]] = {"build": [], "everything": []}

    def recorder(name: str) -> Any:
        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress[name].append(value)

        return on_progress

    async with asyncio.timeout(WAIT), connect(three.aggregate) as client:
        built = await client.call_tool(
            "build__slow_build", {"steps": 3, "delay": 0.01}, progress_callback=recorder("build")
        )
        long = await client.call_tool(
            f"everything__{LONG}", {"duration": 1, "steps": 2}, progress_callback=recorder("everything")
        )
        now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
    assert built.content[0].text == "built 3 steps"  # type: ignore[union-attr]
    assert "Long running operation completed" in long.content[0].text  # type: ignore[union-attr]
    assert json.loads(now.content[0].text)["timezone"] == "UTC"  # type: ignore[union-attr]
    assert progress == {"build": [1, 2, 3], "everything": [1, 2]}, progress


PAGED = [sys.executable, str(ROOT / "tests" / "servers" / "paged_server.py")]


async def test_lists_paginate_across_upstreams_that_page(tmp_path: Path) -> None:
    """Two upstreams that page their tools (25 in pages of 10, 7 in pages of 3) beside one that does
    not: each aggregate page holds the next page of every upstream whose list goes on (in configured
    order), the cursor carries each one's own cursor, and the whole list is every tool once, prefixed."""
    config = f"""
[[upstreams]]
name = "many"
command = {toml_list(PAGED)}

[[upstreams]]
name = "build"
command = {toml_list(EXAMPLE_SERVER)}

[[upstreams]]
name = "few"
command = {toml_list([*PAGED, "--tools", "7", "--page-size", "3"])}
"""
    async with start_gateway(config_text=config) as gateway, asyncio.timeout(WAIT), legacy(gateway.url) as client:
        pages: list[list[str]] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            pages.append([tool.name for tool in page.tools])
            if not (cursor := page.next_cursor):
                break
        async with legacy(f"{gateway.base}/servers/build/mcp") as build:
            build_tools = [f"build__{tool['name']}" for tool in await all_tools(build)]
        called = await client.call_tool("few__tool-006", {"text": "last"})
    assert pages[0] == [f"many__tool-{i:03d}" for i in range(10)] + build_tools + [
        "few__tool-000",
        "few__tool-001",
        "few__tool-002",
    ]
    assert pages[1] == [f"many__tool-{i:03d}" for i in range(10, 20)] + [f"few__tool-{i:03d}" for i in range(3, 6)]
    assert pages[2] == [f"many__tool-{i:03d}" for i in range(20, 25)] + ["few__tool-006"]
    assert len(pages) == 3
    assert called.content[0].text == "tool-006: last"  # type: ignore[union-attr]


async def test_a_tool_no_upstream_owns_is_an_invalid_params_error(three: Three) -> None:
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
        client = WireClient(http, three.aggregate)
        await client.initialize()
        final = (await client.request("tools/call", {"name": "nobody__echo", "arguments": {}})).final
        await client.delete()
    assert final["error"]["code"] == -32602 and "nobody__echo" in final["error"]["message"], final


async def test_hosted_and_passthrough_tasks_are_streamed_and_listed_from_the_aggregate(three: Three) -> None:
    """A gateway-hosted task on the example server and server-everything's own task, both made and
    followed through the aggregate; tasks/list there shows both."""
    code, out, err = await cli(
        "call", three.aggregate, "build__slow_build", "--args", '{"steps": 2, "delay": 0.01}', "--task", "--follow"
    )
    assert code == 0 and out.splitlines()[-1] == "built 2 steps", (out, err)
    hosted = err.split("task ", 1)[1].split()[0]
    code, out, err = await cli(
        "call", three.aggregate, f"everything__{RESEARCH}", "--args", '{"topic": "kelp"}', "--task", "--follow"
    )
    assert code == 0, (out, err)
    passthrough = err.split("task ", 1)[1].split()[0]
    for task_id, tool, progress in (
        (hosted, "build__slow_build", True),
        (passthrough, f"everything__{RESEARCH}", False),
    ):
        code, out, err = await cli("tail", three.aggregate, task_id, "--json")
        assert code == 0, err
        events = json_lines(out)
        assert events[0]["type"].endswith(".task.created") and events[0]["payload"]["tool"] == tool, events[0]
        assert events[-1]["type"].endswith(".task.terminal"), events[-1]
        assert events[-1]["payload"]["status"] == "completed", events[-1]
        assert [event["seq"] for event in events] == list(range(len(events)))
        if progress:
            assert [e["payload"]["progress"] for e in events if e["type"].endswith(".progress")] == [1, 2]
        # Each event says which upstream it came from: the task's creation, and what capture recorded.
        upstream = tool.split("__", 1)[0]
        assert events[0]["payload"]["upstream"] == upstream, events[0]
        captured = [e for e in events if e["type"].endswith((".progress", ".log"))]
        assert all(e["payload"]["upstream"] == upstream for e in captured), captured
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
        client = WireClient(http, three.aggregate)  # tasks/list is a 2025-11-25 method
        await client.initialize()
        listed = [task["taskId"] for task in (await client.result("tasks/list"))["tasks"]]
        await client.delete()
    assert {hosted, passthrough} <= set(listed), listed


# -- each upstream's own path -----------------------------------------------------------------------


@ERAS
async def test_each_path_serves_its_upstream_unrenamed_and_its_tasks_alone(three: Three, connect: Any) -> None:
    """/servers/NAME/mcp lists NAME's tools as they are, and answers calls as the aggregate does; a task
    made there is unknown on the aggregate (and the other way round)."""
    async with asyncio.timeout(WAIT), connect(three.path["time"]) as own, connect(three.aggregate) as aggregate:
        names = {tool["name"] for tool in await all_tools(own)}
        assert names == {"get_current_time", "convert_time"}, names
        arguments = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
        direct = await own.call_tool("convert_time", arguments)
        routed = await aggregate.call_tool("time__convert_time", arguments)
    assert json.loads(direct.content[0].text)["target"] == json.loads(routed.content[0].text)["target"]  # type: ignore[union-attr]

    code, _, err = await cli(
        "call", three.path["build"], "slow_build", "--args", '{"steps": 1, "delay": 0.01}', "--task", "--follow"
    )
    assert code == 0, err
    task_id = err.split("task ", 1)[1].split()[0]
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
        for url, known in ((three.path["build"], True), (three.aggregate, False), (three.path["time"], False)):
            client = WireClient(http, url)
            await client.initialize()
            final = (await client.request("tasks/get", {"taskId": task_id})).final
            await client.delete()
            assert ("result" in final) is known, (url, final)
            if not known:
                assert final["error"]["code"] == -32602, final


async def test_readyz_reports_each_upstream(three: Three) -> None:
    status, body = await readyz(three.gateway)
    assert status == 200 and body["status"] == "ready" and body["ready_when"] == "any", body
    assert set(body["upstreams"]) == {"build", "everything", "time"}, body
    assert all(each["status"] == "ready" for each in body["upstreams"].values()), body
    assert "command" not in json.dumps(body) and "127.0.0.1" not in json.dumps(body), body


# -- auth per upstream ------------------------------------------------------------------------------

KEYS = {"ops": "ops-key-0123456789", "dev": "dev-key-0123456789"}


def auth_config(everything_url: str) -> str:
    return (
        three_upstreams(everything_url)
        + f"""
[auth]
mode = "api_key"

[[auth.api_keys]]
name = "ops"
sha256 = "{hashed(KEYS["ops"])}"
scopes = ["time"]

[[auth.api_keys]]
name = "dev"
sha256 = "{hashed(KEYS["dev"])}"
scopes = []

[[auth.rules]]
upstream = "time"
match = "*"
scopes = ["time"]
"""
    )


def hashed(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def test_a_rule_scoped_to_one_upstream_hides_its_tools_from_one_key_only(tmp_path: Path) -> None:
    async with (
        http_upstream(tmp_path) as (url, _),
        start_gateway(config_text=auth_config(url)) as gateway,
        asyncio.timeout(WAIT),
    ):
        await until_ready(gateway, {"build", "everything", "time"})
        time_path = f"{gateway.base}/servers/time/mcp"
        seen: dict[tuple[str, str], set[str]] = {}
        for key_name, key in KEYS.items():
            headers = {"Authorization": f"Bearer {key}"}
            for where, url_ in (("aggregate", gateway.url), ("path", time_path)):
                transport = streamable_http_client(url_, http_client=create_mcp_http_client(headers=headers))
                async with Client(transport, mode="legacy") as client:
                    seen[(key_name, where)] = {tool["name"] for tool in await all_tools(client)}
    assert {"time__get_current_time", "time__convert_time"} <= seen[("ops", "aggregate")]
    assert not any(name.startswith("time__") for name in seen[("dev", "aggregate")]), seen[("dev", "aggregate")]
    assert "build__slow_build" in seen[("dev", "aggregate")]
    assert seen[("ops", "path")] == {"get_current_time", "convert_time"} and seen[("dev", "path")] == set()


# -- an upstream that dies and comes back ---------------------------------------------------------


async def test_an_upstream_that_dies_leaves_the_aggregate_and_comes_back(tmp_path: Path) -> None:
    """server-everything (HTTP, on a port of its own) starts after the gateway, is killed mid-run and
    started again on the same port. While it is down its tools are out of the aggregate (a list_changed
    each time they leave or return), a call to one gets an error naming it, its own path answers 503,
    /readyz says which upstream is down, and the build server keeps answering."""
    port = free_port()
    config = f"""
[[upstreams]]
name = "build"
command = {toml_list(EXAMPLE_SERVER)}

[[upstreams]]
name = "everything"
url = "http://127.0.0.1:{port}/mcp"
readiness = {{ retry_initial_s = 0.2, retry_max_s = 0.5, recheck_interval_s = 0.5 }}
"""
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async def tool_names() -> set[str]:
        return {tool["name"] for tool in await all_tools(client)}

    async with (
        start_gateway(config_text=config) as gateway,
        asyncio.timeout(WAIT),
        legacy(gateway.url, message_handler=on_message) as client,
    ):
        await until_ready(gateway, {"build"})
        assert not any(name.startswith("everything__") for name in await tool_names())
        for run in (1, 2):
            async with http_upstream(tmp_path, port):
                await until_ready(gateway, {"everything"})
                await changed.wait()
                changed.clear()
                assert f"everything__{LONG}" in await tool_names(), run
            body = await until_ready(gateway, {"everything"}, ready=False)
            assert body["upstreams"]["build"]["status"] == "ready" and body["status"] == "ready", body
            assert (await readyz(gateway))[0] == 200  # ready_when = "any"
            await changed.wait()
            changed.clear()
            names = await tool_names()
            assert "build__echo" in names and not any(name.startswith("everything__") for name in names), names
            echoed = await client.call_tool("build__echo", {"text": "still here"})
            assert echoed.content[0].text == "still here"  # type: ignore[union-attr]
            await check_refusals(gateway)


async def check_refusals(gateway: RunningGateway) -> None:
    """While server-everything is down: a call to one of its tools through the aggregate is -32602
    naming it (never its address), and its own path answers 503 naming it."""
    async with aiohttp.ClientSession() as http:
        client = WireClient(http, gateway.url)
        await client.initialize()
        final = (await client.request("tools/call", {"name": "everything__echo", "arguments": {"message": "x"}})).final
        await client.delete()
        assert final["error"]["code"] == -32602, final
        assert "everything" in final["error"]["message"] and "127.0.0.1" not in final["error"]["message"], final
        own = WireClient(http, f"{gateway.base}/servers/everything/mcp", MODERN)
        reply = await own.request("tools/list")
        assert reply.status == 503, (reply.status, reply.messages)
        assert "everything" in json.dumps(reply.messages) and "127.0.0.1" not in json.dumps(reply.messages)
