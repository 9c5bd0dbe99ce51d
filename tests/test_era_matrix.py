"""The era matrix's forwarded cells: a client whose era the upstream speaks is forwarded unchanged.

A 2026-07-28 client in front of the 2026-only test server (`tests/servers/modern_only_server.py`), and
clients of both eras in front of `mcp-server-time` (a both-eras server on mcp 2.3, from PyPI), each
compared with the official SDK client connected straight to the same server in the same era. /readyz
reports the era the gateway learnt (`modern`, `both`). The bridged cell (a 2025-11-25 client in front
of the 2026-only server) is tests/test_bridge_legacy_client.py.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, RunningGateway, start_gateway
from tests.test_readiness import ready, readyz_until

MODERN_ONLY = [sys.executable, str(ROOT / "tests" / "servers" / "modern_only_server.py")]
TIME_SERVER = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
CONVERT = {"source_timezone": "Europe/Paris", "time": "16:30", "target_timezone": "Asia/Tokyo"}
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def modern_only() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=MODERN_ONLY) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def time_server() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=TIME_SERVER) as gateway:
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
