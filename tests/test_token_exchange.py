"""`[upstream.auth] mode = "token_exchange"` (RFC 8693) against a real authorization server: npm
`oidc-provider` with a token-exchange grant (tests/oidc/provider.mjs), the gateway in oauth mode, and
the example server on Streamable HTTP behind a recording proxy that keeps each request's
`Authorization`.

The upstream sees a token whose subject is the caller and whose audience is the upstream (never the
caller's own token), one per caller and reused while fresh; an expired one is exchanged again; a
refused exchange answers the call with the documented error and nothing reaches the upstream. The
cache's bounds and the sharing of one exchange among concurrent calls are checked in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from gateway.config import UpstreamAuthConfig
from gateway.principal import Caller
from gateway.upstream.credentials import CredentialRefused
from gateway.upstream.token_exchange import ExchangedTokens, TokenExchange
from tests.conftest import RunningGateway, free_port, start_gateway
from tests.test_auth_oidc import CLIENT_ID, CLIENT_SECRET, authorization_server
from tests.test_http_upstream import scripted
from tests.wire import LEGACY, MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET_ENV = "GATEWAY_TEST_EXCHANGE_SECRET"
# The headers an HTTP hop must not copy (aiohttp sets them for the body it sends).
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass
class Seen:
    """A request the upstream received: its HTTP method, JSON-RPC method (POST) and Authorization."""

    http_method: str
    method: str | None
    authorization: str | None

    def claims(self) -> dict[str, Any]:
        assert self.authorization is not None and self.authorization.startswith("Bearer "), self.authorization
        claims: dict[str, Any] = jwt.decode(self.authorization[7:], options={"verify_signature": False})
        return claims


@dataclass
class Stack:
    gateway: RunningGateway
    issuer: str
    upstream_url: str
    seen: list[Seen] = field(default_factory=list)

    def calls(self) -> list[Seen]:
        return [seen for seen in self.seen if seen.method == "tools/call"]


@contextlib.asynccontextmanager
async def recording_proxy(target: str, seen: list[Seen]) -> AsyncIterator[str]:
    """A Streamable HTTP hop in front of `target` that appends each request to `seen`; yields its URL."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            method = orjson.loads(body).get("method") if request.method == "POST" and body else None
            seen.append(Seen(request.method, method, request.headers.get("Authorization")))
            headers = {name: value for name, value in request.headers.items() if name.lower() not in HOP_HEADERS}
            async with http.request(request.method, target, data=body or None, headers=headers) as upstream:
                passed = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
                response = web.StreamResponse(status=upstream.status, headers=passed)
                await response.prepare(request)
                # The gateway drops its GET stream when it stops: the hop ends with it.
                with contextlib.suppress(ConnectionResetError):
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                return response

        async with scripted(forward) as url:
            yield url


@contextlib.asynccontextmanager
async def exchange_stack(
    log_dir: Path, example_http_url: str, exchange_ttl_s: int, upstream_era: str = "auto"
) -> AsyncIterator[Stack]:
    """oidc-provider exchanging tokens for ones lasting `exchange_ttl_s`, and the gateway (oauth mode,
    token_exchange towards the recording proxy in front of the example server, whose `era` it is told)."""
    gw_port = free_port()
    resource = f"http://127.0.0.1:{gw_port}/mcp"
    seen: list[Seen] = []
    os.environ[SECRET_ENV] = CLIENT_SECRET
    try:
        async with (
            recording_proxy(example_http_url, seen) as upstream_url,
            authorization_server(log_dir / "provider.log", resource, "jwt", exchange_ttl_s) as issuer,
        ):
            config = f"""
[upstream]
era = "{upstream_era}"

[auth]
mode = "oauth"
resource = "{resource}"
authorization_servers = ["{issuer}"]
principal_claims = ["iss", "client_id"]
[auth.jwt]
issuer = "{issuer}"

[upstream.auth]
mode = "token_exchange"
token_url = "{issuer}/token"
client_id = "{CLIENT_ID}"
client_secret_env = "{SECRET_ENV}"
scope = "read"
"""
            async with start_gateway(upstream_url=upstream_url, config_text=config, port=gw_port) as gw:
                yield Stack(gw, issuer, upstream_url, seen)
    finally:
        os.environ.pop(SECRET_ENV, None)  # read by the gateway at its start only


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, example_http_url: str) -> AsyncIterator[Stack]:
    async with exchange_stack(tmp_path_factory.mktemp("exchange"), example_http_url, 600) as running:
        yield running


