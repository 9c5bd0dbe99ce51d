"""Unit tests of the task registry: ownership, the per-caller limit, TTL expiry and the log it keeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace

import orjson
import pytest

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.events.log import LogBounds, MemoryEventLog
from gateway.metrics import Metrics
from gateway.protocol.dialect import MODERN
from gateway.protocol.era import Era
from gateway.stores.memory import MemoryTaskStore
from gateway.tasks import registry as registry_module
from gateway.tasks.hosted import related_outcome
from gateway.tasks.lifecycle import Event
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import SUMMARY_LIMIT_BYTES, Task, TaskLimitReached, TaskRegistry, outcome_cap

DIALECT = Era.LEGACY.value


def registry(
    record_events: bool = True,
    retention: dict[str, object] | None = None,
    *,
    stores_of: TaskRegistry | None = None,
    **tasks: object,
) -> TaskRegistry:
    """A registry on stores of its own, or (`stores_of`) on another registry's: a process started on them."""
    config = Config.model_validate({"tasks": tasks, "retention": retention or {}})
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    store = MemoryTaskStore(outcome_cap(config.retention)) if stores_of is None else stores_of.store
    log = MemoryEventLog(100) if stores_of is None else stores_of.log
    return TaskRegistry(config.tasks, config.retention, store, log, capture, Metrics(), record_events=record_events)


@pytest.fixture
def skip_ahead(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """`skip_ahead(s)`: from then on the registry's clocks (the `time` its module reads) are `s` seconds
    ahead, so a TTL runs out without the test waiting for it (and a slow machine cannot outrun it)."""

    def skip(seconds: float) -> None:
        ahead = SimpleNamespace(time=lambda: time.time() + seconds, monotonic=lambda: time.monotonic() + seconds)
        monkeypatch.setattr(registry_module, "time", ahead)

    return skip


async def log_bounds(tasks: TaskRegistry, task: Task) -> LogBounds:
    bounds = await tasks.log.bounds(task.id)
    assert bounds is not None
    return bounds


async def test_a_task_is_visible_only_to_its_owner() -> None:
    tasks = registry()
    task = await tasks.create("alice", "build", None, dialect=DIALECT)
    assert tasks.get("alice", task.id) is task
    assert tasks.get("bob", task.id) is None
    assert tasks.get("alice", "no-such-id") is None
    assert (await tasks.list_owned("bob", None)).records == []


async def test_the_per_caller_limit_holds_and_frees_on_expiry(skip_ahead: Callable[[float], None]) -> None:
    tasks = registry(max_tasks_per_owner=2)
    first = await tasks.create("alice", "build", 1000, dialect=DIALECT)
    second = await tasks.create("alice", "build", 600_000, dialect=DIALECT)
    with pytest.raises(TaskLimitReached):
        await tasks.create("alice", "build", None, dialect=DIALECT)
    await tasks.create("bob", "build", None, dialect=DIALECT)  # another caller has a limit of their own
    skip_ahead(60.0)
    await tasks.sweep_once()  # the 1 s task expired, the 10 min one did not
    assert tasks.get("alice", first.id) is None
    assert tasks.get("alice", second.id) is second
    await tasks.create("alice", "build", None, dialect=DIALECT)
    with pytest.raises(TaskLimitReached):
        await tasks.create("alice", "build", None, dialect=DIALECT)


async def test_requested_ttl_is_capped_and_defaulted() -> None:
    tasks = registry(default_ttl_ms=1000, max_ttl_ms=5000)
    assert (await tasks.create("a", "t", 10_000_000, dialect=DIALECT)).ttl_ms == 5000
    assert (await tasks.create("a", "t", None, dialect=DIALECT)).ttl_ms == 1000
    assert (await tasks.create("a", "t", True, dialect=DIALECT)).ttl_ms == 1000  # a boolean is not a TTL


async def test_terminal_states_never_change_and_the_log_ends_with_them() -> None:
    tasks = registry()
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    assert await tasks.feed(
        task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome={"jsonrpc": "2.0", "id": 1, "result": {}}
    )
    assert not await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.FAILED, "late")
    assert task.status is TaskStatus.COMPLETED and task.done.is_set()
    bounds = await log_bounds(tasks, task)
    events = await tasks.log.read(task.id, -1, 10)
    assert bounds.next_seq == len(events) == 3  # created, status, terminal
    assert b"task.terminal" in events[-1].body


