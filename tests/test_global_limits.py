"""Global ceilings (sessions, stdio processes, tasks, tasks/stream requests) and session expiry, on a
real gateway in front of the example server on stdio.

Each ceiling is hit with small limits and must answer 503 + `Retry-After` + a JSON-RPC error naming
the limit, in the era of the request; service resumes once the load drops. Bare `initialize` calls
expire after `session_handshake_timeout_s` and give their processes back, so 2026-07-28 requests are
not starved; an idle session's process is given back after `session_process_idle_s` and its next
request replays the handshake on a fresh one.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.edge.endpoint import error_response
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Overloaded
from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, start_gateway
from tests.wire import LEGACY, MODERN, Client, Reply

ASYNC = pytest.mark.asyncio(loop_scope="module")

TEST_TIMEOUT = 60.0
TASKS_SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "legacy_tasks_server.py")]
"""An upstream that hosts 2025-11-25 Tasks itself (pass-through)."""
RETRY_AFTER = 7


def config(server: str = "", stdio: str = "", tasks: str = "") -> str:
    return f"""
[server]
retry_after_s = {RETRY_AFTER}
{server}

[upstream.stdio]
{stdio}

[tasks]
{tasks}
"""


def assert_overloaded(reply: Reply, limit: str) -> None:
    """503 + Retry-After + a -32603 whose message and data name the limit."""
    assert reply.status == 503, (reply.status, reply.messages)
    assert reply.headers.get("Retry-After") == str(RETRY_AFTER), dict(reply.headers)
    error = reply.final["error"]
    assert error["code"] == -32603, error
    assert error["data"] == {"reason": "overloaded", "limit": limit}, error
    assert error["message"].startswith("Service Unavailable: ") and f"({limit})" in error["message"], error


async def metric(gw: RunningGateway, http: aiohttp.ClientSession, name: str) -> float:
    """The value of one sample of /metrics (`name` with its labels, as printed); 0 if absent."""
    async with http.get(f"{gw.base}/metrics") as response:
        text = await response.text()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def children(pid: int) -> list[int]:
    """The gateway's child processes (its upstream processes), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, ...
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


async def echo(client: Client, text: str = "hi") -> Reply:
    return await client.request("tools/call", {"name": "echo", "arguments": {"text": text}})


async def bare_initialize(client: Client) -> Reply:
    """An initialize and nothing after it (the session id is kept on `client`)."""
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bare", "version": "0"}}
    reply = await client.request("initialize", params)
    client.session_id = reply.headers.get("Mcp-Session-Id")
    return reply


# -- the one rendering of "overloaded" ---------------------------------------------------------------


@pytest.mark.parametrize("era", [Era.LEGACY, Era.MODERN])
def test_overloaded_is_503_with_retry_after_in_both_eras(era: Era) -> None:
    error = Overloaded("tasks.max_tasks_total", "the gateway holds its maximum of 3 tasks", "retry later", request_id=4)
    response = error_response(error, era, retry_after_s=12)
    assert isinstance(response, web.Response) and response.body is not None
    assert response.status == 503
    assert response.headers["Retry-After"] == "12"
    assert b'"limit":"tasks.max_tasks_total"' in response.body  # type: ignore[operator]


# -- sessions and processes ----------------------------------------------------------------------------


@ASYNC
async def test_session_ceiling_answers_503_and_frees_on_delete(http: aiohttp.ClientSession) -> None:
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config("max_sessions = 2")) as gw,
    ):
        first, second, third = (Client(http, gw.url) for _ in range(3))
        await first.initialize()
        await second.initialize()
        assert_overloaded(await bare_initialize(third), "server.max_sessions")
        assert await metric(gw, http, 'mcp_gateway_rejected_total{limit="server.max_sessions"}') == 1
        assert await metric(gw, http, 'mcp_gateway_limit{limit="server.max_sessions"}') == 2
        assert await first.delete() == 200
        await third.initialize()
        assert "result" in (await echo(third)).final


