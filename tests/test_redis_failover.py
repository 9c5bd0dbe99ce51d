"""Two gateway replicas on one Redis (issue 12's "Two replicas" cancel part and "Owner death").

Real processes: two gateways (`python -m gateway serve`, each with the example server on stdio) on the
test's own `redis-server`, with a short lease TTL; clients on loopback. What must hold:

* `tasks/cancel` sent to replica B cancels the task A runs: A's upstream call stops, and the timeline
  (read on B) ends `cancelled`; a 2026-07-28 `tasks/update` sent to B answers A's input round;
* A stopped gracefully (SIGTERM) hands its running task over at once: B fails it without waiting for
  A's (long) lease;
* SIGKILL of A mid-task: B takes the task over (its lease expired), records `task.owner_lost` then
  `failed`, and a `tasks/stream` reader on B sees it live;
* SIGSTOP of A past its lease, B takes over, SIGCONT: none of A's late appends land (no seq reused or
  duplicated, nothing after the terminal event) and A stops working on the task.

How fast failover is belongs to bench/redis_failover.py; every wait here is only bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from gateway.client import GatewayClient
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway, stop_process
from tests.redis_server import RedisServer, fresh_prefix
from tests.test_input_required import modern_deploy
from tests.test_restart import kind, read_events

WAIT = 30.0
"""Seconds any one phase may take."""
LEASE_TTL_S = 2.0
DEPLOY_POLICY = """
[[tasks.tools]]
match = "deploy"
task_support = "optional"
modern = "after_ms"
after_ms = 0

[[tasks.tools]]
match = "*"
task_support = "optional"
"""


@contextlib.asynccontextmanager
async def two_replicas(
    tmp_path: Path, a_lease_ttl_s: float = LEASE_TTL_S, a_config_extra: str = ""
) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    """Replicas A and B on one Redis of the test's own (one key prefix); A's leases last `a_lease_ttl_s`,
    and A's config has `a_config_extra` (TOML sections) too."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        prefix = fresh_prefix()
        a_config = redis.gateway_config(prefix, a_lease_ttl_s) + a_config_extra + DEPLOY_POLICY
        b_config = redis.gateway_config(prefix, LEASE_TTL_S) + DEPLOY_POLICY
        async with (
            start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=a_config) as a,
            start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=b_config) as b,
        ):
            yield a, b
    finally:
        redis.stop()


async def held_tasks(gw: RunningGateway) -> int:
    """How many tasks the replica runs or watches (its registry, as /healthz counts it)."""
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/healthz") as response:
        count: int = (await response.json())["tasks"]
        return count


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """Wait (bounded) until `check` says yes; `what` names it in the failure."""
    try:
        async with asyncio.timeout(WAIT):
            while not await check():  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT:g} s: {what}") from None


async def test_requests_through_another_replica_reach_the_owner_and_a_stopping_owner_hands_over(
    tmp_path: Path,
) -> None:
    # A's leases outlast every wait here: only A's hand-over at its stop lets B take a task of A's.
    async with two_replicas(tmp_path, a_lease_ttl_s=10 * WAIT) as (a, b):
        await cancel_through(a, b, tmp_path / "build.marker")
        await answer_input_through(a, b)
        await hand_over_at_stop(a, b)


async def cancel_through(a: RunningGateway, b: RunningGateway, marker: Path) -> None:
    """A 2025-11-25 tasks/cancel sent to B of a task A runs: A stops the call and records `cancelled`."""
    async with GatewayClient(a.url) as on_a, GatewayClient(b.url) as on_b:
        task_id = await on_a.start_task("slow_build", {"steps": 600, "delay": 0.05, "marker": str(marker)})
        assert task_id is not None
        await read_events(on_b, task_id, None, 3)  # running on A, read on B
        cancelled = (await on_b.cancel_task(task_id))["result"]
        assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"

        async def call_stopped() -> bool:
            return "cancelled" in await asyncio.to_thread(marker.read_text)

        await until("A's upstream call stops", call_stopped)
        events = await read_events(on_b, task_id, None, None)
        assert (await on_a.get_task(task_id))["result"]["status"] == "cancelled"
    kinds = [kind(event) for event in events]
    assert kinds[-2:] == ["task.status", "task.terminal"] and events[-2]["payload"]["status"] == "cancelled"
    assert [event["seq"] for event in events] == list(range(len(events)))


