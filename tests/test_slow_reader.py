"""A client that stops reading while a tool floods it costs the gateway a bounded number of bytes.

A real gateway on loopback in front of `tests/servers/flood_server.py` on stdio: one client opens a
tools/call whose tool sends 200 progress messages of 1-3 MB each, over a raw socket with a small
receive buffer, and never reads. The gateway's peak RSS (/proc) stays within the bound docs/gateway.md
("Buffered bytes") gives for the configuration, the client is cut after `write_timeout_s`, another
client's call completes meanwhile, and per era: a 2025-11-25 call runs on (its remaining messages
dropped and counted, but for the newest ones its stream keeps for a resume), a 2026-07-28 call is
cancelled upstream. Over `buffered_bytes_budget`, new work gets 503 with Retry-After until the stuck
stream is cut and its bytes are freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import ResumeConfig
from gateway.upstream.stdio import READ_AHEAD_BYTES
from tests.conftest import ROOT, RunningGateway, start_gateway
from tests.wire import LEGACY, MODERN, Client, wait_for_marker

FLOOD_SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "flood_server.py")]
MiB = 1024 * 1024
STREAM_BUFFER_BYTES = 4 * MiB
LINE_LIMIT_BYTES = 4 * MiB
WRITE_TIMEOUT_S = 3.0
RETRY_AFTER_S = 2
FLOOD = {"count": 200, "min_bytes": 1_000_000, "max_bytes": 3_000_000, "delay": 0.01}

RESUME_MAX_AGE_S = 5.0
"""How long a cut 2025-11-25 stream keeps its newest events for a resume (gateway.replay) before they
are dropped too: the test waits for the buffered bytes to return to 0."""

CONFIG = f"""
[server]
stream_buffer_bytes = {STREAM_BUFFER_BYTES}
write_timeout_s = {WRITE_TIMEOUT_S}
retry_after_s = {RETRY_AFTER_S}
{{budget}}

[server.resume]
max_age_s = {RESUME_MAX_AGE_S}

[upstream.stdio]
line_limit_bytes = {LINE_LIMIT_BYTES}
"""

PIPE_READ_BYTES = 256 * 1024
"""What asyncio reads from a pipe at once (`_UnixReadPipeTransport.max_size`)."""

PIPE_READ_AHEAD_BYTES = 2 * READ_AHEAD_BYTES + PIPE_READ_BYTES

WORST_CASE_BYTES = 3 * max(STREAM_BUFFER_BYTES, LINE_LIMIT_BYTES) + 2 * LINE_LIMIT_BYTES + PIPE_READ_AHEAD_BYTES
"""docs/gateway.md "Buffered bytes": one stream, 3 * max(B, M) + 2 * M with M (the largest message) at
most line_limit_bytes, plus its stdio process's pipe reader, twice its read-ahead limit plus one read."""

KEPT_FOR_RESUME_BYTES = max(ResumeConfig().buffer_bytes, LINE_LIMIT_BYTES)
"""docs/gateway.md "Buffered bytes": a 2025-11-25 SSE stream also keeps max(R, M) for a resume."""

MARGIN = 2
"""Python's allocator and the interpreter's own churn: the measured peak may be up to twice the bound."""

WAIT_S = 60.0


