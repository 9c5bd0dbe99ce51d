"""`[auth] mode = "oauth"` against a real authorization server: npm `oidc-provider` (tests/oidc/, pinned by
its lock file, installed by `make node_modules`) on a free loopback port, issuing client-credentials JWTs
whose `aud` is the gateway's resource (resource indicators).

The official SDK client with its `ClientCredentialsOAuthProvider` goes the whole way on its own:
401 → protected-resource metadata → authorization-server discovery → token → a streamed tools/call
with every progress and log notification, in both eras. A tool whose rule needs a scope the token
lacks is hidden from tools/list, and calling it gets 403 `insufficient_scope`, on which the SDK
re-authorizes with that scope and the call succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import jwt
import mcp_types as types
import pytest
import pytest_asyncio
from aiohttp import web
from mcp import Client
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, free_port, listening_process, start_gateway
from tests.test_http_upstream import scripted
from tests.wire import MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROVIDER = ROOT / "tests" / "oidc" / "provider.mjs"
CLIENT_ID = "gateway-test-client"
CLIENT_SECRET = "gateway-test-secret-0123456789abcdef"
SECRET_ENV = "GATEWAY_TEST_INTROSPECTION_SECRET"
UPSTREAM_SECRET_ENV = "GATEWAY_TEST_UPSTREAM_SECRET"

if not (ROOT / "tests" / "oidc" / "node_modules" / "oidc-provider").is_dir() or shutil.which("node") is None:
    pytest.fail("oidc-provider is not installed: run `make node_modules` (needs Node.js 20+)", pytrace=False)


class MemoryTokens(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@dataclass
class Setup:
    gateway: RunningGateway
    issuer: str


@contextlib.asynccontextmanager
async def authorization_server(
    log: Path, resource: str, token_format: str, exchange_ttl_s: int | None = None
) -> AsyncIterator[str]:
    """oidc-provider on a free port, issuing `token_format` tokens for `resource`; yields its issuer.
    With `exchange_ttl_s`, CLIENT_ID may also exchange tokens (RFC 8693) for ones lasting that long, and
    the clients caller-a, caller-b and refused-caller exist (see provider.mjs)."""

    def argv(port: int) -> list[str]:
        exchange = [str(exchange_ttl_s)] if exchange_ttl_s is not None else []
        return ["node", str(PROVIDER), str(port), resource, CLIENT_ID, CLIENT_SECRET, token_format, *exchange]

    async with listening_process(argv, log) as as_port:
        yield f"http://127.0.0.1:{as_port}"


@contextlib.asynccontextmanager
async def authorization_stack(
    log: Path, token_format: str, tokens_config: str, advertised_suffix: str = ""
) -> AsyncIterator[Setup]:
    """oidc-provider issuing `token_format` tokens, and the gateway in oauth mode in front of the example
    server, its `[auth]` ending with `tokens_config` (`{issuer}` filled in); it advertises the issuer
    followed by `advertised_suffix`."""
    gw_port = free_port()
    resource = f"http://127.0.0.1:{gw_port}/mcp"
    async with authorization_server(log, resource, token_format) as issuer:
        config = f"""
[auth]
mode = "oauth"
resource = "{resource}"
authorization_servers = ["{issuer}{advertised_suffix}"]
scopes_supported = ["read"]
principal_claims = ["iss", "client_id"]
{tokens_config.format(issuer=issuer)}

