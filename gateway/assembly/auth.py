"""Builds client authentication: `EdgeAuth` (api keys or OAuth, `[auth]`), the OAuth token validator
with its key-set fetches (both made anew on a config reload: `reauthenticate`), the protected-resource
metadata routes, and the principals' hash key kept in the store (drawn there once, so callers hash the
same after a restart and on every replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.stores import Stores
from gateway.config import Config, ServerConfig, parse_listen, url_host
from gateway.edge.auth import EdgeAuth
from gateway.edge.tokens import OAuthTokens


def endpoint_url(server: ServerConfig) -> str:
    """The MCP endpoint's URL as `[server] listen` names it (https when the gateway serves TLS itself)."""
    host, port = parse_listen(server.listen)
    return f"{'https' if server.tls_cert else 'http'}://{url_host(host)}:{port}{server.path}"


@dataclass(slots=True)
class Auth:
    """The edge's authentication and the token validator it uses (mode = "oauth"); a config reload
    replaces both (`reauthenticate`)."""

    edge: EdgeAuth
    tokens: OAuthTokens | None


def make_auth(config: Config, tokens: OAuthTokens | None) -> EdgeAuth:
    return EdgeAuth(config.auth, endpoint_url(config.server), tokens.validate if tokens is not None else None)


def make_tokens(config: Config) -> OAuthTokens | None:
    return OAuthTokens(config.auth) if config.auth.mode == "oauth" else None


def build_auth(app: web.Application, config: Config, stores: Stores) -> Auth:
    """The edge's authentication; its key comes from the store once the store is open."""
    tokens = make_tokens(config)
    auth = Auth(make_auth(config, tokens), tokens)
    if auth.edge.enabled:
        # The metadata says what reloads leave alone ([auth] resource, authorization_servers, scopes).
        for path in auth.edge.metadata_paths:
            app.router.add_get(path, auth.edge.metadata)

    async def keyed(_: web.Application) -> AsyncIterator[None]:
        if auth.edge.keeps_key_in_store and stores.secret is not None:
            # Callers must hash the same after a restart and on every replica, or their tasks are lost to them.
            auth.edge.use_key(await stores.secret("principal_key"))
        yield

    async def close_tokens(_: web.Application) -> None:
        if auth.tokens is not None:  # the validator of the moment (a reload may have replaced it)
            await auth.tokens.close()

    app.cleanup_ctx.append(keyed)
    if tokens is not None:
        # Outside the cleanup contexts: started once everything else has, closed after it has stopped.
        app.on_startup.append(lambda _: tokens.start())
        app.on_cleanup.append(close_tokens)
    return auth


async def reauthenticate(auth: Auth, config: Config) -> OAuthTokens | None:
    """`auth` made anew from `config` (`[auth]`'s reloadable keys), under the same principals' key;
    returns the token validator it replaced, for the caller to close once nothing uses it."""
    tokens = make_tokens(config) if config.auth != auth.edge.config else auth.tokens
    edge = make_auth(config, tokens)
    edge.use_key(auth.edge.key)
    if tokens is not None and tokens is not auth.tokens:
        await tokens.start()
    replaced = auth.tokens if tokens is not auth.tokens else None
    auth.edge, auth.tokens = edge, tokens
    return replaced
