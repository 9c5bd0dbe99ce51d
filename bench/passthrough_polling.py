"""What observing upstream-hosted tasks costs: N concurrent pass-through tasks polled with tasks/get.

    python bench/passthrough_polling.py [--tasks 1000 --poll-ms 1000 --seconds 10 --rounds 3] [--pushes]

The upstream is tests/servers/modern_tasks_server.py on Streamable HTTP (the `mcp` SDK with the
2026-07-28 Tasks extension), started with `--no-notify` so the gateway has only polling (with
`--pushes`: with notifications, so the gateway follows a subscriptions/listen and polls only as a
check), and `--poll-interval` = the task's pollIntervalMs. The real gateway runs in front of it as a subprocess.
N `slow_job` tasks (long enough to outlive the run) are created through the gateway; then, over
`--rounds` windows of `--seconds`, the bench reads the upstream's own count of tasks/get served
(its `stats` tool), the gateway's poll counter (/metrics) and both processes' CPU time. A window with
no tasks first gives the idle baseline, side by side. Prints a markdown table; medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
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

from bench.tasks_stream import cpu_seconds, free_port, gateway_process, machine, rss_kib  # noqa: E402

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "modern_tasks_server.py")]
MODERN = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
TASK_TTL_MS = 3_600_000
"""Longer than any run: the gateway drops its record of a task (and stops watching it) at its TTL."""
POLLS = re.compile(rb"^mcp_gateway_upstream_task_polls_total (\S+)$", re.MULTILINE)


@contextlib.asynccontextmanager
async def upstream_server(poll_ms: int, pushes: bool) -> AsyncIterator[tuple[str, int]]:
    """The SEP-2663 test server on HTTP (without notifications unless `pushes`); yields (url, pid)."""
    port = free_port()
    quiet = [] if pushes else ["--no-notify"]
    proc = await asyncio.create_subprocess_exec(
        *SERVER, "--http", str(port), *quiet, "--poll-interval", str(poll_ms), "--ttl", str(TASK_TTL_MS),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        proc.terminate()
        await proc.wait()


async def modern_call(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any], *, tasks: bool
) -> Any:
    """One 2026-07-28 request; the result (or the error) of its response."""
    extensions: dict[str, Any] = {EXTENSION: {}} if tasks else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Mcp-Name": str(params.get("name", params.get("taskId", ""))),
    }
    async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
        raw = await response.read()
    if response.content_type == "text/event-stream":
        raw = raw.strip().rsplit(b"data: ", 1)[1]
    message = orjson.loads(raw)
    return message.get("result", message.get("error"))


async def upstream_polls(http: aiohttp.ClientSession, url: str) -> int:
    result = await modern_call(http, url, "tools/call", {"name": "stats", "arguments": {}}, tasks=False)
    count: int = orjson.loads(result["content"][0]["text"])["tasks_get"]
    return count


async def gateway_polls(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as response:
        match = POLLS.search(await response.read())
    return float(match.group(1)) if match else 0.0


async def window(
    http: aiohttp.ClientSession, upstream: str, upstream_pid: int, gateway: str, gateway_pid: int, seconds: float
) -> dict[str, float]:
    """One measuring window: rates and CPU shares over `seconds`."""
    base = gateway.removesuffix("/mcp")
    before = (await upstream_polls(http, upstream), await gateway_polls(http, base))
    cpu_before = (cpu_seconds(gateway_pid), cpu_seconds(upstream_pid))
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    cpu_after = (cpu_seconds(gateway_pid), cpu_seconds(upstream_pid))
    after = (await upstream_polls(http, upstream), await gateway_polls(http, base))
    served = after[0] - before[0]
    sent = after[1] - before[1]
    gateway_cpu = (cpu_after[0] - cpu_before[0]) / elapsed
    return {
        "upstream_rps": served / elapsed,
        "gateway_rps": sent / elapsed,
        "gateway_cpu": gateway_cpu,
        "upstream_cpu": (cpu_after[1] - cpu_before[1]) / elapsed,
        "cpu_us_per_poll": gateway_cpu * 1e6 / (sent / elapsed) if sent else 0.0,
    }


async def run(tasks: int, poll_ms: int, seconds: float, rounds: int, pushes: bool) -> None:
    config = f"[tasks]\nmax_tasks_per_owner = {tasks * 2}\n"
    async with (
        upstream_server(poll_ms, pushes) as (upstream, upstream_pid),
        gateway_process(config, ["--upstream-url", upstream]) as (gateway, gateway_pid),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
    ):
        idle = await window(http, upstream, upstream_pid, gateway, gateway_pid, seconds)
        limit = asyncio.Semaphore(50)

        async def create() -> str:
            async with limit:
                arguments = {"steps": 1, "delay": 3600}
                result = await modern_call(
                    http, gateway, "tools/call", {"name": "slow_job", "arguments": arguments}, tasks=True
                )
                task_id: str = result["taskId"]
                return task_id

        started = time.perf_counter()
        ids = await asyncio.gather(*(create() for _ in range(tasks)))
        created_s = time.perf_counter() - started
        await asyncio.sleep(max(2.0, 2 * poll_ms / 1000))  # let the polls spread over the interval
        windows = [await window(http, upstream, upstream_pid, gateway, gateway_pid, seconds) for _ in range(rounds)]
        status = await modern_call(http, gateway, "tasks/get", {"taskId": ids[0]}, tasks=True)
        rss = rss_kib(gateway_pid)

    def median(key: str) -> float:
        return statistics.median(w[key] for w in windows)

    how = "pushed on a subscription, polled as a check" if pushes else "polled"
    print(f"\n## {tasks} pass-through tasks, {how}, pollIntervalMs={poll_ms} ({machine()})\n")
    print("| window | tasks | upstream tasks/get /s | gateway polls /s | gateway CPU | CPU per poll | upstream CPU |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| idle | 0 | {idle['upstream_rps']:.0f} | {idle['gateway_rps']:.0f} | {idle['gateway_cpu']:.1%} of a core "
        f"| - | {idle['upstream_cpu']:.1%} |"
    )
    for i, w in enumerate(windows, 1):
        print(
            f"| {i} | {tasks} | {w['upstream_rps']:.0f} | {w['gateway_rps']:.0f} | {w['gateway_cpu']:.1%} of a core "
            f"| {w['cpu_us_per_poll']:.0f} µs | {w['upstream_cpu']:.1%} |"
        )
    # Pushed tasks are polled as a check every tasks.upstream_poll_max_ms (default 30 s).
    ideal = tasks / 30 if pushes else tasks * 1000 / poll_ms
    print(
        f"\nmedian of {rounds} windows of {seconds:.0f} s: {median('upstream_rps'):.0f} upstream tasks/get per s "
        f"(expected {ideal:.0f}), gateway {median('gateway_cpu'):.1%} of a core "
        f"({median('cpu_us_per_poll'):.0f} µs per poll), upstream {median('upstream_cpu'):.1%}"
    )
    print(
        f"created the {tasks} tasks in {created_s:.1f} s; gateway RSS {rss / 1024:.0f} MiB; "
        f"a task's status at the end: {status.get('status')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--poll-ms", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pushes", action="store_true", help="an upstream that pushes task status")
    args = parser.parse_args()
    asyncio.run(run(args.tasks, args.poll_ms, args.seconds, args.rounds, args.pushes))


if __name__ == "__main__":
    main()
