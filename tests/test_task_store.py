"""Contract tests for task record stores (``gateway.tasks.store.TaskStore``).

Every store runs the same suite: the ``store_factory`` fixture is parametrized over ``STORES``, and the
``store`` fixture builds one from it. Adding a SQLite or Redis store is one more ``pytest.param`` in
``STORES`` (with a skip mark when its server is unavailable); nothing else changes.

The suite covers create and get by (owner, id) (another owner's id reads as unknown), listing by owner
with a cursor (stable order, pagination, a walk that survives expiry and creation), compare-and-set
status updates (a stale previous status loses; a terminal status never changes), the terminal outcome
within the store's cap, the log's ``next_seq`` (never goes back) and expiry; then a Hypothesis state
machine that checks every step against a dict model, and the record's serialization round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from gateway.app import build_stores
from gateway.config import Config, RetentionConfig
from gateway.events.log import MemoryEventLog
from gateway.stores.memory import MemoryTaskStore
from gateway.stores.redis import RedisBackend, RedisTaskStore
from gateway.stores.sqlite import SqliteDatabase
from gateway.stores.sqlite_tasks import SqliteTaskStore
from gateway.tasks.records import TaskRecord, TaskStatus, UpstreamTaskRef
from gateway.tasks.registry import OUTCOME_OVERHEAD_BYTES, bounded, evicted_outcome, outcome_cap
from gateway.tasks.store import InvalidCursor, OutcomeTooLarge, TaskExists, TaskStore
from tests.conftest import fresh_sqlite_file
from tests.redis_server import fresh_prefix, shared_redis_url

T = TypeVar("T")

CAP = 200
"""The outcome cap of every store under test (bytes)."""
NOW = 1_000_000.0


class StoreFactory(Protocol):
    def __call__(self, *, max_outcome_bytes: int) -> TaskStore: ...


def _memory_store(*, max_outcome_bytes: int) -> TaskStore:
    return MemoryTaskStore(max_outcome_bytes)


def _sqlite_store(*, max_outcome_bytes: int) -> TaskStore:
    return SqliteTaskStore(SqliteDatabase(fresh_sqlite_file()), max_outcome_bytes)


def _redis_store(*, max_outcome_bytes: int) -> TaskStore:
    return RedisTaskStore(RedisBackend(shared_redis_url(), fresh_prefix()), max_outcome_bytes)


STORES = [
    pytest.param(_memory_store, id="memory"),
    pytest.param(_sqlite_store, id="sqlite"),
    pytest.param(_redis_store, id="redis"),
]


@pytest.fixture(params=STORES)
def store_factory(request: pytest.FixtureRequest, sqlite_directory: Path) -> StoreFactory:
    factory: StoreFactory = request.param
    return factory


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[TaskStore]:
    built = store_factory(max_outcome_bytes=CAP)
    yield built
    await built.close()


def record(task_id: str, owner: str = "alice", *, expires_at: float = NOW + 60, **changes: Any) -> TaskRecord:
    made = TaskRecord(
        id=task_id,
        owner=owner,
        tool="build",
        dialect="2025-11-25",
        ttl_ms=60_000,
        poll_interval_ms=1000,
        created_at="2026-12-01T12:00:00.000Z",
        last_updated_at="2026-12-01T12:00:00.000Z",
        expires_at=expires_at,
    )
    return replace(made, **changes)


async def walk(store: TaskStore, owner: str, limit: int) -> list[str]:
    """Every id a cursor walk over `owner`'s records yields, page by page."""
    ids: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await store.list_owned(owner, cursor, limit)
        assert len(page.records) <= limit
        ids += [record.id for record in page.records]
        if page.next_cursor is None:
            return ids
        assert len(page.records) == limit  # only the last page is short
        cursor = page.next_cursor
    raise AssertionError("the cursor walk did not end")


# ------------------------------------------------------------------------------------------ create and get


async def test_a_created_record_reads_back_only_for_its_owner(store: TaskStore) -> None:
    upstream = UpstreamTaskRef("u1", "c0ffee")
    created = record("t1", upstream=upstream)
    await store.create(created)
    assert await store.get("alice", "t1") == created
    assert await store.get("bob", "t1") is None  # another owner's id looks unknown
    assert await store.get("alice", "t2") is None
    assert await store.find("t1") == created  # the gateway's own bookkeeping sees any owner's


