"""Builds the config reload (`gateway.reload` says which keys): what applies a reloaded config to the
running parts, each rebuilt by the builder that made it at start, and `POST /admin/reload` on the
metrics listener (`[server] metrics_listen`; never on the main listener).

Applied for the requests that come after it: the edge's authentication (api keys, JWT/JWKS and
introspection settings) and each endpoint's `[[auth.rules]]` and `[auth.limits]`, the capture rules
(`[[rules]]`), each endpoint's `[[tasks.tools]]` policies, and `[retention]` (the stores' bounds, the
outcomes kept, what is advertised), and with several upstreams the upstream list (`servers`: added
upstreams start and join, removed ones leave and drain). Streams, sessions and tasks under way keep the
objects they started with; a task already running records its later events under the new capture
rules, and its log is trimmed to the new bounds at its next event."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from gateway.assembly.auth import Auth, reauthenticate
from gateway.assembly.routes import route_config
from gateway.assembly.servers import Servers
from gateway.assembly.stores import Stores, retain
from gateway.assembly.tasks import TaskCore, Tasks, make_capture
from gateway.config import Config
from gateway.edge.endpoint import McpEndpoint
from gateway.edge.responder import json_response
from gateway.metrics import Metrics
from gateway.reload import ConfigReloader

RELOAD_PATH = "/admin/reload"


def build_reload(
    reloader: ConfigReloader,
    admin: list[web.RouteDef],
    metrics: Metrics,
    auth: Auth,
    stores: Stores,
    core: TaskCore,
    endpoints: Mapping[str | None, McpEndpoint],
    tasks: Mapping[str | None, Tasks],
    servers: Servers | None,
) -> None:
    """Reloads from now on apply to these parts (`endpoints` and `tasks` kept current by `servers`, the
    several upstreams, if any); `admin` (the metrics listener's routes) gets `POST /admin/reload`."""

    async def apply(config: Config) -> None:
        # Everything that can fail is built (and an added upstream started) before anything is
        # replaced: a failed reload changes nothing.
        capture = make_capture(config)
        change = await servers.prepare(config) if servers is not None else None
        try:
            replaced = await reauthenticate(auth, config)
        except BaseException:
            if servers is not None and change is not None:
                await servers.abandon(change)
            raise
        if servers is not None and change is not None:
            await servers.commit(change)
        scoped = {name: route_config(config, name) for name in endpoints}
        core.registry.capture = capture
        retain(stores, config)
        core.registry.retention = core.hosted.retention = config.retention
        for name, endpoint in endpoints.items():
            endpoint.reconfigure(auth.edge, scoped[name].auth)
            tasks[name].service.use_policies(scoped[name].tasks)
        if replaced is not None:
            await replaced.close()

    async def reload(_: web.Request) -> web.Response:
        result = await reloader.reload()
        body = {"result": result, "config": reloader.current.digest}
        return json_response(body, 200 if result == "ok" else 422 if result == "invalid" else 500)

    reloader.attach(apply, metrics)
    admin.append(web.post(RELOAD_PATH, reload))
