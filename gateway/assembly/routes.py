"""Builds the routes: which MCP endpoints the gateway serves and the upstream behind each.

One upstream (`[upstream]`): one endpoint at `[server] path`. Several (`[[upstreams]]`): each upstream's
own endpoint at `/servers/NAME/mcp`, fronting its link exactly as the single endpoint does, and at
`[server] path` the aggregate (`gateway.upstream.aggregate`): one server made of all of them, over the
same links. Each link is started once, after the stores are open, and closed after every endpoint that
uses it has stopped; each of several upstreams' link starts and stops in that upstream's `Group`
(`gateway.assembly.parts`), so a config reload can add one (`upstream_route`) or stop a removed one."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.parts import Group, Groups
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
    group: Group | None = None
    """What starts and stops with this upstream alone (one of several): its link, its sessions."""


def route_config(config: Config, name: str | None) -> Config:
    """The config the endpoint of route `name` is built from (at start, and on a config reload): the
    whole config with one upstream, else `Config.for_route`."""
    return config.for_route(name) if config.aggregating else config


def upstream_route(app: web.Application, config: Config, name: str, metrics: Metrics, budget: BufferBudget) -> Route:
    """The endpoint of upstream `name` of several, its link started with a group of its own (at start,
    and when a config reload adds it)."""
    scoped = route_config(config, name)
    group = Group(app)
    upstream = start_upstream(group, scoped, metrics, budget, None)
    return Route(name, SERVERS_PATH.format(name=name), scoped, upstream, group)


def build_routes(
    app: web.Application,
    groups: Groups,
    config: Config,
    metrics: Metrics,
    budget: BufferBudget,
    given: Upstream | None,
) -> list[Route]:
    """The endpoints `config` asks for, each upstream link started with the app (`given`: the one
    upstream, used as it is), each of several upstreams' with its group."""
    if not config.aggregating:
        return [Route(None, config.server.path, config, start_upstream(app, config, metrics, budget, given))]
    routes = [upstream_route(app, config, upstream.name, metrics, budget) for upstream in config.named_upstreams()]
    for route in routes:
        assert route.group is not None
        groups.add(route.group)
    aggregate = AggregateUpstream(
        {route.name: route.upstream for route in routes if route.name is not None},
        config.server.name_separator,
        config.server.initialize_timeout_s,
        budget=budget,
    )
    main = route_config(config, None)
    routes.append(Route(None, config.server.path, main, start_upstream(app, main, metrics, budget, aggregate)))
    return routes
