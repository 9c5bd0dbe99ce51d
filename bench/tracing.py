"""What tracing costs a forwarded call, side by side in one run.

One example server over Streamable HTTP, with in front of it: this tree's gateway with tracing off, the
same with tracing on (`[telemetry] sample_ratio = 1`, every span exported over OTLP/HTTP to a local
receiver process that discards them), and (with ``--base-tree DIR``) another checkout's gateway, e.g.
the tree before tracing existed. A raw client (bench/forwarding.py) makes N sequential `echo` calls on
every path, call by call in turn (each comparison measured at the same moment of a noisy machine), in
both eras, for R rounds. Reported: each path's median, and the medians of the per-round differences
(on - off: what tracing adds; off - base: what its mere presence adds).

    python bench/tracing.py [--calls 400] [--rounds 5] [--base-tree DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.forwarding import (  # noqa: E402
    SERVER,
    Mode,
    Proc,
    RawHttpClient,
    free_port,
    machine_info,
    spawn,
    stop,
    wait_until_ready,
)
from bench.tasks_stream import cpu_seconds  # noqa: E402

MODES: tuple[Mode, ...] = ("legacy", "2026-07-28")
THIS = str(Path(__file__).resolve())
EXPORT_DELAY_MS = 200
"""The batch processor's export delay in the bench's gateways (OTEL_BSP_SCHEDULE_DELAY; the SDK's default
is 5000): every round's spans are exported, and their CPU counted, before the round ends."""
EXPORT_SETTLE_S = 2 * EXPORT_DELAY_MS / 1000
TARGET_ADDED_MS = 0.05
"""Issue 23: tracing at sample_ratio 1 adds at most this much per forwarded call (median)."""


def discarding_receiver(port: int) -> None:
    """An OTLP/HTTP endpoint that accepts every export and drops it (`--receiver PORT`)."""
    from aiohttp import web

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", accept)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


