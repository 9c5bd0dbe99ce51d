"""Deadlines: a request the upstream never answers ends at its deadline, in both eras, on both upstream
transports, and gives back what it held.

The upstream is `tests/servers/unruly_server.py`, whose `never_answers(marker)` starts (writing `started`
to the marker) and never answers; when its request is cancelled upstream it writes `cancelled`. On stdio
the gateway runs with `max_processes = 1`, so a request that succeeds after a timed-out one shows that the
process (or its slot) was given back. The rules that pick each request's deadline are unit-tested first.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.config import TasksConfig, ToolTaskPolicy, UpstreamConfig
from gateway.deadlines import RequestDeadlines
from gateway.protocol import jsonrpc
from gateway.upstream.base import REQUEST_TIMEOUT, Deadline
from tests.conftest import ROOT, RunningGateway, serve_http, start_gateway
from tests.test_modern_tasks_server import poll
from tests.wire import LEGACY, MODERN, Client, wait_for_marker

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "unruly_server.py")]
DEADLINE_S = 1.0
# never_answers has a deadline of its own: every other request keeps a generous one, so a fresh upstream
# process starting slowly on a loaded machine never runs into it.
CONFIG = f"""
[upstream]
request_timeout_s = 60

[upstream.stdio]
max_processes = 1
idle_processes = 1

[[tasks.tools]]
match = "never_answers"
task_support = "optional"
modern = "after_ms"
after_ms = 200
request_timeout_s = {DEADLINE_S}

[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "never"
"""
TEST_TIMEOUT = 20.0
"""Seconds any one test may take (each wraps its body in asyncio.timeout)."""
DEADLINE_KEY = 'request_timeout_s of the [[tasks.tools]] entry match = "never_answers"'
TIMEOUT_TEXT = f"Request timeout: the upstream did not answer tools/call within {DEADLINE_S:g} s ({DEADLINE_KEY})"


# -- which deadline a request gets ----------------------------------------------------------------


def call(method: str, name: str | None = None) -> jsonrpc.Message:
    params = {"name": name} if name is not None else {}
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def test_every_request_gets_the_upstream_deadline_and_a_tool_may_set_its_own() -> None:
    tools = [
        ToolTaskPolicy(match="deploy_*", request_timeout_s=3600),
        ToolTaskPolicy(match="watch", request_timeout_s=0),
        ToolTaskPolicy(match="*"),
    ]
    rule = RequestDeadlines(UpstreamConfig(request_timeout_s=30), TasksConfig(tools=tools, max_ttl_ms=7_200_000))
    default = Deadline(30, "upstream.request_timeout_s")
    assert rule(call("tools/list")) == default
    assert rule(call("tools/call", "build")) == default
    assert rule(call("tools/call", "deploy_prod")) == Deadline(
        3600, 'request_timeout_s of the [[tasks.tools]] entry match = "deploy_*"'
    )
    assert rule(call("tools/call", "watch")) is None  # 0: none
    assert rule(call("tasks/result")) == Deadline(7200, "tasks.max_ttl_ms")  # it waits for the task
    assert rule(call("tasks/stream")) == Deadline(7200, "tasks.max_ttl_ms")  # forwarded to a native upstream
    assert rule(call("initialize")) is None  # server.initialize_timeout_s, where it is sent
    assert rule(call("subscriptions/listen")) is None  # a stream its client ends


def test_zero_turns_the_deadline_off() -> None:
    rule = RequestDeadlines(UpstreamConfig(request_timeout_s=0), TasksConfig())
    assert rule(call("tools/call", "anything")) is None
    assert RequestDeadlines(UpstreamConfig(), TasksConfig())(call("ping")) == Deadline(
        300, "upstream.request_timeout_s"
    )


# -- a real upstream that never answers --------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["stdio", "http"])
async def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    if request.param == "stdio":
        async with start_gateway(upstream_cmd=SERVER, config_text=CONFIG) as gateway:
            gateway.upstream_kind = "stdio"
            yield gateway
        return
    log = tmp_path_factory.mktemp("unruly-http") / "server.log"
    async with serve_http(SERVER, log=log) as url, start_gateway(upstream_url=url, config_text=CONFIG) as gateway:
        gateway.upstream_kind = "http"
        yield gateway


def assert_timeout_error(message: jsonrpc.Message) -> None:
    error = message.get("error")
    assert isinstance(error, dict), message
    assert error["code"] == jsonrpc.INTERNAL_ERROR and error["message"].startswith(TIMEOUT_TEXT), error
    assert error["data"] == {"reason": REQUEST_TIMEOUT, "limit": DEADLINE_S, "key": DEADLINE_KEY}


async def cancelled_upstream(marker: Path) -> None:
    """The upstream's handler was cancelled: by `notifications/cancelled` (stdio; legacy HTTP, where a
    dropped POST is no cancel) or by the dropped POST (2026-07-28 HTTP)."""
    lines = await wait_for_marker(marker, ("cancelled",), timeout=10)
    assert lines == ["started", "cancelled"], lines


async def echo_works(client: Client) -> None:
    result = await client.result("tools/call", {"name": "echo", "arguments": {"text": "after"}})
    assert result["content"][0]["text"] == "after", result


def never_answers(marker: Path, **extra: Any) -> dict[str, Any]:
    return {"name": "never_answers", "arguments": {"marker": str(marker)}, **extra}


@MODULE_LOOP
async def test_legacy_call_ends_at_its_deadline_and_is_cancelled_upstream(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    async with asyncio.timeout(TEST_TIMEOUT):
        client = Client(http, gw.url, LEGACY)
        await client.initialize()
        reply = await client.request("tools/call", never_answers(marker))
        assert reply.status == 200
        assert_timeout_error(reply.final)
        await cancelled_upstream(marker)
        await echo_works(client)  # the session and its process go on
        assert await client.delete() == 200  # gives the one process back
    assert "Traceback" not in gw.output_text(), gw.output_text()


@MODULE_LOOP
async def test_modern_call_ends_at_its_deadline_and_frees_its_process(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    async with asyncio.timeout(TEST_TIMEOUT):
        client = Client(http, gw.url, MODERN, tasks=False)
        await echo_works(client)  # a warm process: the deadline must not run out while one starts
        reply = await client.request("tools/call", never_answers(marker))
        assert reply.status == 200
        assert_timeout_error(reply.final)
        await cancelled_upstream(marker)
        await echo_works(client)  # max_processes = 1: the pooled process (or its slot) is free again
    assert "Traceback" not in gw.output_text(), gw.output_text()


@MODULE_LOOP
async def test_legacy_hosted_task_fails_at_its_deadline(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    async with asyncio.timeout(TEST_TIMEOUT):
        client = Client(http, gw.url, LEGACY)
        await client.initialize()
        created = await client.result("tools/call", never_answers(marker, task={"ttl": 60_000}))
        task_id = created["task"]["taskId"]
        outcome = (await client.request("tasks/result", {"taskId": task_id})).final  # blocks until it ends
        assert_timeout_error(outcome)
        task = await client.result("tasks/get", {"taskId": task_id})
        assert task["status"] == "failed" and task["statusMessage"].startswith(TIMEOUT_TEXT), task
        await cancelled_upstream(marker)
        await echo_works(client)
        assert await client.delete() == 200
    assert "Traceback" not in gw.output_text(), gw.output_text()


@MODULE_LOOP
async def test_modern_call_turned_task_fails_at_its_deadline(
    gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The call becomes a task after `after_ms`; its upstream call keeps its deadline, and the task fails."""
    marker = tmp_path / "marker"
    async with asyncio.timeout(TEST_TIMEOUT):
        client = Client(http, gw.url, MODERN)
        await echo_works(client)
        created = await client.result("tools/call", never_answers(marker))
        assert created["resultType"] == "task", created
        task = (await poll(client, created["taskId"], lambda task: task["status"] != "working"))[-1]
        assert task["status"] == "failed" and task["statusMessage"].startswith(TIMEOUT_TEXT), task
        assert_timeout_error({"error": task["error"]})
        await cancelled_upstream(marker)
        failed = [line for line in gw.output if "task failed" in line and created["taskId"] in line]
        assert len(failed) == 1 and REQUEST_TIMEOUT in failed[0], gw.output_text()  # one line, with why
        await echo_works(client)
        async with http.get(f"{gw.base}/metrics") as response:
            metrics = await response.text()
    counted = re.search(
        r'^mcp_gateway_request_timeouts_total\{method="tools/call",upstream="default"\} (\S+)$', metrics, re.MULTILINE
    )
    assert counted and float(counted.group(1)) >= 1, metrics
    assert "Traceback" not in gw.output_text(), gw.output_text()