@ASYNC
async def test_process_ceiling_answers_503_in_both_eras_and_resumes(http: aiohttp.ClientSession) -> None:
    stdio = "max_processes = 2\nidle_processes = 0\nacquire_timeout_s = 0.5"
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config(stdio=stdio)) as gw,
    ):
        sessions = [Client(http, gw.url) for _ in range(2)]
        streams = []  # an open GET stream keeps a session busy: none is idle enough to give way
        for session in sessions:
            await session.initialize()
            assert "result" in (await echo(session)).final
            headers = {"Accept": "text/event-stream", "Mcp-Session-Id": str(session.session_id)}
            streams.append(await http.get(gw.url, headers=headers))
        try:
            assert_overloaded(await bare_initialize(Client(http, gw.url)), "upstream.stdio.max_processes")
            modern = Client(http, gw.url, MODERN)
            assert_overloaded(await echo(modern), "upstream.stdio.max_processes")
            assert await metric(gw, http, 'mcp_gateway_rejected_total{limit="upstream.stdio.max_processes"}') == 2
            streams.pop(0).close()
            assert await sessions[0].delete() == 200  # its process is stopped and its slot free by now

            # The 2026-07-28 call first asks the upstream's capabilities (the rejected call could not):
            # that probe's process is stopped off the request's path, and the call itself waits only
            # acquire_timeout_s for the slot, so it may be refused once more while the probe's process
            # exits. Service resumes: the call is answered once that process is gone.
            async def served() -> bool:
                return "result" in (await echo(modern)).final

            await eventually(served, 10.0, "a 2026-07-28 call is served again")
        finally:
            for stream in streams:
                stream.close()


@ASYNC
async def test_bare_initialize_flood_does_not_starve_modern_requests(http: aiohttp.ClientSession) -> None:
    """40 bare initialize calls: 2026-07-28 calls made meanwhile succeed (sessions cannot take the
    processes kept for them), the bare sessions are closed after the handshake timeout and their
    processes stopped, while a session that made a request lives on."""
    server = "session_handshake_timeout_s = 3.0"
    # A short wait for a process: a 2026-07-28 call must not depend on a bare session expiring.
    stdio = "max_processes = 6\nidle_processes = 1\nacquire_timeout_s = 0.5"
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config(server, stdio)) as gw,
    ):
        engaged = Client(http, gw.url)
        await engaged.initialize()
        assert "result" in (await echo(engaged)).final

        bare = [Client(http, gw.url) for _ in range(40)]
        flood = asyncio.gather(*(bare_initialize(client) for client in bare))

        async def sessions_full() -> bool:
            async with http.get(f"{gw.base}/healthz") as response:
                return (await response.json())["sessions"] >= 5  # the engaged one and 4 bare ones

        await eventually(sessions_full, 10.0, "the bare sessions take every process they may")
        modern = Client(http, gw.url, MODERN)
        during = [await echo(modern, f"served {i}") for i in range(3)]
        replies = await flood
        for i, reply in enumerate(during):
            assert reply.final["result"]["content"][0]["text"] == f"served {i}", reply.messages
        opened = [reply for reply in replies if reply.status == 200]
        assert opened, [reply.status for reply in replies]
        for reply in replies:
            if reply.status != 200:
                assert_overloaded(reply, "upstream.stdio.max_processes")
        assert "result" in (await echo(modern)).final

        async def only_engaged_left() -> bool:
            async with http.get(f"{gw.base}/healthz") as response:
                return (await response.json())["sessions"] == 1

        await eventually(only_engaged_left, 10.0, "the bare sessions expire")
        assert await metric(gw, http, 'mcp_gateway_sessions_expired_total{reason="handshake"}') == len(opened)

        async def processes_released() -> bool:
            return len(children(gw.proc.pid)) <= 2  # the engaged session's and at most one idle one

        await eventually(processes_released, 10.0, "the bare sessions' processes stop")
        assert "result" in (await echo(engaged)).final
        assert (await bare_initialize(Client(http, gw.url))).status == 200


