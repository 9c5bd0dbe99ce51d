"""Two gateway replicas on one Redis (issue 12, "Two replicas, one Redis"): real gateway processes, each in
front of its own example server, sharing the module's own `redis-server` under one key prefix, with
`[auth] mode = "api_key"` and two principals (hashed under the key the replicas share through Redis).

- A task created on replica A, its stream read in 100 cuts alternating between B and A (each resume on
  the other replica, with `after` = the last seq seen): the assembled history is gap-free, without
  duplicates, and equal to a late joiner's on either replica; in both eras.
- `tasks/list` answers the same on A and B for one principal; the other principal sees none of its tasks.
- `tasks/get` and `tasks/result` of a completed task are byte-identical from A and B.
- A task the upstream hosts (server-everything over HTTP), watched by A: B reads it from the stores.

Cross-replica cancel and owner takeover are tested with owner leases, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.client import GatewayClient
from tests import test_auth_api_key
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.redis_server import RedisServer, fresh_prefix
from tests.test_auth_api_key import TWO_KEYS
from tests.test_restart import raw_session, read_events, result_bytes
from tests.test_tasks_stream import EMPTY, create_task, stream, take
from tests.test_upstream_with_tasks import TOOL, http_upstream
from tests.wire import LEGACY, MODERN, Client, seqs, task_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

http_a = test_auth_api_key.http_a  # principal a's requests (to either replica)
http_b = test_auth_api_key.http_b  # principal b's

RESUMES = 100


def replica_config(url: str, prefix: str) -> str:
    return f'[store]\nkind = "redis"\nurl = "{url}"\nkey_prefix = "{prefix}"\n{TWO_KEYS}'


@contextlib.asynccontextmanager
async def together(*contexts: AbstractAsyncContextManager[RunningGateway]) -> AsyncIterator[list[RunningGateway]]:
    """Start gateways at once and stop them at once (a gateway takes seconds to stop)."""
    entered = await asyncio.gather(*(context.__aenter__() for context in contexts), return_exceptions=True)
    started = [context for context, got in zip(contexts, entered, strict=True) if isinstance(got, RunningGateway)]
    try:
        gateways = [got for got in entered if isinstance(got, RunningGateway)]
        for got in entered:
            if not isinstance(got, RunningGateway):
                raise got
        yield gateways
    finally:
        await asyncio.gather(*(context.__aexit__(None, None, None) for context in started))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    """Replicas A and B on the module's own redis-server, one key prefix, one principal key."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        # No principal_key_env: the replicas hash callers under the key the first one drew into Redis.
        config = replica_config(server.url, fresh_prefix())
        starting = [start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) for _ in "AB"]
        async with together(*starting) as (a, b):
            yield a, b
    finally:
        server.stop()


async def legacy_session(gateway: RunningGateway, http: aiohttp.ClientSession) -> Client:
    """A 2025-11-25 client with its session on one replica (sessions stay on the replica that holds them)."""
    client = Client(http, gateway.url, LEGACY)
    await client.initialize()
    return client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sessions_of_a(
    replicas: tuple[RunningGateway, RunningGateway], http_a: aiohttp.ClientSession
) -> AsyncIterator[tuple[Client, Client]]:
    """Principal a's legacy sessions on A and on B (a session costs its replica an upstream process)."""
    on_a, on_b = await asyncio.gather(*(legacy_session(gateway, http_a) for gateway in replicas))
    yield on_a, on_b
    for client in (on_a, on_b):
        await client.delete()


@pytest.fixture(params=[LEGACY, MODERN])
def clients_of_a(
    request: pytest.FixtureRequest,
    replicas: tuple[RunningGateway, RunningGateway],
    sessions_of_a: tuple[Client, Client],
    http_a: aiohttp.ClientSession,
) -> tuple[Client, Client]:
    """Principal a's clients of one era on A and on B."""
    if request.param == LEGACY:
        return sessions_of_a
    on_a, on_b = (Client(http_a, gateway.url, MODERN) for gateway in replicas)
    return on_a, on_b


def after_of(assembled: list[dict[str, Any]]) -> int | None:
    return assembled[-1]["seq"] if assembled else None


async def test_resumes_alternating_between_replicas_assemble_a_late_joiners_history(
    clients_of_a: tuple[Client, Client], sessions_of_a: tuple[Client, Client]
) -> None:
    """The task runs on A and emits ~200 events/s until cancelled after the last cut, so every cut hits a
    live stream; B's readers are woken by A's appends through Redis."""
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    creator = sessions_of_a[0]  # the task runs on A
    on_a, on_b = clients_of_a
    readers = (on_b, on_a)  # B first, then alternating
    async with asyncio.timeout(60):
        task_id = await create_task(creator, "slow_build", {"steps": 1_000_000, "delay": 0.01})
        assembled: list[dict[str, Any]] = []
        try:
            for cut in range(RESUMES):
                reader = readers[cut % 2]
                reply = await stream(reader, task_id, after=after_of(assembled))
                try:
                    messages = await take(reply, rng.randint(0, 5))
                    if rng.random() < 0.5:
                        await asyncio.sleep(rng.random() * 0.01)  # some cuts land mid-write
                finally:
                    reply.close()  # the client goes away mid-stream, without a word
                where = f"cut {cut} on {'AB'[(cut + 1) % 2]} (seed {seed})"
                assert not (messages and "error" in messages[-1]), f"{where}: {messages[-1]}"
                new = seqs(messages)
                assert new == list(range(len(assembled), len(assembled) + len(new))), (
                    f"{where}: after {after_of(assembled)} came {new}"
                )
                assembled += task_events(messages)
        finally:
            await creator.result("tasks/cancel", {"taskId": task_id})  # on the owner
        rest = await (await stream(on_b, task_id, after=after_of(assembled))).rest()
        assert rest.final["result"] == EMPTY[on_b.era], (seed, rest.final)
        assembled += task_events(rest.messages)

        for late in clients_of_a:
            replay = task_events((await (await stream(late, task_id)).rest()).messages)
            assert assembled == replay, f"seed {seed}: the assembled history differs from a late joiner's on {late.url}"
        assert [event["seq"] for event in assembled] == list(range(len(assembled))), f"seed {seed}"
        assert len(assembled) > RESUMES, f"seed {seed}: only {len(assembled)} events"  # the cuts fell among live events
        assert assembled[-1]["type"].endswith(".task.terminal"), assembled[-2:]
        assert assembled[-2]["payload"]["status"] == "cancelled", assembled[-2:]


