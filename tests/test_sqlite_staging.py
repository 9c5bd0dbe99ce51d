"""The SQLite log's staged appends (`gateway.stores.sqlite_log`): small appends go to the insertion-ordered
`staged` table, a fold moves them into `events` in `(task, seq)` order, and none of it shows: seqs,
reads, trims, seals, deletes and restarts are what they are with every event in `events`.

The contract suite (`tests/test_event_log.py`) runs the log as every store; these tests look at the
file's tables too, to check each case runs where it says (staged, folded, or both at once).
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.events.log import LogBounds, LogSealed, StoreUnavailable
from gateway.stores import sqlite_log
from gateway.stores.sqlite import SqliteDatabase
from gateway.stores.sqlite_log import DIRECT_ROWS, SqliteEventLog
from gateway.stores.sqlite_tasks import SqliteTaskStore
from tests.test_sqlite_store import record

TASKS = 64


def open_log(path: Path, max_events: int = 1000) -> SqliteEventLog:
    return SqliteEventLog(SqliteDatabase(path), max_events, tombstone_ttl_s=1e6)


def rows_in(path: Path, table: str) -> list[tuple[str, int]]:
    """(task, seq) of every row of `table` in the file, as a second connection sees it."""
    with sqlite3.connect(path) as connection:
        return list(connection.execute(f"SELECT task, seq FROM {table} ORDER BY task, seq"))


async def bodies(log: SqliteEventLog, task_id: str, after: int = -1, limit: int = 1000) -> list[tuple[int, bytes]]:
    return [(event.seq, event.body) for event in await log.read(task_id, after, limit)]


async def test_many_tasks_appending_one_event_each_in_one_tick_are_staged_with_their_own_seqs(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    log = open_log(path)
    try:
        for round_ in range(3):
            firsts = await asyncio.gather(*(log.append(f"t{i}", [b"%d.%d" % (i, round_)]) for i in range(TASKS)))
            assert firsts == [round_] * TASKS
        staged = rows_in(path, "staged")
        assert len(staged) == 3 * TASKS and rows_in(path, "events") == []
        for i in range(TASKS):
            assert await bodies(log, f"t{i}") == [(r, b"%d.%d" % (i, r)) for r in range(3)]
            assert await log.bounds(f"t{i}") == LogBounds(earliest=0, next_seq=3)
    finally:
        await log.close()


async def test_a_batch_goes_straight_to_events_after_its_tasks_staged_events(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    log = open_log(path)
    try:
        await log.append("other", [b"o"])
        await log.append("mixed", [b"one"])
        assert rows_in(path, "staged") == [("mixed", 0), ("other", 0)]
        await log.append("mixed", [b"m"] * DIRECT_ROWS)  # the staged event moves first: seqs stay in order
        assert rows_in(path, "events") == [("mixed", seq) for seq in range(DIRECT_ROWS + 1)]
        assert rows_in(path, "staged") == [("other", 0)]  # no other task's events move
        assert await bodies(log, "mixed", after=-1, limit=2) == [(0, b"one"), (1, b"m")]
        await log.append("mixed", [b"next"])
        assert await bodies(log, "mixed", after=DIRECT_ROWS - 1) == [(DIRECT_ROWS, b"m"), (DIRECT_ROWS + 1, b"next")]
    finally:
        await log.close()


async def test_a_fold_moves_every_staged_event_into_events_and_reads_join_both_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_log, "FOLD_ROWS", 8)
    path = tmp_path / "gateway.db"
    log = open_log(path)
    try:
        for seq in range(7):
            await asyncio.gather(log.append("a", [b"a%d" % seq]), log.append("b", [b"b%d" % seq]))
            if seq == 3:  # the 8th staged event folds all of them
                assert len(rows_in(path, "events")) == 8 and rows_in(path, "staged") == []
        # a and b have seqs 0-3 in events and 4-6 staged: a read across both, and one page of it
        assert rows_in(path, "staged") == [(task, seq) for task in "ab" for seq in range(4, 7)]
        assert await bodies(log, "a") == [(seq, b"a%d" % seq) for seq in range(7)]
        assert await bodies(log, "b", after=2, limit=3) == [(3, b"b3"), (4, b"b4"), (5, b"b5")]
    finally:
        await log.close()


async def test_seqs_continue_across_a_restart_with_events_left_staged(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    log = open_log(path)
    try:
        await log.append("t", [b"e"] * DIRECT_ROWS)  # seqs 0-15 in events
        for _ in range(3):
            await log.append("t", [b"s"])  # 16-18 staged
        await log.append("sealed", [b"x"], seal=True)
    finally:
        await log.close()
    assert len(rows_in(path, "staged")) == 4
    log = open_log(path)  # a restart: nothing known, events left staged
    try:
        assert await log.bounds("t") == LogBounds(earliest=0, next_seq=19)
        assert [seq for seq, _ in await bodies(log, "t")] == list(range(19))
        assert await log.append("t", [b"after"]) == 19  # the first write folds what was left staged
        assert rows_in(path, "staged") == [("t", 19)]
        assert await bodies(log, "t", after=17) == [(18, b"s"), (19, b"after")]
        with pytest.raises(LogSealed):
            await log.append("sealed", [b"late"])
    finally:
        await log.close()


async def test_trimming_by_count_into_staged_events_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    log = open_log(path, max_events=3)
    try:
        for seq in range(5):
            await log.append("t", [b"%d" % seq])
        assert await log.bounds("t") == LogBounds(earliest=2, next_seq=5)
        assert await bodies(log, "t") == [(2, b"2"), (3, b"3"), (4, b"4")]
        assert {seq for _, seq in rows_in(path, "staged") + rows_in(path, "events")} == {2, 3, 4}
    finally:
        await log.close()


async def test_deleting_a_log_with_staged_events_drops_them_and_keeps_its_next_seq(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    log = open_log(path)
    try:
        await log.append("gone", [b"a"])
        await log.append("kept", [b"k"])
        await log.append("gone", [b"b"])
        await log.delete("gone")
        assert rows_in(path, "staged") == [("kept", 0)]
        assert await log.bounds("gone") == LogBounds(earliest=None, next_seq=2, sealed=True)
        with pytest.raises(LogSealed):
            await log.append("gone", [b"c"])
    finally:
        await log.close()
    log = open_log(path)
    try:
        assert await log.bounds("gone") == LogBounds(earliest=None, next_seq=2, sealed=True)
    finally:
        await log.close()


async def test_appends_of_one_tick_keep_their_order_with_the_logs_other_writes(tmp_path: Path) -> None:
    log = open_log(tmp_path / "gateway.db")
    try:
        before, seal, after = await asyncio.gather(
            log.append("t", [b"before"]), log.seal("t"), log.append("t", [b"after"]), return_exceptions=True
        )
        assert before == 0 and seal is None and isinstance(after, LogSealed)
        assert await bodies(log, "t") == [(0, b"before")]
    finally:
        await log.close()


async def test_a_rolled_back_batch_fails_every_append_in_it_and_the_next_ones_get_the_right_seqs(
    tmp_path: Path,
) -> None:
    database = SqliteDatabase(tmp_path / "gateway.db")
    log = SqliteEventLog(database, 1000)
    try:
        await asyncio.gather(*(log.append(f"t{i}", [b"kept"]) for i in range(3)))

        def broken(connection: sqlite3.Connection) -> None:
            connection.execute("INSERT INTO no_such_table VALUES (1)")

        results = await asyncio.gather(
            *(log.append(f"t{i}", [b"lost"]) for i in range(3)), database.write(broken), return_exceptions=True
        )
        assert all(isinstance(result, StoreUnavailable) for result in results), results
        assert await asyncio.gather(*(log.append(f"t{i}", [b"next"]) for i in range(3))) == [1, 1, 1]
        for i in range(3):
            assert await bodies(log, f"t{i}") == [(0, b"kept"), (1, b"next")]
    finally:
        await log.close()


async def test_an_age_trim_reaches_into_staged_events(tmp_path: Path) -> None:
    now = [1000.0]
    log = SqliteEventLog(SqliteDatabase(tmp_path / "gateway.db"), 100, lambda: now[0], max_event_age_s=10)
    try:
        await log.append("t", [b"old"])
        now[0] += 5
        await log.append("t", [b"young"])
        now[0] += 7  # "old" is 12 s old, "young" 7 s
        assert await log.bounds("t") == LogBounds(earliest=1, next_seq=2)
        assert await bodies(log, "t") == [(1, b"young")]
    finally:
        await log.close()


async def test_a_records_next_seq_comes_from_its_log_without_a_write_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    database = SqliteDatabase(path)
    log = SqliteEventLog(database, 1000)
    tasks = SqliteTaskStore(database, 1 << 20, log)
    writes = [0]
    submit = database.submit

    def counting(*args: Any, **kwargs: Any) -> Any:
        writes[0] += 1
        return submit(*args, **kwargs)

    try:
        await tasks.create(record("t"))
        first = await log.append("t", [b"a", b"b", b"c"])
        database.submit = counting  # type: ignore[method-assign]
        await tasks.advance_next_seq("t", first + 3)  # what the registry does after each append
        assert writes == [0]
        assert (await tasks.find("t")) == replace(record("t"), next_seq=3)
        await tasks.advance_next_seq("t", 5)  # beyond the log (no such append): written
        assert writes == [1]
    finally:
        database.submit = submit  # type: ignore[method-assign]
        await log.close()
        await tasks.close()
    database = SqliteDatabase(path)  # a restart: the record read from the file
    log = SqliteEventLog(database, 1000)
    tasks = SqliteTaskStore(database, 1 << 20, log)
    try:
        assert (await tasks.find("t")) == replace(record("t"), next_seq=5)
        assert await log.append("t", [b"d"] * 4) == 3  # the log passes the column's 5
        await tasks.advance_next_seq("t", 7)
        await tasks.close()
        tasks = SqliteTaskStore(database, 1 << 20, log)  # nothing known: read from the file
        assert [found.next_seq for found in await tasks.unfinished()] == [7]
    finally:
        await log.close()
        await tasks.close()
