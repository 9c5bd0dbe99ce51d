"""What only the SQLite store (`gateway.stores.sqlite*`) promises beyond the contract suites
(`tests/test_task_store.py`, `tests/test_event_log.py`, which run it like every store).

Its data survives closing and reopening the file (records, outcome bytes, events, seals, tombstones'
next_seq, trims); WAL and `synchronous` are as configured; a big append or read never stops the event
loop (a ticker keeps counting while it runs); a corrupt or unusable path is one clear line at start
(`check-config --connect` exits 2); and a real gateway on `[store] kind = "sqlite"` writes tasks,
results and events that a later process reads back from the file.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson
import pytest

from gateway.app import build_stores
from gateway.cli import main
from gateway.config import Config
from gateway.events.log import LogBounds, LogSealed
from gateway.stores.sqlite import SCHEMA, SCHEMA_VERSION, SqliteDatabase, StoreUnavailable, Synchronous
from gateway.stores.sqlite_log import SqliteEventLog
from gateway.stores.sqlite_tasks import SqliteTaskStore
from gateway.tasks.records import TaskRecord, TaskStatus, UpstreamTaskRef
from tests.conftest import EXAMPLE_SERVER, ROOT, start_gateway
from tests.wire import Client, task_events

T = TypeVar("T")

CAP = 1 << 20


def record(task_id: str, owner: str = "alice") -> TaskRecord:
    return TaskRecord(
        id=task_id,
        owner=owner,
        tool="build",
        dialect="2026-07-28",
        ttl_ms=60_000,
        poll_interval_ms=1000,
        created_at="2026-12-01T12:00:00.000Z",
        last_updated_at="2026-12-01T12:00:00.000Z",
        expires_at=2_000_000_000.5,
        upstream=UpstreamTaskRef("up-1", "c0ffee"),
    )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def open_stores(
    path: Path, clock: Clock, *, max_events: int = 5, max_event_age_s: float = math.inf
) -> tuple[SqliteTaskStore, SqliteEventLog]:
    """Both stores on one file, as `build_stores` makes them."""
    database = SqliteDatabase(path)
    log = SqliteEventLog(database, max_events, clock, max_event_age_s=max_event_age_s, tombstone_ttl_s=1e6)
    return SqliteTaskStore(database, CAP, log), log


async def close(tasks: SqliteTaskStore, log: SqliteEventLog) -> None:
    await log.close()
    await tasks.close()


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    opened = SqliteDatabase(tmp_path / "gateway.db").acquire()
    yield opened
    await opened.release()


# ------------------------------------------------------------------------------------------ durability


async def test_everything_survives_closing_and_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    clock = Clock(1000.0)
    outcome = b'{"result":{"content":[{"type":"text","text":"\\u2713 \\n done"}],"x":1.5e300}}'
    tasks, log = open_stores(path, clock, max_event_age_s=100.0)
    for i in range(3):
        await tasks.create(record(f"t{i}"))
    await tasks.advance_next_seq("t0", 12)
    done = await tasks.update_status(
        "t0", TaskStatus.WORKING, TaskStatus.COMPLETED, "done", "2026-12-01T12:00:09.000Z", outcome=outcome
    )
    assert done is not None
    first_page = await tasks.list_owned("alice", None, 2)
    await log.append("aged", [b"old"])
    clock.now = 1050.0
    await log.append("aged", [b"young"])
    await log.append("counted", [b"c%d" % i for i in range(12)])  # the count (5) trims seq 0-6
    await log.append("sealed", [b"s0", b"s1"], seal=True)
    await log.append("buried", [b"b0", b"b1", b"b2"])
    await log.delete("buried")
    await close(tasks, log)

    clock.now = 1120.0  # "old" (created at 1000) is past its 100 s now, "young" (1050) is not
    tasks, log = open_stores(path, clock, max_event_age_s=100.0)
    try:
        assert await tasks.get("alice", "t0") == replace(done, next_seq=12)
        assert await tasks.outcome("t0") == outcome  # byte-identical
        assert await tasks.get("alice", "t1") == record("t1")
        assert first_page.next_cursor is not None
        rest = await tasks.list_owned("alice", first_page.next_cursor, 2)  # an old cursor still walks on
        assert [r.id for r in rest.records] == ["t2"]
        await tasks.create(record("t3"))
        assert [r.id for r in (await tasks.list_owned("alice", first_page.next_cursor, 5)).records] == ["t2", "t3"]

        assert await log.bounds("counted") == LogBounds(earliest=7, next_seq=12)
        assert [e.body for e in await log.read("counted", -1, 100)] == [b"c%d" % i for i in range(7, 12)]
        assert await log.append("counted", [b"c12"]) == 12  # numbering goes on where it was
        assert await log.bounds("sealed") == LogBounds(earliest=0, next_seq=2, sealed=True)
        with pytest.raises(LogSealed):
            await log.append("sealed", [b"late"])
        assert [(e.seq, e.created, e.body) for e in await log.read("aged", -1, 10)] == [(1, 1050.0, b"young")]
        assert await log.bounds("buried") == LogBounds(earliest=None, next_seq=3, sealed=True)
        with pytest.raises(LogSealed):  # the tombstone still refuses a new life at seq 0
            await log.append("buried", [b"again"])
    finally:
        await close(tasks, log)


async def test_a_restart_never_hands_out_a_seq_twice(tmp_path: Path) -> None:
    """Events committed in one life, then more in the next: one gap-free run, no duplicates."""
    path = tmp_path / "gateway.db"
    clock = Clock(0.0)
    for life in range(3):
        tasks, log = open_stores(path, clock, max_events=100)
        assert await log.append("t", [b"%d-%d" % (life, i) for i in range(4)]) == life * 4
        await close(tasks, log)
    tasks, log = open_stores(path, clock, max_events=100)
    try:
        events = await log.read("t", -1, 100)
        assert [e.seq for e in events] == list(range(12))
        assert [e.body for e in events] == [b"%d-%d" % (life, i) for life in range(3) for i in range(4)]
    finally:
        await close(tasks, log)


# ------------------------------------------------------------------------------------------ pragmas


@pytest.mark.parametrize(("synchronous", "level"), [("normal", 1), ("full", 2)])
async def test_the_file_is_in_wal_mode_with_the_configured_synchronous(
    tmp_path: Path, synchronous: Synchronous, level: int
) -> None:
    config = Config.model_validate({"store": {"kind": "sqlite", "path": str(tmp_path / "data" / "g.db")}})
    config = config.model_copy(update={"store": config.store.model_copy(update={"synchronous": synchronous})})
    stores = build_stores(config)
    try:
        assert isinstance(stores.tasks, SqliteTaskStore) and isinstance(stores.log, SqliteEventLog)
        assert stores.log._db is stores.tasks._db  # one file for both
        pragmas = await stores.tasks._db.write(
            lambda c: (c.execute("PRAGMA journal_mode").fetchone()[0], c.execute("PRAGMA synchronous").fetchone()[0])
        )
        assert pragmas == ("wal", level)
    finally:
        await stores.close()
    assert (tmp_path / "data" / "g.db").is_file()  # the directory was created on first start
    with sqlite3.connect(tmp_path / "data" / "g.db") as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # WAL is kept in the file


# ------------------------------------------------------------------------------------------ the loop keeps running


async def ticks_during(work: Awaitable[T]) -> tuple[int, T]:
    """How often a ticker on the loop ran while `work` was awaited, and work's result."""
    ticks = 0
    finished = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not finished.is_set():
            await asyncio.sleep(0.001)
            ticks += 1

    running = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        finished.set()
        await running
    return ticks, result


