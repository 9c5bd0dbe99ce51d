"""The credential an HTTP upstream gets (`[upstream.auth]`), and the gateway's own one (mode =
"client_credentials").

The gateway is an OAuth client of the upstream's authorization server: it gets an access token with
the client-credentials grant (HTTP Basic with `client_id` and the secret from the environment
variable `client_secret_env` names; `resource` per RFC 8707, default the upstream's URL), keeps it in
`headers` for every upstream request, and fetches the next one before it expires. A client's own
token is never forwarded (`gateway.edge.endpoint.forwardable_headers`); this, or a token exchanged for
the caller (`gateway.upstream.token_exchange`), is the only `Authorization` an upstream sees besides
`[upstream.http] headers`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Protocol

import aiohttp

from gateway.config import ConfigError, UpstreamAuthConfig
from gateway.principal import Caller

log = logging.getLogger("gateway.upstream")

FETCH_TIMEOUT_S = 10.0
REFRESH_AT = 0.8
"""A token is replaced once this share of its lifetime has passed."""
RETRY_S = 5.0
"""After a failed fetch, the next try comes this soon (the last token, if any, stays in use)."""
DEFAULT_LIFETIME_S = 300.0
"""A token whose answer has no `expires_in` is taken to last this long."""


class CredentialRefused(Exception):
    """No credential for this call: the message says why in words fit for the client (no secret, no URL);
    `reason` is the error's `data.reason`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamCredentials(Protocol):
    """What an HTTP upstream link asks for the `Authorization` of each of its requests."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def authorization(self, caller: Caller | None) -> Mapping[str, str]:
        """The headers that authenticate a request made for `caller` (None: the gateway's own request);
        raises `CredentialRefused` when there are none to send, so that nothing is sent."""
        ...


def client_login(config: UpstreamAuthConfig) -> aiohttp.BasicAuth:
    """The gateway's client authentication at the token endpoint; ConfigError if the secret is unset."""
    secret = os.environ.get(config.client_secret_env, "")
    if not secret:
        raise ConfigError(
            f"upstream.auth.client_secret_env: the environment variable {config.client_secret_env} is not set or empty"
        )
    return aiohttp.BasicAuth(config.client_id, secret)


async def request_token(
    session: aiohttp.ClientSession, config: UpstreamAuthConfig, login: aiohttp.BasicAuth, form: dict[str, str]
) -> tuple[str, float]:
    """POST `form` (plus `scope`) to the token endpoint: the access token and its lifetime in seconds.
    Raises aiohttp.ClientError, TimeoutError or ValueError (the endpoint's refusal, its text bounded)."""
    if config.scope:
        form = {**form, "scope": config.scope}
    async with session.post(config.token_url, data=form, auth=login, allow_redirects=False) as response:
        answer = await response.json(content_type=None)
        if response.status != 200 or not isinstance(answer, dict):
            raise ValueError(f"HTTP {response.status}: {str(answer)[:200]}")
    token = answer.get("access_token")
    if not isinstance(token, str) or not token:
        raise ValueError(f"no access_token in the answer: {str(answer)[:200]}")
    try:
        lifetime = float(answer.get("expires_in", DEFAULT_LIFETIME_S))
    except (TypeError, ValueError):
        raise ValueError(f"expires_in is not a number: {answer.get('expires_in')!r}") from None
    return token, lifetime


class ClientCredentials:
    def __init__(self, config: UpstreamAuthConfig, upstream_url: str) -> None:
        self._config = config
        self._login = client_login(config)
        self._resource = config.resource or upstream_url
        self._session: aiohttp.ClientSession | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.headers: dict[str, str] = {}
        """`Authorization: Bearer <the gateway's token>` once one was fetched; read on every request."""

    async def authorization(self, caller: Caller | None) -> Mapping[str, str]:
        """The gateway's own token, whoever the call is for."""
        return self.headers

    async def start(self) -> None:
        """Fetch the first token (a failure is logged and retried), then keep it fresh in the background."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        first_wait = await self._fetch()
        self._refresher = asyncio.create_task(self._refresh(first_wait), name="upstream-credentials")

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _refresh(self, wait_s: float) -> None:
        while True:
            await asyncio.sleep(wait_s)
            wait_s = await self._fetch()

    async def _fetch(self) -> float:
        """Get a token; the seconds until the next fetch."""
        assert self._session is not None
        try:
            token, lifetime = await request_token(
                self._session,
                self._config,
                self._login,
                {"grant_type": "client_credentials", "resource": self._resource},
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.error("could not get the upstream access token from %s: %r", self._config.token_url, exc)
            return RETRY_S
        self.headers["Authorization"] = f"Bearer {token}"
        return max(lifetime * REFRESH_AT, 1.0)
