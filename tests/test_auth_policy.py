"""Per-tool policy beyond scopes: claim conditions, per-tool rate limits, and the audit of task creation
and of denials.

The pure parts first (claim matching, the per-tool buckets with a hand-driven clock, the audit fields
of `task.created` under a small payload bound). Then real gateways with api keys that carry claims:
a tool whose rule needs a claim is hidden from the caller without it and its call refused (403, no
step-up challenge), and works for the caller with it; a burst on one tool gets 429 while the same
principal's other tools still work and the upstream never sees an over-budget call; `task.created`
records the creator's principal hash, the tool and the arguments' digest, never their text; denials
are logged with principal, method, tool and reason, and counted by reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from gateway.config import AuthLimits, AuthRule, CaptureRule
from gateway.edge.auth import unmet_claims
from gateway.edge.limits import PrincipalLimits, RateLimited, TokenBuckets
from gateway.events.capture import Capture, TaskEvent
from gateway.events.summaries import call_audit
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.test_auth_api_key import KEY_A, KEY_B, TWO_KEYS, bearer, digest
from tests.test_auth_limits import Clock
from tests.test_http_upstream import scripted
from tests.wire import LEGACY, MODERN, task_events
from tests.wire import Client as WireClient

# -- the pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "unmet"),
    [
        ({"groups": ["ops", "deployers"], "tenant": "acme", "level": 3, "verified": True}, []),
        ({"groups": "deployers", "tenant": "acme", "level": 3, "verified": True}, []),
        ({"groups": ["ops"], "tenant": "acme", "level": 3, "verified": True}, ["groups"]),
        ({"groups": ["deployers"], "tenant": "acme-2", "level": 3, "verified": True}, ["tenant"]),
        ({"groups": ["deployers"], "tenant": ["acme"], "level": "3", "verified": 1}, ["level", "verified"]),
        ({"groups": "ops deployers", "tenant": "acme", "level": [3], "verified": [True]}, ["groups"]),
        ({}, ["groups", "tenant", "level", "verified"]),
    ],
)
def test_a_claim_condition_is_equality_or_list_membership_of_the_same_type(
    claims: dict[str, Any], unmet: list[str]
) -> None:
    rule = AuthRule(match="deploy", claims={"groups": "deployers", "tenant": "acme", "level": 3, "verified": True})
    assert unmet_claims(rule, claims) == unmet


def test_each_principal_and_tool_has_its_own_bucket_under_a_rule() -> None:
    clock = Clock()
    rule = AuthRule(match="build_*", requests_per_s=0.5, burst=2)
    unlimited = AuthRule(match="echo")
    limits = PrincipalLimits(AuthLimits(), clock, rules=[rule, unlimited])
    for _ in range(2):
        limits.admit_call("a", "build_x", rule)
    with pytest.raises(RateLimited) as refused:
        limits.admit_call("a", "build_x", rule)
    assert refused.value.http_status == 429 and refused.value.retry_after_s == 2
    assert refused.value.data == {"reason": "tool_rate_limited", "limit": "auth.rules.requests_per_s"}
    assert "build_x" in refused.value.message
    limits.admit_call("a", "build_y", rule)  # another tool of the same rule
    limits.admit_call("b", "build_x", rule)  # another principal
    for _ in range(100):
        limits.admit_call("a", "echo", unlimited)  # a rule without a rate limits nothing
    clock.now += 2.0  # one token back at 0.5 per second
    limits.admit_call("a", "build_x", rule)
    with pytest.raises(RateLimited):
        limits.admit_call("a", "build_x", rule)


def test_the_buckets_stay_bounded_forgetting_full_ones_first_then_the_least_recently_used() -> None:
    clock = Clock()
    buckets = TokenBuckets(refill_s=10.0, clock=clock, max_keys=4)
    for key in ("a", "b", "c", "d"):
        clock.now += 1.0
        assert buckets.take(key, 0.1, 1) == 0.0
    clock.now = 112.5  # a and b (used at 101 and 102) are full again; c and d are not
    assert buckets.take("e", 0.1, 1) == 0.0  # the table is full: a and b are forgotten, c and d kept
    assert buckets.take("c", 0.1, 1) > 0 and buckets.take("d", 0.1, 1) > 0
    for i in range(10):  # a flood of new keys, none full again: the least recently used go
        clock.now += 0.01
        assert buckets.take(f"k{i}", 0.1, 1) == 0.0
    assert buckets.take("k9", 0.1, 1) > 0  # the newest is remembered, still empty
    assert buckets.take("c", 0.1, 1) == 0.0  # c was forgotten: full again, its use forgiven


def canonical_sha256(arguments: object) -> str:
    """Independently of the gateway: sorted keys, no whitespace, UTF-8."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_audit_fields_survive_a_payload_bound_they_would_exceed() -> None:
    arguments = {"b": [1, {"z": "ü", "a": None}], "a": "secret text"}
    audit = call_audit("p_" + "0" * 32, arguments)
    assert audit == {"principal": "p_" + "0" * 32, "argumentsSha256": canonical_sha256(arguments)[:32]}
    assert call_audit("anonymous", None)["argumentsSha256"] == canonical_sha256({})[:32]
    rules = [CaptureRule(method="*", type="notification")]
    event = TaskEvent("x.task.created", {"tool": "echo", "status": "working"}, audit)
    small = orjson.loads(b"{" + Capture(rules, "x", 40).encode(event) + b"}")
    assert small == {"type": "x.task.created", "payload": {"tool": "echo", "status": "working", **audit}}
    tiny = orjson.loads(b"{" + Capture(rules, "x", 10).encode(event) + b"}")
    assert tiny["type"] == "x.payload.omitted", tiny
    size = len(orjson.dumps(event.payload))  # the bound counts the payload without its audit fields
    assert tiny["payload"] == {"originalType": "x.task.created", "size": size, "limit": 10, **audit}


