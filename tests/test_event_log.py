"""Contract tests for the retained per-task event log (``gateway.events.log``).

Every store runs the same suite: the ``store_factory`` fixture is parametrized over ``STORES``, and
``event_log`` / ``make_event_log`` build stores from it. Adding a Redis or SQLite store is one more
``pytest.param`` in ``STORES`` (with a skip mark when its server is unavailable); nothing else changes.

The suite covers SEP-2694's numbering (seq from 0, +1 exactly, exclusive ``after``), per-task retention
by count and by age with an injected clock (at append, and on read of an idle log), sealing, tombstones
left by ``delete`` (a seq is never reused), ``wait`` (immediate, wake-all, timeout, seal, delete),
independence of many concurrent cursors, and a Hypothesis state machine that checks every step against a
dict model and checks that a cursor either continues at exactly ``c + 1`` or sees a first seq that reveals
``events_gone``. A few tests at the end are specific to the in-memory store's internals (bounded memory,
no leaks).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gateway.events.log import EventLog, LogBounds, LogSealed, MemoryEventLog, StoredEvent
from gateway.stores.redis import RedisBackend, RedisEventLog
from gateway.stores.sqlite import SqliteDatabase
from gateway.stores.sqlite_log import SqliteEventLog
from tests.conftest import fresh_sqlite_file
from tests.redis_server import fresh_prefix, shared_redis_url

Clock = Callable[[], float]
T = TypeVar("T")


class StoreFactory(Protocol):
    def __call__(
        self, *, max_events_per_task: int, clock: Clock, max_event_age_s: float, tombstone_ttl_s: float
    ) -> EventLog: ...


class FakeClock:
    """An injectable clock that only moves when told to."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _memory_store(
    *, max_events_per_task: int, clock: Clock, max_event_age_s: float, tombstone_ttl_s: float
) -> EventLog:
    return MemoryEventLog(max_events_per_task, clock, max_event_age_s=max_event_age_s, tombstone_ttl_s=tombstone_ttl_s)


def _sqlite_store(
    *, max_events_per_task: int, clock: Clock, max_event_age_s: float, tombstone_ttl_s: float
) -> EventLog:
    return SqliteEventLog(
        SqliteDatabase(fresh_sqlite_file()),
        max_events_per_task,
        clock,
        max_event_age_s=max_event_age_s,
        tombstone_ttl_s=tombstone_ttl_s,
    )


def _redis_store(*, max_events_per_task: int, clock: Clock, max_event_age_s: float, tombstone_ttl_s: float) -> EventLog:
    backend = RedisBackend(shared_redis_url(), fresh_prefix())
    return RedisEventLog(
        backend, max_events_per_task, clock, max_event_age_s=max_event_age_s, tombstone_ttl_s=tombstone_ttl_s
    )


STORES = [
    pytest.param(_memory_store, id="memory"),
    pytest.param(_sqlite_store, id="sqlite"),
    pytest.param(_redis_store, id="redis"),
]

DEFAULT_MAX_EVENTS = 100_000
DEFAULT_TOMBSTONE_TTL_S = 3600.0


@pytest.fixture(params=STORES)
def store_factory(request: pytest.FixtureRequest, sqlite_directory: Path) -> StoreFactory:
    factory: StoreFactory = request.param
    return factory


@pytest.fixture
async def make_event_log(store_factory: StoreFactory) -> AsyncIterator[Callable[..., EventLog]]:
    """Build stores with chosen limits and clock; every store built is closed after the test."""
    built: list[EventLog] = []

    def make(
        *,
        max_events_per_task: int = DEFAULT_MAX_EVENTS,
        clock: Clock | None = None,
        max_event_age_s: float = math.inf,
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
    ) -> EventLog:
        log = store_factory(
            max_events_per_task=max_events_per_task,
            clock=clock or FakeClock(),
            max_event_age_s=max_event_age_s,
            tombstone_ttl_s=tombstone_ttl_s,
        )
        built.append(log)
        return log

    yield make
    for log in built:
        await log.close()


@pytest.fixture
async def event_log(make_event_log: Callable[..., EventLog]) -> EventLog:
    return make_event_log()


def body(task: str, seq: int) -> bytes:
    return f'{{"task":"{task}","n":{seq}}}'.encode()


def seqs(events: list[StoredEvent]) -> list[int]:
    return [e.seq for e in events]


# ------------------------------------------------------------------------------------------ numbering