async def test_with_events_disabled_nothing_is_recorded() -> None:
    tasks = registry(record_events=False)
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.FAILED, "boom")
    assert task.status is TaskStatus.FAILED
    assert (await log_bounds(tasks, task)).next_seq == 0


async def test_a_result_over_the_cap_is_kept_as_an_error_that_says_so() -> None:
    tasks = registry(retention={"max_result_bytes": 100})
    small = {"content": [{"type": "text", "text": "x" * 50}]}
    kept = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(kept, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome={"result": small})
    assert kept.outcome == {"result": small}

    large = {"content": [{"type": "text", "text": "x" * 100}]}
    size = len(orjson.dumps(large))
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome={"result": large})
    error = {
        "code": -32603,
        "message": f"the task's result ({size} bytes) exceeded the gateway's cap of 100 bytes and was not kept",
        "data": {"reason": "result_too_large", "size": size, "limit": 100},
    }
    assert task.status is TaskStatus.COMPLETED
    assert related_outcome(task, 7) == {"jsonrpc": "2.0", "id": 7, "error": error}  # what tasks/result answers
    view = MODERN.detailed_task(task)
    assert view["status"] == "completed" and view["error"] == error and "result" not in view
    events = await tasks.log.read(task.id, -1, 10)
    assert b"exceeded the gateway's cap of 100 bytes" in events[-1].body  # the terminal event says so too


def text_result(chars: int) -> dict[str, object]:
    return {"result": {"content": [{"type": "text", "text": "x" * chars}]}}


def result_bytes(chars: int) -> int:
    """What the record's copy of `text_result(chars)` costs: its JSON."""
    return len(orjson.dumps(text_result(chars)))


async def ended(tasks: TaskRegistry, chars: int, ttl_ms: int | None = None) -> Task:
    task = await tasks.create("a", "t", ttl_ms, dialect=DIALECT)
    await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome=text_result(chars))
    return task


async def test_the_results_budget_evicts_the_oldest_kept_results_first_and_logs_it() -> None:
    size = result_bytes(100)
    tasks = registry(retention={"max_result_bytes": 2 * size, "results_budget_bytes": 3 * size})
    first, second, third = [await ended(tasks, 100) for _ in range(3)]
    assert tasks.kept_bytes == 3 * size
    cancelled = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(cancelled, Event.CANCEL_REQUESTED)  # no outcome: nothing kept, nothing evicted
    assert tasks.kept_bytes == 3 * size and first.outcome == text_result(100)

    fourth = await ended(tasks, 100)
    assert tasks.kept_bytes == 3 * size
    assert second.outcome == third.outcome == fourth.outcome == text_result(100)
    error = {
        "code": -32603,
        "message": f"the task's result ({size} bytes) was evicted: the gateway keeps at most {3 * size} bytes "
        "of task results, and this was among the oldest",
        "data": {"reason": "result_evicted", "size": size, "budget": 3 * size},
    }
    assert related_outcome(first, 3) == {"jsonrpc": "2.0", "id": 3, "error": error}  # what tasks/result answers
    view = MODERN.detailed_task(first)
    assert view["status"] == "completed" and view["error"] == error and "result" not in view
    events = await tasks.log.read(first.id, -1, 10)
    assert [orjson.loads(b"{" + event.body + b"}") for event in events[3:]] == [
        {"type": "io.github.mcp-task-gateway.result.evicted", "payload": {"size": size, "budget": 3 * size}}
    ]
    assert len(await tasks.log.read(second.id, -1, 10)) == 3  # created, status, terminal: not evicted

    # A larger result evicts as many of the oldest as it needs.
    big = await ended(tasks, 200)
    assert big.outcome == text_result(200)
    assert [task.outcome == text_result(100) for task in (second, third, fourth)] == [False, False, True]
    assert tasks.kept_bytes == size + result_bytes(200)


