"""Wake-ups for the Redis store's waiters: one pub/sub connection per backend, subscribed only to the
channels of tasks with local waiters.

An append script `PUBLISH`es on its task's channel; the reader task here wakes that task's local
waiters, which then read the task's hash. A wake-up can be lost (a reconnect, a subscription that lands
just after the publish): waiters also read every `SAFETY_POLL_S`, and all of them are woken after a
reconnect, so a lost wake-up costs latency, never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["SAFETY_POLL_S", "UNAVAILABLE", "WakeUps"]

log = logging.getLogger("gateway.stores.redis")

SAFETY_POLL_S = 3.0
"""How often a waiter reads its task's hash without a wake-up: the most a lost wake-up can cost."""
RECONNECT_DELAY_S = 0.2
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
"""What an unreachable or restarting server raises."""


@dataclass(slots=True)
class _Channel:
    """The local waiters of one task: a signal set (and replaced) on each wake-up."""

    waiters: int = 0
    signal: asyncio.Event = field(default_factory=asyncio.Event)
    idle_since: float = 0.0
    """When the last waiter left (loop time): the channel is unsubscribed after `SAFETY_POLL_S` idle, so
    a reader going from one wait to the next does not unsubscribe and subscribe again."""

    def wake(self) -> None:
        self.signal.set()
        self.signal = asyncio.Event()


class WakeUps:
    """One pub/sub connection, subscribed only to the channels of tasks with local waiters."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._channels: dict[str, _Channel] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        """Wake-ups ignored on purpose (`drop_next`): what the tests use to lose one."""
        self._drop = 0

    def drop_next(self, count: int = 1) -> None:
        """Ignore the next `count` wake-ups, as if the network had lost them (for tests)."""
        self._drop += count

    @contextlib.asynccontextmanager
    async def watching(self, channel: str) -> AsyncIterator[_Channel]:
        watched = self._channels.get(channel)
        if watched is None:
            watched = self._channels[channel] = _Channel()
            with contextlib.suppress(*UNAVAILABLE):  # the safety poll covers for a failed subscribe
                await self._pubsub.subscribe(channel)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read(), name="redis-wake-ups")
        watched.waiters += 1
        try:
            yield watched
        finally:
            watched.waiters -= 1
            if not watched.waiters:
                watched.idle_since = asyncio.get_running_loop().time()

    async def _unsubscribe_idle(self) -> None:
        """Unsubscribe the channels without waiters for `SAFETY_POLL_S` (only the reader task does this)."""
        cutoff = asyncio.get_running_loop().time() - SAFETY_POLL_S
        idle = [name for name, watched in self._channels.items() if not watched.waiters and watched.idle_since < cutoff]
        if not idle:
            return
        for name in idle:
            del self._channels[name]
        with contextlib.suppress(*UNAVAILABLE):
            await self._pubsub.unsubscribe(*idle)
            revived = [name for name in idle if name in self._channels]  # a waiter came meanwhile
            if revived:
                await self._pubsub.subscribe(*revived)

    def wake_all(self) -> None:
        for watched in self._channels.values():
            watched.wake()

    async def _read(self) -> None:
        lost = False  # warned about a lost connection: once per outage
        swept = asyncio.get_running_loop().time()
        while True:
            try:
                message = await self._pubsub.get_message(timeout=SAFETY_POLL_S)
            except UNAVAILABLE as error:
                if not lost:
                    log.warning(
                        "redis wake-up connection lost; catching up after reconnect", extra={"error": str(error)}
                    )
                lost = True
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.wake_all()  # the catch-up: every waiter reads its task again
                continue
            lost = False
            now = asyncio.get_running_loop().time()
            if now - swept >= SAFETY_POLL_S:
                swept = now
                await self._unsubscribe_idle()
            if message is None or message.get("type") != "message":
                continue
            if self._drop:
                self._drop -= 1
                self.dropped += 1
                continue
            channel = message["channel"]
            watched = self._channels.get(channel.decode() if isinstance(channel, bytes) else channel)
            if watched is not None:
                watched.wake()

    async def close(self) -> None:
        self._closed = True
        self.wake_all()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(*UNAVAILABLE):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed in newer redis-py
