"""Redis store outages and resets (issue 24): nothing stuck, nothing silent.

Real processes: the test's own `redis-server`, two gateway replicas (A and B, each with the example
server on stdio) on it under one key prefix, a hosted `slow_build` task running on A, and a
`tasks/stream` reader of it on each replica. Then the server goes away in four ways:

- (a) `SHUTDOWN SAVE` and a restart with its data: the task completes, both streams are gap-free to
  the terminal event;
- (d) `SIGSTOP` for a few seconds, then `SIGCONT`: as (a);
- (b) `SHUTDOWN SAVE`, and the restart only after A gave up holding the task's writes
  (`outage_hold_s`): the task ends `failed` (`store_unavailable`), and both streams end with it;
- (c) a restart empty: both streams end with a `store_reset` error, and the task is unknown.

During each outage `tasks/get` is 503 with `Retry-After` and `data.reason` "store_unavailable",
`/readyz` says the store is down, and a plain `tools/call` still answers. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from gateway.client import GatewayClient
from gateway.client.stream import JsonRpcError
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.redis_server import RedisServer, fresh_prefix
from tests.test_redis_replicas import together
from tests.test_restart import kind, raw_session

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 60.0
"""Seconds any one phase may take."""
HOLD_S = 20.0
"""The replicas' `outage_hold_s`: how long A holds a running task's writes before failing it."""
LONG_BUILD = {"steps": 450, "delay": 0.1}
"""A task that outlives every outage here (45 s)."""
LEASE_TTL_S = 60.0
"""Longer than any outage here: no replica takes the other's task over."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[RedisServer, RunningGateway, RunningGateway]]:
    redis = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    redis.start()
    try:
        config = redis.gateway_config(fresh_prefix(), LEASE_TTL_S) + f"timeout_s = 1.0\noutage_hold_s = {HOLD_S}\n"
        async with together(*(start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) for _ in "AB")) as (
            a,
            b,
        ):
            yield redis, a, b
    finally:
        redis.stop()


def redis_command(server: RedisServer, *words: str) -> None:
    """Send one command and do not wait for an answer (SHUTDOWN closes the connection)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"".join([b"*%d\r\n" % len(words), *(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words)]))
        with contextlib.suppress(OSError):
            sock.recv(64)


def shut_down(server: RedisServer, how: str) -> None:
    """`SHUTDOWN SAVE` (its data kept in dump.rdb) or `SHUTDOWN NOSAVE`, waited for."""
    process = server.process
    assert process is not None
    redis_command(server, "SHUTDOWN", how)
    process.wait(timeout=WAIT)
    server.process = None


class Reader:
    """A `tasks/stream` of the task on one replica, read to its end in the background."""

    def __init__(self, gw: RunningGateway, task_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.error: JsonRpcError | None = None
        self.first = asyncio.Event()
        self.done = asyncio.create_task(self._read(gw, task_id))

    async def _read(self, gw: RunningGateway, task_id: str) -> None:
        async with GatewayClient(gw.url) as client, client.stream(task_id) as stream:
            try:
                async for event in stream:
                    self.events.append(event)
                    self.first.set()
            except JsonRpcError as error:
                self.error = error

    async def ended(self) -> None:
        async with asyncio.timeout(WAIT):
            await self.done

    def seqs(self) -> list[int]:
        return [event["seq"] for event in self.events]


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not await check():  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT:g} s: {what}") from None


@contextlib.asynccontextmanager
async def running_task(a: RunningGateway, b: RunningGateway) -> AsyncIterator[tuple[str, Reader, Reader]]:
    """A slow_build on A, read on A and on B (each reader has its first event)."""
    async with GatewayClient(a.url) as client:
        task_id = await client.start_task("slow_build", LONG_BUILD)
    assert task_id is not None
    readers = (Reader(a, task_id), Reader(b, task_id))
    try:
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*(reader.first.wait() for reader in readers))
        yield task_id, *readers
    finally:
        for reader in readers:
            reader.done.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader.done


async def get_raw(gw: RunningGateway, task_id: str) -> tuple[int, str | None, dict[str, Any]]:
    """tasks/get: HTTP status, Retry-After and the JSON-RPC message."""
    async with raw_session(gw.url) as client:
        message = client.message("tasks/get", {"taskId": task_id})
        async with client.http.post(gw.url, data=orjson.dumps(message), headers=client.headers(message)) as response:
            return response.status, response.headers.get("Retry-After"), orjson.loads(await response.read())


async def check_outage_answers(gw: RunningGateway, task_id: str) -> None:
    """While the store is down: tasks/get 503 store_unavailable with Retry-After, /readyz 503 store
    down, and a plain call answered."""
    status, retry_after, answer = await get_raw(gw, task_id)
    assert status == 503 and retry_after is not None, (status, answer)
    assert answer["error"]["data"]["reason"] == "store_unavailable", answer
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/readyz") as response:
        assert response.status == 503 and (await response.json())["store"] == "down"
    async with GatewayClient(gw.url) as client:
        echoed = await client.call_tool("echo", {"text": "still here"})
    assert echoed["content"][0]["text"] == "still here", echoed


def assert_ends(reader: Reader, status: str) -> dict[str, Any]:
    """The reader got a gap-free run of events ending with the task's terminal status; that status event."""
    seqs = reader.seqs()
    assert reader.error is None, reader.error
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert [kind(event) for event in reader.events[-2:]] == ["task.status", "task.terminal"]
    status_event = reader.events[-2]["payload"]
    assert status_event["status"] == status, status_event
    return status_event


