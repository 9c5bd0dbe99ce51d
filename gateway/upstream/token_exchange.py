"""Per-caller upstream credentials (`[upstream.auth] mode = "token_exchange"`, RFC 8693).

For a call made for a caller, the gateway exchanges the caller's validated access token (the edge
hands it down with the call, `gateway.principal.Caller`) at the token endpoint for a token of the
upstream's own (`resource`, default the upstream's URL, and `audience`), authenticating as its client
as the client-credentials mode does. The exchanged token is cached per caller (this object serves one
upstream) until `REFRESH_AT` of its lifetime has passed, in a bounded LRU map; the concurrent first
calls of one caller share one exchange. A failed exchange refuses the call (`CredentialRefused`): it
never falls back to the caller's own token, nor to the gateway's. A call with no caller (the
gateway's own) gets the gateway's client-credentials token, or no Authorization (`no_caller`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import aiohttp

from gateway.config import UpstreamAuthConfig
from gateway.config.upstream import ACCESS_TOKEN_TYPE
from gateway.principal import Caller
from gateway.upstream.credentials import (
    FETCH_TIMEOUT_S,
    REFRESH_AT,
    ClientCredentials,
    CredentialRefused,
    client_login,
    request_token,
)

log = logging.getLogger("gateway.upstream")

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
EXCHANGE_FAILED = "token_exchange_failed"
"""The `data.reason` of a call refused because its caller's token could not be exchanged."""


class ExchangedTokens:
    """Exchanged tokens by caller owner, each until its renewal time, at most `capacity` (LRU)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = capacity
        self._clock = clock
        self._tokens: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tokens)

    def get(self, owner: str) -> str | None:
        """The caller's token while it is fresh; a stale one is dropped."""
        entry = self._tokens.get(owner)
        if entry is None:
            return None
        token, renew_at = entry
        if self._clock() >= renew_at:
            del self._tokens[owner]
            return None
        self._tokens.move_to_end(owner)
        return token

    def put(self, owner: str, token: str, lifetime_s: float) -> None:
        """Keep `token` for `REFRESH_AT` of its `lifetime_s` (nothing, for a token already as good as expired)."""
        fresh_s = lifetime_s * REFRESH_AT
        self._tokens.pop(owner, None)
        if fresh_s <= 0:
            return
        self._tokens[owner] = (token, self._clock() + fresh_s)
        while len(self._tokens) > self._capacity:
            self._tokens.popitem(last=False)


class TokenExchange:
    def __init__(self, config: UpstreamAuthConfig, upstream_url: str) -> None:
        self._config = config
        self._login = client_login(config)
        self._form = {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": config.requested_token_type,
            "resource": config.resource or upstream_url,
        }
        if config.audience:
            self._form["audience"] = config.audience
        self._tokens = ExchangedTokens(config.exchanged_tokens)
        self._pending: dict[str, asyncio.Task[str]] = {}
        """The exchange under way for a caller, which its concurrent calls await together."""
        self._own = ClientCredentials(config, upstream_url) if config.no_caller == "client_credentials" else None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        if self._own is not None:
            await self._own.start()

    async def close(self) -> None:
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._own is not None:
            await self._own.close()
        if self._session is not None:
            await self._session.close()

    async def authorization(self, caller: Caller | None) -> Mapping[str, str]:
        if caller is None:
            return await self._own.authorization(None) if self._own is not None else {}
        return {"Authorization": f"Bearer {await self.token_for(caller)}"}

    async def token_for(self, caller: Caller) -> str:
        """The upstream's token for `caller`: cached, or exchanged now (once for concurrent calls)."""
        token = self._tokens.get(caller.owner)
        if token is not None:
            return token
        pending = self._pending.get(caller.owner)
        if pending is None:
            pending = asyncio.create_task(self._exchange(caller), name="upstream-token-exchange")
            self._pending[caller.owner] = pending
            pending.add_done_callback(lambda _: self._pending.pop(caller.owner, None))
        # Shielded: a caller that goes away does not cancel the exchange the others wait on.
        return await asyncio.shield(pending)

    async def _exchange(self, caller: Caller) -> str:
        assert self._session is not None, "TokenExchange.start() was not awaited"
        try:
            token, lifetime = await request_token(
                self._session, self._config, self._login, {**self._form, "subject_token": caller.token}
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("token exchange at %s failed: %r", self._config.token_url, exc)
            raise CredentialRefused(EXCHANGE_FAILED, "the token exchange for this caller failed") from None
        self._tokens.put(caller.owner, token, lifetime)
        return token
