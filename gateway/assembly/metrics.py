"""Builds the gateway's metrics: the `Metrics`, the configured ceilings they publish, and /metrics,
served on the main listener or, with `[server] metrics_listen`, on a listener of its own."""

from __future__ import annotations

from aiohttp import web

from gateway.config import Config
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.metrics_listener import metrics_listener

METRICS = web.AppKey("metrics", Metrics)
"""The app's metrics (`serve` counts accept errors in them)."""


def build_metrics(app: web.Application, config: Config, admin: list[web.RouteDef]) -> Metrics:
    """The metrics, with /metrics routed; call first: a metrics port in use stops the start before the
    upstream or the stores are opened. `admin`: the routes served beside /metrics on `[server]
    metrics_listen` only (never on the main listener), as the other builders add them."""
    metrics = Metrics()
    app[METRICS] = metrics
    ceilings = {
        "server.max_sessions": config.server.max_sessions,
        "tasks.max_tasks_total": config.tasks.max_tasks_total,
        "tasks.max_streams_total": config.tasks.max_streams_total,
        "server.buffered_bytes_budget": config.server.buffered_bytes_budget,
        "server.max_connections": config.server.max_connections,
    }
    for limit, value in ceilings.items():
        metrics.limits.labels(limit=limit).set(value)

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    if config.server.metrics_listen:
        app.cleanup_ctx.append(metrics_listener(config.server.metrics_listen, metrics_handler, admin))
    else:
        app.router.add_get("/metrics", metrics_handler)
    return metrics
