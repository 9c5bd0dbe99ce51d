"""A gateway killed with SIGKILL and started again on the same SQLite file (issue 12's restart acceptance).

Real processes: the gateway (`python -m gateway serve`), its upstream (the example server on stdio for
hosted tasks; `@modelcontextprotocol/server-everything` over Streamable HTTP, kept running, for a
pass-through task), and clients on loopback. What must hold across the restart:

* a client resuming a running hosted task's stream with its last `after` gets every retained event
  exactly once, then `task.owner_lost` and `failed` (the task's upstream call died with the process);
* a completed task's `tasks/result` answers the same bytes before and after;
* a pass-through task the upstream still runs is watched again: its timeline shows `capture.interrupted`
  and ends `completed`, and its result is the upstream's; for a 2025-11-25 task on its upstream session
  (server-everything), and for a 2026-07-28 one (tests/servers/modern_tasks_server.py over HTTP);
* the registry's bookkeeping is rebuilt from the file: the tasks that ended before the restart still
  count towards `max_tasks_per_owner` and their results towards `results_budget_bytes` (the one that
  ended first is evicted first), and their logs go `terminal_retention_s` after they ended while their
  records answer until their TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.client import GatewayClient
from gateway.client.stream import EventsGone, JsonRpcError
from gateway.config import EventsConfig
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, RunningGateway, serve_http, start_gateway
from tests.test_auth_api_key import KEY_A, KEY_B, TWO_KEYS, bearer
from tests.test_modern_tasks_server import SERVER as MODERN_SERVER
from tests.test_upstream_with_tasks import TOOL, http_upstream
from tests.wire import LEGACY, Client

WAIT = 30.0
"""Seconds any one phase may take."""


def kind(event: dict[str, Any]) -> str:
    return str(event["type"]).removeprefix(EventsConfig().prefix + ".")


def sqlite_config(tmp_path: Path) -> str:
    return f'[store]\nkind = "sqlite"\npath = "{tmp_path / "gateway.db"}"\n'


async def kill(gw: RunningGateway) -> None:
    """SIGKILL the gateway alone (not its process group): nothing of it may run its shutdown."""
    gw.proc.send_signal(signal.SIGKILL)
    await asyncio.wait_for(gw.proc.wait(), WAIT)


async def read_events(
    client: GatewayClient, task_id: str, after: int | None, count: int | None
) -> list[dict[str, Any]]:
    """The task's events after `after`: `count` of them, or (None) all until the stream ends."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT), client.stream(task_id, after=after) as stream:
        async for event in stream:
            events.append(event)
            if len(events) == count:
                break
    return events


