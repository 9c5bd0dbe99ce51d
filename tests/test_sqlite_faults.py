"""SQLite store faults (issue 24): a full disk, a corrupt file, the single-writer lock.

- A gateway whose database lives on a small tmpfs the test mounts (root; skipped only where mounting
  is not permitted), a hosted task running and streamed: the disk is filled mid-task. New tasks get
  503 `store_unavailable` with `Retry-After`, a plain call still answers, `/readyz` says the store is
  down; once space is freed the task completes and its stream is gap-free to the terminal event (it is
  never left `working`). With the disk full again, SIGTERM stops the gateway within 15 s.
- A file with corrupt pages: start-up exits 2 with one line, `check-config --connect` exits non-zero.
- The single-writer lock is on the database file itself: no `.lock` file to delete, and a second
  opener is refused while the first holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.client import GatewayClient
from gateway.client.stream import JsonRpcError
from gateway.stores.sqlite import SqliteDatabase, StoreUnavailable
from tests.conftest import EXAMPLE_SERVER, ROOT, start_gateway
from tests.test_restart import kind
from tests.test_store_outages import Reader

WAIT = 60.0
STOP_WITHIN_S = 15.0
"""What the issue allows a SIGTERM during an outage (the test's bound on the wait, not a measurement)."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (room for SQLite's 4 MiB WAL before its checkpoint), mounted for the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte; the filler file (delete it to free the space)."""
    filler = disk / "filler"
    with filler.open("ab", buffering=0) as out:
        for size in (65536, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    return filler


async def until_refused(url: str) -> JsonRpcError:
    """New tasks are refused once the store's writes fail: the next write that needs room the file does
    not have (a task's event and record fit in pages freed inside the file: its 64 KiB result does not)."""
    async with asyncio.timeout(WAIT):
        while True:
            async with GatewayClient(url) as client:
                try:
                    await client.start_task("echo", {"text": "x" * 65536})
                except JsonRpcError as error:
                    return error
            await asyncio.sleep(0.2)


async def test_a_full_disk_holds_the_task_until_space_is_freed_and_sigterm_still_stops(small_disk: Path) -> None:
    config = f'[store]\nkind = "sqlite"\npath = "{small_disk / "gateway.db"}"\noutage_hold_s = 60.0\n'
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        async with GatewayClient(gw.url) as client:
            task_id = await client.start_task("slow_build", {"steps": 400, "delay": 0.05})
        assert task_id is not None
        reader = Reader(gw, task_id)
        try:
            async with asyncio.timeout(WAIT):
                await reader.first.wait()
            filler = fill(small_disk)
            refused = await until_refused(gw.url)
            assert refused.http_status == 503 and refused.data["reason"] == "store_unavailable", refused
            async with GatewayClient(gw.url) as client:
                echoed = await client.call_tool("echo", {"text": "still here"})
                assert echoed["content"][0]["text"] == "still here"
            async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/readyz") as response:
                body = await response.json()
                assert response.status == 503 and body["store"] == "down", body
            filler.unlink()
            await reader.ended()
        finally:
            reader.done.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader.done
        seqs = reader.seqs()
        assert reader.error is None and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        events: list[dict[str, Any]] = reader.events
        assert [kind(event) for event in events[-2:]] == ["task.status", "task.terminal"]
        assert events[-2]["payload"]["status"] == "completed", events[-2]
        async with GatewayClient(gw.url) as client:
            assert (await client.get_task(task_id))["result"]["status"] == "completed"

        fill(small_disk)
        await until_refused(gw.url)
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(gw.proc.wait(), STOP_WITHIN_S)


def corrupt_database(path: Path) -> None:
    """A real store file with many pages, then garbage over pages past the first (its header intact)."""
    database = SqliteDatabase(path)
    database.acquire()
    asyncio.run(database.release())
    connection = sqlite3.connect(path)
    rows = [("t", seq, 0.0, os.urandom(900)) for seq in range(400)]
    connection.executemany("INSERT INTO events (task, seq, created, body) VALUES (?, ?, ?, ?)", rows)
    connection.commit()
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    with path.open("r+b") as raw:
        raw.seek(4096 * 3)
        raw.write(os.urandom(4096 * 20))


def test_a_file_with_corrupt_pages_is_refused_at_start_and_by_check_config(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    corrupt_database(path)
    with pytest.raises(StoreUnavailable, match=r"corrupt|malformed"):
        SqliteDatabase(path)
    config = tmp_path / "gateway.toml"
    config.write_text(f'[store]\nkind = "sqlite"\npath = "{path}"\n', encoding="utf-8")
    gateway = [sys.executable, "-m", "gateway"]
    serve = [*gateway, "serve", "--config", str(config), "--listen", "127.0.0.1:0", "--upstream-cmd", "true"]
    started = subprocess.run(serve, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert started.returncode == 2, started
    assert started.stderr.count("\n") == 1 and str(path) in started.stderr, started.stderr
    checked = subprocess.run(
        [*gateway, "check-config", str(config), "--connect"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert checked.returncode != 0 and "corrupt" in checked.stderr, checked


async def test_the_writer_lock_is_on_the_database_file_itself(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    first = SqliteDatabase(path).acquire()
    try:
        assert not path.with_name(path.name + ".lock").exists()
        with pytest.raises(StoreUnavailable, match="in use by another gateway process"):
            SqliteDatabase(path)
    finally:
        await first.release()
    second = SqliteDatabase(path).acquire()  # free once the first closed
    await second.release()
