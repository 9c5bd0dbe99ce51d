"""Malformed bearer tokens against the real gateway in oauth mode: every one is a 401 `invalid_token`
with a sendable challenge, none leaves a traceback, and the refusals are counted and logged at most
once per reason per `[logging] rejected_log_interval_s` (1 s here). Also: the protected-resource
metadata names the configured resource whatever `Host` a request sends (oauth and api_key modes).

The keys and the JWKS endpoint are those of `tests.test_auth_jwt`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
import pytest_asyncio

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.test_auth_jwt import ISSUER, RESOURCE, SigningKey, b64, claims, jwks_server, rsa_key, unsigned
from tests.wire import MODERN, Client

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOG_INTERVAL_S = 1.0
REPEATS = 5
"""Each token is sent this often, so that the log has floods to rate-limit."""


def raw_token(header: bytes, payload: bytes, key: SigningKey | None = None) -> str:
    """A token from raw header and payload bytes, signed with `key` (a real signature) or not."""
    signing_input = f"{b64(header)}.{b64(payload)}"
    if key is None:
        return f"{signing_input}.{b64(b'x' * 64)}"
    signature = jwt.get_algorithm_by_name(key.algorithm).sign(signing_input.encode(), key.private)
    return f"{signing_input}.{b64(signature)}"


def malformed_tokens(key: SigningKey) -> dict[str, str]:
    """Tokens with a malformed header or claims, by name (at least 30)."""

    def header(**fields: Any) -> str:
        return raw_token(json.dumps(fields).encode(), json.dumps(claims()).encode(), key)

    def signed(**changes: Any) -> str:
        return raw_token(
            json.dumps({"alg": "RS256", "kid": key.kid}).encode(), json.dumps(claims(**changes)).encode(), key
        )

    def payload(raw: bytes) -> str:
        return raw_token(json.dumps({"alg": "RS256", "kid": key.kid}).encode(), raw, key)

    deep = b"[" * 2000 + b"]" * 2000  # beyond the JSON decoder's recursion limit, within a header's 8 KiB
    return {
        "kid number": header(alg="RS256", kid=1),
        "kid null": header(alg="RS256", kid=None),
        "kid list": header(alg="RS256", kid=[key.kid]),
        "kid object": header(alg="RS256", kid={"k": key.kid}),
        "crit listed": header(alg="RS256", kid=key.kid, crit=["exp"]),
        "crit a string": header(alg="RS256", kid=key.kid, crit="exp"),
        "crit empty": header(alg="RS256", kid=key.kid, crit=[]),
        "alg number": header(alg=256, kid=key.kid),
        "alg null": header(alg=None, kid=key.kid),
        "alg list": header(alg=["RS256"], kid=key.kid),
        "alg missing": header(kid=key.kid),
        "alg with CR LF": header(alg="RS256\r\nX-Injected: 1", kid=key.kid),
        "alg with a quote": header(alg='RS256", error="none', kid=key.kid),
        "alg none": unsigned({"alg": "none", "kid": key.kid}, claims()),
        "header an array": raw_token(b"[1]", json.dumps(claims()).encode(), key),
        "header a string": raw_token(b'"RS256"', json.dumps(claims()).encode(), key),
        "header not JSON": raw_token(b"{alg", json.dumps(claims()).encode(), key),
        "header not UTF-8": raw_token(b"\xff\xfe", json.dumps(claims()).encode(), key),
        "header nested deep": raw_token(b'{"a":' + deep + b"}", json.dumps(claims()).encode(), key),
        "header not base64": "!!!." + b64(json.dumps(claims()).encode()) + ".sig",
        "exp a string": signed(exp="tomorrow"),
        "exp a list": signed(exp=[int(time.time()) + 600]),
        "exp NaN": payload(json.dumps(claims()).replace('"exp": ', '"exp": NaN, "x": ').encode()),
        "nbf a string": signed(nbf="now"),
        "iat a string": signed(iat="now"),
        "iss a number": signed(iss=1),
        "iss a list": signed(iss=[ISSUER]),
        "aud a number": signed(aud=1),
        "aud an object": signed(aud={"a": RESOURCE}),
        "sub a number": signed(sub=1),
        "sub with a control character": signed(sub="ali\x1fce"),
        "sub with a newline": signed(sub="alice\r\nbob"),
        "jti a number": signed(jti=1),
        "payload an array": payload(b"[1]"),
        "payload not JSON": payload(b"{exp"),
        "payload nested deep": payload(deep),
        "bad signature": signed()[:-8] + "AAAAAAAA",
        "unknown kid": rsa_key("forged").sign(claims()),
        "four segments": signed() + ".x",
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oauth_gateway() -> AsyncIterator[tuple[RunningGateway, SigningKey]]:
    key = rsa_key("k1")
    async with jwks_server([key]) as jwks:
        config = f"""
[auth]
mode = "oauth"
resource = "{RESOURCE}"
authorization_servers = ["{ISSUER}"]

