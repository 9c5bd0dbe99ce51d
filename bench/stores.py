"""The task stores side by side (issue 12): memory and SQLite, in one run, on an in-process gateway.

For each `[store] kind` an in-process gateway (as `bench/tasks_stream.py resume` builds it) gets:

1. appends, batched: one writer appending 256 events per call, and 64 tasks each appending one event
   per call concurrently (what the gateway does when many tasks report at once: the SQLite store
   commits each loop tick's appends in one transaction) — events/s, and the process's CPU (all
   threads, from `os.times`) per event; for SQLite also with `synchronous = full` (a store of its own,
   outside the gateway); and 64 tasks each recording one event per call through the task registry
   (`TaskRegistry.record`: the append, then the record's next seq);
2. replay to one client: a sealed 100,000-event log read to its end over `tasks/stream` (HTTP, SSE) —
   events/s at the client, median of 3;
3. resume at the tail of a 1,000,000-event log: the HTTP round trip of `tasks/stream after=N-2` to its
   first event — median and p90 of 30, after a `tasks/get` round trip as the HTTP baseline.

    python bench/stores.py [--events 1000000] [--tree DIR] [--kinds memory,sqlite]

`--tree DIR` runs the gateway code of another checkout (a worktree at an older commit) with this
bench, for a side by side: run it once per tree, alternating.

Prints one markdown table. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
if "--tree" in sys.argv:  # the gateway code under test, imported before anything of it
    TREE = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()
    sys.path.insert(0, str(TREE))
else:
    TREE = ROOT

from bench.tasks_stream import HEADERS, call, first_event_seconds, free_port, machine, open_session, stream_count  # noqa: E402
from gateway.app import REGISTRY, build_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.events.capture import TaskEvent  # noqa: E402
from gateway.events.log import EventLog  # noqa: E402
from gateway.protocol.era import Era  # noqa: E402
from gateway.stores.sqlite import SqliteDatabase  # noqa: E402
from gateway.stores.sqlite_log import SqliteEventLog  # noqa: E402
from gateway.tasks.registry import TaskRegistry  # noqa: E402

BODY = b'"type":"io.github.mcp-task-gateway.progress","payload":{"progress":1,"total":2,"message":"m"}'
BATCH = 256
WRITERS = 64
APPENDS = 200_000
RECORDS = 64_000
REPLAY_EVENTS = 100_000
SAMPLES = 30


def cpu_seconds() -> float:
    """This process's CPU time, every thread's (the SQLite writer's too)."""
    times = os.times()
    return times.user + times.system


async def timed(events: int, run: Awaitable[object]) -> tuple[float, float]:
    """(events/s, µs of process CPU per event) of `run`."""
    cpu, started = cpu_seconds(), time.perf_counter()
    await run
    return events / (time.perf_counter() - started), (cpu_seconds() - cpu) / events * 1e6


async def appends_per_second(log: EventLog) -> dict[str, float]:
    """Events/s and CPU µs per event in batches of BATCH from one writer, and with WRITERS tasks
    appending one each."""

    async def batched() -> None:
        for _ in range(APPENDS // BATCH):
            await log.append("bench-batched", [BODY] * BATCH)

    async def writer(task_id: str) -> None:
        for _ in range(APPENDS // WRITERS):
            await log.append(task_id, [BODY])

    found: dict[str, float] = {}
    found["batched"], found["batched_cpu"] = await timed((APPENDS // BATCH) * BATCH, batched())
    found["concurrent"], found["concurrent_cpu"] = await timed(
        (APPENDS // WRITERS) * WRITERS, asyncio.gather(*(writer(f"bench-writer-{i}") for i in range(WRITERS)))
    )
    return found


async def records_per_second(registry: TaskRegistry) -> tuple[float, float]:
    """(events/s, CPU µs per event) with WRITERS tasks each recording one event per call."""
    tasks = [await registry.create("anonymous", "bench", None, dialect=Era.MODERN.value) for _ in range(WRITERS)]
    runner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for task in tasks:  # a runner alive throughout, as a hosted task has (else the orphan check fails it)
        task.runner = runner
    event = TaskEvent("com.example.progress", {"progress": 1, "total": 2})

    async def writer(task: Any) -> None:
        for _ in range(RECORDS // WRITERS):
            await registry.record(task, event)

    found = await timed((RECORDS // WRITERS) * WRITERS, asyncio.gather(*(writer(task) for task in tasks)))
    for task in tasks:  # every event recorded (none dropped by a log that ended)
        bounds = await registry.log.bounds(task.id)
        assert bounds is not None and bounds.next_seq > RECORDS // WRITERS, (bounds, task.record)
    runner.cancel()
    return found


async def filled_task(registry: TaskRegistry, events: int) -> str:
    task = await registry.create("anonymous", "bench", None, dialect=Era.MODERN.value)
    for start in range(0, events, 10_000):
        await registry.log.append(task.id, [BODY] * min(10_000, events - start))
    return task.id


async def bench_kind(store: dict[str, Any], events: int) -> dict[str, float]:
    upstream = {"command": [sys.executable, str(ROOT / "examples" / "build_server.py")], "stdio": {"idle_processes": 0}}
    config = Config.model_validate({"retention": {"max_events_per_task": events}, "upstream": upstream, "store": store})
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/mcp"
    found: dict[str, float] = {}
    try:
        registry = app[REGISTRY]
        for key, value in (await appends_per_second(registry.log)).items():
            found[f"append_{key}"] = value
        found["record_concurrent"], found["record_concurrent_cpu"] = await records_per_second(registry)
        replayed = await filled_task(registry, REPLAY_EVENTS)
        await registry.log.seal(replayed)
        sealed = await registry.log.bounds(replayed)
        assert sealed is not None
        retained = sealed.next_seq - sealed.retained_from  # the fill and the task.created event
        started = time.perf_counter()
        big = await filled_task(registry, events)
        found["fill"] = events / (time.perf_counter() - started)
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            headers = await open_session(http, url)
            rates = []
            for _ in range(3):
                count, _, _, seconds = await stream_count(http, url, headers, replayed)
                assert count == retained, (count, retained)
                rates.append(count / seconds)
            found["replay"] = statistics.median(rates)
            baseline, tail = [], []
            for _ in range(SAMPLES):
                started = time.perf_counter()
                await call(http, url, headers, "tasks/get", {"taskId": big})
                baseline.append((time.perf_counter() - started) * 1000)
            for _ in range(SAMPLES):
                tail.append(await first_event_seconds(http, url, headers, big, events - 2) * 1000)
                await asyncio.sleep(0.05)  # as bench/tasks_stream.py: the abandoned stream ends first
            found["baseline"] = statistics.median(baseline)
            found["tail"] = statistics.median(tail)
            found["tail_p90"] = sorted(tail)[int(SAMPLES * 0.9)]
    finally:
        await runner.cleanup()
    return found


async def bench(events: int, names: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        kinds = {
            "memory": {"kind": "memory"},
            "sqlite": {"kind": "sqlite", "path": str(Path(tmp) / "gateway.db")},
        }
        results = {name: await bench_kind(kinds[name], events) for name in names}
        if "sqlite" in results:
            full = SqliteEventLog(SqliteDatabase(Path(tmp) / "full.db", "full"), events)
            full_found = await appends_per_second(full)
            results["sqlite"]["full_batched"] = full_found["batched"]
            results["sqlite"]["full_concurrent"] = full_found["concurrent"]
            await full.close()
    if "memory" in results:
        results["memory"]["full_batched"] = results["memory"]["full_concurrent"] = math.nan
    rows = (
        ("append_batched", f"appends, {BATCH} events per call, events/s", "≥ 50,000", "{:,.0f}"),
        ("append_batched_cpu", "… CPU µs per event", "", "{:.1f}"),
        ("append_concurrent", f"appends, {WRITERS} tasks appending 1 event per call, events/s", "≥ 100,000", "{:,.0f}"),
        ("append_concurrent_cpu", "… CPU µs per event", "", "{:.1f}"),
        ("record_concurrent", f"{WRITERS} tasks recording 1 event per call (registry), events/s", "", "{:,.0f}"),
        ("record_concurrent_cpu", "… CPU µs per event", "", "{:.1f}"),
        ("full_batched", f"… with `synchronous = full`, {BATCH} events per call", "", "{:,.0f}"),
        ("full_concurrent", f"… with `synchronous = full`, {WRITERS} tasks appending 1 event per call", "", "{:,.0f}"),
        ("fill", f"filling the {events:,}-event log (10,000 per call), events/s", "", "{:,.0f}"),
        ("replay", f"replay of {REPLAY_EVENTS:,} events to one client (HTTP), events/s", "≥ 200,000", "{:,.0f}"),
        ("baseline", "tasks/get round trip (HTTP baseline), ms", "", "{:.2f}"),
        ("tail", f"resume at the tail of {events:,} events, ms to first event", "≤ 2", "{:.2f}"),
        ("tail_p90", "… p90, ms", "", "{:.2f}"),
    )
    print(f"\n## Stores ({TREE}, {machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print(f"| measure | {' | '.join(names)} | target |")
    print("|---|" + "---|" * len(names) + "---|")
    for key, label, target, fmt in rows:
        cells = [results[name][key] for name in names]
        shown = " | ".join("—" if math.isnan(cell) else fmt.format(cell) for cell in cells)
        print(f"| {label} | {shown} | {target} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the resumed log")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose gateway code runs")
    parser.add_argument("--kinds", default="memory,sqlite", help="the stores, comma-separated: memory, sqlite")
    args = parser.parse_args()
    names = args.kinds.split(",")
    if not set(names) <= {"memory", "sqlite"}:
        parser.error(f"unknown store kinds in --kinds {args.kinds!r}: memory and sqlite are benched")
    asyncio.run(bench(args.events, names))


if __name__ == "__main__":
    main()