async def test_an_id_is_never_taken_twice(store: TaskStore) -> None:
    await store.create(record("t1"))
    with pytest.raises(TaskExists):
        await store.create(record("t1", owner="bob"))
    assert await store.get("bob", "t1") is None
    assert (await store.find("t1")) == record("t1")


# ------------------------------------------------------------------------------------------ list


async def test_listing_pages_an_owners_records_in_creation_order(store: TaskStore) -> None:
    for i in range(7):
        await store.create(record(f"a{i}"))
        await store.create(record(f"b{i}", owner="bob"))
    for limit in (1, 2, 3, 7, 50):
        assert await walk(store, "alice", limit) == [f"a{i}" for i in range(7)]
    assert await walk(store, "bob", 3) == [f"b{i}" for i in range(7)]
    empty = await store.list_owned("carol", None, 5)
    assert (empty.records, empty.next_cursor) == ([], None)


async def test_a_walk_never_repeats_or_skips_while_records_expire_and_appear(store: TaskStore) -> None:
    for i in range(6):
        await store.create(record(f"t{i}", expires_at=NOW + (1 if i in (0, 3) else 60)))
    first = await store.list_owned("alice", None, 2)
    assert [r.id for r in first.records] == ["t0", "t1"]
    expired = await store.expire(NOW + 1)  # t0 (already listed) and t3 (not yet) go
    assert sorted(r.id for r in expired) == ["t0", "t3"]
    await store.create(record("t6"))
    ids = [r.id for r in first.records]
    cursor = first.next_cursor
    while cursor is not None:
        page = await store.list_owned("alice", cursor, 2)
        ids += [r.id for r in page.records]
        cursor = page.next_cursor
    assert ids == ["t0", "t1", "t2", "t4", "t5", "t6"]


@pytest.mark.parametrize("cursor", ["not-a-cursor", "-1", "99999", "", "1.5"])
async def test_a_cursor_the_store_never_gave_is_refused(store: TaskStore, cursor: str) -> None:
    await store.create(record("t1"))
    with pytest.raises(InvalidCursor):
        await store.list_owned("alice", cursor, 10)


# ------------------------------------------------------------------------------------------ status


async def test_a_status_update_is_a_compare_and_set_on_the_previous_status(store: TaskStore) -> None:
    await store.create(record("t1"))
    at = "2026-12-01T12:00:01.000Z"
    updated = await store.update_status("t1", TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, "asking", at)
    assert updated == replace(
        record("t1"), status=TaskStatus.INPUT_REQUIRED, status_message="asking", last_updated_at=at
    )
    assert await store.get("alice", "t1") == updated

    # A writer that still believes the task is working loses, and changes nothing.
    stale = await store.update_status("t1", TaskStatus.WORKING, TaskStatus.FAILED, "late", "2026-12-01T12:00:02.000Z")
    assert stale is None
    assert await store.get("alice", "t1") == updated

    # Same status, new message: still a compare-and-set on the status.
    again = await store.update_status("t1", TaskStatus.INPUT_REQUIRED, TaskStatus.INPUT_REQUIRED, "asking more", at)
    assert again is not None and again.status_message == "asking more"
    assert await store.update_status("nope", TaskStatus.WORKING, TaskStatus.FAILED, None, at) is None


@pytest.mark.parametrize("end", [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED])
async def test_a_terminal_status_never_changes(store: TaskStore, end: TaskStatus) -> None:
    await store.create(record("t1"))
    at = "2026-12-01T12:00:01.000Z"
    ended = await store.update_status("t1", TaskStatus.WORKING, end, None, at, outcome_summary={"status": end.value})
    assert ended is not None and ended.terminal and ended.outcome_summary == {"status": end.value}
    for status in TaskStatus:
        assert await store.update_status("t1", end, status, "again", "2026-12-01T12:00:09.000Z") is None
    assert await store.get("alice", "t1") == ended


async def test_of_two_racing_writers_exactly_one_wins(store: TaskStore) -> None:
    await store.create(record("t1"))
    at = "2026-12-01T12:00:01.000Z"
    outcomes = await asyncio.gather(
        store.update_status("t1", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=b'{"result":{}}'),
        store.update_status("t1", TaskStatus.WORKING, TaskStatus.CANCELLED, "cancelled", at),
    )
    winners = [outcome for outcome in outcomes if outcome is not None]
    assert len(winners) == 1
    assert await store.get("alice", "t1") == winners[0]
    expected_outcome = b'{"result":{}}' if winners[0].status is TaskStatus.COMPLETED else None
    assert await store.outcome("t1") == expected_outcome