async def test_a_big_append_and_a_big_read_do_not_block_the_loop(database: SqliteDatabase) -> None:
    log = SqliteEventLog(database, 1_000_000)
    bodies = [b'{"type":"com.example.progress","payload":{"progress":%d}}' % i for i in range(200_000)]
    ticks, first = await ticks_during(log.append("t", bodies))
    assert first == 0
    assert ticks >= 5, f"the loop ran only {ticks} times during a 200,000-event append"
    ticks, events = await ticks_during(log.read("t", -1, 200_000))
    assert len(events) == 200_000 and events[-1].body == bodies[-1]
    assert ticks >= 5, f"the loop ran only {ticks} times during a 200,000-event read"
    await log.close()


async def test_writes_of_one_tick_commit_together_and_each_refusal_stays_its_own(database: SqliteDatabase) -> None:
    log = SqliteEventLog(database, 100)
    await log.append("sealed", [b"x"], seal=True)
    results = await asyncio.gather(
        *(log.append(f"t{i}", [b"a", b"b"]) for i in range(50)),
        log.append("sealed", [b"late"]),
        return_exceptions=True,
    )
    assert results[:50] == [0] * 50
    assert isinstance(results[50], LogSealed)
    assert [await log.bounds(f"t{i}") for i in (0, 49)] == [LogBounds(0, 2)] * 2
    await log.close()


