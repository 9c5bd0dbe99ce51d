"""Builds client authentication: `EdgeAuth` (api keys or OAuth, `[auth]`), the OAuth token validator
with its key-set fetches, the protected-resource metadata routes, and the principals' hash key kept in
the store (drawn there once, so callers hash the same after a restart and on every replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.assembly.stores import Stores
from gateway.config import Config, ServerConfig, parse_listen, url_host
from gateway.edge.auth import EdgeAuth
from gateway.edge.tokens import OAuthTokens


def endpoint_url(server: ServerConfig) -> str:
    """The MCP endpoint's URL as `[server] listen` names it (https when the gateway serves TLS itself)."""
    host, port = parse_listen(server.listen)
    return f"{'https' if server.tls_cert else 'http'}://{url_host(host)}:{port}{server.path}"


def build_auth(app: web.Application, config: Config, stores: Stores) -> EdgeAuth:
    """The edge's authentication; its key comes from the store once the store is open."""
    tokens = OAuthTokens(config.auth) if config.auth.mode == "oauth" else None
    auth = EdgeAuth(config.auth, endpoint_url(config.server), tokens.validate if tokens is not None else None)
    if auth.enabled:
        for path in auth.metadata_paths:
            app.router.add_get(path, auth.metadata)

    async def keyed(_: web.Application) -> AsyncIterator[None]:
        if auth.keeps_key_in_store and stores.secret is not None:
            # Callers must hash the same after a restart and on every replica, or their tasks are lost to them.
            auth.use_key(await stores.secret("principal_key"))
        yield

    app.cleanup_ctx.append(keyed)
    if tokens is not None:
        # Outside the cleanup contexts: started once everything else has, closed after it has stopped.
        app.on_startup.append(lambda _: tokens.start())
        app.on_cleanup.append(lambda _: tokens.close())
    return auth
