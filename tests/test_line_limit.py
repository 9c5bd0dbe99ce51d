"""A stdio upstream's line over `line_limit_bytes` fails only the request it answers; the process and the
other requests in flight on it go on.

The upstream is `tests/servers/unruly_server.py` behind a gateway with the smallest limit allowed (64 KiB).
One legacy session (one process) holds `hold("a")` in flight while `oversized` answers with a line over
the limit; `oversized_log` sends a notification over it, which nothing can be blamed for.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.protocol import jsonrpc
from gateway.upstream.stdio import RESPONSE_TOO_LARGE
from tests.conftest import ROOT, start_gateway
from tests.wire import LEGACY, Client, wait_for_marker

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "unruly_server.py")]
LIMIT = 65536
CONFIG = f"""
[upstream.stdio]
line_limit_bytes = {LIMIT}
"""
TEST_TIMEOUT = 30.0


def counted(metrics: str, outcome: str) -> float:
    pattern = rf'^mcp_gateway_upstream_oversized_lines_total\{{outcome="{outcome}"\}} (\S+)$'
    match = re.search(pattern, metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def text_of(client: Client, tool: str, **arguments: object) -> str:
    result = await client.result("tools/call", {"name": tool, "arguments": arguments})
    text: str = result["content"][0]["text"]
    return text


@pytest.mark.asyncio
async def test_an_oversized_response_fails_only_its_request(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    async with (
        start_gateway(upstream_cmd=SERVER, config_text=CONFIG) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_TIMEOUT)) as http,
        asyncio.timeout(TEST_TIMEOUT),
    ):
        client = Client(http, gw.url, LEGACY)
        await client.initialize()
        pid = await text_of(client, "pid")
        held = asyncio.create_task(text_of(client, "hold", key="a", marker=str(marker)))
        assert await wait_for_marker(marker, ("holding a",), timeout=10) == ["holding a"]

        reply = await client.request("tools/call", {"name": "oversized", "arguments": {"size": 2 * LIMIT}})
        error = reply.final.get("error")
        assert isinstance(error, dict) and error["code"] == jsonrpc.INTERNAL_ERROR, reply.final
        assert error["message"].startswith("Response too large: the upstream's response ("), error
        assert f"exceeds {LIMIT} bytes (upstream.stdio.line_limit_bytes)" in error["message"], error
        assert error["data"]["reason"] == RESPONSE_TOO_LARGE and error["data"]["size"] > 2 * LIMIT, error
        assert not held.done()

        # The request in flight beside it is answered, by the same process.
        assert await text_of(client, "release", key="a") == "releasing a"
        assert await held == "released a"
        # A notification over the limit has no request to fail: it is dropped, the call completes.
        assert await text_of(client, "oversized_log", size=2 * LIMIT) == "logged"
        assert await text_of(client, "pid") == pid
        async with http.get(f"{gw.base}/metrics") as response:
            metrics = await response.text()
        assert await client.delete() == 200
    assert counted(metrics, "request_failed") == 1 and counted(metrics, "dropped") == 1, metrics
    output = gw.output_text()
    assert output.count("upstream wrote a line longer than line_limit_bytes; skipped it") == 2, output
    assert "Traceback" not in output and "upstream process exited" not in output, output
