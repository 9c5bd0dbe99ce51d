"""Unit tests of store faults in the task registry (issue 24): held writes, a task failed when they
cannot be held, and the orphan check. The stores are the embedded memory ones behind a switch that
makes every write refuse with `StoreUnavailable`, as a store that is down does; the end-to-end cases
(a real Redis, a real full disk) are in test_store_outages.py and test_sqlite_faults.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.events.log import MemoryEventLog, StoreUnavailable
from gateway.metrics import Metrics
from gateway.protocol.era import Era
from gateway.stores.memory import MemoryTaskStore
from gateway.tasks.lifecycle import Event
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import RUNNER_LOST, STORE_UNAVAILABLE, TaskRegistry, outcome_cap

DIALECT = Era.LEGACY.value
WAIT = 10.0


class Switch:
    down = False

    def check(self) -> None:
        if self.down:
            raise StoreUnavailable("the test's store is down")


class SwitchedLog(MemoryEventLog):
    def __init__(self, switch: Switch) -> None:
        super().__init__(1000)
        self.switch = switch

    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        key: str | None = None,
    ) -> int:
        self.switch.check()
        return await super().append(task_id, bodies, seal=seal, epilogue=epilogue, key=key)


class SwitchedStore(MemoryTaskStore):
    def __init__(self, switch: Switch, cap: int) -> None:
        super().__init__(cap)
        self.switch = switch

    async def update_status(self, *args: Any, **kwargs: Any) -> Any:
        self.switch.check()
        return await super().update_status(*args, **kwargs)

    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        self.switch.check()
        await super().advance_next_seq(task_id, next_seq)


def registry(switch: Switch, **store: object) -> TaskRegistry:
    config = Config.model_validate({"store": {"kind": "memory", **store}})
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    return TaskRegistry(
        config.tasks,
        config.retention,
        SwitchedStore(switch, outcome_cap(config.retention)),
        SwitchedLog(switch),
        capture,
        Metrics(),
        outage=config.store,
    )


def event(tasks: TaskRegistry, n: int) -> Any:
    return tasks.capture.lifecycle("progress", n=n)


async def until_written(tasks: TaskRegistry, task_id: str) -> None:
    """Until the retries have written every held write of the task (bounded)."""
    async with asyncio.timeout(WAIT):
        while tasks.writes.holds(task_id):  # noqa: ASYNC110 - the background retry's progress
            await asyncio.sleep(0.01)


async def payloads(tasks: TaskRegistry, task_id: str) -> list[tuple[int, dict[str, Any]]]:
    return [(stored.seq, orjson.loads(b"{" + stored.body + b"}")) for stored in await tasks.log.read(task_id, -1, 1000)]


async def test_writes_held_during_an_outage_land_in_order_when_the_store_returns() -> None:
    switch = Switch()
    tasks = registry(switch)
    task = await tasks.create("alice", "build", None, dialect=DIALECT)
    switch.down = True
    await tasks.record(task, event(tasks, 1))
    await tasks.record(task, event(tasks, 2))
    assert await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome={"result": {"content": []}})
    assert task.terminal and tasks.writes.holds(task.id) and tasks.writes.down
    assert (await tasks.store.find(task.id)).status is TaskStatus.WORKING  # type: ignore[union-attr]
    switch.down = False
    await until_written(tasks, task.id)
    stored = await tasks.store.find(task.id)
    assert stored is not None and stored.status is TaskStatus.COMPLETED
    events = await payloads(tasks, task.id)
    assert [seq for seq, _ in events] == list(range(len(events)))
    names = ["task.created", "progress", "progress", "task.status", "task.terminal"]
    assert [body["type"] for _, body in events] == [tasks.capture.event_type(name) for name in names]
    assert [body["payload"].get("n") for _, body in events[1:3]] == [1, 2]
    bounds = await tasks.log.bounds(task.id)
    assert bounds is not None and bounds.sealed
    await tasks.stop()


async def test_a_task_whose_writes_exceed_the_buffer_fails_and_the_store_learns_it_when_back() -> None:
    switch = Switch()
    tasks = registry(switch, outage_buffer_bytes=2048)
    task = await tasks.create("alice", "build", None, dialect=DIALECT)
    cancelled = asyncio.Event()

    async def cancel() -> None:
        cancelled.set()

    task.cancel = cancel
    switch.down = True
    for n in range(100):
        await tasks.record(task, event(tasks, n))
    assert task.status is TaskStatus.FAILED and task.done.is_set()
    async with asyncio.timeout(WAIT):
        await cancelled.wait()  # the run is stopped at once
    assert not await tasks.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED)  # it has ended here
    switch.down = False
    await until_written(tasks, task.id)
    stored = await tasks.store.find(task.id)
    assert stored is not None and stored.status is TaskStatus.FAILED
    outcome = orjson.loads(await tasks.store.outcome(task.id) or b"{}")
    assert outcome["error"]["data"]["reason"] == STORE_UNAVAILABLE
    events = await payloads(tasks, task.id)
    assert [seq for seq, _ in events] == list(range(len(events)))  # gap-free: dropped events got no seq
    assert events[-2][1]["payload"] | {"statusMessage": ""} == {
        "status": "failed",
        "statusMessage": "",
        "reason": STORE_UNAVAILABLE,
    }
    assert events[-1][1]["type"] == tasks.capture.event_type("task.terminal")
    await tasks.stop()


async def test_the_orphan_check_fails_a_hosted_task_without_a_runner_at_the_second_look() -> None:
    tasks = registry(Switch())
    orphan = await tasks.create("alice", "build", None, dialect=DIALECT)
    running = await tasks.create("alice", "build", None, dialect=DIALECT)
    runner = asyncio.get_running_loop().create_future()
    running.runner = runner
    await tasks.check_orphans()
    assert not orphan.terminal and tasks.orphaned(orphan.id)  # one look: it may be about to start
    await tasks.check_orphans()
    assert orphan.status is TaskStatus.FAILED
    outcome = orjson.loads(await tasks.store.outcome(orphan.id) or b"{}")
    assert outcome["error"]["data"]["reason"] == RUNNER_LOST
    assert not running.terminal and not tasks.orphaned(running.id)
    runner.cancel()
    await tasks.stop()
