"""Builds the legacy (2025-11-25) client sessions: started after the upstream, stopped after the tasks
(so their runs have ended) and before the upstream closes: with the app, or with their upstream's group
(`gateway.assembly.parts`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.assembly.parts import Lifecycle
from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.metrics import Metrics
from gateway.sessions import SessionRegistry
from gateway.upstream.base import Upstream


def build_sessions(
    life: Lifecycle, config: Config, upstream: Upstream, metrics: Metrics, budget: BufferBudget
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

    async def running(_: object) -> AsyncIterator[None]:
        sessions.start()
        yield
        await sessions.stop()

    life.cleanup_ctx.append(running)
    return sessions