async def test_first_seq_is_zero_and_batches_are_contiguous(event_log: EventLog) -> None:
    assert await event_log.append("t", [body("t", 0)]) == 0
    assert await event_log.append("t", [body("t", i) for i in range(1, 4)]) == 1
    assert await event_log.append("t", [body("t", 4)]) == 4
    assert await event_log.append("t", [body("t", i) for i in range(5, 69)]) == 5
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=69)
    events = await event_log.read("t", -1, 1000)
    assert seqs(events) == list(range(69))
    assert [e.body for e in events] == [body("t", i) for i in range(69)]


async def test_seqs_are_independent_per_task(event_log: EventLog) -> None:
    ids = ["a", "b", "task_with_underscore", "x:y/z", "ünï-cødé ✓"]
    for round_ in range(3):
        for task in ids:
            assert await event_log.append(task, [body(task, round_ * 2), body(task, round_ * 2 + 1)]) == round_ * 2
    for task in ids:
        events = await event_log.read(task, -1, 100)
        assert seqs(events) == list(range(6))
        assert [e.body for e in events] == [body(task, i) for i in range(6)]


async def test_empty_batch_creates_log_and_returns_next_seq(event_log: EventLog) -> None:
    assert await event_log.append("t", []) == 0
    assert await event_log.bounds("t") == LogBounds(earliest=None, next_seq=0)
    await event_log.append("t", [b"x", b"y"])
    assert await event_log.append("t", []) == 2
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2)


async def test_create_is_idempotent_and_empty(event_log: EventLog) -> None:
    assert await event_log.bounds("t") is None
    await event_log.create("t")
    assert await event_log.bounds("t") == LogBounds(earliest=None, next_seq=0)
    await event_log.append("t", [b"a"])
    await event_log.create("t")
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=1)
    assert seqs(await event_log.read("t", -1, 10)) == [0]


async def test_bodies_are_byte_exact(event_log: EventLog) -> None:
    tricky = [b"", b"\n\n", b"data: x\r\n\r\n", b"\x00\xff\xfe", '{"t":"✓"}'.encode(), b"x" * 70_000]
    await event_log.append("t", tricky)
    assert [e.body for e in await event_log.read("t", -1, 100)] == tricky


async def test_same_instant_events_keep_insertion_order(make_event_log: Callable[..., EventLog]) -> None:
    log = make_event_log(clock=FakeClock(5.0))
    for i in range(150):
        await log.append("t", [body("t", i)])
    events = await log.read("t", -1, 1000)
    assert [e.body for e in events] == [body("t", i) for i in range(150)]
    assert {e.created for e in events} == {5.0}


