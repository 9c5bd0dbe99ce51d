"""Unit tests of taking over at start-up (`gateway.tasks.takeover`): what becomes of the tasks stores hold
unfinished when a process starts on them. The end-to-end restart on SQLite is tests/test_restart.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.events.log import MemoryEventLog
from gateway.metrics import Metrics
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.stores.memory import MemoryTaskStore
from gateway.tasks.lifecycle import Event
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.records import TaskStatus, UpstreamTaskRef
from gateway.tasks.registry import TaskRegistry, outcome_cap
from gateway.tasks.takeover import LEASE_EXPIRED, take_over, take_over_task
from gateway.upstream.base import Exchange
from tests.fake_upstream import OneConversation

CONFIG = Config()
PREFIX = CONFIG.events.prefix + "."


class ChildUpstream(OneConversation):
    """An upstream whose conversations end with the gateway process (as a stdio child's do)."""

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        raise AssertionError(f"a lost conversation was asked {message['method']}")


def process(store: MemoryTaskStore, log: MemoryEventLog) -> TaskRegistry:
    """A gateway process's registry on the shared `store` and `log`."""
    capture = Capture(CONFIG.rules, CONFIG.events.prefix, CONFIG.retention.max_payload_bytes)
    return TaskRegistry(CONFIG.tasks, CONFIG.retention, store, log, capture, Metrics())


async def events(log: MemoryEventLog, task_id: str) -> list[dict[str, Any]]:
    """The task's stored events as JSON (a body is an object's members: `"type":…,"payload":…`)."""
    return [orjson.loads(b"{" + event.body + b"}") for event in await log.read(task_id, -1, 100)]


async def types(log: MemoryEventLog, task_id: str) -> list[str]:
    return [event["type"].removeprefix(PREFIX) for event in await events(log, task_id)]


async def test_a_new_process_fails_every_unfinished_task_it_cannot_resume_and_leaves_ended_ones() -> None:
    store, log = MemoryTaskStore(outcome_cap(CONFIG.retention)), MemoryEventLog(100)
    dead = process(store, log)
    hosted = await dead.create("alice", "build", None, dialect=Era.LEGACY.value)
    watched = await dead.create(
        "bob", "job", None, dialect=Era.MODERN.value, task_id="c0ffee.u1", upstream=UpstreamTaskRef("u1", "c0ffee")
    )
    ended = await dead.create("alice", "build", None, dialect=Era.LEGACY.value)
    await dead.feed(ended, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, outcome={"result": {"content": []}})

    started = process(store, log)
    upstream = ChildUpstream()
    passthrough = Passthrough(started, upstream, CONFIG.tasks, Metrics())
    await take_over(started, lambda _: passthrough)

    for task, hosted_by in ((hosted, "gateway"), (watched, "upstream")):
        record = await store.find(task.id)
        assert record is not None and record.status is TaskStatus.FAILED
        assert await types(log, task.id) == ["task.created", "task.owner_lost", "task.status", "task.terminal"]
        lost = (await events(log, task.id))[1]["payload"]
        assert lost["hostedBy"] == hosted_by and lost["cause"] == record.status_message
        kept = await store.outcome(task.id)
        assert kept is not None and orjson.loads(kept)["error"]["data"] == {"reason": "owner_lost"}
        assert started.get(task.owner, task.id) is not None  # this process answers for it now
    assert started.get("alice", ended.id) is None  # nothing to take over: the stores answer for it
    assert await types(log, ended.id) == ["task.created", "task.status", "task.terminal"]
    assert await store.unfinished() == []


async def test_a_task_whose_cancel_was_requested_is_cancelled_by_the_taker_not_failed() -> None:
    store, log = MemoryTaskStore(outcome_cap(CONFIG.retention)), MemoryEventLog(100)
    dead = process(store, log)
    hosted = await dead.create("alice", "build", None, dialect=Era.LEGACY.value)

    taker = process(store, log)
    record = await store.find(hosted.id)
    assert record is not None
    passthrough = Passthrough(taker, ChildUpstream(), CONFIG.tasks, Metrics())
    await take_over_task(taker, lambda _: passthrough, taker.adopt(record), LEASE_EXPIRED, cancel_requested=True)

    taken = await store.find(hosted.id)
    assert taken is not None and taken.status is TaskStatus.CANCELLED
    assert await types(log, hosted.id) == ["task.created", "task.owner_lost", "task.status", "task.terminal"]
    assert LEASE_EXPIRED in (await events(log, hosted.id))[1]["payload"]["cause"]
    assert (await events(log, hosted.id))[2]["payload"]["status"] == "cancelled"
