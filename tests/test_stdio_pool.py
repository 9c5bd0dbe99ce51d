"""The stdio upstream's pool of processes for 2026-07-28 requests: a request pinned to a process (its
task, its requestState) reaches that process even while another request is in flight on it.

Against a real subprocess: a line-echoing upstream that answers each request after a short delay.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.config import StdioConfig
from gateway.metrics import Metrics
from gateway.upstream.stdio import StdioUpstream

SLOW_ECHO = """
import json, os, sys, time
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:
        time.sleep(0.3)
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"pid": os.getpid()}}), flush=True)
"""


async def test_a_pinned_request_waits_for_its_busy_process_instead_of_going_to_another() -> None:
    upstream = StdioUpstream([sys.executable, "-c", SLOW_ECHO], StdioConfig(idle_processes=2), Metrics())
    await upstream.start()
    try:
        async with upstream.stateless() as first:
            upstream.pin("task-1", first)
            in_flight = await first.request({"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}, {})

            async def pinned_request() -> object:
                async with upstream.stateless("task-1") as channel:
                    exchange = await channel.request({"jsonrpc": "2.0", "id": 2, "method": "tasks/get"}, {})
                    return (await exchange.collect())[-1]["result"]["pid"]

            second = asyncio.create_task(pinned_request())
            await asyncio.sleep(0.05)  # the second request is waiting while the first is in flight
            assert not second.done()
            first_pid = (await in_flight.collect())[-1]["result"]["pid"]
        async with asyncio.timeout(10):
            assert await second == first_pid
    finally:
        await upstream.close()