async def ready(stack: Stack) -> None:
    """Once /readyz says ready: the gateway's own first requests (readiness, era probe) are done."""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{stack.gateway.base}/readyz") as readiness:
                if readiness.status == 200:
                    return
            await asyncio.sleep(0.1)


async def caller_token(stack: Stack, caller: str) -> str:
    """A client-credentials access token of `caller` for the gateway."""
    form = {"grant_type": "client_credentials", "scope": "read", "resource": stack.gateway.url}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{stack.issuer}/token", data=form, auth=aiohttp.BasicAuth(caller, CLIENT_SECRET)) as response,
    ):
        assert response.status == 200, await response.text()
        token: str = (await response.json())["access_token"]
        return token


@contextlib.asynccontextmanager
async def client_as(stack: Stack, caller: str, era: str) -> AsyncIterator[tuple[WireClient, str]]:
    """A wire client of `era` sending `caller`'s token on every request (initialized, if legacy)."""
    token = await caller_token(stack, caller)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        client = WireClient(http, stack.gateway.url, era)
        if era == LEGACY:
            await client.initialize()
        yield client, token


async def echo(client: WireClient, text: str) -> dict[str, Any]:
    reply = await client.request("tools/call", {"name": "echo", "arguments": {"text": text}})
    assert reply.status == 200, reply.messages
    return reply.final


async def test_calls_with_no_caller_carry_the_gateways_own_token(stack: Stack) -> None:
    """The readiness check and the era probe (this module's first test: no client has called yet)."""
    async with asyncio.timeout(30):
        await ready(stack)
    assert stack.seen, "the upstream saw no request of the gateway's own"
    for seen in stack.seen:
        claims = seen.claims()
        assert claims["sub"] == CLIENT_ID and claims["aud"] == stack.upstream_url and "act" not in claims, claims


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_the_upstream_sees_a_token_acting_for_each_caller(stack: Stack, era: str) -> None:
    async with asyncio.timeout(30):
        async with client_as(stack, "caller-a", era) as (alice, alice_token):
            before = len(stack.calls())
            for text in ("one", "two"):
                assert "result" in await echo(alice, text)
            async with client_as(stack, "caller-b", era) as (bob, bob_token):
                assert "result" in await echo(bob, "three")
    calls = stack.calls()[before:]
    assert len(calls) == 3, calls
    first, second, third = (call.claims() for call in calls)
    for claims, subject in ((first, "caller-a"), (second, "caller-a"), (third, "caller-b")):
        assert claims["sub"] == subject and claims["aud"] == stack.upstream_url, claims
        assert claims["act"] == {"sub": CLIENT_ID} and claims["client_id"] == CLIENT_ID, claims
    assert first["jti"] == second["jti"], "one caller's fresh exchanged token is reused"
    assert third["jti"] != first["jti"]
    own = {f"Bearer {alice_token}", f"Bearer {bob_token}"}
    assert not own.intersection(seen.authorization for seen in stack.seen), "a caller's own token went upstream"


async def test_a_refused_exchange_fails_the_call_and_nothing_goes_upstream(stack: Stack) -> None:
    async with asyncio.timeout(30), client_as(stack, "refused-caller", MODERN) as (client, _):
        before = len(stack.seen)
        final = await echo(client, "never")
    assert final["error"]["code"] == -32603, final
    assert final["error"]["data"] == {"reason": "token_exchange_failed"}, final
    assert final["error"]["message"] == "upstream credentials: the token exchange for this caller failed", final
    assert not [seen for seen in stack.seen[before:] if seen.method == "tools/call"], stack.seen[before:]


async def test_an_expired_exchanged_token_is_exchanged_again(tmp_path: Path, example_http_url: str) -> None:
    async with (
        asyncio.timeout(50),
        exchange_stack(tmp_path, example_http_url, 2) as short,
        client_as(short, "caller-a", MODERN) as (client, _),
    ):
        await echo(client, "first")
        first = short.calls()[-1].claims()
        # The exchanged token lasts 2 s, kept for 1.6 s: the calls go on until one carries a new one.
        while (latest := short.calls()[-1].claims())["jti"] == first["jti"]:
            await echo(client, "again")
            await asyncio.sleep(0.2)
    assert latest["sub"] == "caller-a" and latest["aud"] == short.upstream_url, latest
    assert latest["exp"] > first["exp"], (first, latest)


