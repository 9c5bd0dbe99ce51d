"""Failover on the Redis store: from the SIGKILL of the replica running a task to `failed` on another.

Two gateway processes (`python -m gateway serve`, the example server on stdio each) share the bench's
own `redis-server`. Each round starts replica A, creates a long hosted task on it (`ticker`), opens a
`tasks/stream` reader on replica B, kills A with SIGKILL, and times until B's reader receives the
`task.status` `failed` event (B took the task over once A's lease expired: B's scan wakes when the
earliest lease expires). Prints, per lease TTL, the delay of every kill, their median and max beside
the target (TTL + 2 s), and how many rounds stalled (no `failed` on B within a minute: both
replicas' logs of such a round go to stderr).

    python bench/redis_failover.py [--rounds 10] [--ttl 2 --ttl 5]

Not a test: nothing here asserts a time. Numbers go into docs/benchmarks.md with the date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.client import GatewayClient  # noqa: E402
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway  # noqa: E402
from tests.redis_server import RedisServer, fresh_prefix  # noqa: E402

WAIT = 60.0


async def one_failover(config: str, b: RunningGateway) -> float | None:
    """Seconds from A's SIGKILL to `failed` read on B; None if B's reader saw no `failed` within `WAIT`."""
    b_from = len(b.output)
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as a, GatewayClient(a.url) as on_a:
        task_id = await on_a.start_task("ticker", {"rate": 20, "seconds": 600})
        assert task_id is not None
        killed = 0.0
        try:
            async with GatewayClient(b.url) as on_b, asyncio.timeout(WAIT), on_b.stream(task_id) as stream:
                async for event in stream:
                    if not killed and event["seq"] >= 3:
                        a.proc.send_signal(signal.SIGKILL)
                        killed = time.perf_counter()
                    if event["type"].endswith(".task.status") and event["payload"]["status"] == "failed":
                        return time.perf_counter() - killed
        except TimeoutError:
            print(f"task {task_id}: no `failed` on B within {WAIT:g} s; A's log:", *a.output, sep="\n", file=sys.stderr)
            print("B's log in the round:", *b.output[b_from:], sep="\n", file=sys.stderr)
            return None
        raise RuntimeError("the stream ended without the task failing")


async def failovers(ttl: float, rounds: int) -> list[float | None]:
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="mtg-bench-failover-")))
    redis.start()
    try:
        config = redis.gateway_config(fresh_prefix(), ttl)
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as b:
            return [await one_failover(config, b) for _ in range(rounds)]
    finally:
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, action="append", help="lease TTL in seconds (repeatable; default 2)")
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        "| lease TTL | target (TTL + 2 s) | each kill, s | median | max | within target | stalled |\n"
        "|---|---|---|---|---|---|---|"
    )
    for ttl in args.ttl or [2.0]:
        rounds = asyncio.run(failovers(ttl, args.rounds))
        times = [seconds for seconds in rounds if seconds is not None] or [float("nan")]
        each = " ".join("-" if seconds is None else f"{seconds:.2f}" for seconds in rounds)
        within = sum(1 for seconds in rounds if seconds is not None and seconds <= ttl + 2)
        print(
            f"| {ttl:g} s | {ttl + 2:g} s | {each} | {statistics.median(times):.2f} s | {max(times):.2f} s "
            f"| {within}/{len(rounds)} | {rounds.count(None)} |"
        )


if __name__ == "__main__":
    main()
