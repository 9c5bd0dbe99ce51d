"""`[auth] mode = "oauth"` with JWT access tokens: keys generated here, served as a JWKS on loopback.

The validator (`gateway.edge.tokens.OAuthTokens`) against a real JWKS endpoint: every token case
(expired, not yet valid, wrong issuer, wrong audience, `alg: none`, HS256 signed with the public key,
unknown `kid` refetching once within the throttle, a rotated key, the endpoint down with keys cached),
the validated-token cache; then the real gateway in oauth mode answering them with the documented
401 challenge, and scopes from the token feeding `[[auth.rules]]`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.config import AuthConfig, AuthRule, JwtConfig
from gateway.edge.auth import InvalidToken
from gateway.edge.tokens import OAuthTokens
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

ISSUER = "http://issuer.test"
RESOURCE = "http://gateway.test/mcp"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        public: dict[str, Any] = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, algorithm=self.algorithm, headers={"kid": self.kid, **header})


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


@dataclass
class Jwks:
    """The JWKS endpoint: which keys it serves, whether it is down (503) or hangs (answers nothing until
    the test ends), how often it was asked, and `asked`, set at each request."""

    keys: list[SigningKey]
    url: str = ""
    down: bool = False
    hangs: bool = False
    fetches: int = 0
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, _: web.Request) -> web.Response:
        self.fetches += 1
        self.asked.set()
        if self.hangs:
            await self.released.wait()
        if self.down or self.hangs:
            return web.Response(status=503)
        return web.json_response({"keys": [key.jwk() for key in self.keys]})


@contextlib.asynccontextmanager
async def jwks_server(keys: list[SigningKey]) -> AsyncIterator[Jwks]:
    jwks = Jwks(keys)
    app = web.Application()
    app.router.add_get("/jwks", jwks.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    jwks.url = f"http://127.0.0.1:{port}/jwks"
    try:
        yield jwks
    finally:
        jwks.released.set()
        await runner.cleanup()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": ISSUER, "sub": "alice", "aud": RESOURCE, "exp": now + 600, "iat": now, "scope": "read deploy"}
    return {key: value for key, value in {**base, **changes}.items() if value is not None}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], body: dict[str, Any], secret: bytes | None = None) -> str:
    """A token PyJWT will not make: `alg: none`, or HS256 with `secret` (the public key's PEM)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}"
    signature = b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def auth_config(jwks_url: str, **jwt_keys: Any) -> AuthConfig:
    return AuthConfig(
        mode="oauth",
        resource=RESOURCE,
        authorization_servers=[ISSUER],
        jwt=JwtConfig(issuer=ISSUER, jwks_uri=jwks_url, **jwt_keys),
    )


@pytest.fixture(scope="module")
def key1() -> SigningKey:
    return rsa_key("k1")


@pytest_asyncio.fixture(loop_scope="module")
async def tokens(key1: SigningKey) -> AsyncIterator[tuple[OAuthTokens, Jwks, Clock]]:
    clock = Clock()
    async with jwks_server([key1]) as jwks:
        validator = OAuthTokens(auth_config(jwks.url), clock=clock)
        try:
            yield validator, jwks, clock
        finally:
            await validator.close()


async def test_a_good_token_names_the_caller_and_its_scopes_and_is_cached(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey
) -> None:
    validator, jwks, clock = tokens
    token = key1.sign(claims())
    assert await validator.validate(token) == (f"{ISSUER}\x1falice", frozenset({"read", "deploy"}), {})
    assert jwks.fetches == 1
    jwks.down = True  # a cached token needs neither keys nor a check
    clock.now += 299
    assert (await validator.validate(token))[0] == f"{ISSUER}\x1falice"
    assert jwks.fetches == 1


async def test_the_principal_keeps_only_the_claims_the_rules_have_conditions_on(key1: SigningKey) -> None:
    async with jwks_server([key1]) as jwks:
        rules = [AuthRule(match="deploy", claims={"groups": "deployers"}), AuthRule(match="x", claims={"tenant": "a"})]
        config = auth_config(jwks.url).model_copy(update={"rules": rules})
        validator = OAuthTokens(config)
        try:
            token = key1.sign(claims(groups=["ops", "deployers"], email="alice@example.com"))
            validated = await validator.validate(token)
        finally:
            await validator.close()
    assert validated.claims == {"groups": ["ops", "deployers"]}, validated  # no tenant claim; no email


@pytest.mark.parametrize(
    ("token_claims", "reason"),
    [
        (claims(exp=int(time.time()) - 120), "expired"),
        (claims(nbf=int(time.time()) + 600), "not yet valid"),
        (claims(iss="http://evil.test"), "wrong issuer"),
        (claims(aud="http://other.test/mcp"), "not issued for this resource (aud)"),
        (claims(exp=None), 'Token is missing the "exp" claim'),
        (claims(sub=None), "no sub claim to name the caller"),
    ],
)
async def test_bad_claims_are_refused_with_the_reason(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey, token_claims: dict[str, Any], reason: str
) -> None:
    validator, _, _ = tokens
    with pytest.raises(InvalidToken) as refused:
        await validator.validate(key1.sign(token_claims))
    assert str(refused.value) == reason


async def test_alg_none_and_hs256_with_the_public_key_are_refused(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey
) -> None:
    validator, jwks, _ = tokens
    none = unsigned({"alg": "none", "kid": "k1"}, claims())
    confused = unsigned({"alg": "HS256", "kid": "k1", "typ": "JWT"}, claims(), secret=key1.public_pem())
    for token, algorithm in ((none, "none"), (confused, "HS256")):
        with pytest.raises(InvalidToken, match=f"algorithm {algorithm} is not accepted"):
            await validator.validate(token)
    assert jwks.fetches == 0  # refused before any key is looked at


async def test_an_unknown_kid_refetches_at_most_once_per_throttle_and_a_rotated_key_is_learned(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey
) -> None:
    validator, jwks, clock = tokens
    await validator.validate(key1.sign(claims()))
    forged = rsa_key("forged")
    for _ in range(5):
        with pytest.raises(InvalidToken, match="signed by an unknown key"):
            await validator.validate(forged.sign(claims(sub=f"x{_}")))
    assert jwks.fetches == 1  # the first fetch was this window's: the forged kids fetch nothing more

    rotated = rsa_key("k2")
    jwks.keys = [rotated]
    clock.now += 60  # the throttle (unknown_kid_refresh_min_s = 60) has passed
    assert (await validator.validate(rotated.sign(claims())))[0] == f"{ISSUER}\x1falice"
    assert jwks.fetches == 2
    for _ in range(5):
        with pytest.raises(InvalidToken, match="signed by an unknown key"):
            await validator.validate(forged.sign(claims(sub=f"y{_}")))
    clock.now += 60
    with pytest.raises(InvalidToken, match="signed by an unknown key"):
        await validator.validate(forged.sign(claims(sub="z")))
    assert jwks.fetches == 3  # exactly one refetch per window


@pytest.mark.parametrize("fault", ["down", "hangs"])
async def test_the_last_good_keys_serve_while_the_endpoint_is_down_or_hangs(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey, fault: str
) -> None:
    validator, jwks, clock = tokens
    await validator.validate(key1.sign(claims(sub="one")))
    setattr(jwks, fault, True)
    jwks.asked.clear()
    clock.now += 3600  # the key set is due for a refetch, which fails or never answers
    # Answered from the keys in hand, without waiting for the refetch (it runs beside).
    assert (await validator.validate(key1.sign(claims(sub="two"))))[0] == f"{ISSUER}\x1ftwo"
    await asyncio.wait_for(jwks.asked.wait(), 5)
    assert jwks.fetches == 2
    assert (await validator.validate(key1.sign(claims(sub="three"))))[0] == f"{ISSUER}\x1fthree"
    assert validator.keys.fetches == 2  # one refetch, however many tokens came while it was due


async def test_a_failed_unknown_kid_refetch_leaves_the_good_keys_their_cache_time(
    tokens: tuple[OAuthTokens, Jwks, Clock], key1: SigningKey
) -> None:
    validator, jwks, clock = tokens
    await validator.validate(key1.sign(claims(sub="one")))
    jwks.down = True
    clock.now += 60  # the next unknown-kid window
    with pytest.raises(InvalidToken, match="signed by an unknown key"):
        await validator.validate(rsa_key("forged").sign(claims()))
    assert jwks.fetches == 2
    clock.now += 61  # past the unknown-kid throttle, far within jwks_cache_s
    assert (await validator.validate(key1.sign(claims(sub="two"))))[0] == f"{ISSUER}\x1ftwo"
    assert validator.keys.fetches == 2  # the good keys were not made due by the failed refetch


async def test_an_unknown_kid_waits_for_a_hanging_endpoint_once_per_window_then_fails_fast(
    key1: SigningKey,
) -> None:
    clock = Clock()
    async with jwks_server([key1]) as jwks:
        validator = OAuthTokens(auth_config(jwks.url, jwks_timeout_s=0.2), clock=clock)
        try:
            await validator.validate(key1.sign(claims()))
            jwks.hangs = True
            clock.now += 60  # the next unknown-kid window
            forged = rsa_key("forged")
            # Concurrent unknown kids share one refetch; each waits for it, bounded by jwks_timeout_s
            # (the endpoint never answers while the test runs).
            refused = await asyncio.gather(
                *(validator.validate(forged.sign(claims(sub=f"x{n}"))) for n in range(20)), return_exceptions=True
            )
            assert all(isinstance(error, InvalidToken) for error in refused), refused
            assert (validator.keys.fetches, jwks.fetches) == (2, 2)
            # Within the throttle window: refused at once, no fetch started.
            with pytest.raises(InvalidToken, match="signed by an unknown key"):
                await validator.validate(forged.sign(claims(sub="later")))
            assert validator.keys.fetches == 2
            # Tokens signed with the cached key are answered meanwhile.
            assert (await validator.validate(key1.sign(claims(sub="good"))))[0] == f"{ISSUER}\x1fgood"
            clock.now += 60  # the next window: one more (bounded) try
            with pytest.raises(InvalidToken, match="signed by an unknown key"):
                await validator.validate(forged.sign(claims(sub="next window")))
            assert validator.keys.fetches == 3
        finally:
            await validator.close()


async def test_the_first_tokens_share_one_fetch_and_a_hanging_first_fetch_is_bounded(key1: SigningKey) -> None:
    async with jwks_server([key1]) as jwks:
        validator = OAuthTokens(auth_config(jwks.url))
        try:
            names = await asyncio.gather(*(validator.validate(key1.sign(claims(sub=f"u{n}"))) for n in range(10)))
            assert {name.identity for name in names} == {f"{ISSUER}\x1fu{n}" for n in range(10)}
            assert jwks.fetches == 1
        finally:
            await validator.close()
    async with jwks_server([key1]) as jwks:
        jwks.hangs = True
        validator = OAuthTokens(auth_config(jwks.url, jwks_timeout_s=0.2))
        try:
            for _ in range(3):  # one bounded wait, then refused at once until the retry is due
                with pytest.raises(InvalidToken, match="the issuer's keys are unavailable"):
                    await validator.validate(key1.sign(claims()))
            assert jwks.fetches == 1
        finally:
            await validator.close()


async def test_es256_keys_validate_too() -> None:
    es = SigningKey("e1", "ES256", ec.generate_private_key(ec.SECP256R1()))
    async with jwks_server([es]) as jwks:
        validator = OAuthTokens(auth_config(jwks.url))
        try:
            assert (await validator.validate(es.sign(claims())))[1] == {"read", "deploy"}
        finally:
            await validator.close()


# -- the gateway in oauth mode --------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oauth_gateway(key1: SigningKey) -> AsyncIterator[tuple[RunningGateway, Jwks]]:
    async with jwks_server([key1]) as jwks:
        config = f"""
[auth]
mode = "oauth"
resource = "{RESOURCE}"
authorization_servers = ["{ISSUER}"]
scopes_supported = ["read", "deploy"]

[auth.jwt]
issuer = "{ISSUER}"
jwks_uri = "{jwks.url}"

[[auth.rules]]
match = "deploy"
scopes = ["deploy"]

[[auth.rules]]
match = "run_tests"
claims = {{ groups = "testers" }}
"""
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
            yield gw, jwks


@pytest.mark.parametrize(
    ("case", "description"),
    [
        ("expired", "expired"),
        ("wrong_issuer", "wrong issuer"),
        ("wrong_audience", "not issued for this resource (aud)"),
        ("alg_none", "algorithm none is not accepted"),
        ("hs256", "algorithm HS256 is not accepted"),
        ("garbage", "not a JWT"),
    ],
)
async def test_the_gateway_answers_bad_tokens_401_invalid_token(
    oauth_gateway: tuple[RunningGateway, Jwks],
    http: aiohttp.ClientSession,
    key1: SigningKey,
    case: str,
    description: str,
) -> None:
    gw, _ = oauth_gateway
    bad_tokens: dict[str, Callable[[], str]] = {
        "expired": lambda: key1.sign(claims(exp=int(time.time()) - 120)),
        "wrong_issuer": lambda: key1.sign(claims(iss="http://evil.test")),
        "wrong_audience": lambda: key1.sign(claims(aud="http://other.test/mcp")),
        "alg_none": lambda: unsigned({"alg": "none", "kid": "k1"}, claims()),
        "hs256": lambda: unsigned({"alg": "HS256", "kid": "k1"}, claims(), secret=key1.public_pem()),
        "garbage": lambda: "not-a-jwt",
    }
    token = bad_tokens[case]()
    reply = await WireClient(http, gw.url, MODERN).request("tools/list", headers={"Authorization": f"Bearer {token}"})
    assert reply.status == 401, reply.messages
    metadata = "http://gateway.test/.well-known/oauth-protected-resource/mcp"
    assert reply.headers["WWW-Authenticate"] == (
        f'Bearer resource_metadata="{metadata}", scope="read deploy", error="invalid_token", '
        f'error_description="{description}"'
    )


async def test_the_gateway_takes_scopes_from_the_token(
    oauth_gateway: tuple[RunningGateway, Jwks], http: aiohttp.ClientSession, key1: SigningKey
) -> None:
    gw, _ = oauth_gateway
    client = WireClient(http, gw.url, MODERN)
    reader = {"Authorization": f"Bearer {key1.sign(claims(scope='read'))}"}
    deployer = {"Authorization": f"Bearer {key1.sign(claims(scope='read deploy'))}"}
    listed = await client.request("tools/list", headers=reader)
    assert listed.status == 200, listed.messages
    assert "deploy" not in {tool["name"] for tool in listed.final["result"]["tools"]}
    assert "deploy" in {
        tool["name"] for tool in (await client.request("tools/list", headers=deployer)).final["result"]["tools"]
    }
    refused = await client.request(
        "tools/call", {"name": "deploy", "arguments": {"environment": "prod"}}, headers=reader
    )
    assert refused.status == 403 and 'error="insufficient_scope"' in refused.headers["WWW-Authenticate"]
    async with http.get(f"{gw.base}/.well-known/oauth-protected-resource") as response:
        assert (await response.json())["authorization_servers"] == [ISSUER]


async def test_the_gateway_takes_claims_from_the_token(
    oauth_gateway: tuple[RunningGateway, Jwks], http: aiohttp.ClientSession, key1: SigningKey
) -> None:
    gw, _ = oauth_gateway
    client = WireClient(http, gw.url, MODERN)
    tester = {"Authorization": f"Bearer {key1.sign(claims(groups=['ops', 'testers']))}"}
    other = {"Authorization": f"Bearer {key1.sign(claims(groups=['ops']))}"}
    call = {"name": "run_tests", "arguments": {"count": 1, "delay": 0}}
    listed = (await client.request("tools/list", headers=other)).final["result"]["tools"]
    assert "run_tests" not in {tool["name"] for tool in listed}
    refused = await client.request("tools/call", call, headers=other)
    assert refused.status == 403 and "WWW-Authenticate" not in refused.headers, refused.headers
    assert refused.final["error"]["data"] == {"reason": "claim_mismatch"}, refused.final
    listed = (await client.request("tools/list", headers=tester)).final["result"]["tools"]
    assert "run_tests" in {tool["name"] for tool in listed}
    done = await client.request("tools/call", call, headers=tester)
    assert done.final["result"]["content"][0]["text"].startswith("unit: 1 passed"), done.messages
