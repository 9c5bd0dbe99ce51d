"""The task stores side by side (issue 12): memory and SQLite, in one run, on an in-process gateway.

For each `[store] kind` an in-process gateway (as `bench/tasks_stream.py resume` builds it) gets:

1. appends, batched: one writer appending 256 events per call, and 64 tasks each appending one event
   per call concurrently (what the gateway does when many tasks report at once: the SQLite store
   commits each loop tick's appends in one transaction) — events/s; for SQLite also with
   `synchronous = full` (a store of its own, outside the gateway);
2. replay to one client: a sealed 100,000-event log read to its end over `tasks/stream` (HTTP, SSE) —
   events/s at the client, median of 3;
3. resume at the tail of a 1,000,000-event log: the HTTP round trip of `tasks/stream after=N-2` to its
   first event — median and p90 of 30, after a `tasks/get` round trip as the HTTP baseline.

    python bench/stores.py [--events 1000000]

Prints one markdown table. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.tasks_stream import HEADERS, call, first_event_seconds, free_port, machine, open_session, stream_count  # noqa: E402
from gateway.app import REGISTRY, build_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.events.log import EventLog  # noqa: E402
from gateway.protocol.era import Era  # noqa: E402
from gateway.stores.sqlite import SqliteDatabase  # noqa: E402
from gateway.stores.sqlite_log import SqliteEventLog  # noqa: E402
from gateway.tasks.registry import TaskRegistry  # noqa: E402

BODY = b'"type":"io.github.mcp-task-gateway.progress","payload":{"progress":1,"total":2,"message":"m"}'
BATCH = 256
WRITERS = 64
APPENDS = 200_000
REPLAY_EVENTS = 100_000
SAMPLES = 30


async def appends_per_second(log: EventLog) -> tuple[float, float]:
    """(events/s in batches of BATCH from one writer, events/s with WRITERS tasks appending one each)."""
    started = time.perf_counter()
    for _ in range(APPENDS // BATCH):
        await log.append("bench-batched", [BODY] * BATCH)
    batched = (APPENDS // BATCH) * BATCH / (time.perf_counter() - started)

    async def writer(task_id: str) -> None:
        for _ in range(APPENDS // WRITERS):
            await log.append(task_id, [BODY])

    started = time.perf_counter()
    await asyncio.gather(*(writer(f"bench-writer-{i}") for i in range(WRITERS)))
    concurrent = (APPENDS // WRITERS) * WRITERS / (time.perf_counter() - started)
    return batched, concurrent


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
        found["append_batched"], found["append_concurrent"] = await appends_per_second(registry.log)
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


async def bench(events: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        kinds = {
            "memory": {"kind": "memory"},
            "sqlite": {"kind": "sqlite", "path": str(Path(tmp) / "gateway.db")},
        }
        results = {name: await bench_kind(store, events) for name, store in kinds.items()}
        full = SqliteEventLog(SqliteDatabase(Path(tmp) / "full.db", "full"), events)
        results["sqlite"]["full_batched"], results["sqlite"]["full_concurrent"] = await appends_per_second(full)
        await full.close()
    results["memory"]["full_batched"] = results["memory"]["full_concurrent"] = math.nan
    rows = (
        ("append_batched", f"appends, {BATCH} events per call, events/s", "≥ 50,000", "{:,.0f}"),
        ("append_concurrent", f"appends, {WRITERS} tasks appending 1 event per call, events/s", "≥ 50,000", "{:,.0f}"),
        ("full_batched", f"… with `synchronous = full`, {BATCH} events per call", "", "{:,.0f}"),
        ("full_concurrent", f"… with `synchronous = full`, {WRITERS} tasks appending 1 event per call", "", "{:,.0f}"),
        ("fill", f"filling the {events:,}-event log (10,000 per call), events/s", "", "{:,.0f}"),
        ("replay", f"replay of {REPLAY_EVENTS:,} events to one client (HTTP), events/s", "≥ 200,000", "{:,.0f}"),
        ("baseline", "tasks/get round trip (HTTP baseline), ms", "", "{:.2f}"),
        ("tail", f"resume at the tail of {events:,} events, ms to first event", "≤ 2", "{:.2f}"),
        ("tail_p90", "… p90, ms", "", "{:.2f}"),
    )
    print(f"\n## Stores side by side ({machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print("| measure | memory | sqlite | target |")
    print("|---|---|---|---|")
    for key, label, target, fmt in rows:
        memory, sqlite = (results[kind][key] for kind in ("memory", "sqlite"))
        print(f"| {label} | {'—' if math.isnan(memory) else fmt.format(memory)} | {fmt.format(sqlite)} | {target} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the resumed log")
    asyncio.run(bench(parser.parse_args().events))


if __name__ == "__main__":
    main()
