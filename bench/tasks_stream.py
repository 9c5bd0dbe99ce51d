"""Benchmarks of tasks/stream (SEP-2694) served by the gateway: replay, resume cost, live fan-out.

    python bench/tasks_stream.py replay  [--events 100000]
    python bench/tasks_stream.py resume  [--events 1000000]
    python bench/tasks_stream.py fanout  [--streams 500 --rate 1000 --seconds 30 --clients 4] [--tree DIR ...]
                                         [--flush-ms MS]
    python bench/tasks_stream.py frames  [--events 100000]

replay and fanout run the real gateway as a subprocess in front of the example server (stdio) and
read with raw aiohttp clients; resume fills an in-process gateway's log directly (a million events
through an upstream would take minutes) and times the HTTP round trip to the first event; frames
times building the SSE frames of stored events in process (the replay's CPU work per event, recording
time included), with one event per millisecond (each time formatted anew) and ten (a burst). Each
prints a markdown table; medians unless stated. fanout runs the gateway of each `--tree` (a checkout;
default this one) in turn, for a side-by-side comparison in one run, and reports the gateway's CPU
(utime + stime from /proc) per delivered event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import platform
import re
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.app import REGISTRY, build_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.events.log import StoredEvent  # noqa: E402
from gateway.events.stream_frames import EventFrames  # noqa: E402
from gateway.protocol.era import Era  # noqa: E402

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
FRAME = re.compile(rb'"seq":(\d+)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    return sum(cpu_times(pid))


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.asynccontextmanager
async def gateway_process(
    config_text: str, upstream: list[str] | None = None, tree: Path = ROOT
) -> AsyncIterator[tuple[str, int]]:
    """The real gateway of `tree` (a checkout) in front of `upstream` (its --upstream-* arguments;
    default: the stdio example server); yields (url, pid)."""
    port = free_port()
    config = tree / f".bench-{port}.toml"
    # The stream path as docs/benchmarks.md reports it: on the memory store unless the bench names one.
    config.write_text(config_text if "[store]" in config_text else f'{config_text}\n[store]\nkind = "memory"\n')
    upstream = upstream or ["--upstream-cmd", f"{sys.executable} {tree / 'examples' / 'build_server.py'}"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--listen", f"127.0.0.1:{port}", *upstream,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=tree,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while b"/mcp" not in await proc.stdout.readline():
                pass
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        config.unlink(missing_ok=True)
        proc.terminate()
        await proc.wait()


async def open_session(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    async with http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}) as response:
        await response.read()
        headers = {**HEADERS, "Mcp-Session-Id": response.headers["Mcp-Session-Id"]}
    async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers):
        pass
    return headers


async def call(http: aiohttp.ClientSession, url: str, headers: dict[str, str], method: str, params: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with http.post(url, json=body, headers=headers) as response:
        raw = await response.read()
    if response.content_type == "text/event-stream":
        raw = raw.strip().rsplit(b"data: ", 1)[1]
    return orjson.loads(raw)


async def start_task(http: aiohttp.ClientSession, url: str, headers: dict[str, str], tool: str, args: Any) -> str:
    created = await call(http, url, headers, "tools/call", {"name": tool, "arguments": args, "task": {}})
    task_id: str = created["result"]["task"]["taskId"]
    return task_id


async def stream_count(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], task_id: str, after: int | None = None
) -> tuple[int, int, float, float]:
    """Read one tasks/stream to its end: (events, last seq, seconds to first event, seconds in all)."""
    params: dict[str, Any] = {"taskId": task_id}
    if after is not None:
        params["after"] = after
    body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/stream", "params": params}
    started = time.perf_counter()
    first = 0.0
    count, last, tail = 0, -1, b""
    async with http.post(url, json=body, headers=headers) as response:
        async for chunk in response.content.iter_any():
            data = tail + chunk
            cut = data.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in data else 0
            complete, tail = data[:cut], data[cut:]
            seqs = FRAME.findall(complete)
            if seqs:
                if not count:
                    first = time.perf_counter() - started
                count += len(seqs)
                last = int(seqs[-1])
    return count, last, first, time.perf_counter() - started


async def bench_replay(events: int) -> None:
    config = f"[retention]\nmax_events_per_task = {events + 100}\n"
    async with gateway_process(config) as (url, pid), aiohttp.ClientSession(headers=HEADERS) as http:
        headers = await open_session(http, url)
        task_id = await start_task(http, url, headers, "burst", {"n": events})
        produced = time.perf_counter()
        await call(http, url, headers, "tasks/result", {"taskId": task_id})
        produced = time.perf_counter() - produced
        runs = []
        for _ in range(3):
            count, last, _, seconds = await stream_count(http, url, headers, task_id)
            runs.append((count, last, seconds))
        print(f"\n## Replay of a finished task ({machine()})\n")
        print("| run | events delivered | last seq | seconds | events/s at the client |")
        print("|---|---|---|---|---|")
        for i, (count, last, seconds) in enumerate(runs, 1):
            print(f"| {i} | {count} | {last} | {seconds:.3f} | {count / seconds:,.0f} |")
        median = statistics.median(count / seconds for count, _, seconds in runs)
        print(f"\nmedian {median:,.0f} events/s (target ≥ 200,000/s); recording the {events} events through the")
        print(f"upstream took {produced:.1f} s; gateway RSS {rss_kib(pid) / 1024:.0f} MiB")


async def bench_resume(events: int) -> None:
    upstream = {"command": [sys.executable, str(ROOT / "examples" / "build_server.py")], "stdio": {"idle_processes": 0}}
    app = build_app(
        Config.model_validate(
            {"retention": {"max_events_per_task": events}, "upstream": upstream, "store": {"kind": "memory"}}
        )
    )
    runner = aiohttp.web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        registry = app[REGISTRY]
        task = await registry.create("anonymous", "bench", None, dialect=Era.MODERN.value)
        body = b'"type":"io.github.mcp-task-gateway.progress","payload":{"progress":1,"total":2,"message":"m"}'
        started = time.perf_counter()
        for _ in range(events // 10_000):
            await registry.log.append(task.id, [body] * 10_000)
        fill = time.perf_counter() - started
        bounds = await registry.log.bounds(task.id)
        assert bounds is not None
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            headers = await open_session(http, url)
            results: dict[str, list[float]] = {"baseline": [], "tail": [], "start": []}
            for _ in range(30):
                started = time.perf_counter()
                await call(http, url, headers, "tasks/get", {"taskId": task.id})
                results["baseline"].append((time.perf_counter() - started) * 1000)
            # One resume point at a time: an abandoned replay of a million events would share the loop.
            for name, after in (("tail", bounds.next_seq - 2), ("start", None)):
                for _ in range(30):
                    results[name].append(await first_event_seconds(http, url, headers, task.id, after) * 1000)
                    await asyncio.sleep(0.05)
        print(f"\n## Resume cost on a {bounds.next_seq:,}-event log ({machine()})\n")
        print("| request | median ms to first event (or response) | p90 ms |")
        print("|---|---|---|")
        labels = (
            ("baseline", "tasks/get round trip (HTTP baseline)"),
            ("tail", f"tasks/stream after={bounds.next_seq - 2} (the tail)"),
            ("start", "tasks/stream without after (the start)"),
        )
        for name, label in labels:
            values = sorted(results[name])
            print(f"| {label} | {statistics.median(values):.2f} | {values[int(len(values) * 0.9)]:.2f} |")
        print(f"\n(log filled in-process in {fill:.1f} s; client and gateway share one event loop)")
    finally:
        await runner.cleanup()


async def first_event_seconds(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], task_id: str, after: int | None
) -> float:
    params: dict[str, Any] = {"taskId": task_id} if after is None else {"taskId": task_id, "after": after}
    body = {"jsonrpc": "2.0", "id": 3, "method": "tasks/stream", "params": params}
    started = time.perf_counter()
    async with http.post(url, json=body, headers=headers) as response:
        async for chunk in response.content.iter_any():
            if b'"seq":' in chunk:
                return time.perf_counter() - started
    raise RuntimeError("stream ended without an event")


MODERN_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


async def stamped_stream(http: aiohttp.ClientSession, url: str, task_id: str) -> tuple[int, int, list[float]]:
    """Read one 2026-07-28 tasks/stream of a `ticker` task to its end: (events, last seq, the latency of
    each delivery: its receive time minus the stamp of its first event, the oldest and so its worst)."""
    # 2026-07-28 requests: each POST is its own connection, so one process can hold many streams of
    # one task (a legacy session allows one active stream per task).
    headers = {**HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/stream", "Mcp-Name": task_id}
    body = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "tasks/stream",
        "params": {"taskId": task_id, "_meta": MODERN_ENVELOPE},
    }
    latencies: list[float] = []
    count, last, tail = 0, -1, b""
    async with http.post(url, json=body, headers=headers) as response:
        async for chunk in response.content.iter_any():
            now = time.time()
            data = tail + chunk
            cut = data.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in data else 0
            complete, tail = data[:cut], data[cut:]
            stamp = STAMP.search(complete)
            if stamp:
                latencies.append(now - float(stamp.group(1)))
            seqs = FRAME.findall(complete)
            if seqs:
                count += len(seqs)
                last = int(seqs[-1])
    return count, last, latencies


def fanout_client(url: str, task_id: str, streams: int, out: Any) -> None:
    """One client process holding `streams` streams; reports per-event delivery latencies."""

    async def main() -> None:
        async with aiohttp.ClientSession(
            headers=HEADERS, connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        ) as http:
            results = await asyncio.gather(*(stamped_stream(http, url, task_id) for _ in range(streams)))
        out.put([(count, last, lat) for count, last, lat in results])

    asyncio.run(main())


STAMP = re.compile(rb'"message":"t=([0-9.]+)"')


async def bench_fanout(
    streams: int, rate: float, seconds: float, clients: int, trees: list[Path], flush_ms: float | None
) -> None:
    print(f"\n## Live fan-out ({machine()})\n")
    print(
        "| tree | streams | rate | seconds | events per stream | streams complete | p50 ms | p99 ms "
        "| gateway peak RSS | gateway CPU | gateway CPU per delivery | per live delivery |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for tree in trees:
        await fanout_run(streams, rate, seconds, clients, tree, flush_ms)
    print(
        "\nlatency = client receive time - the tool's timestamp, taken per delivery from its oldest event; "
        "CPU per delivery = the gateway's utime + stime (stime: in the kernel) from the clients' start to "
        "their end, over the events delivered; per live delivery: the same from 30 % to 90 % of the task's "
        "run (every stream connected and live), over streams x rate x that time"
    )


async def fanout_run(
    streams: int, rate: float, seconds: float, clients: int, tree: Path, flush_ms: float | None
) -> None:
    config = f"[retention]\nmax_events_per_task = {int(rate * seconds) + 1000}\n"
    if flush_ms is not None:
        config += f"[tasks]\nstream_flush_interval_ms = {flush_ms}\n"
    async with (
        gateway_process(config, tree=tree) as (url, pid),
        aiohttp.ClientSession(headers=HEADERS) as http,
    ):
        headers = await open_session(http, url)
        task_id = await start_task(http, url, headers, "ticker", {"rate": rate, "seconds": seconds})
        window = asyncio.create_task(live_cpu(pid, seconds))
        queue: Any = multiprocessing.Queue()
        per_client = [streams // clients + (1 if i < streams % clients else 0) for i in range(clients)]
        procs = [multiprocessing.Process(target=fanout_client, args=(url, task_id, n, queue)) for n in per_client]
        peak = 0
        cpu_before, wall_before = cpu_times(pid), time.monotonic()
        for proc in procs:
            proc.start()
        results: list[tuple[int, int, list[float]]] = []
        while len(results) < streams:
            with contextlib.suppress(Exception):
                results.extend(await asyncio.to_thread(queue.get, True, 1.0))
            peak = max(peak, rss_kib(pid))
        for proc in procs:
            proc.join()
        live_s = await window
        user, system = (after - before for after, before in zip(cpu_times(pid), cpu_before, strict=True))
        cpu = (user + system) / (time.monotonic() - wall_before)
        final = await call(http, url, headers, "tasks/get", {"taskId": task_id})
        expected = max(last for _, last, _ in results) + 1
        complete = sum(1 for count, last, _ in results if count == expected and last == expected - 1)
        delivered = sum(count for count, _, _ in results)
        latencies = sorted(value for _, _, lat in results for value in lat)
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99)] * 1000
        counts = sorted(count for count, _, _ in results)
        print(
            f"| {tree.name} | {streams} | {rate:.0f}/s | {seconds:.0f} | {expected} | {complete}/{streams} "
            f"| {p50:.1f} | {p99:.1f} | {peak / 1024:.0f} MiB | {cpu:.0%} of a core "
            f"| {(user + system) / max(delivered, 1) * 1e6:.2f} µs "
            f"({system / max(delivered, 1) * 1e6:.2f} in the kernel) | {live_s / streams / rate * 1e6:.2f} µs |",
            flush=True,
        )
        if complete < streams:
            print(f"(events received per stream: min {counts[0]}, max {counts[-1]})", flush=True)
        assert final["result"]["status"] == "completed", final


async def live_cpu(pid: int, seconds: float) -> float:
    """The gateway's CPU seconds per second of the task's run, from 30 % to 90 % of it."""
    await asyncio.sleep(seconds * 0.3)
    before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds * 0.6)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def bench_frames(events: int, batch: int = 256, runs: int = 15) -> None:
    task_id = "b217405472fd9192c14b56e317ba5892"
    print(f"\n## Building tasks/stream frames ({machine()})\n")
    print(f"| events per millisecond | median ms per {events:,} events | events/s |")
    print("|---|---|---|")
    for per_ms in (1, 10):
        start = time.time()
        stored = [
            StoredEvent(seq, start + seq / per_ms / 1000, b'"type":"io.github.mcp-task-gateway.progress",'
                        b'"payload":{"progress":%d,"total":%d}' % (seq, events))
            for seq in range(events)
        ]  # fmt: skip
        frames = EventFrames(task_id)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            for first in range(0, events, batch):
                frames.frames(stored[first : first + batch])
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        print(f"| {per_ms} | {median * 1000:.1f} | {events / median:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    sub.add_parser("replay").add_argument("--events", type=int, default=100_000)
    sub.add_parser("resume").add_argument("--events", type=int, default=1_000_000)
    fan = sub.add_parser("fanout")
    fan.add_argument("--streams", type=int, default=500)
    fan.add_argument("--rate", type=float, default=1000)
    fan.add_argument("--seconds", type=float, default=30)
    fan.add_argument("--clients", type=int, default=4)
    fan.add_argument("--tree", type=Path, action="append", help="a checkout whose gateway to run (repeatable)")
    fan.add_argument("--flush-ms", type=float, help="[tasks] stream_flush_interval_ms (default: the gateway's)")
    sub.add_parser("frames").add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    if args.bench == "replay":
        asyncio.run(bench_replay(args.events))
    elif args.bench == "resume":
        asyncio.run(bench_resume(args.events))
    elif args.bench == "frames":
        bench_frames(args.events)
    else:
        trees = args.tree or [ROOT]
        asyncio.run(bench_fanout(args.streams, args.rate, args.seconds, args.clients, trees, args.flush_ms))


if __name__ == "__main__":
    main()
