"""Readiness that tells the truth: /healthz is liveness, /readyz answers 200 only while the upstream is usable.

Real processes only: the gateway (`python -m gateway serve`) in front of a stdio command that the tests
rewrite under it (`sh upstream.sh`, first `exit 1`, then `exec python examples/build_server.py`), or in
front of the example server on Streamable HTTP, started late and stopped early. Every wait is a
bounded poll; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from gateway.config import ReadinessConfig
from gateway.readiness import retry_delays
from tests.conftest import (
    EXAMPLE_SERVER,
    READY_TIMEOUT,
    ROOT,
    RunningGateway,
    free_port,
    start_gateway,
    stop_process,
    wait_for_port,
)
from tests.test_modern_tasks_server import SERVER as MODERN_TASKS_SERVER
from tests.wire import LEGACY, MODERN
from tests.wire import Client as WireClient

WAIT_S = 30.0
"""Bound of every poll below (a check takes one process start or one HTTP round trip)."""

FAST_RETRIES = """
[upstream.readiness]
retry_initial_s = 0.1
retry_max_s = 0.5
recheck_interval_s = {recheck}
"""
"""Quick re-checks so the polls end soon; recheck 0 leaves a usable upstream to real traffic alone."""

FAILING = "echo 'upstream.sh: no config file found' >&2\nexit 1\n"
WORKING = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'examples' / 'build_server.py'))}\n"

INITIALIZE = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "readiness-test", "version": "0"}}

Body = dict[str, Any]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Body]:
    async with http.get(url) as response:
        body: Body = await response.json()
        return response.status, body


async def readyz_until(http: aiohttp.ClientSession, gw: RunningGateway, done: Callable[[int, Body], bool]) -> Body:
    """Poll /readyz until `done(status, body)`; fail after WAIT_S with the last answer."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status, body = await get_json(http, f"{gw.base}/readyz")
        if done(status, body):
            return body
        if time.monotonic() > deadline:
            pytest.fail(f"/readyz still answers {status} {body}\n{gw.output_text()}")
        await asyncio.sleep(0.05)


def ready(status: int, body: Body) -> bool:
    return status == 200 and body["status"] == "ready"


def unready(status: int, body: Body) -> bool:
    return status == 503 and body["status"] == "unready"


