"""The Redis Streams store (`gateway.stores.redis`) side by side with the memory store, in one run.

Prints one markdown table, each number the median of `--rounds` rounds:

1. appends/s per replica: 32 writers, each appending one ~100-byte event at a time to its own task and
   awaiting it (the store pipelines what one loop tick queues), and the p99 of one append;
2. replay: 100,000 events of one task read back in pages of 256 (`[tasks] replay_batch`), events/s;
3. resume at the tail: `read(after=n-2, limit=256)` on that 100,000-event log, median and p99;
4. live delivery across instances: a waiter on store B, an append on store A (for memory, one store),
   from the append's start to the waiter's return, p50 and p99 (before any stream pacing);
5. Redis memory per retained small event: `used_memory` growth over 100,000 events in one task, and
   `MEMORY USAGE` of the stream key, each divided by the events;
6. live delivery through two real gateway processes on the same Redis (the example server on stdio
   behind each, `[tasks] stream_flush_interval_ms = 0`: before stream pacing): the example's `ticker`
   task runs on gateway A (an event every 10 ms, stamped with its send time) and a 2026-07-28
   `tasks/stream` reader on B and one on A take each event; p50 and p99 of the receive time minus the
   stamp, on B (across replicas) and on A (the same path without crossing).

Beside the appends, the CPU each append costs the bench process (Python, with its share of the kernel's
loopback work) and the Redis server (`INFO cpu`): figures a loaded machine disturbs less than rates.

The Redis server is the bench's own (`redis-server` on a free port, persistence off, noeviction).

    python bench/redis_store.py [--rounds 3]

Not a test: nothing here asserts a time. Numbers go into docs/benchmarks.md with the date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.event_log import make_body  # noqa: E402
from bench.tasks_stream import HEADERS, gateway_process, open_session, stamped_stream, start_task  # noqa: E402
from gateway.events.log import EventLog, MemoryEventLog  # noqa: E402
from gateway.stores.redis import RedisBackend, RedisEventLog  # noqa: E402
from tests.redis_server import RedisServer, fresh_prefix  # noqa: E402

WRITERS = 32
APPENDS_PER_WRITER = 1_000
REPLAY_EVENTS = 100_000
PAGE = 256
RESUME_CALLS = 500
LIVE_ROUNDS = 500
MAX_EVENTS = 1_000_000
TICKS_PER_S = 100
TICKING_S = 6.0
SETTLING = 20
"""Deliveries not counted at the start of a reader: those may be its replay, not live events."""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def appends(log: EventLog) -> tuple[float, float, float]:
    """(appends/s, p50 ms, p99 ms) for WRITERS concurrent writers, one awaited event at a time each."""
    latencies: list[float] = []

    async def writer(w: int) -> None:
        task = f"w{w}-{fresh_prefix()}"
        for i in range(APPENDS_PER_WRITER):
            started = time.perf_counter()
            await log.append(task, [make_body(i)])
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    elapsed = time.perf_counter() - started
    return (
        WRITERS * APPENDS_PER_WRITER / elapsed,
        statistics.median(latencies) * 1000,
        percentile(latencies, 0.99) * 1000,
    )


async def redis_cpu_s(backend: RedisBackend) -> float:
    info = await backend.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def append_cpu(log: RedisEventLog, backend: RedisBackend) -> tuple[float, float, float, float, float]:
    """`appends`, then the µs of CPU per append in this process and in the Redis server."""
    process, server = time.process_time(), await redis_cpu_s(backend)
    measured = await appends(log)
    count = WRITERS * APPENDS_PER_WRITER
    in_process = (time.process_time() - process) / count * 1e6
    return (*measured, in_process, (await redis_cpu_s(backend) - server) / count * 1e6)


async def fill(log: EventLog, task: str, n: int) -> None:
    for start in range(0, n, 1000):
        await log.append(task, [make_body(i) for i in range(start, min(start + 1000, n))])


async def replay(log: EventLog, task: str) -> tuple[float]:
    """(events/s,) reading the whole log in pages of PAGE."""
    started = time.perf_counter()
    cursor, count = -1, 0
    while page := await log.read(task, cursor, PAGE):
        count += len(page)
        cursor = page[-1].seq
    return (count / (time.perf_counter() - started),)


async def resume(log: EventLog, task: str, n: int) -> tuple[float, float]:
    """(median ms, p99 ms) of a read at the tail."""
    samples = []
    for _ in range(RESUME_CALLS):
        started = time.perf_counter()
        page = await log.read(task, n - 2, PAGE)
        samples.append(time.perf_counter() - started)
        assert [event.seq for event in page] == [n - 1]
    return statistics.median(samples) * 1000, percentile(samples, 0.99) * 1000


async def live(writer: EventLog, reader: EventLog) -> tuple[float, float]:
    """(p50 ms, p99 ms) from an append on `writer` to the return of a waiter on `reader`."""
    task = f"live-{fresh_prefix()}"
    await writer.create(task)
    samples = []

    async def wait(after: int) -> float:
        assert await reader.wait(task, after, 10)
        return time.perf_counter()

    for i in range(LIVE_ROUNDS):
        waiting = asyncio.create_task(wait(i - 1))
        await asyncio.sleep(0.002)  # the waiter is subscribed
        started = time.perf_counter()
        await writer.append(task, [make_body(i)])
        samples.append(await waiting - started)
    return statistics.median(samples) * 1000, percentile(samples, 0.99) * 1000


async def redis_memory(backend: RedisBackend) -> tuple[float, float]:
    """(used_memory growth, MEMORY USAGE of the stream) per event, over REPLAY_EVENTS small events."""
    log = RedisEventLog(backend, MAX_EVENTS)
    task = f"mem-{fresh_prefix()}"
    before = (await backend.client.info("memory"))["used_memory"]
    await fill(log, task, REPLAY_EVENTS)
    after = (await backend.client.info("memory"))["used_memory"]
    usage = await backend.client.memory_usage(backend.keys.task(task)[1], samples=0) or 0
    await log.close()
    return (after - before) / REPLAY_EVENTS, usage / REPLAY_EVENTS


@contextlib.asynccontextmanager
async def two_gateways(url: str) -> AsyncIterator[tuple[str, str]]:
    """Gateways A and B on the Redis at `url` under one fresh prefix, without stream pacing."""
    config = (
        f'[store]\nkind = "redis"\nurl = "{url}"\nkey_prefix = "{fresh_prefix()}"\n'
        f"[tasks]\nstream_flush_interval_ms = 0\n"
    )
    async with gateway_process(config) as (url_a, _), gateway_process(config) as (url_b, _):
        yield url_a, url_b


async def gateway_live(url_a: str, url_b: str) -> tuple[float, float, float, float]:
    """(p50 ms, p99 ms) of a `ticker` event's delivery to a tasks/stream reader on B, then on A."""
    async with aiohttp.ClientSession(headers=HEADERS, timeout=aiohttp.ClientTimeout(total=120)) as http:
        session = await open_session(http, url_a)
        task_id = await start_task(http, url_a, session, "ticker", {"rate": TICKS_PER_S, "seconds": TICKING_S})
        read: list[Any] = await asyncio.gather(*(stamped_stream(http, url, task_id) for url in (url_b, url_a)))
    figures: list[float] = []
    for _, _, latencies in read:
        live_ones = latencies[SETTLING:]
        figures += [statistics.median(live_ones) * 1000, percentile(live_ones, 0.99) * 1000]
    return figures[0], figures[1], figures[2], figures[3]


