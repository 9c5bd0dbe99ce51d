"""Builds the upstream link (`[upstream]` url: Streamable HTTP, or command: stdio) and the budget of
upstream bytes buffered for clients that it, the sessions and the edge share. The link is started
after the stores are open and closed after the sessions and tasks that use it have stopped."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from gateway.assembly.parts import Lifecycle
from gateway.buffers import BufferBudget
from gateway.config import Config, ConfigError, HttpUpstreamConfig
from gateway.deadlines import RequestDeadlines
from gateway.metrics import Metrics
from gateway.upstream.base import Upstream
from gateway.upstream.bridge.legacy_over_modern import LegacyOverModern
from gateway.upstream.bridge.modern_over_legacy import ModernOverLegacy
from gateway.upstream.bridge.upstream import BridgingUpstream
from gateway.upstream.credentials import ClientCredentials, UpstreamCredentials
from gateway.upstream.http import HttpUpstream
from gateway.upstream.stdio import StdioUpstream
from gateway.upstream.token_exchange import TokenExchange


def build_budget(config: Config, metrics: Metrics) -> BufferBudget:
    return BufferBudget(
        stream_messages=config.server.exchange_capacity,
        stream_bytes=config.server.stream_buffer_bytes,
        budget_bytes=config.server.buffered_bytes_budget,
        metrics=metrics,
    )


def build_upstream(config: Config, metrics: Metrics, budget: BufferBudget) -> Upstream:
    upstream = config.upstream
    deadlines = RequestDeadlines(upstream, config.tasks, metrics)
    if upstream.url:
        credentials: UpstreamCredentials | None = None
        if upstream.auth.mode == "client_credentials":
            credentials = ClientCredentials(upstream.auth, upstream.url)
        elif upstream.auth.mode == "token_exchange":
            credentials = TokenExchange(upstream.auth, upstream.url)
        http = with_env_headers(
            upstream.http, "upstream.http" if not config.aggregating else f"upstreams.{upstream.name}.http"
        )
        return HttpUpstream(upstream.url, http, metrics, budget, deadlines, credentials, name=upstream.name)
    if upstream.command:
        return StdioUpstream(upstream.command, upstream.stdio, metrics, budget, deadlines, name=upstream.name)
    raise ValueError("no upstream configured: set upstream.url or upstream.command (or --upstream-url/--upstream-cmd)")


def with_env_headers(http: HttpUpstreamConfig, key: str) -> HttpUpstreamConfig:
    """`http` with `headers_env` read into `headers` (at start: a secret stays out of the file);
    ConfigError naming the key when a variable is unset or empty."""
    headers = dict(http.headers)
    for header, variable in http.headers_env.items():
        if not (value := os.environ.get(variable, "")):
            raise ConfigError(f"{key}.headers_env.{header}: the environment variable {variable} is not set or empty")
        headers[header] = value
    return http.model_copy(update={"headers": headers}) if http.headers_env else http


def bridged(link: Upstream, config: Config, budget: BufferBudget) -> BridgingUpstream:
    """`link` behind the era seam, with the bridges for the eras it may not speak (their exchanges in
    the gateway's budget of buffered bytes)."""
    timeout_s = config.server.initialize_timeout_s
    return BridgingUpstream(
        link,
        config.upstream.era,
        timeout_s,
        modern_bridge=ModernOverLegacy(link, config.upstream.bridge, budget, timeout_s),
        legacy_bridge=LegacyOverModern(link, config.upstream.bridge.input_timeout_s, timeout_s, budget),
    )


def start_upstream(
    life: Lifecycle, config: Config, metrics: Metrics, budget: BufferBudget, given: Upstream | None
) -> Upstream:
    """`given` (used as it is), or the upstream `[upstream]` configures behind the era seam (a client of
    either era carried to it), started with `life` (the app, or its upstream's group) and closed when it stops."""
    upstream = given or bridged(build_upstream(config, metrics, budget), config, budget)
    link = upstream.link if isinstance(upstream, BridgingUpstream) else upstream
    if isinstance(link, StdioUpstream):
        key = "upstream" if not config.aggregating else f"upstreams.{config.upstream.name}"
        metrics.limits.labels(limit=f"{key}.stdio.max_processes").set(config.upstream.stdio.max_processes)

    async def running(_: object) -> AsyncIterator[None]:
        await upstream.start()
        yield
        await upstream.close()

    life.cleanup_ctx.append(running)
    return upstream