@contextlib.asynccontextmanager
async def raw_session(url: str) -> AsyncIterator[Client]:
    """An initialized legacy session over a raw HTTP client (the exact bytes of answers)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        client = Client(http, url, LEGACY)
        await client.initialize()
        yield client


async def result_bytes(url: str, task_id: str) -> bytes:
    """The body of a `tasks/result` for an ended task, asked with a fixed request id."""
    async with raw_session(url) as client:
        message = client.message("tasks/result", {"taskId": task_id}, request_id="same")
        async with client.http.post(url, data=orjson.dumps(message), headers=client.headers(message)) as response:
            assert response.status == 200
            return await response.read()


async def test_a_running_hosted_task_is_lost_after_its_retained_events_and_a_result_survives(tmp_path: Path) -> None:
    config = sqlite_config(tmp_path)
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as first:
        async with GatewayClient(first.url) as client:
            done = await client.start_task("slow_build", {"steps": 2, "delay": 0.01})
            assert done is not None
            await client.follow(done, on_event=lambda _: None)
            before = await result_bytes(first.url, done)
            running = await client.start_task("ticker", {"rate": 200, "seconds": 120})
            assert running is not None
            seen = await read_events(client, running, None, 500)
        assert [event["seq"] for event in seen] == list(range(500))
        await kill(first)

    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as second:
        assert await result_bytes(second.url, done) == before
        async with GatewayClient(second.url) as client:
            rest = await read_events(client, running, seen[-1]["seq"], None)
            task = (await client.get_task(running))["result"]
            with pytest.raises(JsonRpcError) as outcome:
                await client.request("tasks/result", {"taskId": running})
    seqs = [event["seq"] for event in rest]
    assert seqs == list(range(500, 500 + len(rest)))  # every retained event once, in order, no gap
    kinds = [kind(event) for event in rest]
    assert kinds[-3:] == ["task.owner_lost", "task.status", "task.terminal"], kinds[-5:]
    assert set(kinds[:-3]) <= {"progress"}  # what the dead process captured, then the loss
    assert rest[-2]["payload"]["status"] == "failed"
    assert rest[-3]["payload"]["hostedBy"] == "gateway"
    assert task["status"] == "failed" and "cannot be resumed" in task["statusMessage"]
    assert outcome.value.data == {"reason": "owner_lost"}


async def test_a_pass_through_task_is_watched_again_and_ends_completed(tmp_path: Path) -> None:
    config = sqlite_config(tmp_path)
    async with http_upstream(tmp_path) as (upstream_url, _):
        async with start_gateway(upstream_url=upstream_url, config_text=config) as first:
            async with GatewayClient(first.url) as client:
                task_id = await client.start_task(TOOL, {"topic": "restarts"}, ttl_ms=60000)
                assert task_id is not None
                seen = await read_events(client, task_id, None, 2)  # task.created, then the first status
            assert [kind(event) for event in seen] == ["task.created", "task.status"]
            await kill(first)

        async with (
            start_gateway(upstream_url=upstream_url, config_text=config) as second,
            GatewayClient(second.url) as client,
        ):
            rest = await read_events(client, task_id, seen[-1]["seq"], None)
            task = (await client.get_task(task_id))["result"]
            result = await client.request("tasks/result", {"taskId": task_id})
    assert [event["seq"] for event in rest] == list(range(2, 2 + len(rest)))
    kinds = [kind(event) for event in rest]
    assert "capture.interrupted" in kinds
    assert kinds[-2:] == ["task.status", "task.terminal"] and rest[-2]["payload"]["status"] == "completed"
    assert kinds.index("capture.interrupted") < len(kinds) - 2
    assert task["status"] == "completed"
    assert "result" in result and result["result"]["content"], result


async def test_a_modern_pass_through_task_is_watched_again_by_its_upstream_id(tmp_path: Path) -> None:
    config = sqlite_config(tmp_path)
    async with serve_http(MODERN_SERVER, log=tmp_path / "upstream.log") as upstream_url:
        async with start_gateway(upstream_url=upstream_url, config_text=config) as first:
            async with GatewayClient(first.url, era=Era.MODERN) as client:
                task_id = await client.start_task("slow_job", {"steps": 6, "delay": 0.6})
                assert task_id is not None
                seen = await read_events(client, task_id, None, 1)
            await kill(first)

        async with (
            start_gateway(upstream_url=upstream_url, config_text=config) as second,
            GatewayClient(second.url, era=Era.MODERN) as client,
        ):
            rest = await read_events(client, task_id, seen[-1]["seq"], None)
            task = (await client.get_task(task_id))["result"]
    kinds = [kind(event) for event in rest]
    assert [event["seq"] for event in rest] == list(range(1, 1 + len(rest)))
    assert "capture.interrupted" in kinds and kinds[-2:] == ["task.status", "task.terminal"], kinds
    assert rest[-2]["payload"]["status"] == "completed"
    assert task["taskId"] == task_id and task["status"] == "completed"


RESULT_BYTES = 126
"""What the record keeps of a `slow_build` result (`{"result": …}` with "built N steps", N one digit)."""


async def gauge(url: str, name: str) -> float:
    """A gauge of the gateway's `/metrics`."""
    async with aiohttp.ClientSession() as http, http.get(url.removesuffix("/mcp") + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


async def test_the_limits_the_results_budget_and_terminal_retention_count_what_ended_before_a_restart(
    tmp_path: Path,
) -> None:
    # Room for two results, not three; three tasks per caller; logs go 4 s after their task ends,
    # records after a minute.
    config = sqlite_config(tmp_path) + (
        "[tasks]\nmax_tasks_per_owner = 3\n"
        f"[retention]\nterminal_retention_s = 4\nresults_budget_bytes = {RESULT_BYTES * 5 // 2}\n"
        f"max_result_bytes = {RESULT_BYTES * 5 // 2}\n"
    )
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as first:
        async with GatewayClient(first.url) as client:
            # Created first, ended last: the budget evicts by the order tasks ended.
            ended_last = await client.start_task("slow_build", {"steps": 3, "delay": 0.3}, ttl_ms=60_000)
            ended_first = await client.start_task("slow_build", {"steps": 1, "delay": 0.01}, ttl_ms=60_000)
            assert ended_last is not None and ended_first is not None
            await client.follow(ended_first, on_event=lambda _: None)
            await client.follow(ended_last, on_event=lambda _: None)
        assert await gauge(first.url, "mcp_gateway_kept_result_bytes") == 2 * RESULT_BYTES
        await kill(first)

    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as second:
        assert await gauge(second.url, "mcp_gateway_kept_result_bytes") == 2 * RESULT_BYTES
        assert await gauge(second.url, "mcp_gateway_tasks") == 2
        async with GatewayClient(second.url) as client:
            third = await client.start_task("slow_build", {"steps": 1, "delay": 0.01}, ttl_ms=60_000)
            assert third is not None
            await client.follow(third, on_event=lambda _: None)
            with pytest.raises(JsonRpcError, match="already holds 3 tasks"):
                await client.start_task("slow_build", {"steps": 1, "delay": 0.01}, ttl_ms=60_000)
            with pytest.raises(JsonRpcError) as evicted:
                await client.request("tasks/result", {"taskId": ended_first})
            kept = await client.request("tasks/result", {"taskId": ended_last})
            # Its log goes 4 s after it ended (before the restart), long before its record's TTL.
            bounds = (await client.get_task(ended_last))["result"]
            async with asyncio.timeout(WAIT):
                while True:
                    try:
                        await read_events(client, ended_last, 0, None)
                    except EventsGone as gone:
                        earliest = gone.earliest_seq
                        break
                    await asyncio.sleep(0.25)
            after_retention = (await client.get_task(ended_last))["result"]
        assert await gauge(second.url, "mcp_gateway_kept_result_bytes") == 2 * RESULT_BYTES
    assert evicted.value.data is not None and evicted.value.data["reason"] == "result_evicted"
    assert kept["result"]["content"] == [{"type": "text", "text": "built 3 steps"}]
    assert after_retention == bounds and after_retention["status"] == "completed"
    assert earliest is not None and earliest > 1  # the log's next seq: every event is gone


async def test_a_caller_owns_its_tasks_after_a_restart_without_a_configured_principal_key(tmp_path: Path) -> None:
    """With api keys and no `principal_key_env`, the principals' key is the one kept in the SQLite file:
    after a restart the same key still owns its task, and another key still cannot tell it exists."""
    config = sqlite_config(tmp_path) + TWO_KEYS
    async with (
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as first,
        GatewayClient(first.url, headers=bearer(KEY_A)) as client,
    ):
        task_id = await client.start_task("slow_build", {"steps": 1, "delay": 0.01})
        assert task_id is not None
        await client.follow(task_id, on_event=lambda _: None)
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as second:
        async with GatewayClient(second.url, headers=bearer(KEY_A)) as client:
            assert (await client.get_task(task_id))["result"]["status"] == "completed"
        async with GatewayClient(second.url, headers=bearer(KEY_B)) as client:
            with pytest.raises(JsonRpcError) as foreign:
                await client.get_task(task_id)
    assert foreign.value.code == -32602