async def median_of(rounds: int, measure: Callable[[], Awaitable[tuple[float, ...]]]) -> tuple[float, ...]:
    results = [await measure() for _ in range(rounds)]
    return tuple(statistics.median(values) for values in zip(*results, strict=True))


async def run(rounds: int) -> list[tuple[str, str, str]]:
    server = RedisServer(Path(tempfile.mkdtemp(prefix="mtg-bench-redis-")))
    server.start()
    try:
        memory = MemoryEventLog(MAX_EVENTS)
        prefix = fresh_prefix()
        backend_a, backend_b = RedisBackend(server.url, prefix), RedisBackend(server.url, prefix)
        redis_a, redis_b = RedisEventLog(backend_a, MAX_EVENTS), RedisEventLog(backend_b, MAX_EVENTS)
        rows: list[tuple[str, str, str]] = []

        def row(name: str, measured: tuple[tuple[float, ...], tuple[float, ...]], spec: str) -> None:
            memory_cell, redis_cell = (
                " / ".join(format(value, spec) for value in values) or "-" for values in measured
            )
            rows.append((name, memory_cell, redis_cell))

        measured = await median_of(rounds, lambda: append_cpu(redis_a, backend_a))
        row(
            "appends/s with 32 writers / p50 / p99 of one append (ms)",
            (await median_of(rounds, lambda: appends(memory)), measured[:3]),
            ",.2f",
        )
        row("CPU per append: bench process / Redis server (µs)", ((), measured[3:]), ".1f")
        await fill(memory, "replay", REPLAY_EVENTS)
        await fill(redis_a, "replay", REPLAY_EVENTS)
        row(
            "replay in pages of 256 (events/s)",
            (
                await median_of(rounds, lambda: replay(memory, "replay")),
                await median_of(rounds, lambda: replay(redis_a, "replay")),
            ),
            ",.0f",
        )
        row(
            "resume at the tail of 100k events, median / p99 (ms)",
            (
                await median_of(rounds, lambda: resume(memory, "replay", REPLAY_EVENTS)),
                await median_of(rounds, lambda: resume(redis_a, "replay", REPLAY_EVENTS)),
            ),
            ".3f",
        )
        row(
            "live delivery, append on A to waiter on B (memory: one store), p50 / p99 (ms)",
            (
                await median_of(rounds, lambda: live(memory, memory)),
                await median_of(rounds, lambda: live(redis_a, redis_b)),
            ),
            ".3f",
        )
        row(
            "Redis memory per retained ~100 B event: used_memory / MEMORY USAGE (bytes)",
            ((), await median_of(rounds, lambda: redis_memory(backend_a))),
            ".0f",
        )

        async with two_gateways(server.url) as (url_a, url_b):
            through_gateways = await median_of(rounds, lambda: gateway_live(url_a, url_b))
        row(
            "live delivery through two gateways, ticker event on A to a tasks/stream reader on B, p50 / p99 (ms)",
            ((), through_gateways[:2]),
            ".2f",
        )
        row("the same, reader on A (no replica crossed), p50 / p99 (ms)", ((), through_gateways[2:]), ".2f")

        await redis_a.close()
        await redis_b.close()
        await memory.close()
        return rows
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement; the median is shown")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = asyncio.run(run(args.rounds))
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after"
    )
    print("| measure | memory | redis |\n|---|---|---|")
    for name, memory, redis in rows:
        print(f"| {name} | {memory} | {redis} |")


if __name__ == "__main__":
    main()
