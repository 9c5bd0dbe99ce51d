"""Opaque OAuth access tokens, checked by RFC 7662 introspection at `[auth.introspection] endpoint`.

The gateway authenticates to the endpoint as a client (HTTP Basic with `client_id` and the secret
from the environment variable `client_secret_env` names) and accepts a token only when the answer
says `active` and, where it names an audience, the audience includes `[auth] resource`. Redirects are
not followed. Caching by the token's hash is the caller's (`gateway.edge.tokens.OAuthTokens`), so a
revoked token stays accepted for at most `[auth] token_cache_s`.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

from gateway.config import AuthConfig, ConfigError
from gateway.edge.auth import InvalidToken

FETCH_TIMEOUT_S = 10.0


class Introspector:
    def __init__(self, config: AuthConfig) -> None:
        settings = config.introspection
        secret = os.environ.get(settings.client_secret_env, "") if settings.client_secret_env else ""
        if settings.client_secret_env and not secret:
            raise ConfigError(
                f"auth.introspection.client_secret_env: the environment variable {settings.client_secret_env} "
                "is not set or empty"
            )
        self._endpoint = settings.endpoint
        self._login = aiohttp.BasicAuth(settings.client_id, secret) if settings.client_id else None
        self._audiences = {config.resource, *config.jwt.audiences}
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def claims(self, token: str) -> dict[str, Any]:
        """The introspection answer of an active token issued for this resource, or InvalidToken."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S))
        form = {"token": token, "token_type_hint": "access_token"}
        try:
            async with self._session.post(
                self._endpoint, data=form, auth=self._login, allow_redirects=False
            ) as response:
                answer = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            raise InvalidToken("the introspection endpoint did not answer")
        if answer.get("active") is not True:
            raise InvalidToken("not active (introspection)")
        audience = answer.get("aud")
        # Only strings can name this resource (a list may hold anything, unhashable values too).
        audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else None
        if audiences is not None and not any(isinstance(name, str) and name in self._audiences for name in audiences):
            raise InvalidToken("not issued for this resource (aud)")
        return answer
