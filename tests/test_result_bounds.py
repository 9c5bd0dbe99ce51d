"""Task results are bounded in memory: each by `[retention] max_result_bytes`, all together by
`results_budget_bytes` (docs/tasks-stream.md §4), with a real gateway in front of
tests/servers/large_result_server.py, whose `blob(size)` tool returns `size` characters.

- A 3 MB result over a 1 MiB cap: the task completes and `tasks/result` (2025-11-25) and `tasks/get`
  (2026-07-28) answer the `result_too_large` error; 40 such tasks leave the gateway's RSS far below
  40 x 3 MB of growth, while the same 40 tasks under a cap above their size do grow it by about that.
- A client already waiting in `tasks/result` when the over-cap result arrives gets the same error (the
  result is never delivered, not even once).
- Over the budget, the oldest kept result is evicted: its `tasks/result` answers `result_evicted`, its
  log gains `<prefix>.result.evicted`, and /metrics counts it.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import pytest

from tests.conftest import ROOT, RunningGateway, start_gateway
from tests.wire import MODERN, Client, Message, task_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "large_result_server.py")]
MiB = 1024 * 1024
RESULT_CHARS = 3_000_000
TASKS = 40
TIMEOUT_S = 120


async def start_blob(client: Client, size: int, delay: float = 0.0) -> str:
    """A 2025-11-25 task of `blob(size)`; its id."""
    params = {"name": "blob", "arguments": {"size": size, "delay": delay}, "task": {"ttl": 600_000}}
    task_id: str = (await client.result("tools/call", params))["task"]["taskId"]
    return task_id


async def task_result(client: Client, task_id: str) -> Message:
    """What tasks/result answers (it blocks until the task ended)."""
    return (await client.request("tasks/result", {"taskId": task_id})).final


def reason(answer: Message) -> object:
    assert "error" in answer, str(answer)[:300]
    assert answer["error"]["code"] == -32603, answer
    return answer["error"]["data"]["reason"]


async def rss_growth(gw: RunningGateway, client: Client, tasks: int) -> int:
    """The gateway's RSS growth over `tasks` 3 MB-result tasks run one after the other, after two to warm
    up (the first large line grows the upstream reader's buffers, whatever the cap)."""
    for _ in range(2):
        await task_result(client, await start_blob(client, RESULT_CHARS))
    before = gw.rss_bytes()
    for _ in range(tasks):
        answer = await task_result(client, await start_blob(client, RESULT_CHARS))
        if "error" in answer:
            assert reason(answer) == "result_too_large"
    return gw.rss_bytes() - before


async def test_oversized_results_are_answered_with_an_error_and_not_kept_in_memory(
    http: aiohttp.ClientSession,
) -> None:
    capped = f"[retention]\nmax_result_bytes = {MiB}\n"
    async with asyncio.timeout(TIMEOUT_S):
        async with start_gateway(upstream_cmd=SERVER, config_text=capped) as gw:
            client = Client(http, gw.url)
            await client.initialize()
            task_id = await start_blob(client, RESULT_CHARS)
            answer = await task_result(client, task_id)
            size = RESULT_CHARS + len('{"content":[{"type":"text","text":""}],"isError":false}')
            text = f"the task's result ({size} bytes) exceeded the gateway's cap of {MiB} bytes and was not kept"
            assert answer["error"] == {
                "code": -32603,
                "message": text,
                "data": {"reason": "result_too_large", "size": size, "limit": MiB},
            }, str(answer)[:300]
            view = await Client(http, gw.url, MODERN).result("tasks/get", {"taskId": task_id})
            assert view["status"] == "completed" and view["error"] == answer["error"], view
            capped_growth = await rss_growth(gw, client, TASKS)

        # Control: the same tasks with a cap above their size keep every result.
        async with start_gateway(upstream_cmd=SERVER, config_text=f"[retention]\nmax_result_bytes = {4 * MiB}\n") as gw:
            client = Client(http, gw.url)
            await client.initialize()
            answer = await task_result(client, await start_blob(client, RESULT_CHARS))
            assert len(answer["result"]["content"][0]["text"]) == RESULT_CHARS
            kept_growth = await rss_growth(gw, client, TASKS)

    print(
        f"RSS growth over {TASKS} tasks of {RESULT_CHARS} chars: capped {capped_growth / MiB:.1f} MiB, "
        f"kept {kept_growth / MiB:.1f} MiB"
    )
    assert kept_growth > TASKS * RESULT_CHARS * 0.75, kept_growth / MiB  # the measurement sees kept results
    assert capped_growth < TASKS * RESULT_CHARS * 0.25, capped_growth / MiB  # and the cap keeps none


SMALL_BOUNDS = "[retention]\nmax_result_bytes = 1000\nresults_budget_bytes = 3000\n"
PREFIX = "io.github.mcp-task-gateway"


async def test_a_client_waiting_in_tasks_result_gets_the_error_not_the_oversized_result(
    http: aiohttp.ClientSession,
) -> None:
    async with asyncio.timeout(TIMEOUT_S), start_gateway(upstream_cmd=SERVER, config_text=SMALL_BOUNDS) as gw:
        client = Client(http, gw.url)
        await client.initialize()
        task_id = await start_blob(client, 5000, delay=2.0)
        waiting = asyncio.create_task(task_result(client, task_id))
        assert (await client.result("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert reason(await waiting) == "result_too_large"
        assert reason(await task_result(client, task_id)) == "result_too_large"  # and every time after


async def test_over_the_budget_the_oldest_result_is_evicted_and_its_log_says_so(http: aiohttp.ClientSession) -> None:
    async with asyncio.timeout(TIMEOUT_S), start_gateway(upstream_cmd=SERVER, config_text=SMALL_BOUNDS) as gw:
        client = Client(http, gw.url)
        await client.initialize()
        ids = []
        for _ in range(4):  # about 950 bytes each: the fourth does not fit beside the first three
            ids.append(await start_blob(client, 900))
            assert (await task_result(client, ids[-1]))["result"]["content"][0]["text"] == "x" * 900
        size = 900 + len('{"result":{"content":[{"type":"text","text":""}],"isError":false}}')  # as kept
        evicted = await task_result(client, ids[0])
        assert evicted["error"] == {
            "code": -32603,
            "message": f"the task's result ({size} bytes) was evicted: the gateway keeps at most 3000 bytes of "
            "task results, and this was among the oldest",
            "data": {"reason": "result_evicted", "size": size, "budget": 3000},
        }, evicted
        modern = Client(http, gw.url, MODERN)
        view = await modern.result("tasks/get", {"taskId": ids[0]})
        assert view["status"] == "completed" and view["error"] == evicted["error"], view
        for kept in ids[1:]:
            assert "result" in await task_result(client, kept)

        events = task_events((await modern.request("tasks/stream", {"taskId": ids[0]})).messages)
        assert [event["type"].removeprefix(PREFIX + ".") for event in events[-2:]] == [
            "task.terminal",
            "result.evicted",
        ], events
        assert events[-1]["payload"] == {"size": size, "budget": 3000}

        async with http.get(f"{gw.base}/metrics") as response:
            metrics = await response.text()
        assert 'mcp_gateway_results_dropped_total{reason="result_evicted"} 1.0' in metrics
        assert f"mcp_gateway_kept_result_bytes {3 * size}.0" in metrics
