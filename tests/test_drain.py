"""Graceful drain (issue 23, "Drain"): what a replica does between SIGTERM and its exit.

Real processes: gateways (`python -m gateway serve`) in front of the example server on stdio; two of
them on the test's own `redis-server` for the hand-over. What must hold:

* SIGTERM to replica A while a `tasks/stream` and a `tools/call` are open on it: /readyz on A answers
  503 `draining` at once; the call completes with its real result; the stream ends with its normal
  empty result, and its reader resumes on replica B with `after` = the last seq it saw; what it reads
  on A then B is exactly B's whole history of the task (nothing lost or doubled); A hands the task over
  as it stops (B ends it without waiting for A's long lease) and A exits 0 within `drain_timeout_s`;
* a task the upstream holds (server-everything over HTTP), watched by A: after A's drain B watches it
  again and it completes, the reader's events on A then B again its whole history;
* while draining, a new request (a new session, a request in an open one, a GET stream) gets 503 with
  `Retry-After` and the `draining` error, /healthz stays 200, and a notification still gets through;
* a second SIGTERM during the drain stops the gateway at once, the call in flight or not.

The `Drain` bookkeeping itself is tested in process too.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp

from gateway.client import GatewayClient
from gateway.drain import DRAINING, Drain, sigterm_handler
from gateway.protocol import jsonrpc
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.redis_server import RedisServer, fresh_prefix
from tests.test_redis_failover import LEASE_TTL_S, WAIT, two_replicas, until
from tests.test_restart import kind, read_events
from tests.test_upstream_with_tasks import TOOL, http_upstream
from tests.wire import LEGACY, Client

DRAIN_TIMEOUT_S = 20.0
"""A's drain_timeout_s: the call in flight takes a few seconds of it."""
DRAINING_CONFIG = f"[server]\ndrain_timeout_s = {DRAIN_TIMEOUT_S}\n"
IN_FLIGHT_CALL = {"steps": 30, "delay": 0.2}
"""The call in flight at the SIGTERM: about 6 s, in flight throughout the checks (well within the drain)."""


async def status_of(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url) as response:
        return response.status, await response.json()


