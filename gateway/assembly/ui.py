"""Builds the task timeline page's routes on the main listener (`[ui]`): `GET /ui` (index.html), its
static files under `/ui/`, and `/ui/config.json` (which endpoints the page may talk to, and how callers
authenticate). None of them needs credentials: they carry no task data; the page fetches that from the
MCP endpoints with the caller's own. With `[ui] enabled = false` no route is added (404)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.assembly.routes import Route
from gateway.config import UI_PATH, Config
from gateway.edge.responder import json_response
from gateway.ui import StaticFile, static_files

SECURITY_HEADERS = {
    # Only the page's own files run or style it: no inline script, no third-party origin.
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def page_config(config: Config, routes: list[Route]) -> dict[str, Any]:
    """`/ui/config.json`: the endpoint the page talks to by default (`[server] path`), every endpoint it may
    choose (with several upstreams, the aggregate first, then each upstream's own), the auth mode."""
    main = "all upstreams" if config.aggregating else config.upstream.name
    endpoints = [{"name": route.name or main, "path": route.path} for route in routes]
    endpoints.sort(key=lambda endpoint: endpoint["path"] != config.server.path)  # the default first
    return {"endpoint": config.server.path, "endpoints": endpoints, "auth": config.auth.mode, "version": __version__}


def build_ui(app: web.Application, config: Config, routes: list[Route]) -> None:
    if not config.ui.enabled:
        return
    files = static_files()

    def serve(file: StaticFile, request: web.Request) -> web.Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache", "ETag": file.etag}
        if request.headers.get("If-None-Match") == file.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=file.body, content_type=file.content_type, charset="utf-8", headers=headers)

    async def index(request: web.Request) -> web.Response:
        return serve(files["index.html"], request)

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "config.json":
            # Made per request: a config reload may add or remove upstreams (`routes` follows).
            return json_response(page_config(config, routes), headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})
        if (file := files.get(name)) is None:
            raise web.HTTPNotFound(headers=SECURITY_HEADERS)
        return serve(file, request)

    async def slash(_: web.Request) -> web.Response:
        raise web.HTTPPermanentRedirect(UI_PATH)  # the page's links are absolute, but a typed "/ui/" should work

    app.router.add_get(UI_PATH, index)
    app.router.add_get(UI_PATH + "/", slash)
    app.router.add_get(UI_PATH + "/{name}", asset)