# ------------------------------------------------------------------------------------------ outcome


async def test_the_terminal_outcome_is_kept_with_the_status_within_the_cap(store: TaskStore) -> None:
    await store.create(record("t1"))
    await store.create(record("t2"))
    at = "2026-12-01T12:00:01.000Z"
    assert await store.outcome("t1") is None
    at_cap = b'{"result":"' + b"x" * (CAP - 13) + b'"}'
    assert len(at_cap) == CAP
    assert await store.update_status("t1", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=at_cap)
    assert await store.outcome("t1") == at_cap

    # One byte over: refused, and the status did not change either.
    with pytest.raises(OutcomeTooLarge):
        await store.update_status("t2", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=at_cap + b" ")
    assert (await store.get("alice", "t2")) == record("t2")
    assert await store.outcome("t2") is None

    # Only a terminal status keeps an outcome.
    with pytest.raises(ValueError):
        await store.update_status("t2", TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, None, at, outcome=b"{}")
    assert (await store.get("alice", "t2")) == record("t2")


async def test_a_kept_outcome_can_be_replaced_only_once_terminal_and_within_the_cap(store: TaskStore) -> None:
    await store.create(record("t1"))
    evicted = b'{"error":{"code":-32603,"message":"evicted"}}'
    assert not await store.replace_outcome("t1", evicted)  # still working: nothing to replace
    assert not await store.replace_outcome("nope", evicted)
    at = "2026-12-01T12:00:01.000Z"
    await store.update_status("t1", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=b'{"result":{}}')
    assert await store.replace_outcome("t1", evicted)
    assert await store.outcome("t1") == evicted
    with pytest.raises(OutcomeTooLarge):
        await store.replace_outcome("t1", b" " * (CAP + 1))
    assert await store.outcome("t1") == evicted


# ------------------------------------------------------------------------------------------ next_seq, expiry


async def test_next_seq_only_moves_forward(store: TaskStore) -> None:
    await store.create(record("t1"))
    await store.advance_next_seq("t1", 5)
    await store.advance_next_seq("t1", 3)  # a late writer's older view
    assert (await store.get("alice", "t1")) == replace(record("t1"), next_seq=5)
    await store.advance_next_seq("nope", 9)  # an unknown task: nothing happens
    assert await store.find("nope") is None
    at = "2026-12-01T12:00:01.000Z"
    ended = await store.update_status("t1", TaskStatus.WORKING, TaskStatus.FAILED, "boom", at)
    assert ended is not None and ended.next_seq == 5


async def test_expiry_drops_due_records_with_their_outcomes(store: TaskStore) -> None:
    await store.create(record("short", expires_at=NOW + 1))
    await store.create(record("long", expires_at=NOW + 60))
    at = "2026-12-01T12:00:01.000Z"
    await store.update_status("short", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=b'{"result":{}}')
    assert await store.expire(NOW) == []
    expired = await store.expire(NOW + 1)  # due at exactly its expires_at
    assert [(r.id, r.status) for r in expired] == [("short", TaskStatus.COMPLETED)]
    assert await store.get("alice", "short") is None and await store.outcome("short") is None
    assert [r.id for r in (await store.list_owned("alice", None, 10)).records] == ["long"]
    assert await store.expire(NOW + 1) == []
    await store.create(record("short"))  # its id is free again once the record is gone


async def test_unfinished_lists_every_owners_records_not_yet_terminal(store: TaskStore) -> None:
    for task_id, owner in (("t1", "alice"), ("t2", "bob"), ("t3", "alice"), ("t4", "bob")):
        await store.create(record(task_id, owner=owner))
    at = "2026-12-01T12:00:01.000Z"
    await store.update_status("t2", TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, None, at)
    await store.update_status("t3", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=b'{"result":{}}')
    await store.advance_next_seq("t1", 7)
    unfinished = {found.id: found for found in await store.unfinished()}
    assert sorted(unfinished) == ["t1", "t2", "t4"]
    assert unfinished["t1"].next_seq == 7 and unfinished["t2"].status is TaskStatus.INPUT_REQUIRED
    assert unfinished["t2"].owner == "bob"
    await store.expire(NOW + 3600)
    assert await store.unfinished() == []