async def whoami(client: Client) -> object:
    """The upstream process that serves `client`'s session (the example server's pid)."""
    return (await client.request("tools/call", {"name": "whoami", "arguments": {}})).final["result"]


async def until_witness_parked(gw: RunningGateway, http: aiohttp.ClientSession, witness: Client) -> None:
    """A fresh session that made one request and then idles is parked: the sweep that parks it finds
    every session idle since before that request idle long enough too (one `now` for all), so a session
    that still holds its process afterwards was kept on purpose, not by luck of the timing."""
    await witness.initialize()
    await witness.request("tools/call", {"name": "echo", "arguments": {"text": "witness"}})
    parked_before = await metric(gw, http, "mcp_gateway_sessions_parked_total")
    await eventually(
        lambda: _parked_more_than(gw, http, parked_before), 10.0, "the idle witness session gives its process back"
    )


async def _parked_more_than(gw: RunningGateway, http: aiohttp.ClientSession, count: float) -> bool:
    return await metric(gw, http, "mcp_gateway_sessions_parked_total") > count


@ASYNC
async def test_idle_session_gives_its_process_back_and_replays_the_handshake(http: aiohttp.ClientSession) -> None:
    server = "session_process_idle_s = 0.5"
    stdio = "idle_processes = 0"
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config(server, stdio)) as gw,
    ):
        # A session with an open GET stream keeps its process however idle it is; so does a session a
        # hosted task runs on, until the task ends.
        streaming, tasked = Client(http, gw.url), Client(http, gw.url)
        await streaming.initialize()
        streaming_pid = await whoami(streaming)
        headers = {"Accept": "text/event-stream", "Mcp-Session-Id": str(streaming.session_id)}
        get = await http.get(gw.url, headers=headers)
        await tasked.initialize()
        tasked_pid = await whoami(tasked)
        created = await legacy_task(tasked, "slow_build", {"steps": 100_000, "delay": 0.1}, 60_000)
        task_id = created.final["result"]["task"]["taskId"]

        await until_witness_parked(gw, http, Client(http, gw.url))
        assert await metric(gw, http, "mcp_gateway_sessions_parked_total") == 1
        # A session parked meanwhile would answer from a fresh process (its handshake replayed).
        assert await whoami(streaming) == streaming_pid
        assert await whoami(tasked) == tasked_pid

        get.close()
        await tasked.request("tasks/cancel", {"taskId": task_id})

        async def both_parked() -> bool:
            return await metric(gw, http, "mcp_gateway_sessions_parked_total") == 3 and not children(gw.proc.pid)

        await eventually(both_parked, 10.0, "the sessions' processes are stopped once nothing holds them")
        second_pid = await whoami(tasked)
        assert second_pid != tasked_pid  # a fresh process, after a replayed initialize
        assert len(children(gw.proc.pid)) == 1


@ASYNC
async def test_a_session_whose_upstream_task_runs_keeps_its_process(http: aiohttp.ClientSession) -> None:
    """A pass-through task lives in the upstream process, which has long answered the tools/call: the
    session must not give that process back before the task ends."""
    server = "session_process_idle_s = 0.3"
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=TASKS_SERVER, config_text=config(server, "idle_processes = 0")) as gw,
    ):
        client = Client(http, gw.url)
        await client.initialize()
        created = await legacy_task(client, "slow_job", {"steps": 100_000, "delay": 0.2}, 60_000)
        task_id = created.final["result"]["task"]["taskId"]

        await until_witness_parked(gw, http, Client(http, gw.url))
        assert await metric(gw, http, "mcp_gateway_sessions_parked_total") == 1
        # Only the process that runs the task knows it: a fresh one would answer "unknown task".
        cancelled = (await client.request("tasks/cancel", {"taskId": task_id})).final
        assert cancelled["result"]["status"] == "cancelled", cancelled


