"""`/servers/NAME/mcp` with several upstreams: one route for every name, dispatched to the endpoint of
the upstream served under that name now (a config reload adds and removes upstreams while the app
serves, when aiohttp can add no route). A removed upstream's endpoint goes on serving the requests of
its open legacy sessions (those naming one in `Mcp-Session-Id`) until they have drained; any other
request on its path gets 404, as a name never served does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.protocol.names import SESSION_HEADER
from gateway.sessions import SessionRegistry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ServerPaths:
    """Each served upstream's endpoint by name, and the removed ones still draining their sessions."""

    def __init__(self) -> None:
        self._serving: dict[str, Handler] = {}
        self._draining: dict[str, list[tuple[SessionRegistry, Handler]]] = {}

    def mount(self, name: str, handler: Handler) -> None:
        self._serving[name] = handler

    def retire(self, name: str, sessions: SessionRegistry) -> None:
        """`name` is served no more: only the requests of its open `sessions` still reach its endpoint."""
        self._draining.setdefault(name, []).append((sessions, self._serving.pop(name)))

    def forget(self, name: str, sessions: SessionRegistry) -> None:
        """The retired endpoint of `sessions` has drained: its path no longer reaches it."""
        left = [each for each in self._draining.get(name, []) if each[0] is not sessions]
        if left:
            self._draining[name] = left
        else:
            self._draining.pop(name, None)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if (session_id := request.headers.get(SESSION_HEADER)) is not None:
            for sessions, handler in self._draining.get(name, []):
                if sessions.get(session_id) is not None:
                    return await handler(request)
        if (serving := self._serving.get(name)) is None:
            raise web.HTTPNotFound()
        return await serving(request)
