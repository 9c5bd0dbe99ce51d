"""The SEP-2694 client (`gateway.client`), `mcp-task-gateway tail` and `demo`, against the real gateway.

Every test runs the gateway as a subprocess in front of the example build server on stdio, with a
retention of 200 events per task so `burst(1000)` outruns it. Connections are dropped for real: a
consumer task is cancelled mid-stream, or a TCP relay (`FlakyLink`) resets every connection through it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.client import EventsGone, GatewayClient, JsonRpcError
from gateway.client.demo import FlakyLink
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, start_gateway

RETAINED = 200
CONFIG = f"[retention]\nmax_events_per_task = {RETAINED}\n"
TERMINAL_SUFFIX = ".task.terminal"
Event = dict[str, Any]


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


def seqs(events: list[Event]) -> list[int]:
    return [event["seq"] for event in events]


async def full_history(url: str, task_id: str) -> list[Event]:
    """The task's whole retained history, from a fresh client, once the task is terminal."""
    async with GatewayClient(url) as client:
        await client.task_result(task_id)
        return [event async for event in client.stream(task_id)]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


async def run_cli(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """`python -m gateway ARGS...` to completion; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
        cwd=ROOT,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"`{' '.join(args)}` did not finish in {timeout} s:\n{out.decode()}\n{err.decode()}")
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- GatewayClient ----------------------------------------------------------------------------------


async def test_stream_legacy_task_from_start_to_end(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url) as client:
        assert client.session_id
        task_id = await client.start_task("slow_build", {"steps": 3, "delay": 0.1}, ttl_ms=60_000)
        assert task_id is not None
        stream = client.stream(task_id)
        events = [event async for event in stream]
        assert stream.result == {}, "a legacy stream ends with the empty result"
        assert seqs(events) == list(range(len(events)))
        assert events[0]["type"].endswith(".task.created")
        assert events[-1]["type"].endswith(TERMINAL_SUFFIX)
        assert all(event["taskId"] == task_id for event in events)
        assert all(event["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id} for event in events)
        progress = [event["payload"] for event in events if event["type"].endswith(".progress")]
        assert [p["progress"] for p in progress] == [1, 2, 3]

        assert (await client.get_task(task_id))["result"]["status"] == "completed"
        result = await client.task_result(task_id)
        assert result["content"][0]["text"] == "built 3 steps"


async def test_stream_after_cursor_and_errors(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url) as client:
        task_id = await client.start_task("slow_build", {"steps": 2, "delay": 0.05})
        assert task_id is not None
        await client.task_result(task_id)
        everything = [event async for event in client.stream(task_id)]
        tail = [event async for event in client.stream(task_id, after=3)]
        assert tail == everything[4:]
        assert [event async for event in client.stream(task_id, after=everything[-1]["seq"])] == []

        with pytest.raises(JsonRpcError) as unknown:
            async for _ in client.stream("no-such-task"):
                pass
        assert unknown.value.code == -32602 and not isinstance(unknown.value, EventsGone)
        with pytest.raises(JsonRpcError) as beyond:
            async for _ in client.stream(task_id, after=10_000):
                pass
        assert beyond.value.code == -32602
        with pytest.raises(ValueError):
            client.stream(task_id, after=-1)


async def test_follow_resumes_after_the_consumer_is_cancelled(gw: RunningGateway) -> None:
    """A consumer killed mid-stream persists its last seq; `follow(after=seq)` completes the history."""
    async with GatewayClient(gw.url) as client:
        task_id = await client.start_task("slow_build", {"steps": 10, "delay": 0.15})
        assert task_id is not None
        seen: list[Event] = []
        reached = asyncio.Event()

        def first_part(event: Event) -> None:
            seen.append(event)
            if event["seq"] == 5:
                reached.set()

        consumer = asyncio.create_task(client.follow(task_id, on_event=first_part))
        await asyncio.wait_for(reached.wait(), 30)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        last = seen[-1]["seq"]
        assert (await client.get_task(task_id))["result"]["status"] == "working", "the task must outlive the stream"

        returned = await client.follow(task_id, last, on_event=seen.append)
        reference = await full_history(gw.url, task_id)
        assert seen == reference, "the resumed history must equal the full one: no gap, no duplicate"
        assert returned == reference[-1]["seq"]


async def test_follow_reconnects_through_dropped_connections(gw: RunningGateway) -> None:
    """Connections reset under `follow`: it reconnects on the same session and resumes after the last seq."""
    link = FlakyLink("127.0.0.1", int(gw.base.rsplit(":", 1)[1]))
    port = await link.start()
    try:
        async with GatewayClient(f"http://127.0.0.1:{port}/mcp") as client:
            session = client.session_id
            task_id = await client.start_task("slow_build", {"steps": 8, "delay": 0.2})
            assert task_id is not None
            seen: list[Event] = []
            reconnects: list[int | None] = []

            def on_event(event: Event) -> None:
                seen.append(event)
                if event["seq"] in (3, 9):
                    link.cut()

            last = await client.follow(
                task_id,
                on_event=on_event,
                on_reconnect=lambda attempt, after, why: reconnects.append(after),
                backoff=0.05,
            )
            assert client.session_id == session, "the session was still valid: no new one"
        assert len(reconnects) >= 2, reconnects
        reference = await full_history(gw.url, task_id)
        assert seen == reference
        assert last == reference[-1]["seq"]
    finally:
        await link.close()


async def test_follow_opens_a_new_session_when_the_old_one_is_gone(gw: RunningGateway) -> None:
    link = FlakyLink("127.0.0.1", int(gw.base.rsplit(":", 1)[1]))
    port = await link.start()
    try:
        async with GatewayClient(f"http://127.0.0.1:{port}/mcp") as client, aiohttp.ClientSession() as http:
            old_session = client.session_id
            assert old_session is not None
            task_id = await client.start_task("slow_build", {"steps": 8, "delay": 0.2})
            assert task_id is not None
            seen: list[Event] = []
            deleted = False

            async def on_event(event: Event) -> None:
                nonlocal deleted
                seen.append(event)
                if event["seq"] == 4 and not deleted:
                    deleted = True
                    async with http.delete(gw.url, headers={"Mcp-Session-Id": old_session}) as response:
                        assert response.status == 200
                    link.cut()

            await client.follow(task_id, on_event=on_event, backoff=0.05)
            assert client.session_id not in (None, old_session), "a new session replaces the deleted one"
        assert seen == await full_history(gw.url, task_id)
    finally:
        await link.close()


async def test_events_gone_is_raised_never_skipped(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url) as client:
        task_id = await client.start_task("burst", {"n": 1000})
        assert task_id is not None
        assert (await client.task_result(task_id))["content"][0]["text"] == "sent 1000"

        with pytest.raises(EventsGone) as gone:
            async for _ in client.stream(task_id, after=0):
                pytest.fail("events after seq 0 are gone; nothing may be delivered")
        assert gone.value.code == -32010
        assert gone.value.data["reason"] == "events_gone"
        assert gone.value.task_id == task_id
        earliest = gone.value.earliest_seq
        assert earliest is not None and earliest > 1

        with pytest.raises(EventsGone):
            await client.follow(task_id, 0, on_event=lambda event: pytest.fail("follow must not skip"))

        events: list[Event] = []
        last = await client.follow(task_id, earliest - 1, on_event=events.append)
        assert seqs(events) == list(range(earliest, earliest + RETAINED))
        assert events[-1]["type"].endswith(TERMINAL_SUFFIX)
        assert last == events[-1]["seq"]

        # Without a cursor, the stream starts at the earliest retained event.
        unanchored = [event async for event in client.stream(task_id)]
        assert unanchored == events


async def test_modern_era(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url, era=Era.MODERN) as client:
        assert client.session_id is None
        assert await client.start_task("echo", {"text": "quick"}) is None, "a fast call answers with its result"
        plain = await client.call_tool("echo", {"text": "quick"})
        assert plain["content"][0]["text"] == "quick"

        task_id = await client.start_task("slow_build", {"steps": 6, "delay": 0.3})
        assert task_id is not None, "a call outliving 1 s becomes a task"
        stream = client.stream(task_id)
        events = [event async for event in stream]
        assert stream.result == {"resultType": "complete"}
        assert seqs(events) == list(range(len(events)))
        assert events[-1]["type"].endswith(TERMINAL_SUFFIX)
        task = (await client.get_task(task_id))["result"]
        assert task["status"] == "completed"
        assert (await client.task_result(task_id))["content"][0]["text"] == "built 6 steps"


# -- tail -----------------------------------------------------------------------------------------------


async def test_tail_json_is_a_gap_free_run(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url) as client:
        task_id = await client.start_task("slow_build", {"steps": 6, "delay": 0.2})
        assert task_id is not None
    code, out, err = await run_cli("tail", gw.url, task_id, "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events, err
    assert seqs(events) == list(range(len(events)))
    assert {event["taskId"] for event in events} == {task_id}
    assert events[-1]["type"].endswith(TERMINAL_SUFFIX)
    assert "completed" in err

    code, out, _ = await run_cli("tail", gw.url, task_id, "--json", "--after", "5")
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == events[6:]


async def test_tail_reconnects_on_its_own(gw: RunningGateway) -> None:
    link = FlakyLink("127.0.0.1", int(gw.base.rsplit(":", 1)[1]))
    port = await link.start()
    try:
        async with GatewayClient(gw.url) as client:
            # Long enough to be live when tail connects (its session has an upstream process to start).
            task_id = await client.start_task("slow_build", {"steps": 30, "delay": 0.2})
            assert task_id is not None
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "tail",
            f"http://127.0.0.1:{port}/mcp",
            task_id,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=ROOT,
        )
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        cut_at: list[int] = []
        async with asyncio.timeout(60):
            while raw := await proc.stdout.readline():
                lines.append(raw.decode())
                seq = json.loads(raw)["seq"]
                if (not cut_at and seq >= 4) or (len(cut_at) == 1 and seq >= cut_at[0] + 8):
                    link.cut()
                    cut_at.append(seq)
            err = (await proc.stderr.read()).decode()
            code = await proc.wait()
        assert code == 0, err
        assert len(cut_at) == 2
        assert "reconnecting after seq" in err, err
        events = [json.loads(line) for line in lines]
        assert seqs(events) == list(range(len(events))), "gap-free and without duplicates across reconnects"
        assert events[-1]["type"].endswith(TERMINAL_SUFFIX)
    finally:
        await link.close()


async def test_tail_exit_codes(gw: RunningGateway) -> None:
    code, out, err = await run_cli("tail", gw.url, "no-such-task")
    assert (code, out) == (2, "")
    assert "no such task" in err

    async with GatewayClient(gw.url) as client:
        failing = await client.start_task("slow_build", {"steps": "not a number"})
        burst = await client.start_task("burst", {"n": 1000})
        long = await client.start_task("slow_build", {"steps": 100, "delay": 0.1})
        assert failing and burst and long
        await client.task_result(burst)

        tails = asyncio.gather(
            run_cli("tail", gw.url, failing),
            run_cli("tail", gw.url, burst, "--after", "0"),
            run_cli("tail", gw.url, long, "--json"),
        )
        await asyncio.sleep(1.0)
        await client.cancel_task(long)
        (failed, _, failed_err), (gone, gone_out, gone_err), (cancelled, cancelled_out, cancelled_err) = await tails

        assert failed == 1, failed_err
        assert (gone, gone_out) == (4, ""), gone_err
        assert "events_gone" in gone_err and "earliest retained seq" in gone_err
        assert cancelled == 3, cancelled_err
        assert json.loads(cancelled_out.splitlines()[-1])["payload"]["status"] == "cancelled"


# -- demo -----------------------------------------------------------------------------------------------


async def test_demo_passes_every_step() -> None:
    code, out, err = await run_cli("demo", timeout=90)
    results = out[out.index("Results") :] if "Results" in out else out
    passes = [line for line in results.splitlines() if line.strip().startswith("PASS")]
    fails = [line for line in results.splitlines() if line.strip().startswith("FAIL")]
    assert code == 0, f"{out}\n{err}"
    assert len(passes) == 8 and not fails, out
    assert "all 8 steps passed" in out