# -- claims and the audit, end to end (the example server) ----------------------------------------

SECRET_TEXT = "do-not-log-this-5a1f"

CONFIG = f"""
[auth]
mode = "api_key"

[[auth.api_keys]]
name = "a"
sha256 = "{digest(KEY_A)}"
scopes = ["test"]
claims = {{ groups = ["ops", "testers"], tenant = "acme" }}

[[auth.api_keys]]
name = "b"
sha256 = "{digest(KEY_B)}"
scopes = ["test"]
claims = {{ groups = "ops", tenant = "acme" }}

[[auth.rules]]
match = "run_tests"
scopes = ["test"]
claims = {{ groups = "testers", tenant = "acme" }}
hide = true

[[tasks.tools]]
match = "*"
task_support = "optional"

[logging]
format = "json"
rejected_log_interval_s = 0
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sessions() -> AsyncIterator[tuple[aiohttp.ClientSession, aiohttp.ClientSession]]:
    """HTTP sessions that send A's key and B's key."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(headers=bearer(KEY_A), timeout=timeout) as http_a,
        aiohttp.ClientSession(headers=bearer(KEY_B), timeout=timeout) as http_b,
    ):
        yield http_a, http_b


async def metric(http: aiohttp.ClientSession, gw: RunningGateway, reason: str) -> float:
    async with http.get(f"{gw.base}/metrics") as response:
        text = await response.text()
    prefix = f'mcp_gateway_rejected_requests_total{{reason="{reason}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def refusal_lines(gw: RunningGateway, reason: str) -> list[dict[str, Any]]:
    lines = []
    for line in gw.output:
        if line.startswith("{") and f'"reason":"{reason}"' in line:
            lines.append(json.loads(line))
    return lines


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_tool_needing_a_claim_is_hidden_and_refused_without_it_and_works_with_it(
    gw: RunningGateway, sessions: tuple[aiohttp.ClientSession, aiohttp.ClientSession], era: str
) -> None:
    http_a, http_b = sessions
    async with asyncio.timeout(60):
        a, b = WireClient(http_a, gw.url, era), WireClient(http_b, gw.url, era)
        if era == LEGACY:
            await a.initialize()
            await b.initialize()
        names_a = {tool["name"] for tool in (await a.result("tools/list"))["tools"]}
        names_b = {tool["name"] for tool in (await b.result("tools/list"))["tools"]}
        assert "run_tests" in names_a and "run_tests" not in names_b and "echo" in names_b, (names_a, names_b)

        call = {"name": "run_tests", "arguments": {"suite": "x", "count": 1, "delay": 0}}
        refused_before = await metric(http_a, gw, "claim_mismatch")
        refused = await b.request("tools/call", call)
        assert refused.status == 403 and "WWW-Authenticate" not in refused.headers, refused.messages
        error = refused.final["error"]
        assert refused.final["id"] is not None and error["data"] == {"reason": "claim_mismatch"}, refused.final
        assert "groups" in error["message"] and "testers" not in error["message"], error
        assert await metric(http_a, gw, "claim_mismatch") == refused_before + 1
        logged = refusal_lines(gw, "claim_mismatch")[-1]
        assert logged["method"] == "tools/call" and logged["tool"] == "run_tests", logged
        assert logged["principal"].startswith("p_") and "403" in logged["msg"], logged

        done = await a.result("tools/call", call)
        assert done["content"][0]["text"].startswith("x: 1 passed"), done


