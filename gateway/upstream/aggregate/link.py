"""`AggregateUpstream`: every configured upstream as one `Upstream`, for the gateway stack at `/mcp`.

Above it the gateway sees one MCP server of both eras (sessions through `open_session`, 2026-07-28
requests through `stateless`); below it each upstream is an `Upstream` of its own, which this class
does not start or close (their own stacks at `/servers/NAME/mcp` use them too). What is routed where
is `channel`'s; how names, cursors and capabilities read is `naming`'s.

The integrator keeps `usable` (per-upstream readiness) current and calls `upstream_changed` when an
upstream turns usable or unusable, and `serve` when a config reload adds or removes upstreams: every
open session hears the lists changed (and drops its session with an upstream that left).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from cachetools import TTLCache

from gateway.buffers import BufferBudget
from gateway.protocol.jsonrpc import RequestId
from gateway.upstream.aggregate.channel import unavailable
from gateway.upstream.aggregate.listen import LIST_FILTERS, list_changed
from gateway.upstream.aggregate.naming import Names
from gateway.upstream.aggregate.request import ProbeChannel, RequestChannel
from gateway.upstream.aggregate.resources import ResourceOwners
from gateway.upstream.aggregate.session import SessionChannel
from gateway.upstream.base import Exchange, Upstream, UpstreamChannel

log = logging.getLogger("gateway.upstream.aggregate")

PINNED_TTL_S = 600.0
"""How long a pinned affinity (a requestState, a task id) remembers its upstream, as the links do."""


class AggregateUpstream(Upstream):
    """The upstreams (in configured order) behind one server; see the module docstring."""

    def __init__(
        self,
        upstreams: Mapping[str, Upstream],
        separator: str,
        timeout_s: float,
        *,
        budget: BufferBudget | None = None,
    ) -> None:
        self.upstreams: dict[str, Upstream] = dict(upstreams)
        self.names = Names(list(self.upstreams), separator)
        self.timeout_s = timeout_s
        """Bounds each request the aggregate makes itself (an upstream's initialize, discover, setLevel)."""
        self.budget = budget or BufferBudget()
        self.usable: Callable[[str], bool] = lambda upstream: True
        """Whether an upstream may be used now (set by the integrator: per-upstream readiness)."""
        self.resources = ResourceOwners(self.names)
        self.modern_tag = secrets.token_hex(4)
        """The tag of every 2026-07-28 request channel (see `RequestChannel.tag`)."""
        self.handshakes: dict[tuple[str, str], dict[str, Any]] = {}
        """(upstream, protocol version) -> its initialize result, learnt from the first session that
        asked; forgotten when the upstream's usability changes (a restarted server may declare more)."""
        self._pins: TTLCache[str, str] = TTLCache(maxsize=4096, ttl=PINNED_TTL_S)
        self._sessions: set[SessionChannel] = set()
        self.listens: dict[Exchange, tuple[RequestId, dict[str, Any]]] = {}
        """Open 2026-07-28 listens (their client's exchange) -> (the listen's id, its filter)."""
        self._background: set[asyncio.Task[None]] = set()
        self._warned: set[tuple[str, str]] = set()

    @property
    def outlives_gateway(self) -> bool:  # type: ignore[override]
        return all(upstream.outlives_gateway for upstream in self.upstreams.values())

    # -- what the channels ask --------------------------------------------------------------------

    def usable_upstreams(self) -> list[str]:
        return [name for name in self.names.upstreams if self.usable(name)]

    def served(self, name: str) -> Upstream:
        """Upstream `name`; a ProtocolError once a config reload has removed it."""
        if (upstream := self.upstreams.get(name)) is None:
            raise unavailable(name)
        return upstream

    def upstream_of(self, name: str) -> str | None:
        """The upstream a prefixed tool (or prompt) name is, None for a name none owns."""
        return self.names.owner(name)

    def warn_once(self, upstream: str, tool: str) -> None:
        if (upstream, tool) not in self._warned:
            self._warned.add((upstream, tool))
            log.warning(
                "a tool's prefixed name is not a valid tool name (at most 128 of A-Z a-z 0-9 _ . -); "
                "it is left out of the aggregate",
                extra={"upstream": upstream, "tool": tool},
            )

    def own(self, task: asyncio.Task[None]) -> None:
        """Hold a channel's background work until it ends (cancelled on `close`)."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def forget(self, channel: SessionChannel) -> None:
        self._sessions.discard(channel)

    # -- the Upstream interface -------------------------------------------------------------------

    async def open_session(self) -> UpstreamChannel:
        channel = SessionChannel(self)
        self._sessions.add(channel)
        return channel

    @asynccontextmanager
    async def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AsyncIterator[UpstreamChannel]:
        routed = None
        if affinity is not None and (upstream := self._owner_of(affinity)) is not None:
            routed = (upstream, self._child_affinity(upstream, affinity))
        channel = RequestChannel(self, routed, beside, owner)
        try:
            yield channel
        finally:
            await channel.close()

    def _owner_of(self, affinity: str) -> str | None:
        """The upstream an affinity belongs to: a prefixed requestState or task id says so itself, and
        so does a gateway task id (`tag.upstream__id`); else the one it was pinned to."""
        owned = self.names.split(affinity) or self.names.split(affinity.partition(".")[2])
        return owned[0] if owned is not None else self._pins.get(affinity)

    def _child_affinity(self, upstream: str, affinity: str) -> str:
        """The affinity as `upstream` knows it (its own requestState; a task id stays the gateway's)."""
        owned = self.names.split(affinity)
        return owned[1] if owned is not None and owned[0] == upstream else affinity

    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        routed = channel.routed if isinstance(channel, RequestChannel) else None
        if routed is None:
            return
        upstream, child = routed
        self._pins[affinity] = upstream
        if (link := self.upstreams.get(upstream)) is not None:
            link.pin(self._child_affinity(upstream, affinity), child)

    @asynccontextmanager
    async def probe_session(self) -> AsyncIterator[UpstreamChannel]:
        yield ProbeChannel()

    async def upstream_changed(self, name: str) -> None:
        """`name` turned usable or unusable: open sessions hear their lists changed, and what the
        aggregate declares is asked again."""
        log.info("upstream %s changed usability; announcing list changes", name)
        await self._announce([name])

    async def serve(self, upstreams: Mapping[str, Upstream], changed: Iterable[str]) -> None:
        """Serve `upstreams` (in configured order) from now on: a config reload added or removed those
        `changed`. Names are read anew (a removed upstream's own nothing here any more), resource owners
        learnt anew, and open sessions hear the lists changed."""
        self.upstreams = dict(upstreams)
        self.names = Names(list(self.upstreams), self.names.separator)
        self.resources = ResourceOwners(self.names)
        if names := list(changed):  # else only their order changed
            await self._announce(names)

    async def _announce(self, names: list[str]) -> None:
        """`names` came, went, or changed usability: what the aggregate declares is asked again, each
        open session drops its session with those now unusable and hears its lists changed."""
        self.__dict__.pop("_discovery", None)
        for key in [key for key in self.handshakes if key[0] in names]:
            del self.handshakes[key]
        unusable = [name for name in names if not self.usable(name)]
        for channel in list(self._sessions):
            for name in unusable:
                channel.drop_child(name)
            await channel.announce_lists()
        for out, (listen_id, filters) in list(self.listens.items()):
            if out.finished:  # its client has gone; the relay forgets it as it ends
                continue
            for flag, method in LIST_FILTERS.items():
                if filters.get(flag):
                    await out.deliver(list_changed(listen_id, method))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        sessions = list(self._sessions)
        await asyncio.gather(*(channel.close() for channel in sessions), return_exceptions=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