@pytest.mark.parametrize(
    ("upstream_era", "client_era"),
    [("legacy", MODERN), ("modern", LEGACY)],
    ids=["modern-client-over-legacy-sessions", "legacy-session-over-stateless"],
)
async def test_bridged_calls_act_for_their_caller(
    tmp_path: Path, example_http_url: str, upstream_era: str, client_era: str
) -> None:
    """The bridges make their upstream requests anew (a pooled session per principal, or stateless
    requests for a legacy session): each still carries its caller's exchanged token."""
    async with asyncio.timeout(50), exchange_stack(tmp_path, example_http_url, 600, upstream_era) as bridged:
        await ready(bridged)
        for caller in ("caller-a", "caller-b"):
            async with client_as(bridged, caller, client_era) as (client, _):
                before = len(bridged.seen)
                assert "result" in await echo(client, caller)
                window = bridged.seen[before:]
                calls = [seen.claims() for seen in window if seen.method == "tools/call"]
                assert calls and all(claims["sub"] == caller and "act" in claims for claims in calls), calls
                # Besides the caller's, only the gateway's own requests (its lazy server/discover probe).
                subjects = {seen.claims()["sub"] for seen in window if seen.http_method == "POST"}
                assert subjects <= {caller, CLIENT_ID}, subjects


# -- in process: the cache, one exchange for concurrent calls ----------------------------------------


async def test_the_cache_keeps_a_token_for_most_of_its_life_and_evicts_the_least_recently_used() -> None:
    now = [0.0]
    tokens = ExchangedTokens(2, clock=lambda: now[0])
    tokens.put("a", "token-a", 10.0)
    tokens.put("b", "token-b", 100.0)
    now[0] = 7.9
    assert tokens.get("a") == "token-a"  # 'a' is now the most recently used
    now[0] = 8.0  # 80% of a's 10 s
    assert tokens.get("a") is None and len(tokens) == 1
    tokens.put("a", "token-a2", 10.0)
    tokens.put("c", "token-c", 10.0)  # over capacity: 'b', the least recently used, goes
    assert tokens.get("b") is None and tokens.get("a") == "token-a2" and tokens.get("c") == "token-c"
    tokens.put("d", "token-d", 0.0)
    assert tokens.get("d") is None


async def test_concurrent_first_calls_share_one_exchange_and_a_failure_refuses_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[dict[str, str]] = []
    release = asyncio.Event()

    async def token_endpoint(request: web.Request) -> web.StreamResponse:
        posted.append(dict(await request.post()))  # type: ignore[arg-type]
        await release.wait()
        if posted[-1]["subject_token"] == "bad":
            return web.json_response({"error": "invalid_grant"}, status=400)
        return web.json_response({"access_token": f"x-{len(posted)}", "expires_in": 60})

    monkeypatch.setenv("GATEWAY_TEST_UNIT_SECRET", "secret")
    async with asyncio.timeout(10), scripted(token_endpoint) as url:
        config = UpstreamAuthConfig(
            mode="token_exchange",
            token_url=url,
            client_id="gw",
            client_secret_env="GATEWAY_TEST_UNIT_SECRET",
            no_caller="none",
        )
        exchange = TokenExchange(config, "http://upstream.example/mcp")
        await exchange.start()
        try:
            waiting = [asyncio.create_task(exchange.token_for(Caller("a", "good"))) for _ in range(5)]
            while not posted:  # noqa: ASYNC110 - the endpoint's own list is all there is to wait on
                await asyncio.sleep(0.01)
            release.set()
            assert await asyncio.gather(*waiting) == ["x-1"] * 5
            assert await exchange.token_for(Caller("a", "good")) == "x-1"
            assert len(posted) == 1
            assert posted[0] == {
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "resource": "http://upstream.example/mcp",
                "subject_token": "good",
            }
            failing = [asyncio.create_task(exchange.token_for(Caller("b", "bad"))) for _ in range(3)]
            outcomes = await asyncio.gather(*failing, return_exceptions=True)
            assert all(isinstance(outcome, CredentialRefused) for outcome in outcomes), outcomes
            assert len(posted) == 2
            assert await exchange.authorization(None) == {}
        finally:
            await exchange.close()


async def test_a_hosted_tasks_upstream_call_acts_for_its_caller(stack: Stack) -> None:
    async with asyncio.timeout(30), client_as(stack, "caller-b", LEGACY) as (client, _):
        before = len(stack.calls())
        params = {"name": "echo", "arguments": {"text": "as a task"}, "task": {"ttl": 60000}}
        created = await client.result("tools/call", params)
        assert created["task"]["status"] == "working", created
        # The task's upstream call runs after the answer: the proxy's own list is what there is to wait on.
        while len(stack.calls()) == before:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    claims = stack.calls()[before].claims()
    assert claims["sub"] == "caller-b" and claims["aud"] == stack.upstream_url, claims
