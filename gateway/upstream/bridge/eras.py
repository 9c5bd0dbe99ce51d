"""Which protocol eras the upstream speaks: configured, or learnt once by asking it.

`auto` asks with the gateway's own `server/discover` (a result: it speaks 2026-07-28) and `initialize`
on a fresh handshake conversation (a result: it speaks 2025-11-25), once however many requests need
the answer. An upstream that cannot be asked (nothing starts, nothing answers) is asked again by the
next request; until then every request is forwarded unchanged, as if it spoke both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal

from gateway.protocol.dialect import MODERN
from gateway.protocol.era import LATEST_HANDSHAKE_VERSION, Era
from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import Exchange, UpstreamChannel

log = logging.getLogger("gateway.upstream")

EraSetting = Literal["auto", "legacy", "modern"]

ERA_PROBE_ID = "mcp-task-gateway-era"


def probe_initialize(request_id: str) -> Message:
    """The `initialize` of a fresh handshake conversation the gateway opens only to ask the upstream
    (this era probe, the readiness check): no capabilities, the gateway's name."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            "capabilities": {},
            "clientInfo": {"name": request_id, "version": "1"},
        },
    }


@dataclass(frozen=True, slots=True)
class UpstreamEras:
    """The eras the upstream speaks (at least one)."""

    legacy: bool
    modern: bool

    def speaks(self, era: Era) -> bool:
        # The era seam's one question: is this client's era one the upstream speaks?
        return self.legacy if era is Era.LEGACY else self.modern

    @property
    def label(self) -> str:
        """`legacy`, `modern` or `both`: what /readyz and the log say."""
        if self.legacy and self.modern:
            return "both"
        return "legacy" if self.legacy else "modern"

    def describe(self) -> str:
        if self.legacy and self.modern:
            return "speaks 2025-11-25 and 2026-07-28: every client is forwarded in its own era"
        if self.legacy:
            return "speaks 2025-11-25 only: 2026-07-28 clients are bridged onto upstream sessions"
        return "speaks 2026-07-28 only: 2025-11-25 clients are bridged onto stateless requests"


BOTH = UpstreamEras(legacy=True, modern=True)

CONFIGURED: dict[EraSetting, UpstreamEras | None] = {
    "auto": None,
    "legacy": UpstreamEras(legacy=True, modern=False),
    "modern": UpstreamEras(legacy=False, modern=True),
}


Opener = Callable[[], AbstractAsyncContextManager[UpstreamChannel]]


class EraLearner:
    """The upstream's eras: the configured ones, or learnt by `get` (see the module docstring)."""

    def __init__(self, setting: EraSetting, stateless: Opener, probe_session: Opener) -> None:
        self._known = CONFIGURED[setting]
        self._stateless = stateless
        self._probe_session = probe_session
        self._lock = asyncio.Lock()

    @property
    def known(self) -> UpstreamEras | None:
        """What is known now; None before an auto upstream could be asked."""
        return self._known

    async def get(self, timeout_s: float) -> UpstreamEras:
        """The eras, asking the upstream first if they are not known yet (BOTH while it cannot be asked)."""
        if self._known is not None:
            return self._known
        async with self._lock:
            if self._known is None:
                learned = await self._ask(timeout_s)
                if learned is None:
                    return BOTH
                self._known = learned
                log.debug("the upstream %s", learned.describe())
        return self._known

    async def _ask(self, timeout_s: float) -> UpstreamEras | None:
        discover, discover_headers = MODERN.gateway_request(ERA_PROBE_ID, "server/discover", {})
        async with self._stateless() as channel:
            modern = await _answers(await channel.request(discover, discover_headers), timeout_s)
        async with self._probe_session() as channel:
            legacy = await _answers(await channel.request(probe_initialize(ERA_PROBE_ID), {}), timeout_s)
        if modern is None and legacy is None:
            return None
        # One question answered shows the upstream reachable: the other one's link failure (a legacy
        # HTTP server's plain-text 400 to a request without a session) means that era is not spoken.
        modern, legacy = bool(modern), bool(legacy)
        if not (modern or legacy):
            log.warning("the upstream answers neither server/discover nor initialize; forwarding every era as is")
            return BOTH
        return UpstreamEras(legacy=legacy, modern=modern)


async def _answers(exchange: Exchange, timeout_s: float) -> bool | None:
    """True when the request got a result, False for a JSON-RPC error or no answer in time, None when
    the link could not reach the upstream at all (or it answered with no JSON-RPC message)."""
    try:
        async with asyncio.timeout(timeout_s):
            final = (await exchange.collect())[-1]
    except TimeoutError:
        await exchange.cancel()
        return False
    if exchange.failure is not None:
        return None
    return isinstance(final.get("result"), dict)