async def test_live_lists_every_record_with_the_size_of_the_outcome_it_kept_as_it_ended(store: TaskStore) -> None:
    for task_id, owner in (("running", "alice"), ("done", "bob"), ("evicted", "alice"), ("failed", "bob")):
        await store.create(record(task_id, owner=owner))
    at = "2026-12-01T12:00:01.000Z"
    result = b'{"result":{"content":[]}}'
    await store.update_status("done", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=result)
    await store.update_status("evicted", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=result)
    assert await store.replace_outcome("evicted", b'{"error":{"code":-32603,"message":"evicted"}}')
    await store.update_status("failed", TaskStatus.WORKING, TaskStatus.FAILED, "boom", at)  # keeps no outcome
    await store.advance_next_seq("running", 4)
    live = {found.record.id: found for found in await store.live()}
    assert sorted(live) == ["done", "evicted", "failed", "running"]
    assert {task_id: found.outcome_bytes for task_id, found in live.items()} == {
        "running": None,
        "done": len(result),
        "evicted": None,  # replaced: the eviction's error is not the task's own outcome
        "failed": None,
    }
    assert live["running"].record == replace(record("running"), next_seq=4)
    assert live["done"].record.owner == "bob" and live["done"].record.status is TaskStatus.COMPLETED
    await store.expire(NOW + 3600)
    assert await store.live() == []
    await store.create(record("evicted"))  # a new record under a replaced one's id keeps its own outcome
    await store.update_status("evicted", TaskStatus.WORKING, TaskStatus.COMPLETED, None, at, outcome=result)
    assert [found.outcome_bytes for found in await store.live()] == [len(result)]


# ------------------------------------------------------------------------------------------ property tests

OWNERS = ("alice", "bob")
IDS = ("t0", "t1", "t2", "t3")


class TaskStoreMachine(RuleBasedStateMachine):
    """Random creates, compare-and-set updates, outcomes, next_seq moves and expiries, checked against a
    dict model after every step."""

    factory: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store: TaskStore | None = None
        self.model: dict[str, TaskRecord] = {}
        self.outcomes: dict[str, bytes] = {}
        self.now = NOW

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def the_store(self) -> TaskStore:
        assert self.store is not None
        return self.store

    def teardown(self) -> None:
        if self.store is not None:
            self.run(self.store.close())
        self.loop.close()

    @initialize()
    def init_store(self) -> None:
        self.store = self.factory(max_outcome_bytes=CAP)

    @rule(task_id=st.sampled_from(IDS), owner=st.sampled_from(OWNERS), ttl=st.integers(0, 5))
    def create(self, task_id: str, owner: str, ttl: int) -> None:
        made = record(task_id, owner, expires_at=self.now + ttl)
        if task_id in self.model:
            with pytest.raises(TaskExists):
                self.run(self.the_store().create(made))
            return
        self.run(self.the_store().create(made))
        self.model[task_id] = made

    @rule(
        task_id=st.sampled_from(IDS),
        expected=st.sampled_from(TaskStatus),
        status=st.sampled_from(TaskStatus),
        message=st.none() | st.text(max_size=5),
        outcome=st.none() | st.binary(max_size=CAP + 2),
    )
    def update_status(
        self, task_id: str, expected: TaskStatus, status: TaskStatus, message: str | None, outcome: bytes | None
    ) -> None:
        store = self.the_store()
        at = f"T{self.now}"
        current = self.model.get(task_id)
        update = store.update_status(task_id, expected, status, message, at, outcome=outcome)
        if outcome is not None and (not status.terminal or len(outcome) > CAP):
            with pytest.raises((ValueError, OutcomeTooLarge)):
                self.run(update)
            return
        got = self.run(update)
        if current is None or current.terminal or current.status is not expected:
            assert got is None
            return
        self.model[task_id] = replace(current, status=status, status_message=message, last_updated_at=at)
        if outcome is not None:
            self.outcomes[task_id] = outcome
        assert got == self.model[task_id]

    @rule(task_id=st.sampled_from(IDS), next_seq=st.integers(0, 20))
    def advance(self, task_id: str, next_seq: int) -> None:
        self.run(self.the_store().advance_next_seq(task_id, next_seq))
        current = self.model.get(task_id)
        if current is not None and next_seq > current.next_seq:
            self.model[task_id] = replace(current, next_seq=next_seq)

    @rule(seconds=st.integers(0, 3))
    def expire(self, seconds: int) -> None:
        self.now += seconds
        expired = self.run(self.the_store().expire(self.now))
        due = {task_id for task_id, made in self.model.items() if made.expires_at <= self.now}
        assert sorted(expired, key=lambda r: r.id) == sorted((self.model[i] for i in due), key=lambda r: r.id)
        for task_id in due:
            del self.model[task_id]
            self.outcomes.pop(task_id, None)

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 3))
    def list_walk(self, owner: str, limit: int) -> None:
        ids = self.run(walk(self.the_store(), owner, limit))
        assert sorted(ids) == sorted(task_id for task_id, made in self.model.items() if made.owner == owner)
        assert len(ids) == len(set(ids))

    @invariant()
    def records_agree_with_the_model(self) -> None:
        if self.store is None:
            return
        for task_id in IDS:
            expected = self.model.get(task_id)
            for owner in OWNERS:
                got = self.run(self.store.get(owner, task_id))
                assert got == (expected if expected is not None and expected.owner == owner else None)
            assert self.run(self.store.outcome(task_id)) == self.outcomes.get(task_id)