async def test_a_batch_an_sqlite_error_rolls_back_leaves_no_seq_behind(database: SqliteDatabase) -> None:
    """The writer thread remembers logs' rows between appends: a rolled-back batch must not advance them."""
    log = SqliteEventLog(database, 100)
    assert await log.append("t", [b"a"]) == 0
    results = await asyncio.gather(
        log.append("t", [b"lost", b"lost"]),
        database.write(lambda connection: connection.execute("INSERT INTO no_such_table VALUES (1)")),
        return_exceptions=True,
    )
    assert [type(result) for result in results] == [StoreUnavailable, StoreUnavailable]
    assert await log.append("t", [b"b"]) == 1
    assert [(e.seq, e.body) for e in await log.read("t", -1, 10)] == [(0, b"a"), (1, b"b")]
    await log.close()


async def test_the_next_seq_outlives_every_event_whatever_deletes_them(tmp_path: Path) -> None:
    """Appends write only events; the age trim and delete keep the next seq in the log's row first."""
    path = tmp_path / "gateway.db"
    clock = Clock(1000.0)
    tasks, log = open_stores(path, clock, max_events=100, max_event_age_s=10)
    try:
        await log.append("aged", [b"old"] * 3)
        await log.append("buried", [b"x"] * 2)
        clock.now += 20
        assert await log.bounds("aged") == LogBounds(earliest=None, next_seq=3)  # all past their age
        await log.delete("buried")
    finally:
        await close(tasks, log)
    tasks, log = open_stores(path, clock, max_events=100, max_event_age_s=10)
    try:
        assert await log.bounds("aged") == LogBounds(earliest=None, next_seq=3)
        assert await log.bounds("buried") == LogBounds(earliest=None, next_seq=2, sealed=True)
        assert await log.append("aged", [b"new"]) == 3
    finally:
        await close(tasks, log)


async def test_a_read_hands_out_nothing_past_the_bounds_the_loop_knows(tmp_path: Path) -> None:
    """A reader thread sees an append as soon as it commits; the loop learns of it a moment later (the
    commit's callback). Held back here: reads stop at the known next seq, so a stream's cursor is never
    one that `bounds` (tasks/stream's `after` check) would call beyond the task's events."""
    tasks, log = open_stores(tmp_path / "gateway.db", Clock(1000.0), max_events=100)
    try:
        await log.append("t", [b"a", b"b"])
        held: list[tuple[str, object]] = []
        committed = log._known.committed
        log._known.committed = lambda task_id, state: held.append((task_id, state))  # type: ignore[method-assign]
        await log.append("t", [b"c"])  # committed in the file; the loop's state not updated yet
        assert [event.seq for event in await log.read("t", -1, 10)] == [0, 1]
        assert await log.bounds("t") == LogBounds(earliest=0, next_seq=2)
        log._known.committed = committed  # type: ignore[method-assign]
        for task_id, state in held:
            committed(task_id, state)  # type: ignore[arg-type]
        assert [event.body for event in await log.read("t", 1, 10)] == [b"c"]
        assert await log.bounds("t") == LogBounds(earliest=0, next_seq=3)
    finally:
        await close(tasks, log)


def counting_reads(tasks: SqliteTaskStore) -> list[int]:
    """Count the store's trips to a reader thread from now on (in the one-element list returned)."""
    reads = [0]
    read = tasks._db.read

    async def counted(query: Callable[[sqlite3.Connection], T]) -> T:
        reads[0] += 1
        return await read(query)

    tasks._db.read = counted  # type: ignore[method-assign]
    return reads