[[auth.rules]]
match = "whoami"
scopes = ["deploy"]
hide = true
"""
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config, port=gw_port) as gw:
            yield Setup(gw, issuer)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    """JWT access tokens, validated with the keys discovered from the issuer."""
    log = tmp_path_factory.mktemp("oidc") / "provider.log"
    async with authorization_stack(log, "jwt", '[auth.jwt]\nissuer = "{issuer}"') as stack:
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def opaque(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    """Opaque access tokens, introspected on every request (token_cache_s = 0, so a revocation counts at once)."""
    log = tmp_path_factory.mktemp("oidc-opaque") / "provider.log"
    os.environ[SECRET_ENV] = CLIENT_SECRET
    introspection = (
        'token_cache_s = 0.0\n[auth.introspection]\nendpoint = "{issuer}/token/introspection"\n'
        f'client_id = "{CLIENT_ID}"\nclient_secret_env = "{SECRET_ENV}"'
    )
    try:
        async with authorization_stack(log, "opaque", introspection) as stack:
            yield stack
    finally:
        del os.environ[SECRET_ENV]


def oauth_client(setup: Setup, mode: str, scope: str, **kwargs: object) -> Client:
    provider = ClientCredentialsOAuthProvider(
        server_url=setup.gateway.url,
        storage=MemoryTokens(),
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        scope=scope,
        issuer=setup.issuer,
    )
    transport = streamable_http_client(setup.gateway.url, http_client=create_mcp_http_client(auth=provider))
    return Client(transport, mode=mode, cache=None, read_timeout_seconds=30, log_level="debug", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_sdk_client_discovers_gets_a_token_and_streams_a_call(setup: Setup, mode: str) -> None:
    seen: list[float] = []
    logs: list[object] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async with asyncio.timeout(60), oauth_client(setup, mode, "read", logging_callback=on_log) as client:
        result = await client.call_tool("run_tests", {"count": 4, "delay": 0.01}, progress_callback=on_progress)
        assert not result.is_error, result
        assert len(seen) == 4, seen
        assert logs, "no log notification came through"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_missing_scope_hides_the_tool_and_the_sdk_steps_up_on_403(setup: Setup, mode: str) -> None:
    async with asyncio.timeout(60), oauth_client(setup, mode, "read") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "whoami" not in names and "run_tests" in names, names
        # 403 insufficient_scope scope="deploy": the SDK asks for a token with that scope and retries.
        result = await client.call_tool("whoami", {})
        assert not result.is_error, result
        assert "whoami" in {tool.name for tool in (await client.list_tools()).tools}


# -- opaque tokens, introspected --------------------------------------------------------------------


async def test_the_sdk_client_works_with_opaque_tokens(opaque: Setup) -> None:
    async with asyncio.timeout(60), oauth_client(opaque, "2026-07-28", "read") as client:
        result = await client.call_tool("echo", {"text": "opaque"})
        assert not result.is_error, result


async def test_a_revoked_opaque_token_gets_401(opaque: Setup, http: aiohttp.ClientSession) -> None:
    login = aiohttp.BasicAuth(CLIENT_ID, CLIENT_SECRET)
    form = {"grant_type": "client_credentials", "scope": "read", "resource": opaque.gateway.url}
    async with http.post(f"{opaque.issuer}/token", data=form, auth=login) as response:
        assert response.status == 200, await response.text()
        token = (await response.json())["access_token"]
    assert token.count(".") != 2, "oidc-provider issued a JWT, not an opaque token"
    client = WireClient(http, opaque.gateway.url, MODERN)
    bearer = {"Authorization": f"Bearer {token}"}
    assert (await client.request("tools/list", headers=bearer)).status == 200
    async with http.post(f"{opaque.issuer}/token/revocation", data={"token": token}, auth=login) as response:
        assert response.status == 200, await response.text()
    refused = await client.request("tools/list", headers=bearer)
    assert refused.status == 401, refused.messages
    assert refused.headers["WWW-Authenticate"].endswith(
        'error="invalid_token", error_description="not active (introspection)"'
    )


async def test_an_advertised_server_unlike_its_issuer_is_warned_about(tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        stack = authorization_stack(tmp_path / "provider.log", "jwt", '[auth.jwt]\nissuer = "{issuer}"', "/")
        async with stack as mismatched:
            warning = f"authorization server {mismatched.issuer}/: its metadata says issuer '{mismatched.issuer}'"
            # The output is a list the gateway's drain task appends to: nothing to wait on but itself.
            while not any(warning in line for line in mismatched.gateway.output):  # noqa: ASYNC110
                await asyncio.sleep(0.05)


# -- the gateway's own token towards the upstream ---------------------------------------------------


async def test_the_upstream_sees_the_gateways_own_token_never_the_clients(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    seen: list[str | None] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        body = await request.json()
        if "id" not in body:
            return web.Response(status=202)
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"content": [], "tools": []}})

    client_key = "client-key-never-upstream"
    os.environ[UPSTREAM_SECRET_ENV] = CLIENT_SECRET
    async with asyncio.timeout(60), scripted(upstream) as upstream_url:
        try:
            async with authorization_server(tmp_path / "provider.log", upstream_url, "jwt") as issuer:
                config = f"""
[auth]
mode = "api_key"
[[auth.api_keys]]
name = "client"
sha256 = "{hashlib.sha256(client_key.encode()).hexdigest()}"

[upstream.auth]
mode = "client_credentials"
token_url = "{issuer}/token"
client_id = "{CLIENT_ID}"
client_secret_env = "{UPSTREAM_SECRET_ENV}"
scope = "read"
"""
                async with start_gateway(upstream_url=upstream_url, config_text=config) as gw:
                    client = WireClient(http, gw.url, MODERN)
                    reply = await client.request(
                        "tools/call",
                        {"name": "echo", "arguments": {}},
                        headers={"Authorization": f"Bearer {client_key}"},
                    )
                    assert reply.status == 200, reply.messages
        finally:
            del os.environ[UPSTREAM_SECRET_ENV]
    assert seen and all(value is not None and value.startswith("Bearer ") for value in seen), seen
    assert not any(client_key in str(value) for value in seen)
    token = str(seen[-1]).removeprefix("Bearer ")
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == upstream_url and claims["iss"] == issuer and claims["scope"] == "read", claims
