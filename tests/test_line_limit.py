"""A stdio upstream's line over `line_limit_bytes` fails only the request it answers; the process and the
other requests in flight on it go on. A line under the limit but far over the stdout reader's read-ahead
(`READ_AHEAD_BYTES`) is assembled from pieces and arrives intact.

The upstream is `tests/servers/unruly_server.py` behind a gateway with the smallest limit allowed (64 KiB).
One legacy session (one process) holds `hold("a")` in flight while `oversized` answers with a line over
the limit; `oversized_log` sends a notification over it, which nothing can be blamed for. With the limit
raised to 8 MiB, `large` answers with a 3 MB text in which every piece is distinct. `next_line` itself is
checked against a StreamReader fed in arbitrary chunks.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol import jsonrpc, oversized
from gateway.upstream.stdio import READ_AHEAD_BYTES, RESPONSE_TOO_LARGE, OversizedLine, next_line
from tests.conftest import ROOT, start_gateway
from tests.servers.unruly_server import patterned
from tests.wire import LEGACY, Client, wait_for_marker

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "unruly_server.py")]
LIMIT = 65536
CONFIG = f"""
[upstream.stdio]
line_limit_bytes = {LIMIT}
"""
TEST_TIMEOUT = 30.0
LARGE_LIMIT = 8 * 1024 * 1024
LARGE = 3_000_000


def counted(metrics: str, outcome: str) -> float:
    pattern = rf'^mcp_gateway_upstream_oversized_lines_total\{{outcome="{outcome}",upstream="default"\}} (\S+)$'
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


@pytest.mark.asyncio
async def test_a_line_many_times_the_read_ahead_arrives_intact() -> None:
    assert LARGE > 10 * READ_AHEAD_BYTES
    config = f"[upstream.stdio]\nline_limit_bytes = {LARGE_LIMIT}\n"
    async with (
        start_gateway(upstream_cmd=SERVER, config_text=config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_TIMEOUT)) as http,
        asyncio.timeout(TEST_TIMEOUT),
    ):
        client = Client(http, gw.url, LEGACY)
        await client.initialize()
        pid = await text_of(client, "pid")
        text = await text_of(client, "large", size=LARGE)
        assert len(text) == LARGE and text == patterned(LARGE)
        # Read ahead of it and after it, the process's next lines are whole too.
        assert await text_of(client, "echo", text="after") == "after"
        assert await text_of(client, "pid") == pid
        assert await client.delete() == 200
    output = gw.output_text()
    assert "Traceback" not in output and "line_limit_bytes" not in output, output


READER_LIMIT = 64
"""A StreamReader limit far below the lines below, so most of them are assembled from pieces."""
LINE_LIMIT = oversized.HEAD_BYTES + 1000


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.integers(0, LINE_LIMIT + 2 * oversized.HEAD_BYTES), max_size=6),
    newline_at_end=st.booleans(),
    chunk=st.integers(1, 3 * READER_LIMIT),
)
def test_next_line_assembles_lines_from_pieces_and_skips_only_those_over_the_limit(
    lines: list[int], newline_at_end: bool, chunk: int
) -> None:
    texts = [patterned(size).encode() for size in lines]
    data = b"\n".join(texts) + (b"\n" if newline_at_end and texts else b"")

    async def read_all() -> list[bytes | OversizedLine]:
        reader = asyncio.StreamReader(limit=READER_LIMIT)

        async def feed() -> None:
            for start in range(0, len(data), chunk):
                reader.feed_data(data[start : start + chunk])
                await asyncio.sleep(0)
            reader.feed_eof()

        feeder = asyncio.create_task(feed())
        read = [line async for line in _lines(reader)]
        await feeder
        return read

    expected: list[bytes | OversizedLine] = []
    for i, text in enumerate(texts):
        if len(text) > LINE_LIMIT:
            expected.append(OversizedLine(text[: oversized.HEAD_BYTES], text[-oversized.TAIL_BYTES :], len(text)))
        elif i < len(texts) - 1 or newline_at_end:
            expected.append(text + b"\n")
        elif text:  # a last line without a newline counts; an empty one is the end
            expected.append(text)
    assert asyncio.run(read_all()) == expected


async def _lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes | OversizedLine]:
    while (line := await next_line(reader, LINE_LIMIT)) is not None:
        yield line
