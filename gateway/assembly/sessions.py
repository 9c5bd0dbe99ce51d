"""Builds the legacy (2025-11-25) client sessions: started after the upstream, stopped after the tasks
(so their runs have ended) and before the upstream closes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.metrics import Metrics
from gateway.sessions import SessionRegistry
from gateway.upstream.base import Upstream


def build_sessions(
    app: web.Application, config: Config, upstream: Upstream, metrics: Metrics, budget: BufferBudget
) -> SessionRegistry:
    server = config.server
    sessions = SessionRegistry(
        upstream,
        metrics,
        server.max_sessions,
        server.session_idle_timeout_s,
        budget,
        server.session_handshake_timeout_s,
        server.session_process_idle_s,
        server.resume,
    )

    async def running(_: web.Application) -> AsyncIterator[None]:
        sessions.start()
        yield
        await sessions.stop()

    app.cleanup_ctx.append(running)
    return sessions