# -- tasks and streams ----------------------------------------------------------------------------------

TASK_TOOLS = """
[[tasks.tools]]
match = "slow_build"
modern = "after_ms"
after_ms = 100

[[tasks.tools]]
match = "*"
modern = "always"
input_window_ms = 0
"""


async def legacy_task(client: Client, tool: str, arguments: dict[str, Any], ttl_ms: int) -> Reply:
    return await client.request("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": ttl_ms}})


@ASYNC
async def test_task_ceiling_answers_503_in_both_eras_and_resumes_after_expiry(http: aiohttp.ClientSession) -> None:
    tasks = "max_tasks_total = 2\nmax_tasks_per_owner = 100\n" + TASK_TOOLS
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config(tasks=tasks)) as gw,
    ):
        legacy = Client(http, gw.url)
        await legacy.initialize()
        for _ in range(2):
            assert "task" in (await legacy_task(legacy, "echo", {"text": "x"}, 1500)).final["result"]
        assert await metric(gw, http, "mcp_gateway_tasks") == 2

        assert_overloaded(await legacy_task(legacy, "echo", {"text": "x"}, 1500), "tasks.max_tasks_total")
        modern = Client(http, gw.url, MODERN)
        assert_overloaded(await echo(modern), "tasks.max_tasks_total")
        # A call that may become a task later carries on as a plain call when no task can be made.
        slow = await modern.request("tools/call", {"name": "slow_build", "arguments": {"steps": 3, "delay": 0.1}})
        assert slow.status == 200 and slow.final["result"].get("resultType") == "complete", slow.messages
        assert "task" not in slow.final["result"]
        assert await metric(gw, http, 'mcp_gateway_rejected_total{limit="tasks.max_tasks_total"}') == 2

        async def room_again() -> bool:
            return await metric(gw, http, "mcp_gateway_tasks") == 0

        await eventually(room_again, 10.0, "the tasks expire (ttl 1.5 s)")
        created = (await echo(modern)).final["result"]
        assert created.get("resultType") == "task", created


@ASYNC
async def test_stream_ceiling_answers_503_in_both_eras_and_resumes(http: aiohttp.ClientSession) -> None:
    tasks = "max_streams_total = 2\n" + TASK_TOOLS
    async with (
        asyncio.timeout(TEST_TIMEOUT),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config(tasks=tasks)) as gw,
    ):
        first, second = Client(http, gw.url), Client(http, gw.url)
        await first.initialize()
        await second.initialize()
        created = await legacy_task(first, "slow_build", {"steps": 200, "delay": 0.1}, 60_000)
        task_id = created.final["result"]["task"]["taskId"]
        modern = Client(http, gw.url, MODERN)
        held = [
            await first.open("tasks/stream", {"taskId": task_id}),
            await modern.open("tasks/stream", {"taskId": task_id}),
        ]
        try:
            assert [reply.status for reply in held] == [200, 200]
            assert await metric(gw, http, "mcp_gateway_task_streams") == 2
            assert_overloaded(await second.request("tasks/stream", {"taskId": task_id}), "tasks.max_streams_total")
            assert_overloaded(await modern.request("tasks/stream", {"taskId": task_id}), "tasks.max_streams_total")
            held.pop(0).close()

            async def one_left() -> bool:
                return await metric(gw, http, "mcp_gateway_task_streams") == 1

            await eventually(one_left, 10.0, "the dropped stream is released")
            again = await second.open("tasks/stream", {"taskId": task_id})
            held.append(again)
            assert again.status == 200 and await again.next() is not None
        finally:
            for reply in held:
                reply.close()
            await first.request("tasks/cancel", {"taskId": task_id})


def test_children_sees_a_child() -> None:
    """The /proc scan the flood test relies on finds a real child process."""
    import subprocess

    child = subprocess.Popen(["sleep", "5"])
    try:
        assert child.pid in children(os.getpid())
    finally:
        child.kill()
        child.wait(timeout=5)