async def metric(http: aiohttp.ClientSession, gw: RunningGateway, name: str, labels: dict[str, str]) -> float:
    """One sample of /metrics (0 when absent)."""
    async with http.get(f"{gw.base}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def log_lines(gw: RunningGateway, needle: str) -> list[str]:
    return [line for line in gw.output if needle in line]


async def logged(gw: RunningGateway, needle: str) -> list[str]:
    """The gateway's log lines holding `needle`, once there is one: /readyz may show a change before its
    log line has come through the gateway's output pipe."""
    deadline = time.monotonic() + WAIT_S
    while not (lines := log_lines(gw, needle)):
        assert time.monotonic() < deadline, f"no log line with {needle!r}\n{gw.output_text()}"
        await asyncio.sleep(0.05)
    return lines


async def test_unstartable_command_is_live_but_not_ready_until_it_starts(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    script = tmp_path / "upstream.sh"
    script.write_text(FAILING)
    config = FAST_RETRIES.format(recheck=0)
    async with start_gateway(upstream_cmd=["sh", str(script)], config_text=config) as gw:
        body = await readyz_until(http, gw, lambda status, body: body["status"] != "starting")
        assert body["status"] == "unready", body
        assert "exited (code 1)" in body["reason"] and "upstream.sh: no config file found" in body["reason"], body

        status, health = await get_json(http, f"{gw.base}/healthz")
        assert status == 200 and health["status"] == "ok" and health["upstream"] == "unready", health
        assert {"version", "sessions", "tasks"} <= health.keys(), health

        # Several retries later, still one line: it names the command and the cause.
        deadline = time.monotonic() + WAIT_S
        while (
            await metric(http, gw, "mcp_gateway_upstream_checks_total", {"outcome": "unusable", "upstream": "default"})
            < 4
        ):
            assert time.monotonic() < deadline, gw.output_text()
            await asyncio.sleep(0.05)
        (line,) = log_lines(gw, "not usable")
        assert f"sh {script}" in line and "upstream.sh: no config file found" in line, line
        assert '"upstream":"default"' in line, line  # the configured name, for a log that holds several
        assert await metric(http, gw, "mcp_gateway_upstream_ready", {"upstream": "default"}) == 0

        # Requests meanwhile get a JSON-RPC error that says why, in both eras; never a 500. The upstream's
        # stderr (it may name paths) is for the log and /readyz, not for clients.
        legacy = await WireClient(http, gw.url).request("initialize", INITIALIZE)
        assert legacy.status == 200, legacy.messages
        assert "exited (code 1)" in legacy.final["error"]["message"], legacy.final
        modern = await WireClient(http, gw.url, MODERN).request("tools/list")
        assert modern.status != 500 and "exited (code 1)" in modern.final["error"]["message"], modern.final
        for reply in (legacy, modern):
            assert "upstream.sh" not in reply.final["error"]["message"], reply.final

        script.write_text(WORKING)
        await readyz_until(http, gw, ready)
        assert gw.proc.returncode is None
        assert len(await logged(gw, "usable again")) == 1, gw.output_text()
        async with Client(gw.url, mode="legacy", cache=None, read_timeout_seconds=60) as client:
            result = await client.call_tool("echo", {"text": "ready"})
        assert result.content[0].model_dump()["text"] == "ready"


async def test_a_ready_stdio_upstream_that_no_longer_starts_turns_unready(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    script = tmp_path / "upstream.sh"
    script.write_text(WORKING)
    config = FAST_RETRIES.format(recheck=0)
    async with start_gateway(upstream_cmd=["sh", str(script)], config_text=config) as gw:
        await readyz_until(http, gw, ready)
        script.write_text(FAILING)
        # No periodic re-check (recheck 0): the request whose process fails to start triggers it.
        reply = await WireClient(http, gw.url).request("initialize", INITIALIZE)
        assert reply.status == 200 and "exited (code 1)" in reply.final["error"]["message"], reply.final
        body = await readyz_until(http, gw, unready)
        assert "upstream.sh: no config file found" in body["reason"], body
        assert len(await logged(gw, "not usable any more")) == 1, gw.output_text()


async def test_what_the_gateway_learns_from_the_upstream_waits_until_it_is_usable(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # The first 2026-07-28 request asks the upstream (server/discover) whether it hosts tasks. Asked while
    # the command cannot start, the answer must not stick: once it runs, its own tasks are passed through.
    script = tmp_path / "upstream.sh"
    script.write_text(FAILING)
    config = FAST_RETRIES.format(recheck=0)
    async with start_gateway(upstream_cmd=["sh", str(script)], config_text=config) as gw:
        client = WireClient(http, gw.url, MODERN)
        early = await client.request("tools/list")
        assert "exited (code 1)" in early.final["error"]["message"], early.final
        script.write_text(f"exec {shlex.join(MODERN_TASKS_SERVER)}\n")
        await readyz_until(http, gw, ready)
        created = await client.result("tools/call", {"name": "slow_job", "arguments": {"steps": 1, "delay": 0}})
        tag, _, upstream_id = created["taskId"].partition(".")
        assert tag and len(upstream_id) == 32, created  # the upstream's task, namespaced; not a hosted one


async def test_http_upstream_down_at_start_comes_up_then_goes_away(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    port = free_port()
    config = FAST_RETRIES.format(recheck=0.2)
    async with start_gateway(upstream_url=f"http://127.0.0.1:{port}/mcp", config_text=config) as gw:
        body = await readyz_until(http, gw, unready)
        assert "upstream unreachable" in body["reason"] and str(port) not in body["reason"], body
        (line,) = await logged(gw, "not usable")
        assert f"http://127.0.0.1:{port}/mcp" in line, line
        # A client's error says the upstream is unreachable, never where it is.
        reply = await WireClient(http, gw.url, MODERN).request("tools/list")
        assert reply.final["error"]["message"] == "upstream unreachable: connection refused", reply.final

        with (tmp_path / "upstream.log").open("wb") as out:
            upstream = await asyncio.create_subprocess_exec(
                *EXAMPLE_SERVER, "--http", "--host", "127.0.0.1", "--port", str(port),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
        try:
            await wait_for_port("127.0.0.1", port, READY_TIMEOUT)
            await readyz_until(http, gw, ready)
        finally:
            await stop_process(upstream)
        # Without any traffic: the periodic re-check notices.
        body = await readyz_until(http, gw, unready)
        assert "upstream unreachable" in body["reason"], body


async def test_hosted_task_status_without_a_listener_is_undelivered_not_dropped(
    gateway_stdio: RunningGateway, http: aiohttp.ClientSession
) -> None:
    # The raw client: the SDK's (this version) validates a tools/call answer as CallToolResult and
    # refuses the CreateTaskResult of a 2025-11-25 task-augmented call.
    gw = gateway_stdio
    status_labels = {"method": "notifications/tasks/status", "reason": "no_get_stream"}
    undelivered_before = await metric(http, gw, "mcp_gateway_notifications_undelivered_total", status_labels)
    client = WireClient(http, gw.url)
    await client.initialize()
    params = {"name": "slow_build", "arguments": {"steps": 2, "delay": 0.05}, "task": {"ttl": 60_000}}
    task_id = (await client.result("tools/call", params))["task"]["taskId"]
    deadline = time.monotonic() + WAIT_S
    while (task := await client.result("tasks/get", {"taskId": task_id}))["status"] != "completed":
        assert task["status"] == "working" and time.monotonic() < deadline, task
        await asyncio.sleep(0.05)
    result = await client.result("tasks/result", {"taskId": task_id})
    assert result["content"] and not result.get("isError"), result
    assert await client.delete() == 200

    async with http.get(f"{gw.base}/metrics") as response:
        text = await response.text()
    losses = [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        # `_created` samples are counters' creation timestamps, not losses.
        if ("dropped" in sample.name or "lost" in sample.name) and not sample.name.endswith("_created") and sample.value
    ]
    assert losses == []
    assert await metric(http, gw, "mcp_gateway_notifications_undelivered_total", status_labels) > undelivered_before


def test_retries_double_up_to_the_cap() -> None:
    delays = retry_delays(0.5, 30.0)
    assert [next(delays) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_retry_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match="retry_initial_s must not exceed retry_max_s"):
        ReadinessConfig(retry_initial_s=5, retry_max_s=1)
