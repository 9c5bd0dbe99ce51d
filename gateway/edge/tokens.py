"""OAuth access tokens as JWTs, validated locally: the issuer's key set, and the validated-token cache.

The key set (JWKS) is fetched with aiohttp, never following redirects (a redirect could point the
gateway anywhere), from `[auth.jwt] jwks_uri` or the URI the issuer's metadata names, one fetch at a
time (requests that need it join the one in flight), each bounded by `jwks_timeout_s`. It is kept for
`jwks_cache_s`, then refreshed beside the requests its keys keep answering; a token whose `kid` it
lacks refetches it at most once per `unknown_kid_refresh_min_s` and is refused at once otherwise (so
forged `kid`s cannot make the gateway hammer the authorization server, nor wait on it). A failed fetch
changes nothing: the last good keys serve on with their age, and the next try comes after the
throttle. PyJWT does the signature and claim checks with only the algorithm allow-list (no `none`, no
HMAC: a public key must never be used as an HMAC secret); any malformed header or claim is an
`InvalidToken` whose message quotes nothing of the token. A validated token is remembered by its
sha256 until min(its `exp`, `[auth] token_cache_s`), with only the claims `[[auth.rules]]` have
conditions on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import jwt

from gateway.config import AuthConfig
from gateway.edge.auth import InvalidToken, ValidatedToken
from gateway.edge.introspection import Introspector

log = logging.getLogger("gateway.edge.auth")

FETCH_TIMEOUT_S = 10.0
MAX_CACHED_TOKENS = 10_000
"""Validated tokens remembered at once; beyond it the cache starts over (a flood of distinct valid
tokens costs validations, never memory)."""


class KeySet:
    """The issuer's signing keys by `kid`, fetched lazily and refreshed as the module docstring says."""

    def __init__(self, config: AuthConfig, clock: Any = time.monotonic) -> None:
        self._jwt = config.jwt
        self._servers = config.authorization_servers
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        """When the keys in hand were fetched; a failed fetch leaves it (and the keys) as they were."""
        self._retry_at = 0.0
        """After a failed fetch, the keys (due or missing) are not fetched again before this."""
        self._unknown_kid_refreshed_at: float | None = None
        self._fetch: asyncio.Task[None] | None = None
        """The one fetch in flight, which every request that needs it joins (single flight)."""
        self._jwks_uri = self._jwt.jwks_uri
        self.fetches = 0
        """Key-set fetches attempted (for tests and the log)."""

    async def close(self) -> None:
        if self._fetch is not None:
            self._fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetch
        if self._session is not None:
            await self._session.close()

    async def key_for(self, kid: str | None) -> jwt.PyJWK:
        """The key of `kid`. Keys in hand answer at once (a due refresh runs beside); a `kid` they lack
        waits for a fetch, at most `jwks_timeout_s`: one in flight, or one started if the keys are due
        or the unknown-kid throttle allows; otherwise it is refused at once."""
        now = self._clock()
        due = (self._fetched_at is None or now - self._fetched_at >= self._jwt.jwks_cache_s) and now >= self._retry_at
        key = self._known(kid)
        if key is not None:
            if due and self._fetch is None:
                self._start_fetch()
            return key
        if self._fetch is None and (due or self._may_refresh_for_unknown_kid(now)):
            self._unknown_kid_refreshed_at = now  # this window's wait for a key the set lacks
            self._start_fetch()
        if self._fetch is not None:
            await asyncio.shield(self._fetch)  # ends within jwks_timeout_s; a caller gone leaves it running
            key = self._known(kid)
        if key is None:
            raise InvalidToken("signed by an unknown key" if self._keys else "the issuer's keys are unavailable")
        return key

    def _known(self, kid: str | None) -> jwt.PyJWK | None:
        key = self._keys.get(kid)
        if key is None and kid is None and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        return key

    def _may_refresh_for_unknown_kid(self, now: float) -> bool:
        last = self._unknown_kid_refreshed_at
        return last is None or now - last >= self._jwt.unknown_kid_refresh_min_s

    def _start_fetch(self) -> None:
        self.fetches += 1
        self._fetch = asyncio.create_task(self._refresh(), name="jwks-fetch")

    async def _refresh(self) -> None:
        started = self._clock()
        try:
            async with asyncio.timeout(self._jwt.jwks_timeout_s):
                document = await self._get_json(await self._uri())
            keys = jwt.PyJWKSet.from_dict(dict(document)).keys
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, KeyError, jwt.PyJWTError) as exc:
            # Keep the last good keys and their age; try again after the unknown-kid throttle, not on every
            # request (so this warning, too, comes at most once per throttle window).
            self._retry_at = started + min(self._jwt.unknown_kid_refresh_min_s, self._jwt.jwks_cache_s)
            why = "no answer within jwks_timeout_s" if isinstance(exc, TimeoutError) else repr(exc)[:200]
            log.warning("could not fetch the JWKS (keeping %d cached keys): %s", len(self._keys), why)
        else:
            self._keys = {key.key_id: key for key in keys}
            self._fetched_at = self._clock()
        finally:
            self._fetch = None

    async def _uri(self) -> str:
        if self._jwks_uri:
            return self._jwks_uri
        metadata = await self.server_metadata(self._jwt.issuer)
        if metadata is None or not isinstance(metadata.get("jwks_uri"), str):
            raise ValueError(f"no jwks_uri in the metadata of {self._jwt.issuer}")
        self._jwks_uri = metadata["jwks_uri"]
        return self._jwks_uri

    async def server_metadata(self, server: str) -> Mapping[str, Any] | None:
        """An authorization server's RFC 8414 metadata (or its OpenID configuration); None if neither answers."""
        base = server.rstrip("/")
        for well_known in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
            try:
                return await self._get_json(base + well_known)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
        return None

    async def check_servers(self) -> None:
        """At start-up: warn for each advertised authorization server whose metadata cannot be fetched,
        or whose `issuer` differs from the advertised string (SDK clients compare them byte for byte)."""
        for server in self._servers:
            metadata = await self.server_metadata(server)
            if metadata is None:
                log.warning("authorization server %s: no metadata at its well-known URLs", server)
            elif metadata.get("issuer") != server:
                log.warning(
                    "authorization server %s: its metadata says issuer %r; advertise exactly that in [auth] "
                    "authorization_servers, or clients refuse it",
                    server,
                    metadata.get("issuer"),
                )

    async def _get_json(self, url: str) -> Mapping[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        async with self._session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise ValueError(f"GET {url}: HTTP {response.status}")
            document = await response.json(content_type=None)
        if not isinstance(document, dict):
            raise ValueError(f"GET {url}: not a JSON object")
        return document


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """`scope` (RFC 9068: space-separated) or `scp` (a list, as some issuers write it)."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    return frozenset(str(item) for item in scp) if isinstance(scp, list) else frozenset()


class OAuthTokens:
    """Validates OAuth access tokens for `[auth]`: what the token says of its caller, or InvalidToken.

    A token shaped like a JWT is verified locally when `[auth.jwt] issuer` is set; any other goes to
    introspection when `[auth.introspection] endpoint` is set."""

    def __init__(self, config: AuthConfig, clock: Any = time.monotonic, wall_clock: Any = time.time) -> None:
        self._config = config
        self._audiences = [config.resource, *config.jwt.audiences]
        self._clock = clock
        self._wall_clock = wall_clock
        self.keys = KeySet(config, clock)
        self._introspector = Introspector(config) if config.introspection.endpoint else None
        self._rule_claims = config.rule_claims
        self._cache: dict[bytes, tuple[float, ValidatedToken]] = {}
        self._check: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Check the advertised authorization servers in the background (warnings only)."""
        self._check = asyncio.create_task(self.keys.check_servers())

    async def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._check
        await self.keys.close()
        if self._introspector is not None:
            await self._introspector.close()

    async def validate(self, token: str) -> ValidatedToken:
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(digest)
        now = self._clock()
        if cached is not None and now < cached[0]:
            return cached[1]
        claims = await self._claims(token)
        missing = [name for name in self._config.principal_claims if not isinstance(claims.get(name), str)]
        if missing:
            raise InvalidToken(f"no {', '.join(missing)} claim to name the caller")
        # Control characters could make two callers' joined identities equal, and have no place in a name.
        unprintable = [name for name in self._config.principal_claims if not claims[name].isprintable()]
        if unprintable:
            raise InvalidToken(f"control characters in the {', '.join(unprintable)} claim")
        validated = ValidatedToken(
            identity="\x1f".join(claims[name] for name in self._config.principal_claims),
            scopes=scopes_of(claims),
            claims={name: claims[name] for name in self._rule_claims if name in claims},
        )
        expires = claims.get("exp")
        lifetime = self._config.token_cache_s
        wall = self._wall_clock()
        # Compared before subtracting: an `exp` of hundreds of digits is a valid JSON number.
        if isinstance(expires, int | float) and expires < wall + lifetime:
            lifetime = float(expires) - wall
        if lifetime > 0:
            if len(self._cache) >= MAX_CACHED_TOKENS:
                self._cache.clear()
            self._cache[digest] = (now + lifetime, validated)
        return validated

    async def _claims(self, token: str) -> dict[str, Any]:
        if self._config.jwt.issuer and token.count(".") == 2:
            return await self._verified_claims(token)
        if self._introspector is not None:
            return await self._introspector.claims(token)
        raise InvalidToken("not a JWT")

    async def _verified_claims(self, token: str) -> dict[str, Any]:
        header = unverified_header(token)
        algorithm = header.get("alg")
        if algorithm not in self._config.jwt.algorithms:
            named = isinstance(algorithm, str) and algorithm.isascii() and algorithm.isalnum() and len(algorithm) <= 16
            raise InvalidToken(f"algorithm {algorithm} is not accepted" if named else "its algorithm is not accepted")
        key = await self.keys.key_for(header.get("kid"))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=[algorithm],
                audience=self._audiences,
                issuer=self._config.jwt.issuer,
                leeway=self._config.jwt.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("expired") from None
        except jwt.ImmatureSignatureError:
            raise InvalidToken("not yet valid") from None
        except jwt.InvalidAudienceError:
            raise InvalidToken("not issued for this resource (aud)") from None
        except jwt.InvalidIssuerError:
            raise InvalidToken("wrong issuer") from None
        except jwt.InvalidSignatureError:
            raise InvalidToken("invalid signature") from None
        except (jwt.MissingRequiredClaimError, jwt.InvalidIssuedAtError, jwt.InvalidAlgorithmError) as exc:
            raise InvalidToken(str(exc)) from None  # PyJWT's own words, naming no client bytes
        except (jwt.PyJWTError, TypeError, ValueError, OverflowError, RecursionError):
            # Claims of the wrong type (PyJWT raises TypeError for a non-string `iss`) or a payload that
            # is not a JSON object; PyJWT's message may quote the token, so it is not passed on.
            raise InvalidToken("malformed claims") from None
        return claims


def unverified_header(token: str) -> dict[str, Any]:
    """A JWT's header, before any key is looked at: InvalidToken unless it is a JSON object whose `kid`,
    if any, is a string, and which lists no critical extensions (the gateway understands none)."""
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, TypeError, ValueError, RecursionError):
        raise InvalidToken("not a JWT (malformed header)") from None
    if not isinstance(header, dict):
        raise InvalidToken("not a JWT (malformed header)")
    if "kid" in header and not isinstance(header["kid"], str):
        raise InvalidToken("malformed header: kid must be a string")
    if "crit" in header:
        raise InvalidToken("malformed header: critical extensions (crit) are not supported")
    return header
