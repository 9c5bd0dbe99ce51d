"""Cost of the in-memory event log (``gateway.events.log.MemoryEventLog``): memory, reads, seeks, appends.

Prints one markdown table:

1. memory per retained small event (~100-byte body): 1,000,000 events appended to one task in a fresh
   child process, as (RSS after - RSS before) / N from ``/proc/self/statm``, and as the traced-heap
   growth / N from ``tracemalloc`` (a second fresh child, since tracing slows everything down);
2. read throughput: all 1,000,000 events read back in pages of 1,000;
3. seek cost: median time of ``read(after=999_000, limit=100)`` against ``read(after=-1, limit=100)``;
4. append throughput in batches of 1 and of 64, without trimming and at the per-task cap.

    python bench/event_log.py [--events 1000000]

Not a test: nothing here asserts a time. Numbers go into docs/benchmarks.md with the date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from gateway.events.log import MemoryEventLog

TASK = "task-0001"
PAGE = 1_000
SEEK_CALLS = 1_000
SEEK_LIMIT = 100
CHILD_TIMEOUT_S = 120.0


def make_body(i: int) -> bytes:
    """A ~100-byte encoded event fragment, distinct per event (as the capture path would produce)."""
    return b'{"type":"com.example.progress","payload":{"progress":%d,"total":1000000,"note":"step %08d"}}' % (i, i)


BODY_BYTES = len(make_body(500_000))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


async def fill(log: MemoryEventLog, n: int, batch: int = PAGE, task: str = TASK) -> None:
    """Append ``n`` freshly built bodies to ``task``; the bodies are created here so only the log keeps them."""
    for start in range(0, n, batch):
        await log.append(task, [make_body(i) for i in range(start, min(start + batch, n))])


# ------------------------------------------------------------------------------------------ memory (child)


async def child_memory(mode: str, n: int) -> dict[str, float]:
    log = MemoryEventLog(max_events_per_task=n)
    await fill(log, 10, task="warm-up")  # warm up code paths before the baseline (a deleted log stays deleted)
    await log.delete("warm-up")
    gc.collect()
    if mode == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        await fill(log, n)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    else:
        before = rss_bytes()
        await fill(log, n)
        gc.collect()
        after = rss_bytes()
    bounds = await log.bounds(TASK)
    assert bounds is not None and bounds.next_seq == n
    return {"bytes_per_event": (after - before) / n, "total_mib": (after - before) / 2**20}


def run_child(mode: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--events", str(n), "--child", mode],
        check=True,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


# ------------------------------------------------------------------------------------------ in-process


@dataclass
class Row:
    what: str
    result: str
    notes: str


class Stopwatch:
    """CPU time of this (single-threaded) process is the headline figure: it is stable on a shared machine;
    wall time is reported next to it."""

    def __init__(self) -> None:
        self.cpu = time.process_time()
        self.wall = time.perf_counter()

    def stop(self) -> tuple[float, float]:
        return time.process_time() - self.cpu, time.perf_counter() - self.wall


def rate(events: int, seconds: float) -> str:
    return (
        f"{events / seconds / 1e6:.2f} M events/s" if events / seconds >= 1e6 else f"{events / seconds:,.0f} events/s"
    )


async def bench_reads(n: int) -> list[Row]:
    log = MemoryEventLog(max_events_per_task=n)
    await fill(log, n)

    clock = Stopwatch()
    cursor, seen = -1, 0
    while page := await log.read(TASK, cursor, PAGE):
        cursor = page[-1].seq
        seen += len(page)
    cpu, wall = clock.stop()
    assert seen == n
    rows = [Row(f"read all {n:,} in pages of {PAGE:,}", rate(n, cpu), f"{rate(n, wall)} wall; a StoredEvent per event")]

    async def median_read_us(after: int) -> float:
        samples: list[float] = []
        for _ in range(SEEK_CALLS):
            t0 = time.process_time_ns()
            page = await log.read(TASK, after, SEEK_LIMIT)
            samples.append((time.process_time_ns() - t0) / 1e3)
            assert len(page) == SEEK_LIMIT
        return statistics.median(samples)

    far = n - 1_000 if n > 1_000 + SEEK_LIMIT else n // 2
    head_us = await median_read_us(-1)
    far_us = await median_read_us(far)
    rows.append(
        Row(f"seek: read(after=-1, limit={SEEK_LIMIT})", f"{head_us:.1f} µs median", f"{SEEK_CALLS:,} calls, CPU time")
    )
    rows.append(
        Row(
            f"seek: read(after={far:,}, limit={SEEK_LIMIT})",
            f"{far_us:.1f} µs median",
            f"{far_us / head_us:.2f}x the head read (O(1) seek)",
        )
    )
    await log.close()
    return rows


async def bench_appends(bodies: list[bytes], batch: int, cap: int) -> tuple[float, float]:
    """(CPU, wall) seconds to append ``bodies`` in batches of ``batch`` to one task of a log capped at ``cap``."""
    log = MemoryEventLog(max_events_per_task=cap)
    batches = [bodies[i : i + batch] for i in range(0, len(bodies), batch)]
    append = log.append
    clock = Stopwatch()
    for chunk in batches:
        await append(TASK, chunk)
    cpu, wall = clock.stop()
    await log.close()
    return cpu, wall


async def bench_append_rows(n: int) -> list[Row]:
    bodies = [make_body(i) for i in range(n)]
    rows: list[Row] = []
    cases: list[tuple[int, int, int, str]] = [
        (1, n // 4, n, "no trimming"),
        (64, n, n, "no trimming"),
        (1, n // 4, 10_000, "at the cap of 10,000: every append trims one"),
        (64, n, 10_000, "at the cap of 10,000: every append trims 64"),
    ]
    for batch, count, cap, notes in cases:
        gc.collect()
        cpu, wall = await bench_appends(bodies[:count], batch, cap)
        rows.append(
            Row(
                f"append, batches of {batch} ({count:,} events)", rate(count, cpu), f"{notes}; {rate(count, wall)} wall"
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| Measure | Result | Notes |", "|---|---|---|"]
    lines += [f"| {r.what} | {r.result} | {r.notes} |" for r in rows]
    return "\n".join(lines)


def memory_rows(n: int, measure: Callable[[str, int], dict[str, float]]) -> list[Row]:
    rss = measure("rss", n)
    traced = measure("tracemalloc", n)
    return [
        Row(
            f"memory per retained event, RSS ({n:,} x {BODY_BYTES} B bodies)",
            f"{rss['bytes_per_event']:.0f} B/event",
            f"{rss['total_mib']:.0f} MiB for the task; fresh process, /proc/self/statm",
        ),
        Row(
            "memory per retained event, tracemalloc",
            f"{traced['bytes_per_event']:.0f} B/event",
            f"{traced['total_mib']:.0f} MiB traced heap growth; fresh process",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000, help="events per measurement (default 1,000,000)")
    parser.add_argument("--child", choices=["rss", "tracemalloc"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    n: int = args.events

    if args.child:
        print(json.dumps(asyncio.run(child_memory(args.child, n))))
        return

    started = time.perf_counter()
    rows = memory_rows(n, run_child)
    rows += asyncio.run(bench_reads(n))
    rows += asyncio.run(bench_append_rows(n))
    cpus = os.cpu_count()
    print(
        f"Event log (MemoryEventLog), {time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, "
        f"{platform.machine()}, {cpus} CPUs, body {BODY_BYTES} B"
    )
    print()
    print(table(rows))
    print()
    print(f"(rates are per CPU-second of this process; load average at the end {os.getloadavg()[0]:.1f};")
    print(f" total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
