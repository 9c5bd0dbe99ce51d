"""What only the Redis store has: writer epochs (fencing), wake-ups that may be lost, several store
instances on one server, a server restart, terminal retention in Redis time, and the start-up check of
`maxmemory-policy`. The shared behaviour is in the contract suites (test_event_log.py, test_task_store.py).

Every server here is the test's own `redis-server` on a free port (tests/redis_server.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import build_stores
from gateway.cli import main
from gateway.config import Config
from gateway.events.log import LogBounds, LogSealed
from gateway.stores.redis import RedisBackend, RedisEventLog, RedisTaskStore, TaskGone, WriterFenced
from gateway.stores.redis_wakeups import UNAVAILABLE
from gateway.tasks.records import TaskStatus
from tests.conftest import EXAMPLE_SERVER, free_port, start_gateway
from tests.redis_server import RedisServer, fresh_prefix, shared_redis_url
from tests.test_cli_tasks import cli, json_lines
from tests.test_task_store import NOW, record


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Pair:
    """A task store and an event log on one backend (one replica's view)."""

    def __init__(self, url: str, prefix: str, *, safety_poll_s: float = 3.0, clock: Clock | None = None) -> None:
        backend = RedisBackend(url, prefix)
        self.backend = backend
        self.clock = clock or Clock()
        self.tasks = RedisTaskStore(backend, 10_000, terminal_retention_s=30.0, clock=self.clock)
        self.log = RedisEventLog(backend, 1000, self.clock, safety_poll_s=safety_poll_s)

    async def close(self) -> None:
        await self.log.close()
        await self.tasks.close()


@pytest.fixture
async def replica() -> AsyncIterator[Pair]:
    pair = Pair(shared_redis_url(), fresh_prefix())
    yield pair
    await pair.close()


async def until_waiting(pair: Pair, task_id: str) -> None:
    """Until the server has the pair's store subscribed to the task's wake-ups (a waiter is blocked)."""
    channel = pair.backend.keys.channel(task_id)
    async with asyncio.timeout(30):
        while (await pair.backend.client.pubsub_numsub(channel))[0][1] == 0:  # noqa: ASYNC110 - a server's state
            await asyncio.sleep(0.01)


def until_polls_fail(pair: Pair, count: int) -> asyncio.Future[None]:
    """Done once `count` of the pair's polls of a task's hash (the waiter's `HMGET`) found no server."""
    client = pair.backend.client
    real_hmget = client.hmget
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed = 0

    async def hmget(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        try:
            return await real_hmget(*args, **kwargs)
        except UNAVAILABLE:
            failed += 1
            if failed >= count and not done.done():
                done.set_result(None)
            raise

    client.hmget = hmget  # type: ignore[method-assign]
    return done


async def all_events(log: RedisEventLog, task_id: str) -> list[bytes]:
    return [event.body for event in await log.read(task_id, -1, 10_000)]


# ------------------------------------------------------------------------------------------ fencing


async def test_a_stale_epoch_is_fenced_nothing_lands_and_no_seq_is_reused(replica: Pair) -> None:
    await replica.tasks.create(record("t1"))
    await replica.log.create("t1")
    assert await replica.tasks.epoch("t1") == 0
    assert await replica.log.append("t1", [b"a", b"b"], epoch=0) == 0

    assert await replica.tasks.bump_epoch("t1", 0) == 1  # another replica takes the task over
    assert await replica.tasks.bump_epoch("t1", 0) is None  # a second claimant of epoch 0 loses
    with pytest.raises(WriterFenced):
        await replica.log.append("t1", [b"late"], epoch=0)
    with pytest.raises(WriterFenced):
        await replica.log.append("t1", [], seal=True, epoch=0)
    assert await replica.log.bounds("t1") == LogBounds(earliest=0, next_seq=2)
    assert await all_events(replica.log, "t1") == [b"a", b"b"]

    assert await replica.log.append("t1", [b"c"], epoch=1) == 2  # the new owner continues at seq 2
    assert await all_events(replica.log, "t1") == [b"a", b"b", b"c"]


async def test_a_fenced_append_to_an_unknown_or_expired_task_is_refused(replica: Pair) -> None:
    with pytest.raises(TaskGone):
        await replica.log.append("never", [b"x"], epoch=0)
    assert await replica.log.bounds("never") is None
    await replica.tasks.create(record("t1"))
    await replica.log.append("t1", [b"a"], epoch=0)
    assert [r.id for r in await replica.tasks.expire(NOW + 60)] == ["t1"]
    with pytest.raises(TaskGone):
        await replica.log.append("t1", [b"after expiry"], epoch=0)
    assert await all_events(replica.log, "t1") == [b"a"]
    assert issubclass(TaskGone, LogSealed) and issubclass(WriterFenced, LogSealed)  # callers stop writing


# ------------------------------------------------------------------------------------------ wake-ups


async def test_a_lost_wake_up_is_covered_by_the_safety_poll() -> None:
    pair = Pair(shared_redis_url(), fresh_prefix(), safety_poll_s=0.2)
    try:
        await pair.log.create("t")
        waiter = asyncio.create_task(pair.log.wait("t", -1, 30))
        await until_waiting(pair, "t")
        pair.backend.wake_ups.drop_next()
        await pair.log.append("t", [b"x"])
        assert await asyncio.wait_for(waiter, 30) is True
        assert pair.backend.wake_ups.dropped == 1  # the only wake-up was lost: the poll found the event
    finally:
        await pair.close()


async def test_a_waiter_on_one_instance_is_woken_by_an_append_on_another() -> None:
    prefix = fresh_prefix()
    a, b = Pair(shared_redis_url(), prefix), Pair(shared_redis_url(), prefix)
    try:
        await a.tasks.create(record("t"))
        await a.log.create("t")
        waiter = asyncio.create_task(b.log.wait("t", -1, 30))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await a.log.append("t", [b"from a"])
        assert await asyncio.wait_for(waiter, 30) is True
        assert await all_events(b.log, "t") == [b"from a"]
        assert await b.tasks.get("alice", "t") == await a.tasks.get("alice", "t")
        assert [r.id for r in (await b.tasks.list_owned("alice", None, 10)).records] == ["t"]
    finally:
        await a.close()
        await b.close()


# ------------------------------------------------------------------------------------------ restart


async def test_a_reader_blocked_across_a_redis_restart_resumes_without_a_gap(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", aof=True)
    server.start()
    prefix = fresh_prefix()
    writer = Pair(server.url, prefix)
    reader = Pair(server.url, prefix, safety_poll_s=0.2)
    try:
        await writer.log.create("t")
        for i in range(100):
            await writer.log.append("t", [b"%d" % i])

        async def read_all(total: int) -> list[int]:
            cursor, seen = -1, []
            while cursor < total - 1:
                page = await reader.log.read("t", cursor, 37)
                if not page:
                    await reader.log.wait("t", cursor, 60)
                    continue
                assert page[0].seq == cursor + 1  # never a gap, never a repeat
                seen += [event.seq for event in page]
                cursor = page[-1].seq
            return seen

        reading = asyncio.create_task(read_all(200))
        await until_waiting(reader, "t")  # caught up and blocked in wait
        poll_failed = until_polls_fail(reader, 1)
        server.stop(signal.SIGKILL)  # a crash: appendfsync always kept every acknowledged append
        # The waiter asked the dead server; the failure came back to it in the step that resolves
        # `poll_failed`, so had it ended the reader, the reader would be done by now.
        await asyncio.wait_for(poll_failed, 30)
        assert not reading.done()
        server.start()
        late = Pair(server.url, prefix)  # a replica that first connects after the restart
        try:
            assert await all_events(late.log, "t") == [b"%d" % i for i in range(100)]  # every acknowledged one
        finally:
            await late.close()
        for i in range(100, 200):
            await writer.log.append("t", [b"%d" % i])
        assert await asyncio.wait_for(reading, 60) == list(range(200))
        assert await all_events(reader.log, "t") == [b"%d" % i for i in range(200)]
    finally:
        await writer.close()
        await reader.close()
        server.stop()


# ------------------------------------------------------------------------------------------ retention


async def test_terminal_retention_expires_hash_and_stream_together(replica: Pair) -> None:
    await replica.tasks.create(record("t1"))
    await replica.log.append("t1", [b"a"])
    ended = await replica.tasks.update_status(
        "t1", TaskStatus.WORKING, TaskStatus.COMPLETED, None, "x", outcome=b'{"result":{}}'
    )
    assert ended is not None
    hash_key, stream_key = replica.backend.keys.task("t1")
    client = replica.backend.client
    hash_ttl, stream_ttl = await client.pttl(hash_key), await client.pttl(stream_key)
    assert hash_ttl > 0 and stream_ttl > 0 and abs(hash_ttl - stream_ttl) < 5_000  # one expiry for both
    assert await replica.tasks.get("alice", "t1") == ended  # within the retention

    replica.clock.now += 30.0  # the retention is over: the id reads as unknown, before Redis drops the keys
    assert await replica.tasks.get("alice", "t1") is None
    assert await replica.tasks.outcome("t1") is None
    assert [r.id for r in await replica.tasks.expire(replica.clock.now)] == ["t1"]
    with pytest.raises(TaskGone):
        await replica.log.append("t1", [b"late"], epoch=0)


async def test_a_deleted_log_keeps_its_next_seq_in_a_tombstone_that_expires(replica: Pair) -> None:
    await replica.log.append("t", [b"a", b"b"])
    await replica.log.delete("t")
    assert await replica.log.bounds("t") == LogBounds(earliest=None, next_seq=2, sealed=True)
    with pytest.raises(LogSealed):
        await replica.log.append("t", [b"new life"])
    hash_key, stream_key = replica.backend.keys.task("t")
    assert await replica.backend.client.pttl(hash_key) > 0  # the tombstone has a life
    assert await replica.backend.client.exists(stream_key) == 0


# ------------------------------------------------------------------------------------------ start-up checks


async def test_a_policy_other_than_noeviction_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path / "lru", policy="allkeys-lru")
    server.start()
    try:
        config = Config.model_validate({"store": {"kind": "redis", "url": server.url, "key_prefix": fresh_prefix()}})
        stores = build_stores(config)
        assert isinstance(stores.tasks, RedisTaskStore) and isinstance(stores.log, RedisEventLog)
        with caplog.at_level(logging.WARNING):
            await stores.open()
        await stores.close()
        assert any("allkeys-lru" in r.getMessage() and "noeviction" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()
    good = build_stores(Config.model_validate({"store": {"kind": "redis", "url": shared_redis_url()}}))
    assert good.check is not None and await good.check() == []
    await good.close()


def test_check_config_connect_and_serve_reach_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    up = tmp_path / "up.toml"
    up.write_text(f'[store]\nkind = "redis"\nurl = "{shared_redis_url()}"\n')
    assert main(["check-config", str(up), "--connect"]) == 0
    assert "reachable" in capsys.readouterr().out
    down = tmp_path / "down.toml"
    down.write_text(f'[store]\nkind = "redis"\nurl = "redis://127.0.0.1:{free_port()}/0"\n')
    assert main(["check-config", str(down), "--connect"]) == 1
    assert "not reachable" in capsys.readouterr().err
    assert main(["check-config", str(down)]) == 0  # without --connect, only the file is checked
    capsys.readouterr()
    serve = ["serve", "--config", str(down), "--listen", f"127.0.0.1:{free_port()}", "--upstream-cmd", "true"]
    assert main(serve) == 1  # a gateway whose store is down at start-up says so and exits
    assert "the Redis store at 127.0.0.1:" in capsys.readouterr().err


async def test_a_replayed_append_pipeline_appends_once(replica: Pair) -> None:
    """redis-py replays a pipeline whose connection broke; an append that had already run answers again."""
    keys = [*replica.backend.keys.task("t"), replica.backend.keys.acks("t")]
    script = replica.backend.scripts.append
    header = f"{NOW!r} 1000 - 00 -"
    args: list[str | bytes] = [f"{header} batch-1 0", b"a", b"b"]
    assert await script(keys=keys, args=args) == 0
    assert await script(keys=keys, args=args) == 0  # the replay: same batch, same index
    assert await all_events(replica.log, "t") == [b"a", b"b"]
    assert await script(keys=keys, args=[f"{header} batch-2 0", b"c"]) == 2  # a new batch appends
    assert await all_events(replica.log, "t") == [b"a", b"b", b"c"]
    # Two appends of the task in one batch (indexes 1 and 12), replayed: each answers its own seq.
    assert await script(keys=keys, args=[f"{header} batch-3 1", b"d"]) == 3
    assert await script(keys=keys, args=[f"{header} batch-3 12", b"e"]) == 4
    assert await script(keys=keys, args=[f"{header} batch-3 2", b"f"]) == 5  # index 2 is not 12's tail
    assert await script(keys=keys, args=[f"{header} batch-3 1", b"d"]) == 3
    assert await script(keys=keys, args=[f"{header} batch-3 12", b"e"]) == 4
    assert await all_events(replica.log, "t") == [b"a", b"b", b"c", b"d", b"e", b"f"]


# ------------------------------------------------------------------------------------------ in the gateway


async def test_a_gateway_on_the_redis_store_runs_streams_and_lists_a_task() -> None:
    """The real gateway with `[store] kind = "redis"`: a task's events and record land in Redis."""
    prefix = fresh_prefix()
    config = f'[store]\nkind = "redis"\nurl = "{shared_redis_url()}"\nkey_prefix = "{prefix}"\n'
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gateway:
        code, out, err = await cli(
            "call", gateway.url, "slow_build", "--args", '{"steps": 3, "delay": 0.05}', "--task", "--follow", "--json"
        )
        assert code == 0, err
        *events, result = json_lines(out)
        task_id = events[0]["taskId"]
        assert [event["seq"] for event in events] == list(range(len(events)))
        assert result["content"] == [{"type": "text", "text": "built 3 steps"}]
        code, out, err = await cli("tasks", gateway.url, "list")
        assert code == 0 and task_id in out, err
    replica = Pair(shared_redis_url(), prefix)  # what another replica would read
    try:
        stored = await replica.tasks.find(task_id)
        assert stored is not None and stored.status is TaskStatus.COMPLETED
        bounds = await replica.log.bounds(task_id)
        assert bounds is not None and bounds.sealed and bounds.next_seq == len(events)
        assert [event.seq for event in await replica.log.read(task_id, -1, 100)] == list(range(len(events)))
    finally:
        await replica.close()
