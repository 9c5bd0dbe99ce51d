"""Builds the routes: which MCP endpoints the gateway serves and the upstream behind each.

One upstream (`[upstream]`): one endpoint at `[server] path`. Several (`[[upstreams]]`): each upstream's
own endpoint at `/servers/NAME/mcp`, fronting its link exactly as the single endpoint does, and at
`[server] path` the aggregate (`gateway.upstream.aggregate`): one server made of all of them, over the
same links. Each link is started once, after the stores are open, and closed after every endpoint that
uses it has stopped."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.upstream import start_upstream
from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.metrics import Metrics
from gateway.upstream.aggregate.link import AggregateUpstream
from gateway.upstream.base import Upstream

SERVERS_PATH = "/servers/{name}/mcp"
"""Where each of several upstreams is served on its own."""


@dataclass(frozen=True, slots=True)
class Route:
    """One MCP endpoint: its path, the config it is built from (`Config.for_route`) and its upstream."""

    name: str | None
    """The upstream's name on its own endpoint; None for the endpoint at `[server] path`."""
    path: str
    config: Config
    upstream: Upstream


def route_config(config: Config, name: str | None) -> Config:
    """The config the endpoint of route `name` is built from (at start, and on a config reload): the
    whole config with one upstream, else `Config.for_route`."""
    return config.for_route(name) if config.aggregating else config


def build_routes(
    app: web.Application, config: Config, metrics: Metrics, budget: BufferBudget, given: Upstream | None
) -> list[Route]:
    """The endpoints `config` asks for, each upstream link started with the app (`given`: the one
    upstream, used as it is)."""
    if not config.aggregating:
        return [Route(None, config.server.path, config, start_upstream(app, config, metrics, budget, given))]
    routes = [
        Route(
            upstream.name,
            SERVERS_PATH.format(name=upstream.name),
            scoped := route_config(config, upstream.name),
            start_upstream(app, scoped, metrics, budget, None),
        )
        for upstream in config.named_upstreams()
    ]
    aggregate = AggregateUpstream(
        {route.name: route.upstream for route in routes if route.name is not None},
        config.server.name_separator,
        config.server.initialize_timeout_s,
        budget=budget,
    )
    main = route_config(config, None)
    routes.append(Route(None, config.server.path, main, start_upstream(app, main, metrics, budget, aggregate)))
    return routes