async def test_created_never_decreases_within_a_task(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(100.0)
    log = make_event_log(clock=clock)
    await log.append("t", [b"a"])
    clock.now = 90.0  # the wall clock stepped back
    await log.append("t", [b"b"])
    clock.now = 120.0
    await log.append("t", [b"c"])
    assert [e.created for e in await log.read("t", -1, 10)] == [100.0, 100.0, 120.0]


# ------------------------------------------------------------------------------------------ reading


async def test_read_after_n_starts_at_n_plus_one(event_log: EventLog) -> None:
    await event_log.append("t", [body("t", i) for i in range(50)])
    for after in range(-1, 50):
        for limit in (1, 3, 50, 1000):
            events = await event_log.read("t", after, limit)
            expected = list(range(after + 1, min(after + 1 + limit, 50)))
            assert seqs(events) == expected
            assert [e.body for e in events] == [body("t", s) for s in expected]


async def test_read_after_last_or_beyond_is_empty(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b", b"c"])
    assert await event_log.read("t", 2, 100) == []
    assert await event_log.read("t", 3, 100) == []
    assert await event_log.read("t", 10**9, 100) == []


async def test_read_unknown_task_or_zero_limit_is_empty(event_log: EventLog) -> None:
    assert await event_log.read("nope", -1, 100) == []
    await event_log.append("t", [b"a"])
    assert await event_log.read("t", -1, 0) == []
    assert await event_log.read("other", -1, 100) == []


async def test_paging_with_a_cursor_sees_everything_once(event_log: EventLog) -> None:
    await event_log.append("t", [body("t", i) for i in range(1000)])
    cursor, got = -1, []
    while page := await event_log.read("t", cursor, 37):
        assert page[0].seq == cursor + 1
        got.extend(page)
        cursor = page[-1].seq
    assert seqs(got) == list(range(1000))


# ------------------------------------------------------------------------------------------ retention


async def test_max_events_drops_the_oldest(make_event_log: Callable[..., EventLog]) -> None:
    log = make_event_log(max_events_per_task=10)
    await log.append("t", [body("t", i) for i in range(7)])
    assert await log.bounds("t") == LogBounds(earliest=0, next_seq=7)
    await log.append("t", [body("t", i) for i in range(7, 12)])
    assert await log.bounds("t") == LogBounds(earliest=2, next_seq=12)
    for i in range(12, 40):
        await log.append("t", [body("t", i)])
        assert await log.bounds("t") == LogBounds(earliest=i - 9, next_seq=i + 1)
    events = await log.read("t", -1, 100)
    assert seqs(events) == list(range(30, 40))
    assert [e.body for e in events] == [body("t", i) for i in range(30, 40)]


async def test_batch_larger_than_max_events(make_event_log: Callable[..., EventLog]) -> None:
    log = make_event_log(max_events_per_task=4)
    assert await log.append("t", [body("t", i) for i in range(10)]) == 0
    assert await log.bounds("t") == LogBounds(earliest=6, next_seq=10)
    assert await log.append("t", [body("t", 10)]) == 10
    assert seqs(await log.read("t", -1, 100)) == [7, 8, 9, 10]


async def test_trimmed_cursor_reveals_the_gap(make_event_log: Callable[..., EventLog]) -> None:
    """A cursor behind ``earliest`` gets a run starting at ``earliest``: the caller answers events_gone."""
    log = make_event_log(max_events_per_task=5)
    await log.append("t", [body("t", i) for i in range(20)])
    bounds = await log.bounds("t")
    assert bounds == LogBounds(earliest=15, next_seq=20)
    for after in (-1, 0, 13):
        events = await log.read("t", after, 100)
        assert events[0].seq == 15 > after + 1
        assert seqs(events) == list(range(15, 20))
    # resuming at earliest - 1 is gap-free
    assert seqs(await log.read("t", 14, 100)) == list(range(15, 20))


async def test_max_events_is_per_task(make_event_log: Callable[..., EventLog]) -> None:
    log = make_event_log(max_events_per_task=3)
    await log.append("a", [b"1", b"2", b"3", b"4"])
    await log.append("b", [b"1"])
    assert await log.bounds("a") == LogBounds(earliest=1, next_seq=4)
    assert await log.bounds("b") == LogBounds(earliest=0, next_seq=1)


async def test_max_event_age_trims_the_appended_task_by_the_injected_clock(
    make_event_log: Callable[..., EventLog],
) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_event_age_s=10.0)
    await log.append("a", [b"a0", b"a1", b"a2"])  # created 0
    await log.append("b", [b"b0"])  # created 0
    clock.now = 10.0
    await log.append("a", [b"a3", b"a4"])  # created 10: a0-a2 are 10 s old, not older: kept
    assert await log.bounds("a") == LogBounds(earliest=0, next_seq=5)
    clock.now = 15.0
    await log.append("a", [b"a5"])  # created 15: a0-a2 are older than 10 s now
    assert await log.read("a", -1, 10) == [
        StoredEvent(seq=3, created=10.0, body=b"a3"),
        StoredEvent(seq=4, created=10.0, body=b"a4"),
        StoredEvent(seq=5, created=15.0, body=b"a5"),
    ]
    assert await log.bounds("a") == LogBounds(earliest=3, next_seq=6)
    clock.now = 25.5
    await log.append("a", [b"a6"])  # a3-a5 are older than 10 s
    assert seqs(await log.read("a", -1, 10)) == [6]
    assert await log.bounds("a") == LogBounds(earliest=6, next_seq=7)


async def test_max_event_age_holds_for_an_idle_log_when_it_is_read(make_event_log: Callable[..., EventLog]) -> None:
    """A task that stops appending still never hands out an event older than the age (nothing sweeps)."""
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_event_age_s=10.0)
    await log.append("idle", [b"i0", b"i1"])
    clock.now = 5.0
    await log.append("idle", [b"i2"])
    clock.now = 12.0
    assert seqs(await log.read("idle", -1, 10)) == [2]
    assert await log.bounds("idle") == LogBounds(earliest=2, next_seq=3)
    clock.now = 100.0
    assert await log.bounds("idle") == LogBounds(earliest=None, next_seq=3)
    assert await log.read("idle", -1, 10) == []
    assert await log.read("idle", 1, 10) == []
    # numbering continues after everything was trimmed
    assert await log.append("idle", [b"i3"]) == 3
    assert await log.bounds("idle") == LogBounds(earliest=3, next_seq=4)
    assert seqs(await log.read("idle", 0, 10)) == [3]