# -- right after deadlines: the next calls are served ---------------------------------------------------

SLOW_START_S = 1.5
"""The upstream reads nothing for this long after it starts (a cold start on a loaded host): longer
than the deadline, so a deadline that counted a process's start would run out on every fresh process."""
AFTER_DEADLINES_CONFIG = f"""
[upstream]
request_timeout_s = {DEADLINE_S}

[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "after_ms"
after_ms = 300
"""
LOOPS, ECHOES = 10, 20


async def echo_succeeds(client: Client, text: str) -> None:
    """An echo answers `text`: at once, or (2026-07-28, past after_ms) as a task that completes with it."""
    result = await client.result("tools/call", {"name": "echo", "arguments": {"text": text}})
    if result.get("resultType") == "task":
        task = (await poll(client, result["taskId"], lambda task: task["status"] != "working"))[-1]
        assert task["status"] == "completed", task
        result = task["result"]
    assert result["content"][0]["text"] == text, result


@MODULE_LOOP
async def test_after_four_deadlines_twenty_echoes_succeed_in_both_eras_ten_times(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Four calls (two per era) run into `[upstream] request_timeout_s` on a slow-starting stdio
    upstream, then 20 echoes in each era all succeed; ten times. The pooled processes the timed-out
    calls leave are recycled off the request path, a warm one takes their place, and a fresh process's
    start does not count against the deadline of the request that waits for it."""
    server = [*SERVER, "--start-delay", str(SLOW_START_S)]
    async with start_gateway(upstream_cmd=server, config_text=AFTER_DEADLINES_CONFIG) as gw:
        async with asyncio.timeout(LOOPS * 30):
            legacy = Client(http, gw.url, LEGACY)
            await legacy.initialize()
            modern = Client(http, gw.url, MODERN)
            for loop in range(LOOPS):
                marker = tmp_path / f"marker-{loop}"
                timed_out = await asyncio.gather(
                    legacy.request("tools/call", never_answers(marker)),
                    legacy.request("tools/call", never_answers(marker)),
                    Client(http, gw.url, MODERN, tasks=False).request("tools/call", never_answers(marker)),
                    Client(http, gw.url, MODERN, tasks=False).request("tools/call", never_answers(marker)),
                )
                for reply in timed_out:
                    assert reply.final["error"]["data"]["reason"] == REQUEST_TIMEOUT, reply.final
                for i in range(ECHOES):
                    await echo_succeeds(modern, f"modern {loop}.{i}")
                    await echo_succeeds(legacy, f"legacy {loop}.{i}")
    assert "Traceback" not in gw.output_text(), gw.output_text()