async def listed(client: Client) -> list[dict[str, Any]]:
    """Every task `tasks/list` shows the client, following `nextCursor`."""
    tasks: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        result = await client.result("tasks/list", {"cursor": cursor} if cursor is not None else {})
        tasks += result["tasks"]
        cursor = result.get("nextCursor")
        if cursor is None:
            return tasks


async def test_tasks_list_is_the_same_on_both_replicas_and_per_principal(
    replicas: tuple[RunningGateway, RunningGateway], sessions_of_a: tuple[Client, Client], http_b: aiohttp.ClientSession
) -> None:
    a_on_a, a_on_b = sessions_of_a
    async with asyncio.timeout(30):
        created = [await create_task(a_on_a, "echo", {"text": f"on A {i}"}) for i in range(2)]
        created.append(await create_task(a_on_b, "echo", {"text": "on B"}))
        for task_id in created:  # ended, so no status changes between the two lists
            await a_on_a.result("tasks/result", {"taskId": task_id})

        seen_on_a, seen_on_b = await listed(a_on_a), await listed(a_on_b)
        assert seen_on_a == seen_on_b
        assert set(created) <= {task["taskId"] for task in seen_on_a}, (created, seen_on_a)

        for other in await asyncio.gather(*(legacy_session(gateway, http_b) for gateway in replicas)):
            assert await listed(other) == [], f"principal b sees a's tasks on {other.url}"
            await other.delete()


async def raw_answer(client: Client, method: str, task_id: str) -> tuple[int, bytes]:
    """The status and the JSON-RPC body of the answer to `method`, as the bytes the replica sent."""
    reply = await client.send(client.message(method, {"taskId": task_id}, request_id=7))
    try:
        body = await reply.response.read()
    finally:
        reply.close()
    assert reply.status == 200 and not reply.is_sse, (method, reply.status, body)
    return reply.status, body


async def test_get_and_result_of_a_completed_task_are_byte_identical_on_both_replicas(
    clients_of_a: tuple[Client, Client], sessions_of_a: tuple[Client, Client]
) -> None:
    creator = sessions_of_a[0]
    on_a, on_b = clients_of_a
    async with asyncio.timeout(30):
        task_id = await create_task(creator, "slow_build", {"steps": 3, "delay": 0.01})
        result = await creator.result("tasks/result", {"taskId": task_id})
        assert result["content"] == [{"type": "text", "text": "built 3 steps"}], result
        for method in ("tasks/get", "tasks/result") if on_a.era == LEGACY else ("tasks/get",):
            from_a, from_b = await raw_answer(on_a, method, task_id), await raw_answer(on_b, method, task_id)
            assert from_a == from_b, (method, from_a, from_b)
            assert b'"error"' not in from_a[1] and task_id.encode() in from_a[1], (method, from_a)


# -- a task the upstream hosts, watched by A, read on B ----------------------------------------------


async def test_a_pass_through_task_watched_by_a_reads_on_b_from_the_stores(tmp_path: Path) -> None:
    """server-everything over HTTP hosts the task and replica A watches it: B answers tasks/get, streams
    its events live to the end and answers tasks/result with A's bytes, from the stores; B refuses a
    cancel of the running task, which only A's upstream conversation can carry out, with task_elsewhere
    rather than an unknown id."""
    server = RedisServer(tmp_path / "redis")
    server.directory.mkdir()
    server.start()
    try:
        config = f'[store]\nkind = "redis"\nurl = "{server.url}"\nkey_prefix = "{fresh_prefix()}"\n'
        async with (
            asyncio.timeout(90),
            http_upstream(tmp_path) as (upstream_url, _),
            together(*(start_gateway(upstream_url=upstream_url, config_text=config) for _ in "AB")) as (a, b),
        ):
            async with raw_session(a.url) as on_a:
                created = await on_a.result(
                    "tools/call", {"name": TOOL, "arguments": {"topic": "replicas"}, "task": {"ttl": 60000}}
                )
            task_id = created["task"]["taskId"]
            async with raw_session(b.url) as on_b:
                seen = await on_b.result("tasks/get", {"taskId": task_id})
                # The research query runs for seconds: still working while B is asked.
                assert seen["taskId"] == task_id and seen["status"] == "working", seen
                refused = await on_b.request("tasks/cancel", {"taskId": task_id})
                error = refused.messages[-1]["error"]
                assert error["code"] == -32603 and error["data"]["reason"] == "task_elsewhere", error
            async with GatewayClient(b.url) as client:
                events = await read_events(client, task_id, None, None)
            assert [event["seq"] for event in events] == list(range(len(events)))
            assert events[-2]["payload"]["status"] == "completed", events[-2:]
            assert await result_bytes(b.url, task_id) == await result_bytes(a.url, task_id)
    finally:
        server.stop()
