"""Does the time of a task lookup tell whether the id exists? `tasks/get` of known and unknown ids on
SQLite, side by side (issue 24, item 8).

An in-process gateway on a SQLite file (as `bench/stores.py` builds it) holds `--tasks` tasks; the
client asks `tasks/get` for a known id and an unknown one in turn, `--rounds` times each, and prints
the medians, the p90s and the difference. The memory store is measured the same way as the reference
where both answers come from memory.

    python bench/lookup_timing.py [--tasks 1000] [--rounds 300]

Prints one markdown table. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
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

from bench.tasks_stream import HEADERS, call, free_port, machine, open_session  # noqa: E402
from gateway.app import REGISTRY, build_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.protocol.era import Era  # noqa: E402


async def bench_kind(store: dict[str, Any], tasks: int, rounds: int) -> dict[str, list[float]]:
    upstream = {"command": [sys.executable, str(ROOT / "examples" / "build_server.py")], "stdio": {"idle_processes": 0}}
    app = build_app(Config.model_validate({"upstream": upstream, "store": store}))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/mcp"
    times: dict[str, list[float]] = {"known": [], "unknown": []}
    try:
        registry = app[REGISTRY]
        known = [(await registry.create("anonymous", "bench", None, dialect=Era.MODERN.value)).id for _ in range(tasks)]
        async with aiohttp.ClientSession(headers=HEADERS) as http:
            headers = await open_session(http, url)
            for round_number in range(rounds):
                ids = {"known": known[round_number % len(known)], "unknown": secrets.token_hex(16)}
                for kind in ("known", "unknown") if round_number % 2 else ("unknown", "known"):
                    started = time.perf_counter()
                    await call(http, url, headers, "tasks/get", {"taskId": ids[kind]})
                    times[kind].append((time.perf_counter() - started) * 1e6)
    finally:
        await runner.cleanup()
    return times


async def bench(tasks: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-lookups-") as tmp:
        kinds = {"sqlite": {"kind": "sqlite", "path": str(Path(tmp) / "gateway.db")}, "memory": {"kind": "memory"}}
        results = {name: await bench_kind(store, tasks, rounds) for name, store in kinds.items()}
    print(f"{machine()}; {tasks} tasks, {rounds} tasks/get of each kind, alternating\n")
    print("| store | known id, median µs | unknown id, median µs | known p90 | unknown p90 | unknown - known |")
    print("|---|---|---|---|---|---|")
    for name, times in results.items():
        known, unknown = statistics.median(times["known"]), statistics.median(times["unknown"])
        p90 = {kind: f"{sorted(values)[int(len(values) * 0.9)]:.0f}" for kind, values in times.items()}
        print(f"| {name} | {known:.0f} | {unknown:.0f} | {p90['known']} | {p90['unknown']} | {unknown - known:+.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(bench(args.tasks, args.rounds))


if __name__ == "__main__":
    main()
