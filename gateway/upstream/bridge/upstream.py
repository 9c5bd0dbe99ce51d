"""`BridgingUpstream`: the one seam where the era a client speaks meets the era the upstream speaks.

It wraps the upstream link and hands out, per request, the link's own channel when the upstream
speaks the client's era (forwarded unchanged, as if the seam were not there), or a bridge's channel
when it does not: a 2026-07-28 request to a legacy-only upstream goes through `ModernBridge`, a
2025-11-25 session with a modern-only upstream through `LegacyBridge`. Which eras the upstream
speaks is `EraLearner`'s answer. The seam decides only where a request goes; bridges translate.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from gateway.upstream.base import FailureListener, Upstream, UpstreamChannel
from gateway.upstream.bridge.eras import EraLearner, EraSetting, UpstreamEras


class ModernBridge(Protocol):
    """Serves 2026-07-28 requests over an upstream that speaks only 2025-11-25."""

    def channel(self, owner: str | None) -> contextlib.AbstractAsyncContextManager[UpstreamChannel]:
        """A channel for one 2026-07-28 request of `owner` (held for that request's lifetime)."""

    def owns(self, channel: UpstreamChannel) -> bool:
        """Whether `channel` is one of this bridge's (its state is the bridge's, not the link's)."""

    async def close(self) -> None: ...


class LegacyBridge(Protocol):
    """Serves 2025-11-25 sessions over an upstream that speaks only 2026-07-28."""

    async def open_session(self) -> UpstreamChannel: ...

    async def close(self) -> None: ...


class BridgingUpstream(Upstream):
    """The upstream link, with a client of either era carried to it (see the module docstring)."""

    def __init__(
        self,
        link: Upstream,
        era: EraSetting,
        learn_timeout_s: float,
        *,
        modern_bridge: ModernBridge | None = None,
        legacy_bridge: LegacyBridge | None = None,
    ) -> None:
        self.link = link
        self.eras = EraLearner(era, link.stateless, link.probe_session)
        self._learn_timeout_s = learn_timeout_s
        self._modern_bridge = modern_bridge
        self._legacy_bridge = legacy_bridge

    @property
    def shared_stateless(self) -> bool:  # type: ignore[override]
        return self.link.shared_stateless

    @property
    def outlives_gateway(self) -> bool:  # type: ignore[override]
        return self.link.outlives_gateway

    def on_failure(self, listener: FailureListener) -> None:
        self.link.on_failure(listener)

    def report_failure(self, cause: str) -> None:
        self.link.report_failure(cause)

    async def learn_eras(self) -> UpstreamEras:
        """The eras the upstream speaks, asked once (see `EraLearner`)."""
        return await self.eras.get(self._learn_timeout_s)

    async def open_session(self) -> UpstreamChannel:
        eras = await self.learn_eras()
        if not eras.legacy and self._legacy_bridge is not None:
            return await self._legacy_bridge.open_session()
        return await self.link.open_session()

    def rejoin(self, handle: str, protocol_version: str) -> UpstreamChannel | None:
        return self.link.rejoin(handle, protocol_version)

    @contextlib.asynccontextmanager
    async def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AsyncIterator[UpstreamChannel]:
        eras = await self.learn_eras()
        if not eras.modern and self._modern_bridge is not None:
            async with self._modern_bridge.channel(owner) as channel:
                yield channel
            return
        async with self.link.stateless(affinity, beside=beside, owner=owner) as channel:
            yield channel

    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        if self._modern_bridge is not None and self._modern_bridge.owns(channel):
            return  # a bridge keeps its own conversations' state (its requestState names the held call)
        self.link.pin(affinity, channel)

    def probe_session(self) -> contextlib.AbstractAsyncContextManager[UpstreamChannel]:
        return self.link.probe_session()

    async def start(self) -> None:
        await self.link.start()

    async def close(self) -> None:
        bridges: list[Any] = [self._modern_bridge, self._legacy_bridge]
        for bridge in bridges:
            if bridge is not None:
                await bridge.close()
        await self.link.close()