def test_task_store_state_machine(store_factory: StoreFactory) -> None:
    machine = type("BoundTaskStoreMachine", (TaskStoreMachine,), {"factory": staticmethod(store_factory)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )


records = st.builds(
    TaskRecord,
    id=st.text(min_size=1, max_size=8),
    owner=st.text(max_size=8),
    tool=st.text(max_size=8),
    dialect=st.sampled_from(["2025-11-25", "2026-07-28"]),
    ttl_ms=st.integers(1, 2**40),
    poll_interval_ms=st.integers(1, 2**31),
    created_at=st.text(max_size=24),
    last_updated_at=st.text(max_size=24),
    expires_at=st.floats(allow_nan=False, allow_infinity=False),
    status=st.sampled_from(TaskStatus),
    status_message=st.none() | st.text(max_size=16),
    # JSON integers, as the gateway parses them (orjson: 64-bit): what a durable store can write.
    outcome_summary=st.none()
    | st.dictionaries(st.text(max_size=6), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6), max_size=3),
    upstream=st.none() | st.builds(UpstreamTaskRef, st.text(max_size=8), st.text(max_size=8)),
    next_seq=st.integers(0, 2**53),
)


@given(records)
def test_a_record_survives_a_json_round_trip(made: TaskRecord) -> None:
    """What a durable store writes (`to_dict` as JSON) reads back as the same record."""
    assert TaskRecord.from_dict(orjson.loads(orjson.dumps(made.to_dict()))) == made


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@given(
    outcome=st.sampled_from(["result", "error"]).flatmap(lambda key: st.fixed_dictionaries({key: json_values})),
    limit=st.integers(1, 400),
    size=st.integers(0, 2**62),
)
def test_whatever_the_registry_keeps_fits_the_cap_it_gives_the_store(
    outcome: dict[str, Any], limit: int, size: int
) -> None:
    """`outcome_cap` bounds every outcome the registry hands a store: a kept result or error, the
    error kept instead of one too large, and the error kept instead of an evicted one."""
    cap = outcome_cap(RetentionConfig(max_result_bytes=limit, results_budget_bytes=limit))
    assert cap == limit + OUTCOME_OVERHEAD_BYTES
    _, kept = bounded(outcome, limit)
    assert len(kept) <= cap
    assert len(orjson.dumps(evicted_outcome(size, 2**62))) <= cap


async def test_the_factory_builds_the_configured_kind_with_the_cap_the_registry_needs() -> None:
    config = Config.model_validate(
        {"store": {"kind": "memory"}, "retention": {"max_result_bytes": 1000, "max_events_per_task": 7}}
    )
    stores = build_stores(config)
    assert isinstance(stores.tasks, MemoryTaskStore) and isinstance(stores.log, MemoryEventLog)
    assert stores.tasks.max_outcome_bytes == 1000 + OUTCOME_OVERHEAD_BYTES
    assert stores.log.max_events_per_task == 7
    await stores.close()
