"""Stateless scale-out of a legacy server: two gateway replicas on one Redis, each in front of its own
server-everything over stdio (2025-11-25 only), behind a round-robin balancer that sends every request
to the other replica than the one before. A client pinned to 2026-07-28 needs no sticky session: each
replica bridges its requests onto upstream sessions of its own, and a gateway-hosted task started on
one replica is followed, and read, on the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import RunningGateway, start_gateway
from tests.redis_server import RedisServer, fresh_prefix
from tests.test_cli_tasks import cli, json_lines
from tests.test_readiness import readyz_until
from tests.test_redis_replicas import together
from tests.test_upstream_with_tasks import node_command

pytestmark = pytest.mark.asyncio(loop_scope="module")

LONG = "trigger-long-running-operation"
STEPS = 3
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})
TASKS = """
[[tasks.tools]]
match = "*"
task_support = "optional"
"""


class RoundRobin:
    """A loopback HTTP balancer: request i goes to backend i mod n, its response streamed back as it comes."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.served = [0] * len(backends)
        self._next = itertools.cycle(range(len(backends)))
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        index = next(self._next)
        self.served[index] += 1
        headers = {name: value for name, value in request.headers.items() if name.lower() not in HOP_BY_HOP}
        async with self._client.request(
            request.method, self.backends[index] + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={name: value for name, value in upstream.headers.items() if name.lower() not in HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def close(self) -> None:
        await self._client.close()


@contextlib.asynccontextmanager
async def balancer(backends: list[str]) -> AsyncIterator[tuple[str, RoundRobin]]:
    robin = RoundRobin(backends)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", robin.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/mcp", robin
    finally:
        await runner.cleanup()
        await robin.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        config = f'[store]\nkind = "redis"\nurl = "{server.url}"\nkey_prefix = "{fresh_prefix()}"\n{TASKS}'
        starting = [start_gateway(upstream_cmd=[*node_command(), "stdio"], config_text=config) for _ in "AB"]
        async with together(*starting) as (a, b):
            yield a, b
    finally:
        server.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def balanced(replicas: tuple[RunningGateway, RunningGateway]) -> AsyncIterator[tuple[str, RoundRobin]]:
    async with balancer([gateway.base for gateway in replicas]) as pair:
        yield pair


async def test_each_replica_reports_the_era_it_learnt(replicas: tuple[RunningGateway, RunningGateway]) -> None:
    async with aiohttp.ClientSession() as http:
        for gateway in replicas:
            body = await readyz_until(http, gateway, lambda status, body: status == 200)
            assert body["era"] == "legacy", body
    assert "speaks 2025-11-25 only: 2026-07-28 clients are bridged" in replicas[0].output_text()


async def test_a_2026_client_is_served_by_alternating_replicas(balanced: tuple[str, RoundRobin]) -> None:
    url, robin = balanced
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with asyncio.timeout(60), Client(streamable_http_client(url), mode="2026-07-28", cache=None) as client:
        tools = await client.list_tools()
        assert LONG in {tool.name for tool in tools.tools}
        result = await client.call_tool(LONG, {"duration": 1, "steps": STEPS}, progress_callback=on_progress)
        assert not result.is_error, result
        assert progress == [float(step) for step in range(1, STEPS + 1)]
        resources = await client.list_resources()
        read = await client.read_resource(resources.resources[0].uri)
        assert read.contents
        prompts = await client.list_prompts()
        assert prompts.prompts
    # Five requests, turn by turn: both replicas served this client's calls.
    assert sorted(robin.served) == [2, 3], robin.served


async def test_a_task_started_on_one_replica_is_followed_on_the_other(balanced: tuple[str, RoundRobin]) -> None:
    url, robin = balanced
    args = f'{{"duration": 1, "steps": {STEPS}}}'
    code, out, err = await cli("call", url, LONG, "--args", args, "--task", "--follow", "--era", "modern")
    assert code == 0, err
    assert out.splitlines()[-1].startswith("Long running operation completed"), out
    started = re.search(r"task (\S+) started", err)
    assert started is not None, err
    served = list(robin.served)
    code, out, err = await cli("tail", url, started.group(1), "--json", "--era", "modern")
    assert code == 0, err
    events = json_lines(out)
    progress = [event["payload"]["progress"] for event in events if event["type"].endswith(".progress")]
    assert progress == list(range(1, STEPS + 1)), events
    assert events[-1]["payload"]["status"] == "completed", events[-1]
    # The tail's requests went to both replicas: whichever ran the task, the other one read it too.
    assert all(now > before for now, before in zip(robin.served, served, strict=True)), (served, robin.served)
