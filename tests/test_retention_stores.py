"""Retention through a real gateway process on each durable store (issue 12's retention acceptance).

The gateway (`python -m gateway serve`) runs on SQLite, or on Redis (a `redis-server` the tests start,
`tests/redis_server.py`, each test with key prefix of its own), in front of the example server on
stdio, with small `[retention]` limits. What must hold on both:

* count trim: a `tasks/stream` with an `after` before the last `max_events_per_task` events answers
  `events_gone` with `earliestSeq` exactly the first of them, and a stream from there is gap-free;
* age trim: once a task's first events are older than `max_event_age_s`, `events_gone` names exactly
  the first event younger than that (events come in bursts seconds apart, so which ones are past
  their age is known);
* terminal retention (`terminal_retention_s` after the task ended), as each store documents it
  (docs/gateway.md, "Stores"): on SQLite the log is deleted (its tombstone keeps the next seq: a
  stream from before it answers `events_gone` with that seq) while the record and its result answer
  until the TTL; on Redis the record, its result and its events go together and the id reads as
  unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.client import GatewayClient
from gateway.client.stream import EventsGone, JsonRpcError
from gateway.protocol import jsonrpc
from tests.conftest import EXAMPLE_SERVER, start_gateway
from tests.redis_server import fresh_prefix, shared_redis_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0
"""Seconds any one phase may take."""
MAX_EVENTS = 20
MAX_AGE_S = 3.0
BURST_GAP_S = 2.0
"""The pause between a `slow_build`'s bursts of events: its `delay` per step."""
RETENTION = (
    f"[retention]\nmax_events_per_task = {MAX_EVENTS}\nmax_event_age_s = {MAX_AGE_S}\nterminal_retention_s = 1.5\n"
)


def store_config(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f'[store]\nkind = "sqlite"\npath = "{tmp_path / "gateway.db"}"\n'
    return f'[store]\nkind = "redis"\nurl = "{shared_redis_url()}"\nkey_prefix = "{fresh_prefix()}"\n'


@dataclass(frozen=True)
class Served:
    store_kind: str
    url: str


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["sqlite", "redis"])
async def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """One gateway per store for the module's tests (each test's tasks are its own)."""
    config = store_config(request.param, tmp_path_factory.mktemp("retention")) + RETENTION
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gateway:
        yield Served(request.param, gateway.url)


@pytest_asyncio.fixture(loop_scope="module")
async def client(served: Served) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(served.url) as client:
        yield client


async def follow(client: GatewayClient, task_id: str) -> list[tuple[float, dict[str, Any]]]:
    """Every event of the task from its first to its end, each with when it arrived."""
    events: list[tuple[float, dict[str, Any]]] = []
    async with asyncio.timeout(WAIT):
        await client.follow(task_id, on_event=lambda event: events.append((time.monotonic(), event)))
    assert [event["seq"] for _, event in events] == list(range(len(events)))
    return events


async def events_gone(client: GatewayClient, task_id: str, after: int) -> int:
    """The `earliestSeq` of the `events_gone` a stream from `after` answers (failing if it streams)."""
    with pytest.raises(EventsGone) as gone:
        async with asyncio.timeout(WAIT), client.stream(task_id, after=after) as stream:
            async for event in stream:
                raise AssertionError(f"streamed {event} instead of events_gone")
    assert gone.value.earliest_seq is not None
    return gone.value.earliest_seq


async def seqs_from(client: GatewayClient, task_id: str, after: int | None) -> list[int]:
    async with asyncio.timeout(WAIT), client.stream(task_id, after=after) as stream:
        return [event["seq"] async for event in stream]


async def test_a_count_trim_answers_events_gone_with_the_first_of_the_last_events(client: GatewayClient) -> None:
    task_id = await client.start_task("slow_build", {"steps": 30, "delay": 0}, ttl_ms=60_000)
    assert task_id is not None
    await client.request("tasks/result", {"taskId": task_id})  # to its end, without streaming it
    retained = await seqs_from(client, task_id, None)
    assert len(retained) == MAX_EVENTS and retained[-1] >= 2 * MAX_EVENTS  # far more events than retained
    earliest, last = retained[0], retained[-1]
    assert earliest == last + 1 - MAX_EVENTS
    assert await events_gone(client, task_id, 0) == earliest
    assert await events_gone(client, task_id, earliest - 2) == earliest
    assert await seqs_from(client, task_id, earliest - 1) == retained


async def test_an_age_trim_answers_events_gone_with_the_first_event_younger_than_the_age(
    client: GatewayClient,
) -> None:
    # Bursts of events at 0 s, 2 s and 4 s; at its end (4 s) the first burst is past the 3 s age.
    task_id = await client.start_task("slow_build", {"steps": 2, "delay": BURST_GAP_S}, ttl_ms=60_000)
    assert task_id is not None
    events = await follow(client, task_id)
    bursts = [0] + [i for i in range(1, len(events)) if events[i][0] - events[i - 1][0] > BURST_GAP_S / 2]
    assert len(bursts) == 3, [(round(at - events[0][0], 2), event["seq"]) for at, event in events]
    second_burst = events[bursts[1]][1]["seq"]
    assert await events_gone(client, task_id, 0) == second_burst
    streamed = await seqs_from(client, task_id, second_burst - 1)
    assert streamed == list(range(second_burst, len(events)))


async def test_terminal_retention_ends_as_the_store_documents(client: GatewayClient, served: Served) -> None:
    task_id = await client.start_task("slow_build", {"steps": 1, "delay": 0}, ttl_ms=60_000)
    assert task_id is not None
    next_seq = len(await follow(client, task_id))
    result = await client.request("tasks/result", {"taskId": task_id})
    async with asyncio.timeout(WAIT):
        while True:  # until the retention (1.5 s) has ended and the sweep (every second) has run
            try:
                await seqs_from(client, task_id, 0)
            except JsonRpcError as error:
                gone = error
                break
            await asyncio.sleep(0.2)
    if served.store_kind == "sqlite":
        # The log's tombstone keeps its next seq (none is reused); the record and result stay until the TTL.
        assert isinstance(gone, EventsGone) and gone.earliest_seq == next_seq
        assert await seqs_from(client, task_id, next_seq - 1) == []
        assert (await client.get_task(task_id))["result"]["status"] == "completed"
        assert (await client.request("tasks/result", {"taskId": task_id}))["result"] == result["result"]
    else:
        # Redis: the record, its result and its events expire together; the id reads as unknown.
        assert not isinstance(gone, EventsGone) and gone.code == jsonrpc.INVALID_PARAMS
        for method in ("tasks/get", "tasks/result"):
            with pytest.raises(JsonRpcError) as unknown:
                await client.request(method, {"taskId": task_id})
            assert unknown.value.code == jsonrpc.INVALID_PARAMS, method
