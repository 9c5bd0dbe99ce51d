"""Cancellation through the gateway follows each era's rule, on both upstream transports.

* 2025-11-25: `notifications/cancelled` stops the upstream tool; a client that merely drops its POST
  does not (the tool runs to completion, so a client can come back for the result).
* 2026-07-28: there is no cancel frame on HTTP; the dropped POST *is* the cancel.

The upstream tool `slow_build(marker=PATH)` appends `started`, `step i`, then `finished` or
`cancelled` to PATH, so the tests observe from outside what the upstream did. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from mcp import Client

from tests.conftest import RunningGateway

ACCEPT = "application/json, text/event-stream"
LEGACY = "2025-11-25"
TERMINAL = ("finished", "cancelled")


def marker_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


async def wait_for_line(path: Path, wanted: tuple[str, ...], timeout: float) -> list[str]:
    """Poll the marker until its last line is one of `wanted` (or `timeout` s pass); return all lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = marker_lines(path)
        if lines and lines[-1] in wanted:
            return lines
        if time.monotonic() >= deadline:
            return lines
        await asyncio.sleep(0.05)


async def wait_until(path: Path, done: Callable[[list[str]], bool], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = marker_lines(path)
        if done(lines) or time.monotonic() >= deadline:
            return lines
        await asyncio.sleep(0.02)


async def abandon_once_running(call: Awaitable[object], marker: Path, limit: float = 20.0) -> bool:
    """Await `call` inside `anyio.move_on_after`, and move on as soon as the tool has done a step.

    Cancelling on the marker rather than after a fixed delay keeps the test independent of machine load:
    the tool is known to be running upstream when the client abandons the call. True if abandoned.
    """
    with anyio.move_on_after(limit) as scope:
        async with anyio.create_task_group() as group:

            async def abandon_when_running() -> None:
                await wait_until(marker, lambda lines: "step 1" in lines, limit)
                scope.cancel()

            group.start_soon(abandon_when_running)
            await call
            group.cancel_scope.cancel()
    return scope.cancelled_caught


def make_client(gw: RunningGateway, mode: str) -> Client:
    return Client(gw.url, mode=mode, cache=None, read_timeout_seconds=60)


async def echo_works(client: Client) -> None:
    result = await client.call_tool("echo", {"text": "after"})
    assert not result.is_error, result
    assert result.content[0].text == "after"  # type: ignore[union-attr]


async def test_legacy_cancel_notification_stops_the_tool(gateway: RunningGateway, tmp_path: Path) -> None:
    """(a) The SDK client sends `notifications/cancelled` when its call is abandoned; the tool stops."""
    marker = tmp_path / "marker"
    async with make_client(gateway, "legacy") as client:
        await client.list_tools()  # so the call below is the only request in flight
        call = client.call_tool("slow_build", {"steps": 40, "delay": 0.1, "marker": str(marker)})
        assert await abandon_once_running(call, marker), "slow_build(40 x 0.1 s) ran to the end"
        lines = await wait_for_line(marker, TERMINAL, timeout=10)
        assert lines[:1] == ["started"], lines
        assert lines[-1] == "cancelled", f"the upstream tool was not cancelled ({gateway.upstream_kind}): {lines}"
        assert "step 40" not in lines, lines
        await echo_works(client)  # the session survives the cancel


async def test_legacy_dropped_post_is_not_a_cancel(gateway: RunningGateway, tmp_path: Path) -> None:
    """(b) A legacy client that walks away from its tools/call POST leaves the tool running to the end."""
    marker = tmp_path / "marker"
    steps, delay = 10, 0.1
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "drop", "version": "0"}},
        }
        async with http.post(gateway.url, json=initialize, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            session_id = resp.headers["Mcp-Session-Id"]
            await resp.read()
        headers |= {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(gateway.url, json=initialized, headers=headers) as resp:
            assert resp.status == 202, await resp.text()

        call: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "slow_build",
                "arguments": {"steps": steps, "delay": delay, "marker": str(marker)},
                "_meta": {"progressToken": "drop-1"},
            },
        }
        resp = await http.post(gateway.url, json=call, headers=headers)
        try:
            assert resp.status == 200, await resp.text()
            assert resp.headers.get("Content-Type", "").startswith("text/event-stream"), resp.headers
            first = await asyncio.wait_for(_first_notification(resp), timeout=10)
            assert first.get("method", "").startswith("notifications/"), first
        finally:
            resp.close()  # drop the connection mid-stream, without a cancel frame

        lines = await wait_for_line(marker, TERMINAL, timeout=steps * delay + 15)
        assert lines[-1:] == ["finished"], f"a dropped legacy POST stopped the tool ({gateway.upstream_kind}): {lines}"
        assert lines == ["started", *[f"step {i}" for i in range(1, steps + 1)], "finished"], lines

        # The session is still usable afterwards.
        echo = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x"}},
        }
        async with http.post(gateway.url, json=echo, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            assert b'"id":3' in (await resp.read()).replace(b" ", b"")
        async with http.delete(gateway.url, headers=headers) as resp:
            assert resp.status < 300, resp.status


async def _first_notification(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """Read SSE lines until the first data line carrying a JSON-RPC message (priming events skipped)."""
    async for raw in resp.content:
        line = raw.rstrip(b"\r\n")
        if line.startswith(b"data:") and line[5:].strip():
            message: dict[str, Any] = json.loads(line[5:])
            return message
    raise AssertionError("the tools/call stream ended before any notification")


async def test_modern_dropped_post_cancels_the_tool(gateway: RunningGateway, tmp_path: Path) -> None:
    """(c) At 2026-07-28 the SDK client aborts the POST when its call is abandoned; the tool stops."""
    marker = tmp_path / "marker"
    async with make_client(gateway, "2026-07-28") as client:
        await client.list_tools()  # the SDK lists tools before a first call; keep that out of the window
        call = client.call_tool("slow_build", {"steps": 40, "delay": 0.1, "marker": str(marker)})
        assert await abandon_once_running(call, marker), "slow_build(40 x 0.1 s) ran to the end"
        lines = await wait_for_line(marker, TERMINAL, timeout=10)
        assert lines[:1] == ["started"], lines
        assert lines[-1] == "cancelled", f"a dropped 2026 POST did not stop the tool ({gateway.upstream_kind}): {lines}"
        assert "step 40" not in lines, lines
        await echo_works(client)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_cancel_of_one_call_leaves_concurrent_calls_alone(
    gateway: RunningGateway, tmp_path: Path, mode: str
) -> None:
    """Cancelling one call must not stop another one in flight on the same client (ids are not mixed up)."""
    doomed, survivor = tmp_path / "doomed", tmp_path / "survivor"
    async with make_client(gateway, mode) as client:
        await client.list_tools()
        keep = asyncio.create_task(client.call_tool("slow_build", {"steps": 15, "delay": 0.1, "marker": str(survivor)}))
        call = client.call_tool("slow_build", {"steps": 40, "delay": 0.1, "marker": str(doomed)})
        assert await abandon_once_running(call, doomed)
        result = await asyncio.wait_for(keep, timeout=30)
        assert not result.is_error, result
        assert (await wait_for_line(doomed, TERMINAL, timeout=10))[-1:] == ["cancelled"], marker_lines(doomed)
        assert marker_lines(survivor)[-1:] == ["finished"], marker_lines(survivor)