async def final_status(gw: RunningGateway, task_id: str) -> str:
    async with GatewayClient(gw.url) as client:
        status: str = (await client.get_task(task_id))["result"]["status"]
        return status


async def test_a_restart_with_the_data_loses_nothing(setup: tuple[RedisServer, RunningGateway, RunningGateway]) -> None:
    redis, a, b = setup
    async with running_task(a, b) as (task_id, on_a, on_b):
        shut_down(redis, "SAVE")
        await asyncio.gather(check_outage_answers(a, task_id), check_outage_answers(b, task_id))
        redis.start()
        await on_a.ended()
        await on_b.ended()
    assert_ends(on_a, "completed")
    assert_ends(on_b, "completed")
    assert on_a.events[-1] == on_b.events[-1]
    assert await final_status(b, task_id) == "completed"


async def test_a_paused_server_loses_nothing(setup: tuple[RedisServer, RunningGateway, RunningGateway]) -> None:
    redis, a, b = setup
    assert redis.process is not None
    async with running_task(a, b) as (task_id, on_a, on_b):
        os.kill(redis.process.pid, signal.SIGSTOP)
        try:
            await asyncio.gather(check_outage_answers(a, task_id), check_outage_answers(b, task_id))
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        await on_a.ended()
        await on_b.ended()
    assert_ends(on_a, "completed")
    assert_ends(on_b, "completed")
    assert on_a.seqs() == sorted(set(on_a.seqs()))  # no event twice
    assert await final_status(a, task_id) == "completed"


async def failed_for_store(gw: RunningGateway) -> float:
    """A's count of tasks it failed because the store could not take their writes in time."""
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith('mcp_gateway_tasks_failed_by_gateway_total{reason="store_unavailable"}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_restart_after_the_hold_fails_the_task_and_both_streams_say_so(
    setup: tuple[RedisServer, RunningGateway, RunningGateway],
) -> None:
    redis, a, b = setup
    before = await failed_for_store(a)
    async with running_task(a, b) as (task_id, on_a, on_b):
        shut_down(redis, "SAVE")
        await check_outage_answers(a, task_id)

        async def given_up() -> bool:
            return await failed_for_store(a) > before

        await until("A fails the task it cannot hold", given_up)
        redis.start()
        await on_a.ended()
        await on_b.ended()
    for reader in (on_a, on_b):
        assert assert_ends(reader, "failed")["reason"] == "store_unavailable"
    async with GatewayClient(b.url) as client:
        assert (await client.get_task(task_id))["result"]["status"] == "failed"
        with pytest.raises(JsonRpcError) as failed:
            await client.task_result(task_id)
    assert failed.value.data["reason"] == "store_unavailable"
    assert "task failed" in a.output_text()


async def test_a_restart_empty_ends_both_streams_with_store_reset(
    setup: tuple[RedisServer, RunningGateway, RunningGateway],
) -> None:
    redis, a, b = setup
    async with running_task(a, b) as (task_id, on_a, on_b):
        shut_down(redis, "NOSAVE")
        (redis.directory / "dump.rdb").unlink(missing_ok=True)
        redis.start()
        await on_a.ended()
        await on_b.ended()
    for reader in (on_a, on_b):
        assert reader.error is not None and reader.error.data["reason"] == "store_reset", reader.events[-2:]
        assert "task.terminal" not in [kind(event) for event in reader.events]
    async with GatewayClient(a.url) as client:
        with pytest.raises(JsonRpcError) as unknown:
            await client.get_task(task_id)
    assert unknown.value.code == -32602
    for gw in (a, b):
        assert "data set under this key prefix was replaced" in gw.output_text()
