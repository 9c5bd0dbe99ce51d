"""An upstream stdio process that dies is contained: the caller gets an error, the gateway lives on.

The upstream processes are found as the gateway's descendants in /proc and killed with SIGKILL while a
long `slow_build` is in flight. The client must get a JSON-RPC error promptly (within 1 s), `/healthz`
stays 200, the next call on the *same* client succeeds (the gateway respawns the process and, for a
legacy session, replays the handshake), and `/metrics` counts the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from mcp import Client, MCPError

from tests.conftest import RunningGateway

MODES = ["legacy", "2026-07-28"]
ERROR_WITHIN_S = 1.0


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(p) for p in (task / "children").read_text().split())
    return found


def descendants(pid: int) -> set[int]:
    seen: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def marker_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


async def wait_for_line(path: Path, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if line in marker_lines(path):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never got {line!r}: {marker_lines(path)}")


async def whoami(client: Client) -> int:
    result = await client.call_tool("whoami", {})
    assert not result.is_error, result
    return int(result.content[0].text)  # type: ignore[union-attr]


async def restarts_total(gw: RunningGateway) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    match = re.search(r'^mcp_gateway_upstream_restarts_total\{upstream="default"\} (\S+)$', text, re.MULTILINE)
    assert match, f"no mcp_gateway_upstream_restarts_total in /metrics:\n{text}"
    return float(match.group(1))


async def healthz(gw: RunningGateway) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/healthz") as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("mode", MODES)
async def test_upstream_killed_mid_call(gateway_stdio: RunningGateway, tmp_path: Path, mode: str) -> None:
    gw = gateway_stdio
    marker = tmp_path / "marker"
    async with Client(gw.url, mode=mode, cache=None, read_timeout_seconds=30) as client:
        before = await whoami(client)
        assert before in descendants(gw.proc.pid), "whoami's pid is not a child of the gateway"

        call = asyncio.create_task(client.call_tool("slow_build", {"steps": 100, "delay": 0.1, "marker": str(marker)}))
        await wait_for_line(marker, "step 1", timeout=10)
        victims = descendants(gw.proc.pid)
        assert victims, "the gateway has no upstream processes"
        killed_at = time.monotonic()
        kill_all(victims)

        try:
            outcome = await asyncio.wait_for(call, timeout=10)
        except MCPError as exc:
            outcome = exc
        elapsed = time.monotonic() - killed_at
        assert isinstance(outcome, MCPError), f"expected a JSON-RPC error after the upstream died, got {outcome!r}"
        assert elapsed < ERROR_WITHIN_S, f"the error came {elapsed:.2f} s after the kill"
        assert "finished" not in marker_lines(marker)

        assert gw.proc.returncode is None, f"the gateway died with its upstream:\n{gw.output_text()}"
        assert await healthz(gw) == 200

        # The same client goes on working; a fresh process serves it.
        result = await client.call_tool("echo", {"text": "after the crash"})
        assert not result.is_error, result
        assert result.content[0].text == "after the crash"  # type: ignore[union-attr]
        after = await whoami(client)
        assert after not in victims, "the call was served by a killed process?"
        assert after in descendants(gw.proc.pid)

    assert await restarts_total(gw) >= 1
    assert "Traceback" not in gw.output_text(), gw.output_text()


@pytest.mark.parametrize("mode", MODES)
async def test_upstream_killed_while_idle(gateway_stdio: RunningGateway, mode: str) -> None:
    """No call in flight: the next call still works (legacy: the handshake is replayed to the new process)."""
    gw = gateway_stdio
    async with Client(gw.url, mode=mode, cache=None, read_timeout_seconds=30) as client:
        await whoami(client)
        victims = descendants(gw.proc.pid)
        kill_all(victims)
        await asyncio.sleep(0.3)  # let the gateway notice the exit
        assert await healthz(gw) == 200
        for i in range(3):
            result = await client.call_tool("echo", {"text": f"call {i}"})
            assert not result.is_error, result
            assert result.content[0].text == f"call {i}"  # type: ignore[union-attr]
        assert await whoami(client) not in victims
    assert await restarts_total(gw) >= 1