async def test_age_trimming_is_per_task(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_event_age_s=10.0)
    await log.append("old", [b"o0"])
    clock.now = 8.0
    await log.append("young", [b"y0"])
    clock.now = 12.0
    assert await log.bounds("old") == LogBounds(earliest=None, next_seq=1)
    assert await log.bounds("young") == LogBounds(earliest=0, next_seq=1)


async def test_count_and_age_trim_together(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_events_per_task=3, max_event_age_s=10.0)
    await log.append("t", [b"0", b"1"])
    clock.now = 6.0
    await log.append("t", [b"2", b"3"])  # the count drops seq 0
    assert await log.bounds("t") == LogBounds(earliest=1, next_seq=4)
    clock.now = 11.0
    await log.append("t", [b"4"])  # the count drops seq 1, the age nothing more (2-3 are 5 s old)
    assert seqs(await log.read("t", -1, 10)) == [2, 3, 4]
    clock.now = 16.5
    assert seqs(await log.read("t", -1, 10)) == [4]  # 2-3 are now 10.5 s old


async def test_trim_on_empty_and_created_logs(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_event_age_s=1.0)
    await log.create("t")
    clock.now = 100.0
    assert await log.bounds("t") == LogBounds(earliest=None, next_seq=0)
    assert await log.append("t", []) == 0
    assert await log.bounds("t") == LogBounds(earliest=None, next_seq=0)


# ------------------------------------------------------------------------------------------ seal


async def test_seal_ends_the_log(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b"])
    await event_log.seal("t")
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2, sealed=True)
    with pytest.raises(LogSealed):
        await event_log.append("t", [b"late"])
    with pytest.raises(LogSealed):
        await event_log.append("t", [], seal=True)
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2, sealed=True)
    assert seqs(await event_log.read("t", -1, 10)) == [0, 1]
    await event_log.seal("t")  # idempotent
    await event_log.create("t")  # a no-op: it stays sealed
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2, sealed=True)
    assert await event_log.bounds("other") is None  # per task


async def test_append_can_seal_in_the_same_call(event_log: EventLog) -> None:
    await event_log.create("t")
    assert await event_log.append("t", [b"status", b"terminal"], seal=True) == 0
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2, sealed=True)
    assert await event_log.append("empty", [], seal=True) == 0  # an empty batch seals too
    assert await event_log.bounds("empty") == LogBounds(earliest=None, next_seq=0, sealed=True)


async def test_seal_creates_a_missing_log(event_log: EventLog) -> None:
    await event_log.seal("never-appended")
    assert await event_log.bounds("never-appended") == LogBounds(earliest=None, next_seq=0, sealed=True)
    assert await event_log.wait("never-appended", -1, 3600) is False


async def test_an_epilogue_follows_the_seal_and_the_log_stays_sealed(event_log: EventLog) -> None:
    await event_log.append("t", [b"a"], seal=True)
    assert await event_log.append("t", [b"note"], epilogue=True) == 1
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=2, sealed=True)
    assert [e.body for e in await event_log.read("t", -1, 10)] == [b"a", b"note"]
    with pytest.raises(LogSealed):
        await event_log.append("t", [b"late"])