[auth.jwt]
issuer = "{ISSUER}"
jwks_uri = "{jwks.url}"

[logging]
rejected_log_interval_s = {LOG_INTERVAL_S}
"""
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
            yield gw, key


async def status_of(gw: RunningGateway, authorization: bytes) -> tuple[int, bytes]:
    """A POST with these raw `Authorization` bytes (ones aiohttp's client would not send): status, head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(gw.base.rsplit(":", 1)[1]))
    try:
        body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
        writer.write(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
            b"Authorization: " + authorization + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]), head


async def test_every_malformed_token_is_a_401_without_a_traceback_and_the_log_stays_rate_limited(
    oauth_gateway: tuple[RunningGateway, SigningKey], http: aiohttp.ClientSession
) -> None:
    gw, key = oauth_gateway
    tokens = malformed_tokens(key)
    assert len(tokens) >= 30
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json, text/event-stream"}
    logged_before = len(gw.output)
    started = time.monotonic()
    answers: dict[str, tuple[int, str, Any]] = {}
    for _ in range(REPEATS):
        for name, token in tokens.items():
            async with http.post(gw.url, json=body, headers={**headers, "Authorization": f"Bearer {token}"}) as reply:
                answers[name] = (reply.status, reply.headers.get("WWW-Authenticate", ""), await reply.json())
    raw = {
        "a tab inside": b"Bearer abc\tdef",
        "bytes that are not UTF-8": b"Bearer \xff\xfe\xfd",
        "non-ASCII letters": "Bearer jéton".encode(),
    }
    raw_answers = {name: await status_of(gw, value) for name, value in raw.items()}
    elapsed = time.monotonic() - started

    for name, (status, challenge, reply) in answers.items():
        assert status == 401, (name, reply)
        assert reply["error"]["data"] == {"reason": "invalid_token"}, (name, reply)
        assert 'error="invalid_token"' in challenge, (name, challenge)
        description = re.search(r'error_description="([^"]*)"$', challenge)
        assert description is not None, (name, challenge)
        assert re.fullmatch(r"[\x20\x21\x23-\x5b\x5d-\x7e]*", description.group(1)), (name, challenge)
        assert "Injected" not in challenge, challenge
    for name, (status, head) in raw_answers.items():
        assert status == 401 and b'error="invalid_token"' in head, (name, head)

    async with http.get(gw.base + "/metrics") as response:
        metrics = await response.text()
    refused = len(tokens) * REPEATS + len(raw)
    assert f'mcp_gateway_rejected_requests_total{{reason="invalid_token"}} {float(refused)}' in metrics

    # The gateway's stderr is read by a task: wait (bounded) for its refusal lines to arrive.
    for _ in range(100):
        if any('"reason":"invalid_token"' in line for line in gw.output[logged_before:]):
            break
        await asyncio.sleep(0.05)
    logged = gw.output[logged_before:]
    assert not [line for line in logged if "Traceback" in line or '"exc"' in line], "\n".join(logged)
    refusal_lines = [line for line in logged if '"reason":"invalid_token"' in line]
    assert 1 <= len(refusal_lines) <= elapsed / LOG_INTERVAL_S + 1, (elapsed, refusal_lines)
    assert not [line for line in logged if '"level":"error"' in line], "\n".join(logged)


async def test_a_valid_token_still_works_beside_them(
    oauth_gateway: tuple[RunningGateway, SigningKey], http: aiohttp.ClientSession
) -> None:
    gw, key = oauth_gateway
    reply = await Client(http, gw.url, MODERN).request(
        "tools/list", headers={"Authorization": f"Bearer {key.sign(claims())}"}
    )
    assert reply.status == 200 and reply.final["result"]["tools"], reply.messages


async def test_the_metadata_names_the_configured_resource_under_a_foreign_host(
    oauth_gateway: tuple[RunningGateway, SigningKey], http: aiohttp.ClientSession
) -> None:
    gw, _ = oauth_gateway
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        async with http.get(gw.base + path, headers={"Host": "evil.example"}) as response:
            assert (await response.json())["resource"] == RESOURCE
    async with http.post(gw.url, json={}, headers={"Host": "evil.example"}) as response:
        assert response.status == 421  # the MCP endpoint itself refuses a foreign Host


async def test_the_api_key_metadata_names_the_listen_url_under_a_foreign_host(http: aiohttp.ClientSession) -> None:
    config = """
[auth]
mode = "api_key"

[[auth.api_keys]]
name = "ci"
sha256 = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
"""
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        async with http.get(
            gw.base + "/.well-known/oauth-protected-resource/mcp", headers={"Host": "evil.example"}
        ) as response:
            assert (await response.json())["resource"] == gw.url
        async with http.post(gw.url, json={}, headers={"Host": "127.0.0.1"}) as response:
            assert response.status == 401
            assert (
                f'resource_metadata="{gw.base}/.well-known/oauth-protected-resource/mcp"'
                in (response.headers["WWW-Authenticate"])
            )
