"""The gateway's own credential towards an HTTP upstream (`[upstream.auth] mode = "client_credentials"`).

The gateway is an OAuth client of the upstream's authorization server: it gets an access token with
the client-credentials grant (HTTP Basic with `client_id` and the secret from the environment
variable `client_secret_env` names; `resource` per RFC 8707, default the upstream's URL), keeps it in
`headers` for every upstream request, and fetches the next one before it expires. A client's own
token is never forwarded (`gateway.edge.endpoint.forwardable_headers`); this is the only
`Authorization` an upstream sees besides `[upstream.http] headers`.
"""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp

from gateway.config import ConfigError, UpstreamAuthConfig

log = logging.getLogger("gateway.upstream")

FETCH_TIMEOUT_S = 10.0
REFRESH_AT = 0.8
"""A token is replaced once this share of its lifetime has passed."""
RETRY_S = 5.0
"""After a failed fetch, the next try comes this soon (the last token, if any, stays in use)."""


class ClientCredentials:
    def __init__(self, config: UpstreamAuthConfig, upstream_url: str) -> None:
        secret = os.environ.get(config.client_secret_env, "")
        if not secret:
            raise ConfigError(
                f"upstream.auth.client_secret_env: the environment variable {config.client_secret_env} is not set "
                "or empty"
            )
        self._config = config
        self._login = aiohttp.BasicAuth(config.client_id, secret)
        self._resource = config.resource or upstream_url
        self._session: aiohttp.ClientSession | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.headers: dict[str, str] = {}
        """`Authorization: Bearer <the gateway's token>` once one was fetched; read on every request."""

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
        form = {"grant_type": "client_credentials", "resource": self._resource}
        if self._config.scope:
            form["scope"] = self._config.scope
        try:
            async with self._session.post(
                self._config.token_url, data=form, auth=self._login, allow_redirects=False
            ) as response:
                answer = await response.json(content_type=None)
                if response.status != 200 or not isinstance(answer, dict):
                    raise ValueError(f"HTTP {response.status}: {str(answer)[:200]}")
            token = answer["access_token"]
            lifetime = float(answer.get("expires_in", 300))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.error("could not get the upstream access token from %s: %r", self._config.token_url, exc)
            return RETRY_S
        self.headers["Authorization"] = f"Bearer {token}"
        return max(lifetime * REFRESH_AT, 1.0)