async def test_records_known_since_their_last_write_are_read_without_a_reader_thread(tmp_path: Path) -> None:
    """tasks/get, tasks/stream and tasks/result look a record up first: for a task this process wrote,
    that is no trip to a reader thread. What is remembered is what the last commit left (a refused
    compare-and-set, an append's next seq, an expiry), and a record found in the file is read once."""
    path = tmp_path / "gateway.db"
    tasks, log = open_stores(path, Clock(1000.0))
    try:
        reads = counting_reads(tasks)
        await tasks.create(record("t1"))
        await tasks.create(replace(record("t2"), expires_at=4_000_000_000.0))
        assert await tasks.get("alice", "t1") == record("t1") and reads == [0]
        completed = await tasks.update_status("t1", TaskStatus.WORKING, TaskStatus.COMPLETED, "done", "later")
        assert completed is not None
        assert await tasks.update_status("t1", TaskStatus.WORKING, TaskStatus.FAILED, None, "later") is None
        await tasks.advance_next_seq("t1", 7)
        assert await tasks.get("alice", "t1") == replace(completed, next_seq=7)
        assert await tasks.get("bob", "t1") is None
        assert reads == [0]
        assert await tasks.expire(3_000_000_000.0) == [replace(completed, next_seq=7)]
        assert await tasks.get("alice", "t1") is None
    finally:
        await close(tasks, log)
    tasks, log = open_stores(path, Clock(1000.0))  # a restart: nothing known yet
    try:
        reads = counting_reads(tasks)
        expected = replace(record("t2"), expires_at=4_000_000_000.0)
        assert await tasks.get("alice", "t2") == expected and reads == [1]
        assert await tasks.get("alice", "t2") == expected and reads == [1]
    finally:
        await close(tasks, log)


async def test_unknown_ids_are_answered_from_memory_as_known_ones_are(tmp_path: Path) -> None:
    """An unknown id never costs a trip to a reader thread (the in-memory index covers every id in the
    file), so the time of an answer does not tell whether an id exists; creates and expiries keep the
    index, also those committed while it was being read, and after a restart it holds the file's ids."""
    path = tmp_path / "gateway.db"
    tasks, log = open_stores(path, Clock(1000.0))
    try:
        reads = counting_reads(tasks)
        await tasks.create(record("before"))
        lookup = asyncio.ensure_future(tasks.get("alice", "nobody"))
        await asyncio.sleep(0)  # the index is being read: a create in the same batch, after it
        created = asyncio.ensure_future(tasks.create(replace(record("during"), expires_at=4_000_000_000.0)))
        assert await lookup is None
        await created
        assert await tasks.get("alice", "during") is not None
        for _ in range(50):
            assert await tasks.get("alice", secrets.token_hex(16)) is None
        assert await tasks.expire(3_000_000_000.0) == [record("before")]
        assert await tasks.get("alice", "before") is None
        assert reads == [0]
    finally:
        await close(tasks, log)
    tasks, log = open_stores(path, Clock(1000.0))  # a restart: the index is the file's
    try:
        reads = counting_reads(tasks)
        assert await tasks.get("alice", "unknown") is None and reads == [0]
        assert await tasks.get("alice", "during") is not None and reads == [1]  # its record, read once
    finally:
        await close(tasks, log)


# ------------------------------------------------------------------------------------------ bad files


def write_config(tmp_path: Path, store_path: Path) -> Path:
    config = tmp_path / "gateway.toml"
    config.write_text(f'[store]\nkind = "sqlite"\npath = "{store_path}"\n', encoding="utf-8")
    return config