async def test_a_registry_started_on_the_stores_rebuilds_the_counts_the_budget_and_log_expiry() -> None:
    size = result_bytes(100)
    retention = {"max_result_bytes": size, "results_budget_bytes": 3 * size, "terminal_retention_s": 3600}
    before = registry(retention=retention, max_tasks_per_owner=5)
    created_first = await before.create("a", "t", None, dialect=DIALECT)
    evicted_before, ended_first, _ = [await ended(before, 100) for _ in range(3)]
    await asyncio.sleep(0.01)  # the records say when each ended to the millisecond
    # Evicts `evicted_before`: the error kept instead no longer counts, before or after the start.
    await before.feed(created_first, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome=text_result(100))
    running = await before.create("a", "t", None, dialect=DIALECT)
    assert before.kept_bytes == 3 * size

    after = registry(retention=retention, stores_of=before, max_tasks_per_owner=5)
    await after.rebuild()
    assert after.kept_bytes == 3 * size
    with pytest.raises(TaskLimitReached):  # five live records: four ended, one running
        await after.create("a", "t", None, dialect=DIALECT)
    assert len(after) == 5  # what mcp_gateway_tasks shows
    assert after.find(running.id) is None  # counted, not adopted: take-over is another step

    # The oldest ended kept result goes first: the one created first but ended last stays.
    newest = await after.create("b", "t", None, dialect=DIALECT)
    await after.feed(newest, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome=text_result(100))
    assert after.kept_bytes == 3 * size
    outcomes = {task.id: await after.store.outcome(task.id) for task in (evicted_before, ended_first, created_first)}
    evicted = [task_id for task_id, outcome in outcomes.items() if outcome != orjson.dumps(text_result(100))]
    assert sorted(evicted) == sorted([evicted_before.id, ended_first.id])  # one before, one after the start
    events = [orjson.loads(b"{" + event.body + b"}") for event in await after.log.read(ended_first.id, -1, 10)]
    assert events[-1]["type"].endswith(".result.evicted") and events[-1]["payload"]["size"] == size


async def test_the_logs_of_tasks_that_ended_before_the_start_go_after_terminal_retention() -> None:
    before = registry(retention={"terminal_retention_s": 3600})
    done = await ended(before, 10)
    running = await before.create("a", "t", None, dialect=DIALECT)
    kept = registry(retention={"terminal_retention_s": 3600}, stores_of=before)
    await kept.rebuild()
    await kept.sweep_once()
    assert (await log_bounds(kept, done)).retained_from == 0  # within its retention: kept

    after = registry(retention={"terminal_retention_s": 0}, stores_of=before)
    await after.rebuild()
    await after.sweep_once()
    gone = await log_bounds(after, done)
    assert gone.earliest is None and gone.next_seq == 3  # deleted: its tombstone keeps the next seq
    assert (await log_bounds(after, running)).retained_from == 0  # still running: its log stays
    assert await after.store.get("a", done.id) is not None  # the record lives until its TTL


async def test_a_sweep_of_records_another_process_counted_leaves_this_ones_counts_alone(
    skip_ahead: Callable[[float], None],
) -> None:
    other = registry(max_tasks_per_owner=2)
    expiring = await other.create("a", "t", 1000, dialect=DIALECT)  # a shared store: another replica's task
    this = registry(stores_of=other, max_tasks_per_owner=2)
    await this.create("a", "t", None, dialect=DIALECT)
    await this.create("a", "t", None, dialect=DIALECT)
    skip_ahead(60.0)
    await this.sweep_once()  # drops the other's expired record: none of this one's two
    assert await this.store.get("a", expiring.id) is None
    with pytest.raises(TaskLimitReached):
        await this.create("a", "t", None, dialect=DIALECT)


