"""The era matrix's forwarded cells: a client whose era the upstream speaks is forwarded unchanged.

A 2026-07-28 client in front of the 2026-only test server (`tests/servers/modern_only_server.py`), and
clients of both eras in front of `mcp-server-time` (a both-eras server on mcp 2.3, from PyPI), each
compared with the official SDK client connected straight to the same server in the same era. /readyz
reports the era the gateway learnt (`modern`, `both`). Each cell also follows a gateway-hosted task with
`tasks/stream`; the 2026-only server's cell cancels a call and hears a list change on
`subscriptions/listen` (over HTTP: on stdio each stateless request may reach another pooled process).
mcp-server-time's tools answer at once and never change, so its cells have no cancel or list change.
The bridged cell (a 2025-11-25 client in front of the 2026-only server) is
tests/test_bridge_legacy_client.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, RunningGateway, serve_http, start_gateway
from tests.test_cli_tasks import cli, json_lines
from tests.test_readiness import ready, readyz_until
from tests.wire import wait_for_marker

MODERN_ONLY = [sys.executable, str(ROOT / "tests" / "servers" / "modern_only_server.py")]
TIME_SERVER = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
CONVERT = {"source_timezone": "Europe/Paris", "time": "16:30", "target_timezone": "Asia/Tokyo"}
TASKS = """
[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "always"
"""
"""Every tool may run as a gateway-hosted task: a 2026-07-28 caller that declares the tasks extension
(the CLI's `--task`) gets one at once; the SDK client, which declares none, is answered plainly."""
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def modern_only() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=MODERN_ONLY, config_text=TASKS) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def modern_only_http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    log = tmp_path_factory.mktemp("modern-only") / "server.log"
    async with serve_http(MODERN_ONLY, log=log) as url, start_gateway(upstream_url=url, config_text=TASKS) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def time_server() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=TIME_SERVER, config_text=TASKS) as gateway:
        yield gateway


def through(gateway: RunningGateway, mode: str) -> Client:
    server: Any = gateway.url if mode != "legacy" else streamable_http_client(gateway.url)
    return Client(server, mode=mode, cache=None)  # type: ignore[arg-type]


def straight(command: list[str], mode: str) -> Client:
    return Client(StdioServerParameters(command=command[0], args=command[1:]), mode=mode, cache=None)  # type: ignore[arg-type]


def listed(result: Any) -> list[dict[str, Any]]:
    """The tools as listed, without `execution` (the gateway adds each tool's effective task support)."""
    return [tool.model_dump(exclude={"execution"}) for tool in result.tools]


def answered(result: Any) -> dict[str, Any]:
    """A result as the client sees it, without `_meta` (serverInfo: the server's in both)."""
    dumped: dict[str, Any] = result.model_dump(exclude={"meta"})
    return dumped


async def era_of(gateway: RunningGateway) -> str:
    async with aiohttp.ClientSession() as http:
        body = await readyz_until(http, gateway, ready)
    return str(body["era"])


async def test_readyz_learns_each_upstreams_era(modern_only: RunningGateway, time_server: RunningGateway) -> None:
    assert await era_of(modern_only) == "modern"
    assert await era_of(time_server) == "both"


async def test_a_modern_client_is_forwarded_to_the_modern_only_server(modern_only: RunningGateway) -> None:
    progress: dict[str, list[tuple[float, float | None, str | None]]] = {"gateway": [], "direct": []}

    def recorder(key: str) -> Any:
        async def record(done: float, total: float | None, message: str | None) -> None:
            progress[key].append((done, total, message))

        return record

    async with (
        asyncio.timeout(60),
        through(modern_only, "2026-07-28") as client,
        straight(MODERN_ONLY, "2026-07-28") as direct,
    ):
        assert listed(await client.list_tools()) == listed(await direct.list_tools())
        call = await client.call_tool("count", {"n": 30}, progress_callback=recorder("gateway"))
        reference = await direct.call_tool("count", {"n": 30}, progress_callback=recorder("direct"))
        assert answered(call) == answered(reference)
        assert progress["gateway"] == progress["direct"] == [(float(i), 30.0, f"step {i}") for i in range(1, 31)]
        read, read_direct = await client.read_resource("memo://greeting"), await direct.read_resource("memo://greeting")
        assert answered(read) == answered(read_direct)
        prompt = await client.get_prompt("greet", {"name": "Bo"})
        assert answered(prompt) == answered(await direct.get_prompt("greet", {"name": "Bo"}))


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_both_eras_are_forwarded_to_a_both_eras_server(time_server: RunningGateway, mode: str) -> None:
    async with asyncio.timeout(60), through(time_server, mode) as client, straight(TIME_SERVER, mode) as direct:
        assert listed(await client.list_tools()) == listed(await direct.list_tools())
        call = await client.call_tool("convert_time", CONVERT)
        assert not call.is_error, call
        assert answered(call) == answered(await direct.call_tool("convert_time", CONVERT))


async def hosted_task_events(url: str, tool: str, arguments: str, era: str) -> list[dict[str, Any]]:
    """`call TOOL --task --follow` in `era`, then the task's whole log read back with `tail`."""
    code, out, err = await cli("call", url, tool, "--args", arguments, "--task", "--follow", "--era", era)
    assert code == 0, err
    started = re.search(r"task (\S+) started", err)
    assert started is not None, err
    code, out, err = await cli("tail", url, started.group(1), "--json", "--era", era)
    assert code == 0, err
    events = json_lines(out)
    assert events[0]["type"].endswith("task.created") and events[-1]["payload"]["status"] == "completed", events
    return events


async def test_a_modern_clients_hosted_task_on_the_modern_only_server(modern_only: RunningGateway) -> None:
    events = await hosted_task_events(modern_only.url, "count", '{"n": 5, "delay": 0.05}', "modern")
    progress = [event["payload"]["progress"] for event in events if event["type"].endswith(".progress")]
    assert progress == [1, 2, 3, 4, 5], events


async def test_a_modern_clients_dropped_call_is_cancelled_on_the_modern_only_server(
    modern_only: RunningGateway, tmp_path: Path
) -> None:
    marker = tmp_path / "wait.marker"
    async with asyncio.timeout(60), through(modern_only, "2026-07-28") as client:
        call = asyncio.create_task(client.call_tool("wait", {"seconds": 30, "marker": str(marker)}))
        assert await wait_for_marker(marker, ("started",), 20) == ["started"]
        call.cancel()  # the SDK client closes the POST: the 2026-07-28 cancel
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await wait_for_marker(marker, ("cancelled",), 20) == ["started", "cancelled"]


async def test_a_modern_client_hears_the_modern_only_servers_list_change(modern_only_http: RunningGateway) -> None:
    async with (
        asyncio.timeout(60),
        through(modern_only_http, "2026-07-28") as client,
        client.listen(tools_list_changed=True) as subscription,
    ):
        assert subscription.honored is not None and subscription.honored.tools_list_changed is True
        await client.call_tool("add_tool", {"name": "matrix_added"})
        event = await anext(aiter(subscription))
        assert type(event).__name__ == "ToolsListChanged", event
        assert "matrix_added" in [tool.name for tool in (await client.list_tools()).tools]


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_hosted_task_on_a_both_eras_server(time_server: RunningGateway, era: str) -> None:
    events = await hosted_task_events(time_server.url, "convert_time", json.dumps(CONVERT), era)
    assert events[-1]["payload"]["status"] == "completed"