async def test_wait_returns_at_once_on_a_sealed_log(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b"], seal=True)
    assert await asyncio.wait_for(event_log.wait("t", 1, 3600), 1.0) is False  # nothing after: over
    assert await asyncio.wait_for(event_log.wait("t", 0, 3600), 1.0) is True


async def test_seal_wakes_waiters(event_log: EventLog) -> None:
    await event_log.append("t", [b"a"])
    waiters = [asyncio.create_task(event_log.wait("t", 0, 3600)) for _ in range(5)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    await event_log.seal("t")
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [False] * 5


async def test_a_sealing_append_wakes_waiters_with_its_events(event_log: EventLog) -> None:
    await event_log.create("t")
    waiter = asyncio.create_task(event_log.wait("t", -1, 3600))
    await asyncio.sleep(0)
    await event_log.append("t", [b"terminal"], seal=True)
    assert await asyncio.wait_for(waiter, 1.0) is True
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=1, sealed=True)


# ------------------------------------------------------------------------------------------ delete


async def test_delete_drops_the_events_and_leaves_a_tombstone(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b"])
    await event_log.append("keep", [b"k"])
    await event_log.delete("t")
    assert await event_log.bounds("t") == LogBounds(earliest=None, next_seq=2, sealed=True)
    assert await event_log.read("t", -1, 10) == []
    assert await event_log.bounds("keep") == LogBounds(earliest=0, next_seq=1)
    await event_log.delete("t")  # idempotent
    assert await event_log.bounds("t") == LogBounds(earliest=None, next_seq=2, sealed=True)
    await event_log.delete("never-existed")
    assert await event_log.bounds("never-existed") is None


async def test_a_tombstone_never_reuses_a_seq(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b", b"c"])
    await event_log.delete("t")
    for append in (
        event_log.append("t", [b"again"]),
        event_log.append("t", []),
        event_log.append("t", [b"note"], epilogue=True),
    ):
        with pytest.raises(LogSealed):
            await append
    await event_log.create("t")  # a no-op: the tombstone stays
    await event_log.seal("t")
    assert await event_log.bounds("t") == LogBounds(earliest=None, next_seq=3, sealed=True)
    assert await event_log.wait("t", -1, 3600) is False
    assert await event_log.read("t", -1, 10) == []


async def test_a_tombstone_lives_at_least_its_ttl(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, tombstone_ttl_s=100.0)
    await log.append("t", [b"a"])
    await log.delete("t")
    clock.now = 99.0
    await log.append("other", [b"x"])
    await log.delete("other")  # a delete is where a store may expire old tombstones
    assert await log.bounds("t") == LogBounds(earliest=None, next_seq=1, sealed=True)


# ------------------------------------------------------------------------------------------ wait


async def test_wait_returns_immediately_when_data_exists(event_log: EventLog) -> None:
    await event_log.append("t", [b"a", b"b", b"c"])
    assert await event_log.wait("t", -1, 0) is True
    assert await event_log.wait("t", 1, 0) is True
    assert await event_log.wait("t", 2, 0) is False
    # a long timeout does not delay an answer that is already known
    assert await asyncio.wait_for(event_log.wait("t", 0, 3600), 1.0) is True


async def test_wait_then_append_race_is_not_lost(event_log: EventLog) -> None:
    """Read finds nothing, an append lands, then wait is called: it must not sleep through the append."""
    await event_log.create("t")
    assert await event_log.read("t", -1, 10) == []
    await event_log.append("t", [b"late"])
    assert await event_log.wait("t", -1, 0) is True


async def test_wait_true_even_when_the_events_were_trimmed(make_event_log: Callable[..., EventLog]) -> None:
    clock = FakeClock(0.0)
    log = make_event_log(clock=clock, max_event_age_s=50.0)
    await log.append("t", [b"a", b"b"])
    clock.now = 100.0
    assert await log.read("t", -1, 10) == []
    assert await log.wait("t", 0, 0) is True  # seq 1 existed; read + bounds tell the caller events_gone
    assert await log.bounds("t") == LogBounds(earliest=None, next_seq=2)


async def test_wait_wakes_every_waiter_on_append(event_log: EventLog) -> None:
    await event_log.create("t")
    first = [asyncio.create_task(event_log.wait("t", -1, 10)) for _ in range(20)]
    second = [asyncio.create_task(event_log.wait("t", 0, 10)) for _ in range(20)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert not any(w.done() for w in first + second)

    await event_log.append("t", [b"seq0"])
    assert await asyncio.wait_for(asyncio.gather(*first), 1.0) == [True] * 20
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in second)  # seq 0 is not after 0

    await event_log.append("t", [b"seq1"])
    assert await asyncio.wait_for(asyncio.gather(*second), 1.0) == [True] * 20


async def test_wait_wakes_on_a_batch_that_jumps_past_the_cursor(event_log: EventLog) -> None:
    await event_log.append("t", [b"a"])
    waiter = asyncio.create_task(event_log.wait("t", 5, 10))
    await asyncio.sleep(0)
    await event_log.append("t", [b"b", b"c", b"d"])  # up to seq 3: not yet
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await event_log.append("t", [b"e", b"f", b"g"])  # seq 6 exists now
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_wait_times_out_with_false(event_log: EventLog) -> None:
    await event_log.append("t", [b"a"])
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await event_log.wait("t", 0, 0.05) is False
    assert loop.time() - started >= 0.04
    assert await event_log.wait("t", 0, 0) is False
    assert await event_log.wait("t", 0, -1) is False
    await event_log.create("empty")
    assert await event_log.wait("empty", -1, 0.01) is False
    assert await event_log.wait("empty", -5, 0) is False  # nothing at all was appended


async def test_wait_returns_false_when_the_log_is_deleted(event_log: EventLog) -> None:
    await event_log.append("t", [b"a"])
    waiters = [asyncio.create_task(event_log.wait("t", 0, 3600)) for _ in range(5)]
    await asyncio.sleep(0)
    await event_log.delete("t")
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [False] * 5


async def test_waiter_of_a_deleted_log_is_not_woken_by_a_refused_append(event_log: EventLog) -> None:
    await event_log.create("t")
    waiter = asyncio.create_task(event_log.wait("t", -1, 3600))
    await asyncio.sleep(0)
    await event_log.delete("t")
    with pytest.raises(LogSealed):  # the tombstone refuses a new life at seq 0
        await event_log.append("t", [b"new life"])
    assert await asyncio.wait_for(waiter, 1.0) is False


async def test_wait_for_a_log_that_does_not_exist_yet(event_log: EventLog) -> None:
    assert await event_log.wait("later", -1, 0.02) is False
    waiter = asyncio.create_task(event_log.wait("later", -1, 10))
    await asyncio.sleep(0)
    await event_log.create("later")
    await asyncio.sleep(0.01)
    assert not waiter.done()  # created but empty
    await event_log.append("later", [b"x"])
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_cancelled_waiter_does_not_disturb_others(event_log: EventLog) -> None:
    await event_log.create("t")
    victim = asyncio.create_task(event_log.wait("t", -1, 10))
    survivor = asyncio.create_task(event_log.wait("t", -1, 10))
    await asyncio.sleep(0)
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim
    await event_log.append("t", [b"a"])
    assert await asyncio.wait_for(survivor, 1.0) is True


async def test_close_wakes_waiters(make_event_log: Callable[..., EventLog]) -> None:
    log = make_event_log()
    await log.create("t")
    waiters = [
        asyncio.create_task(log.wait("t", -1, 3600)),
        asyncio.create_task(log.wait("missing", -1, 3600)),
    ]
    await asyncio.sleep(0)
    await log.close()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [False, False]


# ------------------------------------------------------------------------------------------ many cursors


async def test_500_concurrent_readers_do_not_affect_each_other(event_log: EventLog) -> None:
    total = 1000
    rng = random.Random(2694)
    expected = [body("t", s) for s in range(total)]

    async def writer() -> None:
        seq = 0
        while seq < total:
            n = min(rng.randint(1, 40), total - seq)
            await event_log.append("t", expected[seq : seq + n])
            seq += n
            await asyncio.sleep(0)

    async def reader(limit: int, slow: bool) -> list[int]:
        cursor, got = -1, []
        while cursor < total - 1:
            page = await event_log.read("t", cursor, limit)
            if not page:
                assert await event_log.wait("t", cursor, 10)
                continue
            assert page[0].seq == cursor + 1
            assert [e.body for e in page] == expected[page[0].seq : page[-1].seq + 1]
            got.extend(seqs(page))
            cursor = page[-1].seq
            if slow:
                await asyncio.sleep(0.001)
        return got

    await event_log.create("t")
    readers = [asyncio.create_task(reader(limit=1 + i % 50, slow=i % 10 == 5)) for i in range(500)]
    doomed = [asyncio.create_task(reader(limit=5, slow=True)) for _ in range(25)]
    write = asyncio.create_task(writer())
    await asyncio.sleep(0.005)
    for task in doomed:  # readers that go away mid-stream cost the others nothing
        task.cancel()
    await asyncio.wait_for(write, 30)
    results = await asyncio.wait_for(asyncio.gather(*readers), 60)
    assert all(r == list(range(total)) for r in results)
    assert await event_log.bounds("t") == LogBounds(earliest=0, next_seq=total)


# ------------------------------------------------------------------------------------------ property test

TASKS = ("a", "b_1", "ü:c")


class EventLogMachine(RuleBasedStateMachine):
    """Random appends (sealing, epilogues), seals, clock ticks (age trims), deletes (tombstones) and reads,
    checked against a dict model each step."""

    factory: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(0.0)
        self.log: EventLog | None = None
        self.max_events = 0
        self.max_age = math.inf
        self.model: dict[str, dict[int, tuple[bytes, float]]] = {}
        self.next_seq: dict[str, int] = {}
        self.sealed: set[str] = set()
        self.deleted: set[str] = set()
        """Tombstones: sealed, no events, next_seq kept (they outlive the run: the TTL is far away)."""
        self.cursors: dict[str, int] = {}
        """A paging reader per task: the last seq it processed (Jepsen's poll-skip check)."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def store(self) -> EventLog:
        assert self.log is not None
        return self.log

    def teardown(self) -> None:
        if self.log is not None:
            self.run(self.log.close())
        self.loop.close()

    @initialize(max_events=st.integers(1, 6), max_age=st.sampled_from([0.5, 1.0, 2.0, math.inf]))
    def init_store(self, max_events: int, max_age: float) -> None:
        self.max_events = max_events
        self.max_age = max_age
        self.log = self.factory(
            max_events_per_task=max_events, clock=self.clock, max_event_age_s=max_age, tombstone_ttl_s=1e9
        )

    def expire(self, task: str) -> None:
        """What the store does wherever it touches a task's log: drop events older than the age."""
        events = self.model.get(task, {})
        for seq in [seq for seq, (_, created) in events.items() if created < self.clock.now - self.max_age]:
            del events[seq]

    # -- operations

    @rule(
        task=st.sampled_from(TASKS),
        batch=st.lists(st.binary(max_size=6), max_size=8),
        seal=st.booleans(),
        epilogue=st.booleans(),
    )
    def append(self, task: str, batch: list[bytes], seal: bool, epilogue: bool) -> None:
        if task in self.deleted or (task in self.sealed and not epilogue):
            with pytest.raises(LogSealed):
                self.run(self.store().append(task, batch, seal=seal, epilogue=epilogue))
            return
        first = self.run(self.store().append(task, batch, seal=seal, epilogue=epilogue))
        events = self.model.setdefault(task, {})
        expected_first = self.next_seq.get(task, 0)
        assert first == expected_first
        created = self.clock.now
        if events:  # never older than the last retained event
            created = max(created, events[max(events)][1])
        for i, b in enumerate(batch):
            events[expected_first + i] = (b, created)
        self.next_seq[task] = expected_first + len(batch)
        for seq in sorted(events)[: max(0, len(events) - self.max_events)]:
            del events[seq]
        if batch:
            self.expire(task)
        if seal:
            self.sealed.add(task)

    @rule(task=st.sampled_from(TASKS))
    def create(self, task: str) -> None:
        self.run(self.store().create(task))
        self.model.setdefault(task, {})
        self.next_seq.setdefault(task, 0)

    @rule(task=st.sampled_from(TASKS))
    def seal(self, task: str) -> None:
        self.run(self.store().seal(task))
        self.model.setdefault(task, {})
        self.next_seq.setdefault(task, 0)
        self.sealed.add(task)

    @rule(seconds=st.sampled_from([0.0, 0.25, 1.0, 3.0, -2.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)  # a negative step is a wall clock stepping back

    @rule(task=st.sampled_from(TASKS))
    def delete(self, task: str) -> None:
        self.run(self.store().delete(task))
        if task in self.next_seq:
            self.model[task] = {}
            self.sealed.add(task)
            self.deleted.add(task)

    # -- reads

    @rule(task=st.sampled_from(TASKS), limit=st.integers(1, 10))
    def read_every_cursor(self, task: str, limit: int) -> None:
        """For every cursor c: a run starting at exactly c+1, or one starting at earliest > c+1 (events_gone)."""
        self.expire(task)
        events = self.model.get(task, {})
        earliest = min(events) if events else None
        for c in range(-3, self.next_seq.get(task, 0) + 2):
            got = self.run(self.store().read(task, c, limit))
            expected = sorted(seq for seq in events if seq > c)[:limit]
            assert [e.seq for e in got] == expected
            assert [(e.body, e.created) for e in got] == [events[seq] for seq in expected]
            if got:
                assert earliest is not None
                first = got[0].seq
                assert [e.seq for e in got] == list(range(first, first + len(got)))  # contiguous
                if c + 1 >= earliest:
                    assert first == c + 1
                else:
                    assert first == earliest > c + 1  # the caller must answer events_gone

    @rule(task=st.sampled_from(TASKS), limit=st.integers(1, 4))
    def page_forward(self, task: str, limit: int) -> None:
        """A reader paging with its own cursor never skips silently and never goes backwards."""
        if task not in self.next_seq:
            return
        self.expire(task)
        cursor = self.cursors.get(task, -1)
        page = self.run(self.store().read(task, cursor, limit))
        if not page:
            return
        first = page[0].seq
        assert first > cursor
        if first != cursor + 1:
            # legitimate only if cursor + 1 was really dropped
            assert cursor + 1 not in self.model[task]
            assert first == min(self.model[task])
        self.cursors[task] = page[-1].seq

    @rule(task=st.sampled_from(TASKS), data=st.data())
    def wait_without_blocking(self, task: str, data: st.DataObject) -> None:
        c = data.draw(st.integers(-3, self.next_seq.get(task, 0) + 1), label="after")
        ready = self.run(self.store().wait(task, c, 0))
        exists = task in self.next_seq and task not in self.deleted
        assert ready == (exists and self.next_seq[task] > max(c + 1, 0))

    @rule(task=st.sampled_from(TASKS))
    def wait_on_a_sealed_log_returns_at_once(self, task: str) -> None:
        if task not in self.sealed:
            return
        after = self.next_seq[task] - 1
        assert self.run(asyncio.wait_for(self.store().wait(task, after, 3600), 1.0)) is False

    # -- invariants

    @invariant()
    @precondition(lambda self: self.log is not None)
    def bounds_agree_with_model(self) -> None:
        for task in TASKS:
            bounds = self.run(self.store().bounds(task))
            if task not in self.next_seq:
                assert bounds is None
                continue
            self.expire(task)
            events = self.model[task]
            assert bounds == LogBounds(
                earliest=min(events) if events else None, next_seq=self.next_seq[task], sealed=task in self.sealed
            )
            if events:  # retained seqs form one contiguous run
                assert sorted(events) == list(range(min(events), max(events) + 1))


def test_event_log_state_machine(store_factory: StoreFactory) -> None:
    machine = type("BoundEventLogMachine", (EventLogMachine,), {"factory": staticmethod(store_factory)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# ------------------------------------------------------------------------------------------ memory store internals


@pytest.fixture
def memory_log() -> Iterator[MemoryEventLog]:
    yield MemoryEventLog(8, FakeClock(0.0))


async def test_memory_trimmed_prefix_is_compacted(memory_log: MemoryEventLog) -> None:
    for i in range(10_000):
        await memory_log.append("t", [body("t", i)])
        internal = memory_log._logs["t"]
        assert len(internal.bodies) <= 2 * 8 + 1
        assert len(internal.times) == len(internal.bodies)
    assert seqs(await memory_log.read("t", -1, 100)) == list(range(9992, 10_000))


async def test_memory_waiters_for_missing_logs_leave_nothing_behind(memory_log: MemoryEventLog) -> None:
    await asyncio.gather(*(memory_log.wait(f"ghost-{i}", -1, 0.01) for i in range(50)))
    assert memory_log._gates == {}
    waiter = asyncio.create_task(memory_log.wait("ghost", -1, 10))
    await asyncio.sleep(0)
    await memory_log.append("ghost", [b"boo"])
    assert await asyncio.wait_for(waiter, 1.0) is True
    assert memory_log._gates == {}


def test_memory_rejects_a_zero_limit() -> None:
    with pytest.raises(ValueError):
        MemoryEventLog(0)


async def test_memory_append_after_close_fails() -> None:
    log = MemoryEventLog(8)
    await log.close()
    with pytest.raises(RuntimeError):
        await log.append("t", [b"x"])


async def test_memory_tombstones_are_small_and_expire_on_a_later_delete() -> None:
    clock = FakeClock(0.0)
    log = MemoryEventLog(8, clock, tombstone_ttl_s=10.0)
    for i in range(100):
        await log.append(f"t{i}", [body("t", n) for n in range(8)])
        await log.delete(f"t{i}")
    assert len(log._logs) == 100
    assert all(not tombstone.bodies and not tombstone.times for tombstone in log._logs.values())
    clock.now = 9.0
    await log.delete("none")
    assert len(log._logs) == 100  # not yet
    clock.now = 10.0
    await log.delete("none")
    assert log._logs == {} and log._tombstones == {}
    assert await log.bounds("t0") is None
    assert await log.append("t0", [b"x"]) == 0  # past its tombstone's life an id starts afresh


def test_memory_rejects_a_non_positive_age() -> None:
    with pytest.raises(ValueError):
        MemoryEventLog(8, max_event_age_s=0)