def rss_bytes(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def metric(http: aiohttp.ClientSession, gateway: RunningGateway, name: str) -> float:
    async with http.get(f"{gateway.base}/metrics") as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def until_metric(
    http: aiohttp.ClientSession, gateway: RunningGateway, name: str, done: Callable[[float], bool]
) -> None:
    """Poll /metrics until `done(value of name)`; fails the test after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not done(value := await metric(http, gateway, name)):
        if time.monotonic() > deadline:
            pytest.fail(f"{name} stayed at {value}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def stalled_post(
    gateway: RunningGateway, client: Client, message: dict[str, Any]
) -> AsyncIterator[socket.socket]:
    """POST `message` over a raw socket with a small receive buffer, and read nothing until the block
    exits; yields the socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    port = int(gateway.base.rsplit(":", 1)[1])
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        body = orjson.dumps(message)
        headers = {**client.headers(message), "Host": f"127.0.0.1:{port}", "Content-Length": str(len(body))}
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        await loop.sock_sendall(sock, f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + body)
        yield sock
    finally:
        sock.close()


async def read_until_closed(sock: socket.socket) -> None:
    """Drain the socket until the server has closed it (EOF or reset); fails the test on a hang."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(WAIT_S):
        with contextlib.suppress(ConnectionResetError):
            while await loop.sock_recv(sock, 1 << 20):
                pass


def flood_call(client: Client, marker: Path) -> dict[str, Any]:
    params = {"name": "flood", "arguments": {**FLOOD, "marker": str(marker)}, "_meta": {"progressToken": "flood"}}
    return client.message("tools/call", params)


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_client_that_stops_reading_is_cut_and_costs_bounded_memory(era: str, tmp_path: Path) -> None:
    marker = tmp_path / "flood.marker"
    async with (
        start_gateway(upstream_cmd=FLOOD_SERVER, config_text=CONFIG.format(budget="")) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as http,
    ):
        slow = Client(http, gateway.url, era, tasks=False)
        other = Client(http, gateway.url, era, tasks=False)
        if era == LEGACY:
            await slow.initialize()
            await other.initialize()
        # Warm: the gateway's code paths and the upstream processes are up before the baseline.
        assert (await other.result("tools/call", {"name": "echo", "arguments": {"text": "warm"}}))["content"]
        pid = gateway.proc.pid
        baseline = rss_bytes(pid, "VmRSS")

        async with stalled_post(gateway, slow, flood_call(slow, marker)) as sock:
            await wait_for_marker(marker, ("started",), WAIT_S)
            await until_metric(http, gateway, "mcp_gateway_buffered_bytes", lambda held: held > 0)
            # Another client is served while the stuck one holds its stream.
            echoed = await other.result("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
            assert echoed["content"][0]["text"] == "still here"
            await until_metric(http, gateway, "mcp_gateway_slow_clients_total", lambda cut: cut == 1)
            await read_until_closed(sock)

        outcome = "finished" if era == LEGACY else "cancelled"
        assert (await wait_for_marker(marker, ("finished", "cancelled"), WAIT_S))[-1] == outcome
        if era == LEGACY:
            # The call ran on; what it sent after the cut was discarded, and counted, but for the
            # newest events its stream kept for a resume until it was forgotten (RESUME_MAX_AGE_S).
            assert await metric(http, gateway, "mcp_gateway_messages_dropped_total") > 0
        await until_metric(http, gateway, "mcp_gateway_buffered_bytes", lambda held: held == 0)

        bound = WORST_CASE_BYTES + (KEPT_FOR_RESUME_BYTES if era == LEGACY else 0)
        growth = rss_bytes(pid, "VmHWM") - baseline
        print(f"{era}: peak RSS growth {growth / MiB:.1f} MiB, bound {bound / MiB:.0f} MiB")
        assert growth <= MARGIN * bound, (growth, bound)


async def test_over_the_budget_new_work_gets_503_until_the_stuck_stream_is_cut(tmp_path: Path) -> None:
    marker = tmp_path / "flood.marker"
    config = CONFIG.format(budget=f"buffered_bytes_budget = {MiB}")
    async with (
        start_gateway(upstream_cmd=FLOOD_SERVER, config_text=config) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as http,
    ):
        slow = Client(http, gateway.url, MODERN, tasks=False)
        other = Client(http, gateway.url, MODERN, tasks=False)
        echo = {"name": "echo", "arguments": {"text": "hello"}}
        async with stalled_post(gateway, slow, flood_call(slow, marker)):
            await until_metric(http, gateway, "mcp_gateway_buffered_bytes", lambda held: held >= MiB)
            refused = await other.request("tools/call", echo)
            # The one overloaded shape: Retry-After from [server] retry_after_s, data naming the key.
            assert refused.status == 503 and refused.headers["Retry-After"] == str(RETRY_AFTER_S)
            error = refused.final["error"]
            assert error["code"] == -32603 and "(server.buffered_bytes_budget)" in error["message"]
            assert error["data"] == {"reason": "overloaded", "limit": "server.buffered_bytes_budget"}
            refusals = 'mcp_gateway_rejected_total{limit="server.buffered_bytes_budget"}'
            assert await metric(http, gateway, refusals) == 1
            await until_metric(http, gateway, "mcp_gateway_slow_clients_total", lambda cut: cut == 1)
        # Cut and cancelled: its bytes are freed and new work is served again.
        await until_metric(http, gateway, "mcp_gateway_buffered_bytes", lambda held: held < MiB)
        assert (await other.result("tools/call", echo))["content"][0]["text"] == "hello"
