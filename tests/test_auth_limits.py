"""`[auth.limits]`: per-principal request rate, failed task lookups and concurrent streams.

The pure core (`gateway.edge.limits.PrincipalLimits`) with a hand-driven clock; then the real gateway
(api keys, in front of a scripted upstream that counts what reaches it): a burst over the rate gets
429 with `Retry-After` and nothing of it reaches the upstream, and 1,000 guessed task ids are cut off
after the budget while another principal is unaffected.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import Counter

import aiohttp
import pytest
from aiohttp import web

from gateway.config import AuthLimits
from gateway.edge.limits import PrincipalLimits, RateLimited
from tests.conftest import EXAMPLE_SERVER, start_gateway
from tests.test_global_limits import metric
from tests.test_http_upstream import scripted
from tests.wire import LEGACY, MODERN
from tests.wire import Client as WireClient
from tests.wire import Reply as WireReply


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_allows_the_burst_then_the_rate_and_says_when_to_come_back() -> None:
    clock = Clock()
    limits = PrincipalLimits(AuthLimits(requests_per_s=2.0, burst=3), clock)
    for _ in range(3):
        limits.admit("a")
    with pytest.raises(RateLimited) as refused:
        limits.admit("a")
    assert refused.value.http_status == 429 and refused.value.retry_after_s == 1
    assert refused.value.data == {"reason": "rate_limited", "limit": "auth.limits.requests_per_s"}
    limits.admit("b")  # another principal has its own bucket
    clock.now += 0.5  # one token back at 2 per second
    limits.admit("a")
    with pytest.raises(RateLimited):
        limits.admit("a")


def test_the_failed_lookup_budget_is_per_principal_and_per_minute() -> None:
    clock = Clock()
    limits = PrincipalLimits(AuthLimits(failed_lookups_per_min=2), clock)
    for _ in range(2):
        limits.reserve_lookup("a")
    with pytest.raises(RateLimited) as refused:
        limits.reserve_lookup("a")
    assert refused.value.retry_after_s == 60 and refused.value.data["reason"] == "lookup_budget"
    limits.reserve_lookup("b")
    clock.now += 60
    limits.reserve_lookup("a")


def test_streams_are_counted_while_open() -> None:
    limits = PrincipalLimits(AuthLimits(max_streams=1))
    with limits.stream("a", 5):
        with pytest.raises(RateLimited) as refused, limits.stream("a", 5):
            pass
        assert refused.value.retry_after_s == 5
        with limits.stream("b", 5):
            pass
    with limits.stream("a", 5):
        pass


KEY_A, KEY_B = "limits-key-a", "limits-key-b"


def config(limits: str) -> str:
    keys = "".join(
        f'[[auth.api_keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
        for name, key in (("a", KEY_A), ("b", KEY_B))
    )
    return f'[auth]\nmode = "api_key"\n{keys}\n[auth.limits]\n{limits}\n'


@pytest.mark.asyncio(loop_scope="module")
async def test_a_burst_over_the_rate_gets_429_and_never_reaches_the_upstream(http: aiohttp.ClientSession) -> None:
    methods: Counter[str] = Counter()

    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        methods[body.get("method", "")] += 1
        if "id" not in body:
            return web.Response(status=202)
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}})

    async with (
        scripted(upstream) as url,
        start_gateway(upstream_url=url, config_text=config("requests_per_s = 0.01\nburst = 3")) as gw,
    ):
        a = WireClient(http, gw.url, MODERN)
        statuses = []
        for _ in range(8):
            reply = await a.request(
                "tools/call", {"name": "echo", "arguments": {}}, headers={"Authorization": f"Bearer {KEY_A}"}
            )
            statuses.append(reply.status)
            if reply.status == 429:
                assert int(reply.headers["Retry-After"]) >= 1
                assert reply.final["error"]["data"] == {"reason": "rate_limited", "limit": "auth.limits.requests_per_s"}
        assert statuses.count(200) == 3 and statuses.count(429) == 5, statuses
        assert methods["tools/call"] == 3, methods
        b = await a.request(
            "tools/call", {"name": "echo", "arguments": {}}, headers={"Authorization": f"Bearer {KEY_B}"}
        )
        assert b.status == 200 and methods["tools/call"] == 4
        async with http.get(f"{gw.base}/metrics") as response:
            text = await response.text()
            assert 'mcp_gateway_rejected_requests_total{reason="rate_limited"} 5.0' in text


@pytest.mark.asyncio(loop_scope="module")
async def test_guessed_task_ids_are_cut_off_after_the_budget_and_others_are_unaffected(
    http: aiohttp.ClientSession,
) -> None:
    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "id" not in body:
            return web.Response(status=202)
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {}})

    limits = "requests_per_s = 100000.0\nburst = 100000\nfailed_lookups_per_min = 10"
    async with scripted(upstream) as url, start_gateway(upstream_url=url, config_text=config(limits)) as gw:
        client = WireClient(http, gw.url, MODERN)
        answers: Counter[tuple[int, str]] = Counter()
        for _ in range(1000):
            reply = await client.request(
                "tasks/get", {"taskId": str(uuid.uuid4())}, headers={"Authorization": f"Bearer {KEY_A}"}
            )
            error = reply.final["error"]
            answers[(reply.status, error["message"].split(":")[0])] += 1
            if reply.status == 429:
                assert reply.headers["Retry-After"].isdigit()
        unknown = [key for key in answers if key[1] == "Invalid params"]
        assert len(unknown) == 1 and answers[unknown[0]] == 10, answers
        assert answers[(429, "Too Many Requests")] == 990, answers
        other = await client.request(
            "tasks/get", {"taskId": str(uuid.uuid4())}, headers={"Authorization": f"Bearer {KEY_B}"}
        )
        assert other.status != 429 and other.final["error"]["message"] == "Invalid params: no such task"


def test_a_reserved_lookup_counts_until_given_back_once() -> None:
    limits = PrincipalLimits(AuthLimits(failed_lookups_per_min=2), Clock())
    give_back = limits.reserve_lookup("a")
    limits.reserve_lookup("a")
    with pytest.raises(RateLimited):
        limits.reserve_lookup("a")  # both in flight: a third cannot pass the check meanwhile
    give_back()
    give_back()  # once only
    limits.reserve_lookup("a")
    with pytest.raises(RateLimited):
        limits.reserve_lookup("a")


CONCURRENCY = 100


@pytest.mark.asyncio(loop_scope="module")
async def test_the_lookup_budget_is_exact_at_concurrency_100(http: aiohttp.ClientSession) -> None:
    """100 guessed ids at once against a budget of 60: exactly 60 are looked up, 40 get 429."""

    async def upstream(request: web.Request) -> web.StreamResponse:
        return web.Response(status=202)

    limits = "requests_per_s = 100000.0\nburst = 100000\nfailed_lookups_per_min = 60"
    async with scripted(upstream) as url, start_gateway(upstream_url=url, config_text=config(limits)) as gw:
        client = WireClient(http, gw.url, MODERN)
        auth = {"Authorization": f"Bearer {KEY_A}"}
        replies = await asyncio.gather(
            *(client.request("tasks/get", {"taskId": str(uuid.uuid4())}, headers=auth) for _ in range(CONCURRENCY))
        )
        statuses = Counter(reply.status for reply in replies)
        assert statuses[429] == CONCURRENCY - 60, statuses
        unknown = [reply for reply in replies if reply.status != 429]
        assert all(reply.final["error"]["message"] == "Invalid params: no such task" for reply in unknown)


@pytest.mark.asyncio(loop_scope="module")
async def test_max_tasks_per_owner_is_exact_at_concurrency_100(http: aiohttp.ClientSession) -> None:
    """100 calls at once that each become a task, against a cap of 20: exactly 20 tasks are made (the
    rest answer as plain calls), and the other principal still makes one."""

    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "id" not in body:
            return web.Response(status=202)
        await asyncio.sleep(0.01)  # answers overlap, as a real upstream's do
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}})

    text = config("requests_per_s = 100000.0\nburst = 100000")
    text += '\n[tasks]\nmax_tasks_per_owner = 20\n\n[[tasks.tools]]\nmatch = "*"\nmodern = "always"\n'
    async with scripted(upstream) as url, start_gateway(upstream_url=url, config_text=text) as gw:
        client = WireClient(http, gw.url, MODERN)

        async def call(key: str) -> str:
            params = {"name": "echo", "arguments": {}}
            reply = await client.request("tools/call", params, headers={"Authorization": f"Bearer {key}"})
            final = reply.final
            return final["result"].get("resultType", "complete") if "result" in final else final["error"]["message"]

        outcomes = Counter(await asyncio.gather(*(call(KEY_A) for _ in range(CONCURRENCY))))
        assert outcomes["task"] == 20, outcomes
        assert await call(KEY_B) == "task"


# -- legacy sessions: a share per principal, and the least recently used idle one gives way ------------


def as_principal(key: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"})


def sessions_config(max_sessions: int, max_processes: int) -> str:
    limits = f"requests_per_s = 100000.0\nburst = 100000\nmax_sessions = {max_sessions}"
    return config(limits) + f"\n[upstream.stdio]\nmax_processes = {max_processes}\nidle_processes = 1\n"


async def bare_initialize(client: WireClient) -> WireReply:
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bare", "version": "0"}}
    return await client.request("initialize", params)


async def whoami(client: WireClient) -> object:
    final = (await client.request("tools/call", {"name": "whoami", "arguments": {}})).final
    assert "result" in final, final
    return final["result"]


@pytest.mark.asyncio(loop_scope="module")
async def test_one_principal_opening_60_sessions_cannot_keep_another_from_opening_one() -> None:
    """B opens 60 bare sessions at once against max_sessions = 4 (sessions may hold 7 processes): B
    gets exactly 4, the other 56 get 429 naming the limit, and A still opens a session and calls."""
    async with (
        asyncio.timeout(60),
        as_principal(KEY_A) as http_a,
        as_principal(KEY_B) as http_b,
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=sessions_config(4, 8)) as gw,
    ):
        replies = await asyncio.gather(*(bare_initialize(WireClient(http_b, gw.url)) for _ in range(60)))
        assert Counter(reply.status for reply in replies) == {200: 4, 429: 56}
        for reply in replies:
            if reply.status == 429:
                assert reply.headers["Retry-After"].isdigit()
                assert reply.final["error"]["data"] == {"reason": "max_sessions", "limit": "auth.limits.max_sessions"}

        a = WireClient(http_a, gw.url)
        await a.initialize()
        echoed = (await a.request("tools/call", {"name": "echo", "arguments": {"text": "mine"}})).final
        assert echoed["result"]["content"][0]["text"] == "mine", echoed


@pytest.mark.asyncio(loop_scope="module")
async def test_under_pressure_the_least_recently_used_idle_session_gives_its_process_back() -> None:
    """Sessions may hold 2 processes: B's two engaged sessions hold both, so A's initialize takes the
    process of B's least recently used one, which gets a process again on its next request."""
    async with (
        asyncio.timeout(60),
        as_principal(KEY_A) as http_a,
        as_principal(KEY_B) as http_b,
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=sessions_config(5, 3)) as gw,
    ):
        older, newer = WireClient(http_b, gw.url), WireClient(http_b, gw.url)
        for client in (older, newer):
            await client.initialize()
        older_pid = await whoami(older)
        newer_pid = await whoami(newer)

        a = WireClient(http_a, gw.url)
        await a.initialize()
        assert "result" in (await a.request("tools/call", {"name": "echo", "arguments": {"text": "x"}})).final
        assert await metric(gw, http_a, "mcp_gateway_sessions_parked_total") == 1
        assert await whoami(newer) == newer_pid  # the more recently used kept its process
        assert await whoami(older) != older_pid  # the older one's next request: a process again
        assert await metric(gw, http_a, "mcp_gateway_sessions_parked_total") == 2