@pytest.mark.asyncio(loop_scope="module")
async def test_task_created_records_principal_tool_and_argument_digest_never_the_arguments(
    gw: RunningGateway, sessions: tuple[aiohttp.ClientSession, aiohttp.ClientSession]
) -> None:
    http_a, http_b = sessions
    async with asyncio.timeout(60):
        arguments = {"text": SECRET_TEXT}
        principals = []
        for http_x in (http_a, http_a, http_b):
            client = WireClient(http_x, gw.url)
            await client.initialize()
            created = await client.result(
                "tools/call", {"name": "echo", "arguments": arguments, "task": {"ttl": 60000}}
            )
            task_id = created["task"]["taskId"]
            await client.result("tasks/result", {"taskId": task_id})
            reply = await (await client.open("tasks/stream", {"taskId": task_id})).rest()
            events = task_events(reply.messages)
            assert events[0]["type"].endswith(".task.created") and events[-1]["type"].endswith(".task.terminal")
            payload = events[0]["payload"]
            assert payload["tool"] == "echo", payload
            assert payload["argumentsSha256"] == canonical_sha256(arguments)[:32], payload
            assert SECRET_TEXT not in orjson.dumps(reply.messages).decode()  # nowhere in the whole log
            principals.append(payload["principal"])
        assert principals[0] == principals[1] != principals[2], principals
        assert all(p.startswith("p_") and len(p) == 34 for p in principals), principals


@pytest.mark.asyncio(loop_scope="module")
async def test_another_principals_task_id_is_logged_and_counted_as_unknown_task(
    gw: RunningGateway, sessions: tuple[aiohttp.ClientSession, aiohttp.ClientSession]
) -> None:
    http_a, http_b = sessions
    async with asyncio.timeout(60):
        a, b = WireClient(http_a, gw.url), WireClient(http_b, gw.url)
        await a.initialize()
        await b.initialize()
        created = await a.result("tools/call", {"name": "echo", "arguments": {"text": "x"}, "task": {"ttl": 60000}})
        task_id = created["task"]["taskId"]
        before = await metric(http_a, gw, "unknown_task")
        foreign = await b.request("tasks/get", {"taskId": task_id})
        assert foreign.final["error"]["message"] == "Invalid params: no such task", foreign.messages
        assert await metric(http_a, gw, "unknown_task") == before + 1
        logged = refusal_lines(gw, "unknown_task")[-1]
        assert logged["method"] == "tasks/get" and logged["tool"] is None and logged["principal"].startswith("p_")
        assert logged["msg"] == f"refused a request: HTTP {foreign.status} Invalid params: no such task", logged


# -- per-tool rate limits, end to end (an upstream that counts what reaches it) --------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_a_burst_on_one_tool_gets_429_while_the_principals_other_tools_still_work(
    http: aiohttp.ClientSession,
) -> None:
    calls: Counter[str] = Counter()

    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "id" not in body:
            return web.Response(status=202)
        if body.get("method") == "tools/call":
            calls[body["params"]["name"]] += 1
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"content": []}})

    config = f"""{TWO_KEYS}
[[auth.rules]]
match = "limited_*"
requests_per_s = 0.001
burst = 2
"""
    async with scripted(upstream) as url, start_gateway(upstream_url=url, config_text=config) as gw:
        a = WireClient(http, gw.url, MODERN)

        async def call(tool: str, key: str = KEY_A) -> int:
            reply = await a.request("tools/call", {"name": tool, "arguments": {}}, headers=bearer(key))
            if reply.status == 429:
                assert int(reply.headers["Retry-After"]) >= 1 and reply.final["id"] is not None, reply.headers
                data = reply.final["error"]["data"]
                assert data == {"reason": "tool_rate_limited", "limit": "auth.rules.requests_per_s"}, data
            return reply.status

        assert [await call("limited_one") for _ in range(5)] == [200, 200, 429, 429, 429]
        assert await call("limited_two") == 200  # the same rule, another tool: its own bucket
        assert [await call("open") for _ in range(5)] == [200] * 5  # no rate on this tool
        assert await call("limited_one", KEY_B) == 200  # another principal
        assert calls == {"limited_one": 3, "limited_two": 1, "open": 5}, calls  # never an over-budget call
        assert await metric(http, gw, "tool_rate_limited") == 3.0