async def until_draining(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    """Wait (bounded) until the gateway's /readyz answers 503 `draining`."""

    async def draining() -> bool:
        status, body = await status_of(http, f"{gw.base}/readyz")
        return status == 503 and body["status"] == DRAINING

    await until("/readyz answers 503 draining", draining)


async def started(marker: Path) -> bool:
    """Whether the example server's call has begun (it writes `marker` as it goes)."""
    return "started" in await asyncio.to_thread(lambda: marker.read_text() if marker.exists() else "")


async def test_sigterm_drains_a_replica_its_call_completes_and_its_stream_resumes_on_the_other(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "call.marker"
    # A's leases outlast every wait here: only A's hand-over at its stop lets B end A's task.
    async with (
        two_replicas(tmp_path, a_lease_ttl_s=10 * WAIT, a_config_extra=DRAINING_CONFIG) as (a, b),
        aiohttp.ClientSession() as http,
        GatewayClient(a.url) as on_a,
        GatewayClient(b.url) as on_b,
    ):
        task_id = await on_a.start_task("ticker", {"rate": 20, "seconds": 600})
        assert task_id is not None
        call = asyncio.create_task(on_a.call_tool("slow_build", {**IN_FLIGHT_CALL, "marker": str(marker)}))
        await until("the call is in flight on A", lambda: started(marker))

        read_on_a: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT), on_a.stream(task_id) as stream:
            async for event in stream:
                read_on_a.append(event)
                if len(read_on_a) == 5:
                    a.proc.send_signal(signal.SIGTERM)
        assert stream.result == {}, "the stream on A ends with its normal empty result"
        await until_draining(a, http)
        assert not call.done(), "the call is still in flight while A drains"
        assert (await status_of(http, f"{a.base}/healthz"))[0] == 200

        last_seq = read_on_a[-1]["seq"]
        read_on_b = await read_events(on_b, task_id, last_seq, None)  # live on B, to the task's end
        result = await call
        assert result["content"][0]["text"] == "built 30 steps" and not result.get("isError"), result
        assert await asyncio.wait_for(a.proc.wait(), DRAIN_TIMEOUT_S) == 0
        history = await read_events(on_b, task_id, None, None)
        task = (await on_b.get_task(task_id))["result"]

    assert read_on_a + read_on_b == history, "the reader's events, A then B, are the whole history"
    assert [event["seq"] for event in history] == list(range(len(history)))
    kinds = [kind(event) for event in history]
    assert kinds[-3:] == ["task.owner_lost", "task.status", "task.terminal"], kinds[-5:]
    assert task["status"] == "failed" and "stopped renewing its lease" in task["statusMessage"], task
    assert any("drained: nothing in flight" in line for line in a.output), a.output_text()[-2000:]


async def test_a_pass_through_task_handed_over_at_the_drain_completes_on_the_other_replica(tmp_path: Path) -> None:
    """server-everything over HTTP holds the task and A watches it: after A's drain, B watches it again
    (A handed its lease over) and the task completes; the reader's A-then-B events are its history."""
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        prefix = fresh_prefix()
        # A's lease outlasts every wait here: only A's hand-over lets B watch the task.
        a_config = redis.gateway_config(prefix, 10 * WAIT) + DRAINING_CONFIG
        async with (
            http_upstream(tmp_path) as (upstream_url, _),
            start_gateway(upstream_url=upstream_url, config_text=a_config) as a,
            start_gateway(upstream_url=upstream_url, config_text=redis.gateway_config(prefix, LEASE_TTL_S)) as b,
            GatewayClient(a.url) as on_a,
            GatewayClient(b.url) as on_b,
        ):
            task_id = await on_a.start_task(TOOL, {"topic": "drain"}, ttl_ms=60000)
            assert task_id is not None
            read_on_a: list[dict[str, Any]] = []
            async with asyncio.timeout(WAIT), on_a.stream(task_id) as stream:
                async for event in stream:
                    read_on_a.append(event)
                    if len(read_on_a) == 2:  # task.created, then the first status: the query runs on
                        a.proc.send_signal(signal.SIGTERM)
            assert stream.result == {}
            assert await asyncio.wait_for(a.proc.wait(), DRAIN_TIMEOUT_S) == 0
            read_on_b = await read_events(on_b, task_id, read_on_a[-1]["seq"], None)
            history = await read_events(on_b, task_id, None, None)
            task = (await on_b.get_task(task_id))["result"]
    finally:
        redis.stop()
    assert read_on_a + read_on_b == history
    assert [event["seq"] for event in history] == list(range(len(history)))
    kinds = [kind(event) for event in history]
    assert "capture.interrupted" in kinds, kinds
    assert kinds[-2:] == ["task.status", "task.terminal"] and history[-2]["payload"]["status"] == "completed", history
    assert task["status"] == "completed", task


async def test_while_draining_new_requests_get_503_and_a_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    marker = tmp_path / "call.marker"
    config = DRAINING_CONFIG + '[[tasks.tools]]\nmatch = "*"\ntask_support = "optional"\n'
    async with (
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw,
        aiohttp.ClientSession() as http,
        GatewayClient(gw.url) as client,
    ):
        session = Client(http, gw.url, LEGACY)
        await session.initialize()
        # Long enough to outlast every check: only the second SIGTERM ends it.
        call = asyncio.create_task(client.call_tool("slow_build", {"steps": 600, "delay": 0.1, "marker": str(marker)}))
        await until("the call is in flight", lambda: started(marker))
        gw.proc.send_signal(signal.SIGTERM)
        await until_draining(gw, http)

        fresh = Client(http, gw.url, LEGACY)
        for reply in (
            await fresh.request("initialize", {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {}}),
            await session.request("tools/list"),
        ):
            assert reply.status == 503 and int(reply.headers["Retry-After"]) > 0, (reply.status, reply.messages)
            error = reply.final["error"]
            assert error["code"] == jsonrpc.INTERNAL_ERROR and error["data"]["reason"] == DRAINING, error
        async with http.get(
            gw.url, headers={**session.headers({"method": "GET"}), "Accept": "text/event-stream"}
        ) as get:
            assert get.status == 503 and (await get.json())["error"]["data"]["reason"] == DRAINING
        # A notification reaches what is in flight: an open session's answers are not refused.
        notified = await session.send(session.message("notifications/cancelled", {"requestId": 10**6}))
        assert notified.status == 202, notified.status
        healthz_status, healthz = await status_of(http, f"{gw.base}/healthz")
        assert healthz_status == 200 and healthz["status"] == DRAINING, healthz
        assert not call.done()

        gw.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(gw.proc.wait(), WAIT) == 0
        call.cancel()
    assert "cancelled" in marker.read_text(), "the second SIGTERM stopped the upstream call"


# -- the bookkeeping, in process --------------------------------------------------------------------


async def test_settle_waits_for_the_requests_in_flight_and_no_longer_than_the_timeout() -> None:
    drain = Drain(timeout_s=WAIT)
    assert drain.refusal() is None
    with drain.track():
        settling = asyncio.create_task(drain.settle())
        await asyncio.sleep(0)
        refusal = drain.refusal(7)
        assert refusal is not None and refusal.http_status == 503 and refusal.data["reason"] == DRAINING
        assert refusal.to_message()["id"] == 7
        assert not settling.done()
    await asyncio.wait_for(settling, WAIT)

    stuck = Drain(timeout_s=0.01)
    with stuck.track():
        await asyncio.wait_for(stuck.settle(), WAIT)  # returns once the timeout passed, the request still on


async def test_the_first_sigterm_asks_for_a_drain_and_a_second_cancels() -> None:
    requested, listening = asyncio.Event(), asyncio.Event()
    listening.set()
    serving = asyncio.create_task(asyncio.Event().wait())
    on_sigterm = sigterm_handler(requested, serving, listening)
    on_sigterm()
    assert requested.is_set() and not serving.cancelling()
    on_sigterm()
    assert serving.cancelling()
    await asyncio.gather(serving, return_exceptions=True)


async def test_a_sigterm_before_the_gateway_listens_stops_it_at_once() -> None:
    requested, listening = asyncio.Event(), asyncio.Event()
    starting = asyncio.create_task(asyncio.Event().wait())
    sigterm_handler(requested, starting, listening)()
    assert starting.cancelling()
    await asyncio.gather(starting, return_exceptions=True)
