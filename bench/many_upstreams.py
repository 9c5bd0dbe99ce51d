"""Many upstreams: what the aggregate endpoint costs, side by side in one run.

* Routed `tools/call`: one example server over Streamable HTTP behind two gateways, a single-upstream
  one (`[upstream]`, its `/mcp`) and one with it as the first of two `[[upstreams]]` (the aggregate
  `/mcp`, tool `build__echo`). The same raw client (bench/forwarding.py) makes N sequential `echo`
  calls through each, alternating each round, in both eras: the added median is the aggregate's routing.
* `tools/list` on an aggregate of 10 upstreams against one: a gateway with one `[[upstreams]]` entry
  and one with ten (all the same example server, ten names), each listed N times per round.

    python bench/many_upstreams.py [--calls 400] [--lists 200] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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
    latency_loop,
    machine_info,
    spawn,
    stop,
    wait_until_ready,
)

MODES: tuple[Mode, ...] = ("legacy", "2026-07-28")
WIDE = 10
"""Upstreams in the wide aggregate."""


def upstreams(url: str, names: list[str]) -> str:
    return "".join(f'[[upstreams]]\nname = "{name}"\nurl = "{url}"\n\n' for name in names)


@contextlib.asynccontextmanager
async def gateways(logdir: Path) -> AsyncIterator[dict[str, str]]:
    """The upstream and four gateways in front of it: `single` ([upstream]), `routed` (two
    [[upstreams]]), `one` (one [[upstreams]]) and `wide` (ten): each one's /mcp."""
    python = sys.executable
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    store = '[store]\nkind = "memory"\n\n'
    configs = {
        "single": f'{store}[upstream]\nurl = "{upstream_url}"\n',
        "routed": store + upstreams(upstream_url, ["build", "other"]),
        "one": store + upstreams(upstream_url, ["u0"]),
        "wide": store + upstreams(upstream_url, [f"u{i}" for i in range(WIDE)]),
    }
    procs: list[Proc] = []
    try:
        upstream = spawn(
            "upstream", [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(upstream_port)], logdir
        )
        procs.append(upstream)
        await wait_until_ready(upstream, upstream_port, None)
        urls: dict[str, str] = {}
        for name, text in configs.items():
            config = logdir / f"{name}.toml"
            config.write_text(text)
            port = free_port()
            argv = [python, "-m", "gateway", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
            gateway = spawn(f"gateway-{name}", argv, logdir)
            procs.append(gateway)
            await wait_until_ready(gateway, port, "/readyz")
            urls[name] = f"http://127.0.0.1:{port}/mcp"
        yield urls
    finally:
        for proc in reversed(procs):
            stop(proc)


async def call_median(url: str, mode: Mode, tool: str, calls: int) -> float:
    async with RawHttpClient(url, mode) as client:

        async def echo() -> None:
            await client.call_tool(tool, {"text": "ping"})

        latency = await latency_loop(echo, calls, warmup=max(20, calls // 10))
    if latency.errors:
        raise RuntimeError(f"{url} {mode}: {latency.errors} errors")
    return latency.median_ms


async def list_median(url: str, lists: int) -> tuple[float, int]:
    """The median ms of a whole tools/list (every page), and how many tools it holds."""
    async with RawHttpClient(url, "legacy") as client:
        counted = 0

        async def whole_list() -> None:
            nonlocal counted
            cursor: str | None = None
            counted = 0
            while True:
                result = await client.request("tools/list", {"cursor": cursor} if cursor else {})
                counted += len(result["tools"])
                cursor = result.get("nextCursor")
                if not cursor:
                    return

        latency = await latency_loop(whole_list, lists, warmup=10)
    if latency.errors:
        raise RuntimeError(f"{url}: {latency.errors} errors")
    return latency.median_ms, counted


async def run(calls: int, lists: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        async with gateways(Path(tmp)) as urls:
            for round_no in range(rounds):
                started = time.perf_counter()
                for mode in MODES:
                    pair = [("single", "echo"), ("routed", "build__echo")]
                    for name, tool in pair if round_no % 2 == 0 else reversed(pair):
                        median_ms = await call_median(urls[name], mode, tool, calls)
                        samples.setdefault(f"{name} {mode}", []).append(median_ms)
                for name in ("one", "wide") if round_no % 2 == 0 else ("wide", "one"):
                    median, tools = await list_median(urls[name], lists)
                    samples.setdefault(f"list {name}", []).append(median)
                    samples.setdefault(f"tools {name}", []).append(tools)
                print(f"round {round_no + 1} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return samples


def render(samples: dict[str, list[float]], calls: int, lists: int) -> str:
    def med(key: str) -> float:
        return float(statistics.median(samples[key]))

    rounds = len(samples["list one"])
    lines = [
        f"Medians over {rounds} rounds; {calls} sequential `echo` calls per path and era, {lists} whole "
        "`tools/list`s per gateway.",
        "",
        "| path | 2025-11-25 median ms | 2026-07-28 median ms |",
        "|---|---:|---:|",
    ]
    for name, label in (("single", "single-upstream gateway, `echo`"), ("routed", "aggregate `/mcp`, `build__echo`")):
        lines.append(f"| {label} | {med(f'{name} legacy'):.3f} | {med(f'{name} 2026-07-28'):.3f} |")
    lines.append("")
    for mode in MODES:
        added = [r - s for r, s in zip(samples[f"routed {mode}"], samples[f"single {mode}"], strict=True)]
        lines.append(
            f"- routed `tools/call` {mode}: added median {statistics.median(added):+.3f} ms "
            f"(rounds {', '.join(f'{a:+.3f}' for a in added)}; target <= +0.050)"
        )
    ratio = [w / o for w, o in zip(samples["list wide"], samples["list one"], strict=True)]
    lines += [
        "",
        "| aggregate | tools | whole tools/list median ms |",
        "|---|---:|---:|",
        f"| 1 upstream | {int(med('tools one'))} | {med('list one'):.3f} |",
        f"| {WIDE} upstreams | {int(med('tools wide'))} | {med('list wide'):.3f} |",
        "",
        f"- tools/list of {WIDE} upstreams / of 1: {statistics.median(ratio):.2f}x "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratio)}; target <= 2x)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--lists", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    samples = asyncio.run(run(args.calls, args.lists, args.rounds))
    print(json.dumps(machine_info()))
    print(render(samples, args.calls, args.lists))
    if args.json is not None:
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