def test_a_corrupt_file_is_one_clear_line_at_start(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(StoreUnavailable, match="file is not a database"):
        SqliteDatabase(corrupt)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(write_config(tmp_path, corrupt)), "--connect"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(corrupt) in done.stderr and "not a database" in done.stderr


def test_serve_refuses_to_start_on_a_corrupt_file(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database, " * 100)
    config = str(write_config(tmp_path, corrupt))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            config,
            "--listen",
            "127.0.0.1:0",
            "--upstream-cmd",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert done.returncode == 2, done
    assert "listening" not in done.stdout + done.stderr
    assert done.stderr.splitlines()[-1].startswith("mcp-task-gateway: cannot use the SQLite store"), done.stderr


def test_an_unusable_path_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    unusable = blocker / "data" / "gateway.db"  # its "directory" is a file
    config = write_config(tmp_path, unusable)
    assert main(["check-config", str(config)]) == 0  # without --connect only the file is checked
    capsys.readouterr()
    assert main(["check-config", str(config), "--connect"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(unusable) in err and "Not a directory" in err, err


def test_check_config_connect_opens_a_good_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "fresh" / "gateway.db"
    assert main(["check-config", str(write_config(tmp_path, store)), "--connect"]) == 0
    assert store.is_file()
    memory = tmp_path / "memory.toml"
    memory.write_text('[store]\nkind = "memory"\n', encoding="utf-8")
    assert main(["check-config", str(memory), "--connect"]) == 0
    assert capsys.readouterr().out.count(": ok") == 2


async def test_a_second_opener_of_the_same_file_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = SqliteDatabase(tmp_path / "gateway.db").acquire()
    with pytest.raises(StoreUnavailable, match="in use by another gateway process"):
        SqliteDatabase(tmp_path / "gateway.db")
    await first.release()
    second = SqliteDatabase(tmp_path / "gateway.db").acquire()
    await second.release()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    with sqlite3.connect(path) as other:
        other.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreUnavailable, match="schema version 99"):
        SqliteDatabase(path)


async def test_a_file_of_schema_version_1_is_migrated_and_its_outcomes_count_as_kept(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    version_1 = re.sub(r"outcome BLOB,\n\s*outcome_replaced [^\n]*\n", "outcome BLOB\n", SCHEMA)
    assert "outcome_replaced" not in version_1
    made = TaskRecord(
        "t1",
        "alice",
        "build",
        "2025-11-25",
        60_000,
        1000,
        "2026-12-01T12:00:00.000Z",
        "2026-12-01T12:00:00.000Z",
        2e9,
        status=TaskStatus.COMPLETED,
    )
    with sqlite3.connect(path) as old:
        old.executescript(f"{version_1} PRAGMA user_version = 1;")
        old.execute(
            "INSERT INTO tasks (id, owner, status, expires_at, next_seq, record, outcome) VALUES (?, ?, ?, ?, 0, ?, ?)",
            ("t1", "alice", "completed", 2e9, orjson.dumps(made.to_dict()), b'{"result":{}}'),
        )
    store = SqliteTaskStore(SqliteDatabase(path), 1000)
    try:
        assert [(found.record, found.outcome_bytes) for found in await store.live()] == [(made, 13)]
        assert await store.replace_outcome("t1", b'{"error":{}}')
        assert [found.outcome_bytes for found in await store.live()] == [None]
    finally:
        await store.close()
    with sqlite3.connect(path) as reopened:
        assert reopened.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3


# ------------------------------------------------------------------------------------------ a real gateway


async def test_a_gateway_on_sqlite_keeps_its_tasks_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    config = f'[store]\nkind = "sqlite"\npath = "{path}"\n'
    async with (
        asyncio.timeout(60),
        aiohttp.ClientSession() as http,
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw,
    ):
        client = Client(http, gw.url)
        await client.initialize()
        created = await client.result(
            "tools/call", {"name": "slow_build", "arguments": {"steps": 3, "delay": 0.01}, "task": {"ttl": 60_000}}
        )
        task_id = created["task"]["taskId"]
        result = (await client.request("tasks/result", {"taskId": task_id})).final["result"]
        stream = await client.request("tasks/stream", {"taskId": task_id})
        events = task_events(stream.messages)
        assert [e["seq"] for e in events] == list(range(len(events))) and len(events) >= 3
        await client.delete()

    tasks, log = open_stores(path, Clock(0.0))
    try:
        stored = await tasks.find(task_id)
        assert stored is not None and stored.status is TaskStatus.COMPLETED
        assert stored.next_seq == len(events)
        kept = await tasks.outcome(task_id)
        assert kept is not None and result["content"] == orjson.loads(kept)["result"]["content"]
        bounds = await log.bounds(task_id)
        assert bounds is not None and bounds.sealed and bounds.next_seq == len(events)
    finally:
        await close(tasks, log)
