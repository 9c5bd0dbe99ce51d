"""An HTTP upstream that forgets a session (it restarted): the client is told to initialize again.

The upstream answers 404 for the session it no longer knows; the gateway relays that request's
error and then ends its own session, so the client's next request gets the spec's 404 and the
client starts a new session, which works against the restarted upstream.
"""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp

from tests.conftest import EXAMPLE_SERVER, free_port, start_gateway, wait_for_port
from tests.wire import Client


def start_upstream(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EXAMPLE_SERVER, "--http", "--host", "127.0.0.1", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)


async def test_a_lost_upstream_session_ends_the_client_session() -> None:
    port = free_port()
    upstream = start_upstream(port)
    try:
        await wait_for_port("127.0.0.1", port, 20)
        async with (
            asyncio.timeout(90),
            start_gateway(upstream_url=f"http://127.0.0.1:{port}/mcp") as gateway,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            client = Client(http, gateway.url)
            await client.initialize()
            echo = {"name": "echo", "arguments": {"text": "before"}}
            assert (await client.result("tools/call", echo))["content"][0]["text"] == "before"

            stop(upstream)  # the upstream restarts and forgets every session
            upstream = start_upstream(port)
            await wait_for_port("127.0.0.1", port, 20)

            first = await client.request("tools/call", echo)
            assert "error" in first.final, first.messages  # the upstream's "session not found", relayed
            second = await client.request("tools/call", echo)
            assert second.status == 404, second.messages  # now the gateway's session is gone too

            fresh = Client(http, gateway.url)
            await fresh.initialize()
            again = {"name": "echo", "arguments": {"text": "after"}}
            assert (await fresh.result("tools/call", again))["content"][0]["text"] == "after"
    finally:
        stop(upstream)
