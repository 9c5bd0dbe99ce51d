"""Start and stop for parts that are not the whole app's: each of several upstreams' link and sessions
(`Groups`), so a config reload can start an added upstream's while the app serves, and stop a removed
one's once it has drained, as the app's cleanup contexts start and stop the rest.

A builder registers its start and stop on a `Lifecycle`: the app itself (`web.Application`) or one
upstream's `Group`, run in the same way (started in order, stopped in reverse)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from aiohttp import web

log = logging.getLogger("gateway")

StartStop = Callable[[web.Application], AsyncIterator[None]]
"""A part's start (up to its `yield`) and stop (after it), as an aiohttp cleanup context."""


class StartStops(Protocol):
    def append(self, start_stop: StartStop, /) -> None: ...


class Lifecycle(Protocol):
    """What a builder registers its parts' start and stop on (`web.Application` is one)."""

    @property
    def cleanup_ctx(self) -> StartStops: ...


class Group:
    """One upstream's parts, started and stopped together (`start`, `stop`)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.cleanup_ctx: list[StartStop] = []
        self._running: list[AsyncIterator[None]] = []

    async def start(self) -> None:
        """Start each part in order; if one fails, those started are stopped and the failure raised."""
        try:
            for context in self.cleanup_ctx:
                running = context(self.app)
                await anext(running)
                self._running.append(running)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the started parts in reverse order (a failure is logged: the others still stop)."""
        while self._running:
            running = self._running.pop()
            try:
                await anext(running, None)
            except Exception:
                log.exception("an upstream's part failed to stop")


class Groups:
    """The groups of the upstreams served now: those there at start start with the app (where the app's
    cleanup context of `Groups` stands), and every group still here stops with it."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._groups: list[Group] = []
        app.cleanup_ctx.append(self._running)

    def add(self, group: Group) -> None:
        """`group` starts with the app (an upstream there at start)."""
        self._groups.append(group)

    async def start(self, group: Group) -> None:
        """Start the group of an upstream added while the app serves (kept only if it starts)."""
        await group.start()
        self._groups.append(group)

    async def stop(self, group: Group) -> None:
        """Stop `group` now (a removed upstream's, drained): it no longer stops with the app."""
        if group in self._groups:
            self._groups.remove(group)
            await group.stop()

    async def _running(self, _: web.Application) -> AsyncIterator[None]:
        started: list[Group] = []
        try:
            for group in list(self._groups):
                await group.start()
                started.append(group)
        except BaseException:
            for group in reversed(started):
                await group.stop()
            raise
        yield
        for group in reversed(list(self._groups)):
            await group.stop()
