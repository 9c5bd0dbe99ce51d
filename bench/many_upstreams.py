"""Many upstreams: what the aggregate endpoint costs, side by side in one run.

* Routed `tools/call`: one example server over Streamable HTTP behind two gateways, a single-upstream
  one (`[upstream]`, its `/mcp`) and one with it as the first of two `[[upstreams]]` (the aggregate
  `/mcp`, tool `build__echo`). Raw clients (bench/forwarding.py) make N sequential `echo` calls
  through each, call by call in turn, in both eras: the added median is the aggregate's routing.
* `tools/list` on an aggregate of 10 upstreams against one: a gateway with one `[[upstreams]]` entry
  and one with ten (ten example servers, each a process of its own), each listed N times per round.

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


def upstreams(urls: dict[str, str]) -> str:
    return "".join(f'[[upstreams]]\nname = "{name}"\nurl = "{url}"\n\n' for name, url in urls.items())


@contextlib.asynccontextmanager
async def gateways(logdir: Path) -> AsyncIterator[dict[str, str]]:
    """Ten upstreams and four gateways: `single` ([upstream]: the first), `routed` (the first two as
    [[upstreams]]), `one` (the first as one [[upstreams]]) and `wide` (all ten): each one's /mcp."""
    python = sys.executable
    procs: list[Proc] = []
    try:
        upstream_urls: list[str] = []
        for index in range(WIDE):  # ten servers of their own, as ten upstreams would be
            port = free_port()
            upstream = spawn(
                f"upstream-{index}", [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(port)], logdir
            )
            procs.append(upstream)
            await wait_until_ready(upstream, port, None)
            upstream_urls.append(f"http://127.0.0.1:{port}/mcp")
        store = '[store]\nkind = "memory"\n\n'
        configs = {
            "single": f'{store}[upstream]\nurl = "{upstream_urls[0]}"\n',
            "routed": store + upstreams({"build": upstream_urls[0], "other": upstream_urls[1]}),
            "one": store + upstreams({"u0": upstream_urls[0]}),
            "wide": store + upstreams({f"u{i}": url for i, url in enumerate(upstream_urls)}),
        }
        urls: dict[str, str] = {"direct": ",".join(upstream_urls)}
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


async def paired_medians(urls: dict[str, str], mode: Mode, calls: int) -> tuple[float, float]:
    """The median ms of `echo` through the single-upstream gateway and of `build__echo` through the
    aggregate, call by call in turn (each pair measured at the same moment of a noisy machine)."""
    single, routed = RawHttpClient(urls["single"], mode), RawHttpClient(urls["routed"], mode)
    timings: dict[str, list[float]] = {"single": [], "routed": []}
    async with single, routed:
        for index in range(calls + max(20, calls // 10)):
            for name, client, tool in (("single", single, "echo"), ("routed", routed, "build__echo")):
                started = time.perf_counter()
                await client.call_tool(tool, {"text": "ping"})
                if index >= max(20, calls // 10):  # after the warm-up
                    timings[name].append(time.perf_counter() - started)
    return statistics.median(timings["single"]) * 1000, statistics.median(timings["routed"]) * 1000


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


async def direct_median(upstream_urls: list[str], lists: int) -> float:
    """The median ms of asking every upstream in `upstream_urls` for its tools/list at once, straight
    (no gateway): what the upstreams themselves take, on this machine, to answer together."""
    clients = [RawHttpClient(url, "legacy") for url in upstream_urls]
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)

        async def together() -> None:
            await asyncio.gather(*(client.request("tools/list", {}) for client in clients))

        latency = await latency_loop(together, lists, warmup=10)
    if latency.errors:
        raise RuntimeError(f"direct: {latency.errors} errors")
    return latency.median_ms


async def run(calls: int, lists: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        async with gateways(Path(tmp)) as urls:
            for round_no in range(rounds):
                started = time.perf_counter()
                for mode in MODES:
                    single, routed = await paired_medians(urls, mode, calls)
                    samples.setdefault(f"single {mode}", []).append(single)
                    samples.setdefault(f"routed {mode}", []).append(routed)
                for name in ("one", "wide") if round_no % 2 == 0 else ("wide", "one"):
                    median, tools = await list_median(urls[name], lists)
                    samples.setdefault(f"list {name}", []).append(median)
                    samples.setdefault(f"tools {name}", []).append(tools)
                upstream_urls = urls["direct"].split(",")
                for name, at_once in (("one", upstream_urls[:1]), ("wide", upstream_urls)):
                    samples.setdefault(f"direct {name}", []).append(await direct_median(at_once, lists))
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
    direct = [w / o for w, o in zip(samples["direct wide"], samples["direct one"], strict=True)]
    lines += [
        "",
        "| aggregate | tools | whole tools/list through /mcp, median ms | the upstreams' lists, straight and at once |",
        "|---|---:|---:|---:|",
        f"| 1 upstream | {int(med('tools one'))} | {med('list one'):.3f} | {med('direct one'):.3f} |",
        f"| {WIDE} upstreams | {int(med('tools wide'))} | {med('list wide'):.3f} | {med('direct wide'):.3f} |",
        "",
        f"- tools/list of {WIDE} upstreams / of 1: {statistics.median(ratio):.2f}x "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratio)}; target <= 2x); straight from the upstreams, "
        f"{WIDE} at once / 1: {statistics.median(direct):.2f}x",
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