async def answer_input_through(a: RunningGateway, b: RunningGateway) -> None:
    """A 2026-07-28 tasks/update sent to B answers the input round of the call A runs."""
    async with GatewayClient(a.url, era=Era.MODERN) as on_a, GatewayClient(b.url, era=Era.MODERN) as on_b:
        task_id = (await modern_deploy(on_a, "prod"))["taskId"]

        async def waiting_for_input() -> bool:
            return bool((await on_a.get_task(task_id))["result"].get("inputRequests"))

        await until("A shows the input round", waiting_for_input)
        (key,) = (await on_a.get_task(task_id))["result"]["inputRequests"]
        accept = {"action": "accept", "content": {"confirm": True}}
        update = await on_b.request("tasks/update", {"taskId": task_id, "inputResponses": {key: accept}})
        assert update["result"] == {"resultType": "complete"}

        async def completed() -> bool:
            return bool((await on_b.get_task(task_id))["result"]["status"] == "completed")

        await until("the task completes", completed)
        done = (await on_b.get_task(task_id))["result"]
        events = await read_events(on_b, task_id, None, None)
    assert done["result"]["content"][0]["text"] == "deployed to prod", done
    assert "input.answered" in [kind(event) for event in events]


async def hand_over_at_stop(a: RunningGateway, b: RunningGateway) -> None:
    """A stopped gracefully (SIGTERM) lets its leases expire at once: B takes A's running task over."""
    async with GatewayClient(a.url) as on_a:
        task_id = await on_a.start_task("ticker", {"rate": 20, "seconds": 600})
        assert task_id is not None
    await stop_process(a.proc)
    async with GatewayClient(b.url) as on_b:
        events = await read_events(on_b, task_id, None, None)
    kinds = [kind(event) for event in events]
    assert kinds[-3:] == ["task.owner_lost", "task.status", "task.terminal"], kinds[-5:]
    assert events[-2]["payload"]["status"] == "failed"


async def test_a_killed_owners_task_is_failed_by_another_replica_and_seen_live(tmp_path: Path) -> None:
    async with two_replicas(tmp_path) as (a, b), GatewayClient(a.url) as on_a, GatewayClient(b.url) as on_b:
        task_id = await on_a.start_task("ticker", {"rate": 20, "seconds": 120})
        assert task_id is not None
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT), on_b.stream(task_id) as stream:  # one live reader on B throughout
            async for event in stream:
                events.append(event)
                if len(events) == 5:
                    a.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(a.proc.wait(), WAIT)
        task = (await on_b.get_task(task_id))["result"]
    kinds = [kind(event) for event in events]
    assert kinds[-3:] == ["task.owner_lost", "task.status", "task.terminal"], kinds[-5:]
    assert events[-2]["payload"]["status"] == "failed" and events[-3]["payload"]["hostedBy"] == "gateway"
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert task["status"] == "failed" and "stopped renewing its lease" in task["statusMessage"]


async def test_a_paused_owner_is_fenced_after_a_takeover_and_stops_working_on_the_task(tmp_path: Path) -> None:
    async with two_replicas(tmp_path) as (a, b), GatewayClient(a.url) as on_a, GatewayClient(b.url) as on_b:
        task_id = await on_a.start_task("ticker", {"rate": 50, "seconds": 120})
        assert task_id is not None
        await read_events(on_b, task_id, None, 5)
        assert await held_tasks(a) == 1
        a.proc.send_signal(signal.SIGSTOP)
        try:

            async def failed_on_b() -> bool:
                return bool((await on_b.get_task(task_id))["result"]["status"] == "failed")

            await until("B takes the task over", failed_on_b)
        finally:
            a.proc.send_signal(signal.SIGCONT)

        async def a_holds_nothing() -> bool:
            return await held_tasks(a) == 0

        await until("A stops working on the task", a_holds_nothing)
        events = await read_events(on_b, task_id, None, None)
    kinds = [kind(event) for event in events]
    assert [event["seq"] for event in events] == list(range(len(events)))  # no seq reused or duplicated
    assert kinds[-3:] == ["task.owner_lost", "task.status", "task.terminal"], kinds[-5:]  # nothing after it
    assert kinds.count("task.terminal") == 1
    assert sum("taken over by another replica" in line for line in a.output) == 1  # A logged it once