async def test_an_expired_task_gives_its_kept_result_back_to_the_budget(skip_ahead: Callable[[float], None]) -> None:
    size = result_bytes(100)
    tasks = registry(retention={"max_result_bytes": size, "results_budget_bytes": 2 * size})
    short = await ended(tasks, 100, ttl_ms=1000)
    kept = await ended(tasks, 100, ttl_ms=600_000)
    skip_ahead(60.0)
    await tasks.sweep_once()
    assert tasks.find(short.id) is None and tasks.kept_bytes == size
    await ended(tasks, 100)
    assert kept.outcome == text_result(100)  # room was made by the expiry, not by evicting it


async def test_an_oversized_result_counts_only_its_small_error_against_the_budget() -> None:
    tasks = registry(retention={"max_result_bytes": 100, "results_budget_bytes": 1000})
    task = await ended(tasks, 5000)
    assert task.outcome is not None and task.outcome["error"]["data"]["reason"] == "result_too_large"
    assert tasks.kept_bytes == len(orjson.dumps(task.outcome)) < 1000


def test_max_result_bytes_must_fit_the_budget() -> None:
    with pytest.raises(ValueError, match="max_result_bytes must not exceed results_budget_bytes"):
        Config.model_validate({"retention": {"max_result_bytes": 2000, "results_budget_bytes": 1000}})


async def test_the_store_holds_what_another_process_needs_to_answer_for_the_task() -> None:
    tasks = registry()
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, "done", outcome=text_result(3))
    stored = await tasks.store.get("a", task.id)
    assert stored is not None
    assert (stored.status, stored.status_message, stored.dialect) == (TaskStatus.COMPLETED, "done", DIALECT)
    assert stored.outcome_summary == {
        "status": "completed",
        "isError": False,
        "content": [{"type": "text", "bytes": 3}],
    }
    assert stored.next_seq == (await log_bounds(tasks, task)).next_seq == 3  # created, status, terminal
    assert await tasks.store.outcome(task.id) == orjson.dumps(text_result(3))


async def test_a_status_change_another_writer_got_to_first_loses_and_records_nothing() -> None:
    tasks = registry()
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    # Another writer (a second replica, say) ends the task behind this process's back, as a status write
    # does: its two lifecycle events and the seal in one append, then the status in the store.
    await tasks.log.append(task.id, [b'{"other":1}', b'{"other":2}'], seal=True)
    assert await tasks.store.update_status(task.id, TaskStatus.WORKING, TaskStatus.CANCELLED, None, "T1")
    assert not await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome=text_result(3))
    stored = await tasks.store.find(task.id)
    assert stored is not None and stored.status is TaskStatus.CANCELLED
    assert await tasks.store.outcome(task.id) is None and tasks.kept_bytes == 0
    assert (await log_bounds(tasks, task)).next_seq == 3  # task.created and the other writer's two: none of ours
    assert not task.done.is_set()


async def test_a_large_outcome_summary_is_kept_in_the_record_only_as_its_status_and_size() -> None:
    tasks = registry()
    blocks = {"result": {"content": [{"type": "text", "text": "x"}] * 100}}
    task = await tasks.create("a", "t", None, dialect=DIALECT)
    await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome=blocks)
    events = await tasks.log.read(task.id, -1, 10)
    terminal = orjson.loads(b"{" + events[-1].body + b"}")["payload"]
    assert len(terminal["content"]) == 100  # the terminal event says it all
    size = len(orjson.dumps(terminal))
    assert size > SUMMARY_LIMIT_BYTES
    stored = await tasks.store.get("a", task.id)
    assert stored is not None
    assert stored.outcome_summary == {"status": "completed", "omitted": {"size": size, "limit": SUMMARY_LIMIT_BYTES}}
