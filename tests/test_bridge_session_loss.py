"""A bridged upstream session that the upstream loses, end to end, for a 2026-07-28 client.

stdio: every upstream process is killed while a call runs: that call gets the link's clear error, and
the next request gets a new session. Streamable HTTP: server-everything restarts on the same port and
forgets its sessions: the next request finds its session gone (HTTP 404, never processed), and the
bridge sends it again on a new session, so the client sees no failure at all.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import READY_TIMEOUT, free_port, start_gateway, stop_process, wait_for_port
from tests.test_upstream_crash import descendants, kill_all
from tests.test_upstream_with_tasks import node_command
from tests.wire import MODERN

pytestmark = pytest.mark.asyncio

WAIT = 60.0
LONG = "trigger-long-running-operation"


async def echo(url: str, text: str) -> str:
    async with asyncio.timeout(WAIT), Client(streamable_http_client(url), mode=MODERN) as client:
        result = await client.call_tool("echo", {"message": text})
    block = result.content[0]
    return str(getattr(block, "text", block))


async def test_a_killed_stdio_session_fails_its_call_and_the_next_request_gets_a_new_one() -> None:
    async with start_gateway(upstream_cmd=[*node_command(), "stdio"]) as gateway:
        assert await echo(gateway.url, "before") == "Echo: before"
        async with asyncio.timeout(WAIT), Client(streamable_http_client(gateway.url), mode=MODERN) as client:
            started = asyncio.Event()

            async def progress(_value: float, _total: float | None, _message: str | None) -> None:
                started.set()

            call = asyncio.create_task(
                client.call_tool(LONG, {"duration": 30, "steps": 30}, progress_callback=progress)
            )
            await started.wait()
            kill_all(descendants(gateway.proc.pid))
            with pytest.raises(MCPError) as failed:
                await call
        assert "upstream process exited" in str(failed.value), failed.value
        assert "node" not in str(failed.value) and "/" not in str(failed.value)
        assert await echo(gateway.url, "after") == "Echo: after"


@asynccontextmanager
async def server_everything(port: int, log: Path) -> AsyncIterator[None]:
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *node_command(),
            "streamableHttp",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PORT": str(port)},
            start_new_session=True,
        )
    try:
        await wait_for_port("127.0.0.1", port, READY_TIMEOUT)
        yield
    finally:
        await stop_process(proc)


async def test_a_restarted_http_upstream_is_met_with_a_new_session(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    log = tmp_path / "upstream.log"
    first: AbstractAsyncContextManager[None] | None = server_everything(port, log)
    await first.__aenter__()
    try:
        async with start_gateway(upstream_url=url) as gateway:
            assert await echo(gateway.url, "first") == "Echo: first"
            await first.__aexit__(None, None, None)
            first = None
            async with server_everything(port, log):  # a new server: it knows none of the old sessions
                assert await echo(gateway.url, "second") == "Echo: second"
    finally:
        if first is not None:
            await first.__aexit__(None, None, None)
