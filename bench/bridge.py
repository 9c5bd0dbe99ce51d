"""Era bridging overhead: a bridged `tools/call` against a same-era forward, side by side, in one run.

One example server over Streamable HTTP (it speaks both eras) has two gateways in front of it: one
that learns it speaks both (`era = "auto"`: every client forwarded in its own era) and one told it is
legacy-only (`era = "legacy"`: a 2026-07-28 client is bridged onto upstream 2025-11-25 sessions, as for
server-everything). The same raw client (bench/forwarding.py) measures, in turn, each round:

* `forward 2025`: a 2025-11-25 client through the legacy-only gateway (the session path, forwarded);
* `forward 2026`: a 2026-07-28 client through the both-eras gateway (the stateless path, forwarded);
* `bridged 2026`: a 2026-07-28 client through the legacy-only gateway (bridged);

the median and p99 of N sequential `echo` calls and a `burst(n)` of progress notifications (delivered,
and their rate); and the same client straight to the upstream in each era (`direct`), for what the
upstream's own two paths cost. Prints a markdown table of the medians over rounds, and the bridged path's added
median latency and burst rate ratio against each forward.

    python bench/bridge.py [--calls 400] [--burst 5000] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
    measure_raw,
    spawn,
    stop,
    wait_until_ready,
)

PATHS: tuple[tuple[str, Mode, str], ...] = (
    ("direct 2025", "legacy", "direct"),
    ("direct 2026", "2026-07-28", "direct"),
    ("forward 2025", "legacy", "legacy_only"),
    ("forward 2026", "2026-07-28", "both"),
    ("bridged 2026", "2026-07-28", "legacy_only"),
)
"""(label, client era, which gateway; `direct`: none, the upstream itself)."""


@dataclass
class Sample:
    median_ms: float
    p99_ms: float
    burst_delivered: int
    burst_rate: float


@contextlib.asynccontextmanager
async def gateways(logdir: Path) -> AsyncIterator[dict[str, str]]:
    python = sys.executable
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    procs: list[Proc] = []
    try:
        upstream = spawn(
            "upstream", [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(upstream_port)], logdir
        )
        procs.append(upstream)
        await wait_until_ready(upstream, upstream_port, None)
        urls = {"direct": upstream_url}
        for name, era in (("both", "auto"), ("legacy_only", "legacy")):
            config = logdir / f"{name}.toml"
            config.write_text(f'[store]\nkind = "memory"\n\n[upstream]\nera = "{era}"\n')
            port = free_port()
            gateway = spawn(
                f"gateway-{name}",
                [
                    *(python, "-m", "gateway", "serve", "--config", str(config)),
                    *("--listen", f"127.0.0.1:{port}", "--upstream-url", upstream_url),
                ],
                logdir,
            )
            procs.append(gateway)
            await wait_until_ready(gateway, port, "/healthz")
            urls[name] = f"http://127.0.0.1:{port}/mcp"
        yield urls
    finally:
        for proc in reversed(procs):
            stop(proc)


async def measure(url: str, mode: Mode, calls: int, burst_n: int) -> Sample:
    m = await measure_raw(RawHttpClient(url, mode), mode, calls, burst_n)
    assert m.latency is not None and m.burst is not None
    if m.latency.errors or m.burst.error or m.burst.delivered != burst_n:
        raise RuntimeError(f"{url} {mode}: {m.latency.errors} errors, burst {m.burst}")
    return Sample(m.latency.median_ms, m.latency.p99_ms, m.burst.delivered, m.burst.rate)


async def run(calls: int, burst_n: int, rounds: int) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {label: [] for label, _, _ in PATHS}
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
        async with gateways(Path(tmp)) as urls:
            for round_no in range(rounds):
                for label, mode, gateway in PATHS:
                    sample = await measure(urls[gateway], mode, calls, burst_n)
                    samples[label].append(sample)
                    print(
                        f"round {round_no + 1}: {label}: median {sample.median_ms:.3f} ms, "
                        f"burst {sample.burst_rate:,.0f}/s",
                        file=sys.stderr,
                    )
    return samples


def render(samples: dict[str, list[Sample]], calls: int, burst_n: int) -> str:
    def med(label: str, field: str) -> float:
        return float(statistics.median(getattr(sample, field) for sample in samples[label]))

    lines = [
        f"{calls} sequential `echo` calls and a {burst_n:,}-notification burst per path and round; "
        f"medians over {len(samples['bridged 2026'])} rounds.",
        "",
        "| path | median ms | p99 ms | burst delivered | burst rate /s |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, _, _ in PATHS:
        delivered = min(sample.burst_delivered for sample in samples[label])
        lines.append(
            f"| {label} | {med(label, 'median_ms'):.3f} | {med(label, 'p99_ms'):.3f} | "
            f"{delivered:,}/{burst_n:,} | {med(label, 'burst_rate'):,.0f} |"
        )
    lines.append("")
    for forward in ("forward 2025", "forward 2026"):
        # Per round, side by side: the bridged path against this forward measured next to it.
        added = [b.median_ms - f.median_ms for b, f in zip(samples["bridged 2026"], samples[forward], strict=True)]
        ratio = [b.burst_rate / f.burst_rate for b, f in zip(samples["bridged 2026"], samples[forward], strict=True)]
        lines.append(
            f"- bridged 2026 vs {forward}: added median {statistics.median(added):+.3f} ms "
            f"(rounds {', '.join(f'{a:+.3f}' for a in added)}); burst rate ratio {statistics.median(ratio):.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    samples = asyncio.run(run(args.calls, args.burst, args.rounds))
    print(json.dumps(machine_info()))
    print(render(samples, args.calls, args.burst))
    if args.json is not None:
        args.json.write_text(json.dumps({label: [vars(s) for s in rows] for label, rows in samples.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