@contextlib.asynccontextmanager
async def paths(logdir: Path, base_tree: Path | None) -> AsyncIterator[tuple[dict[str, str], dict[str, int]]]:
    """The upstream, the receiver and the gateways; yields each path's URL (`direct` is the upstream)
    and each gateway's pid."""
    python = sys.executable
    procs: list[Proc] = []
    try:
        upstream_port, receiver_port = free_port(), free_port()
        procs.append(
            spawn(
                "upstream", [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(upstream_port)], logdir
            )
        )
        await wait_until_ready(procs[-1], upstream_port, None)
        procs.append(spawn("receiver", [python, THIS, "--receiver", str(receiver_port)], logdir))
        await wait_until_ready(procs[-1], receiver_port, None)
        urls = {"direct": f"http://127.0.0.1:{upstream_port}/mcp"}
        pids: dict[str, int] = {}
        store = '[store]\nkind = "memory"\n'
        telemetry = f'[telemetry]\notlp_endpoint = "http://127.0.0.1:{receiver_port}/v1/traces"\nsample_ratio = 1.0\n'
        gateways = {"off": (ROOT, store), "on": (ROOT, store + telemetry)}
        if base_tree is not None:
            gateways["base"] = (base_tree, store)
        for name, (tree, text) in gateways.items():
            config = logdir / f"{name}.toml"
            config.write_text(text)
            port = free_port()
            argv = [python, "-m", "gateway", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
            procs.append(spawn(f"gateway-{name}", [*argv, "--upstream-url", urls["direct"]], logdir, cwd=tree))
            await wait_until_ready(procs[-1], port, "/readyz")
            urls[name] = f"http://127.0.0.1:{port}/mcp"
            pids[name] = procs[-1].popen.pid
        yield urls, pids
    finally:
        for proc in reversed(procs):
            stop(proc)


async def paired_medians(urls: dict[str, str], pids: dict[str, int], mode: Mode, calls: int) -> dict[str, float]:
    """The median ms of `echo` on every path, call by call in turn; and (`cpu NAME`) each gateway's CPU
    time per call in µs (its process's utime + stime: the export thread included, the load of a shared
    machine barely moves it)."""
    clients = {name: RawHttpClient(url, mode) for name, url in urls.items()}
    timings: dict[str, list[float]] = {name: [] for name in urls}
    warmup = max(20, calls // 10)
    async with contextlib.AsyncExitStack() as stack:
        for client in clients.values():
            await stack.enter_async_context(client)
        cpu_before: dict[str, float] = {}
        for index in range(calls + warmup):
            if index == warmup:
                cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            for name, client in clients.items():
                started = time.perf_counter()
                await client.call_tool("echo", {"text": "ping"})
                if index >= warmup:
                    timings[name].append(time.perf_counter() - started)
        await asyncio.sleep(EXPORT_SETTLE_S)  # the last batch exported, its CPU counted
    medians = {name: statistics.median(samples) * 1000 for name, samples in timings.items()}
    cpu = {f"cpu {name}": (cpu_seconds(pid) - cpu_before[name]) * 1e6 / calls for name, pid in pids.items()}
    return medians | cpu


async def run(calls: int, rounds: int, base_tree: Path | None) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        async with paths(Path(tmp), base_tree) as (urls, pids):
            for round_no in range(rounds):
                started = time.perf_counter()
                for mode in MODES:
                    for name, value in (await paired_medians(urls, pids, mode, calls)).items():
                        samples.setdefault(f"{name} {mode}", []).append(value)
                print(f"round {round_no + 1} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return samples


def render(samples: dict[str, list[float]], calls: int) -> str:
    names = [name for name in ("direct", "base", "off", "on") if f"{name} legacy" in samples]
    labels = {
        "direct": "direct to the upstream",
        "base": "gateway, base tree",
        "off": "gateway, tracing off",
        "on": "gateway, tracing on (ratio 1)",
    }
    rounds = len(samples["direct legacy"])
    lines = [
        f"Medians over {rounds} rounds of {calls} sequential `echo` calls per path and era (paths in turn).",
        "",
        "| path | 2025-11-25 median ms | 2026-07-28 median ms |",
        "|---|---:|---:|",
    ]
    for name in names:
        row = " | ".join(f"{statistics.median(samples[f'{name} {mode}']):.3f}" for mode in MODES)
        lines.append(f"| {labels[name]} | {row} |")
    for name in names:
        if f"cpu {name} legacy" in samples:
            row = " | ".join(f"{statistics.median(samples[f'cpu {name} {mode}']):.0f}" for mode in MODES)
            lines.append(f"| {labels[name]}: gateway CPU µs per call | {row} |")
    lines.append("")
    comparisons = [("on", "off", f"tracing on adds (target <= +{TARGET_ADDED_MS:.3f})")]
    if "base" in names:
        comparisons.append(("off", "base", "tracing off adds, vs the base tree (target: nothing measurable)"))
    for mode in MODES:
        for more, less, what in comparisons:
            added = [a - b for a, b in zip(samples[f"{more} {mode}"], samples[f"{less} {mode}"], strict=True)]
            lines.append(
                f"- {mode}: {what}: median {statistics.median(added):+.3f} ms "
                f"(rounds {', '.join(f'{value:+.3f}' for value in added)})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base-tree", type=Path, default=None, help="a checkout to compare (e.g. before tracing)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)  # the discarding receiver's process
    args = parser.parse_args(argv)
    if args.receiver is not None:
        discarding_receiver(args.receiver)
        return 0
    base = args.base_tree.resolve() if args.base_tree is not None else None
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = str(EXPORT_DELAY_MS)  # the gateways inherit it (spawn)
    samples = asyncio.run(run(args.calls, args.rounds, base))
    print(json.dumps(machine_info()))
    print(render(samples, args.calls))
    if args.json is not None:
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
