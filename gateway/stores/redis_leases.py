"""Owner leases on the Redis store (`LeaseStore`): each replica's leases, takeover claims, and the
requests other replicas record for a task's owner.

A task's lease is its hash's `replica` and `lease` fields (expiry in Redis server time, ms: every
replica's leases are measured by one clock, so skewed hosts cannot steal or keep a lease), mirrored in
the lease set (`RedisKeys.leases`, scored by expiry) that takeover scans read. Renewal is one script
per task, compare-and-set on (replica, epoch), all of a tick's in one pipeline; a claim is one script
that moves an expired lease's task to epoch + 1 (the script is atomic: the lease is still expired and
the epoch the one it read). Requests (`cancel`, input answers in the task's input list) are recorded by
one script that also `PUBLISH`es the task id on the owner's control channel, which the owner listens to
on the wake-up connection; renewals report what is waiting, so a lost notification costs a renewal
period, never the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.stores.redis_backend import FENCED_EPOCH, RedisBackend
from gateway.tasks.lease_store import Claim, LeaseStore, Renewal

__all__ = ["RedisLeases"]

SCAN_BATCH = 100
"""Expired leases claimed per scan at most (the next scan takes the rest)."""


class RedisLeases(LeaseStore):
    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._client: Any = backend.client
        self.ttl_s = backend.lease_ttl_ms / 1000
        self.on_lost = None
        self._leased: set[str] = set()
        backend.on_held = self._leased.add
        backend.on_fenced = self._fenced

    @property
    def replica(self) -> str:
        return self._backend.replica

    def _fenced(self, task_id: str) -> None:
        self._leased.discard(task_id)
        if self.on_lost is not None:
            self.on_lost(task_id)

    def leased(self) -> list[str]:
        return sorted(self._leased)

    async def renew(self, task_ids: list[str]) -> dict[str, Renewal]:
        return await self._renew(task_ids, self._backend.lease_ttl_ms)

    async def give_up(self) -> None:
        self.on_lost = None  # stopping: no local run is left to stop
        await self._renew(self.leased(), 0)  # expiring now, still by compare-and-set
        self._leased.clear()

    async def _renew(self, task_ids: list[str], ttl_ms: int) -> dict[str, Renewal]:
        """Set the leases of `task_ids` this replica holds to expire `ttl_ms` from now (one pipeline)."""
        if not task_ids:
            return {}
        keys = self._backend.keys
        pipe = self._client.pipeline(transaction=False)
        for task_id in task_ids:
            epoch = self._backend.epoch_of(task_id)
            args: list[str | int] = [self.replica, -1 if epoch is None else epoch, ttl_ms]
            await self._backend.scripts.renew_lease(
                keys=[keys.task(task_id)[0], keys.inputs(task_id)], args=args, client=pipe
            )
        renewed: dict[str, Renewal] = {}
        scores: dict[str, int] = {}
        for task_id, found in zip(task_ids, await pipe.execute(), strict=True):
            held = int(found[0])
            if held == 0:
                self._backend.fenced(task_id)  # taken over (or gone): another replica's now
            if held != 1:  # (2: it ended here as the renewal ran: released on the next tick)
                continue
            scores[task_id] = int(found[1])
            renewed[task_id] = Renewal(cancel_requested=bool(found[2]), input_waiting=bool(found[3]))
        if scores:
            await self._client.zadd(keys.leases, scores, xx=True)
        return renewed

    async def release(self, task_ids: list[str]) -> None:
        if not task_ids:
            return
        self._leased.difference_update(task_ids)
        for task_id in task_ids:
            # Ended: nothing is taken over any more, so nothing to fence (a fenced epoch stays: it holds
            # off the late writes of a run another replica took over).
            if self._backend.held.get(task_id, FENCED_EPOCH) != FENCED_EPOCH:
                del self._backend.held[task_id]
        await self._client.zrem(self._backend.keys.leases, *task_ids)

    def forget(self, task_id: str) -> None:
        self._leased.discard(task_id)

    async def _now_ms(self) -> int:
        seconds, micros = await self._client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def next_expiry_s(self) -> float | None:
        now_ms = await self._now_ms()
        earliest = await self._client.zrangebyscore(
            self._backend.keys.leases, f"({now_ms}", "+inf", start=0, num=1, withscores=True
        )
        return (earliest[0][1] - now_ms) / 1000 if earliest else None

    async def claim_expired(self) -> list[Claim]:
        keys = self._backend.keys
        now_ms = await self._now_ms()
        members = await self._client.zrangebyscore(keys.leases, "-inf", now_ms, start=0, num=SCAN_BATCH)
        claims: list[Claim] = []
        for member in members:
            task_id = member.decode()
            if task_id in self._leased:
                continue  # this replica's own, renewed late (it was paused): the next renewal says
            found = await self._backend.scripts.claim_lease(
                keys=[keys.task(task_id)[0]], args=[self.replica, self._backend.lease_ttl_ms]
            )
            outcome = int(found[0])
            if outcome == -1:  # ended, or no record: nothing to lease
                await self._client.zrem(keys.leases, task_id)
            elif outcome == 0:  # renewed after all (or claimed by another replica first)
                await self._client.zadd(keys.leases, {task_id: int(found[1])})
            else:
                self._backend.hold(task_id, int(found[1]))
                await self._client.zadd(keys.leases, {task_id: int(found[2])})
                claims.append(Claim(task_id, cancel_requested=bool(found[3])))
        return claims

    async def _request(self, task_id: str, kind: str, payload: bytes) -> bool:
        keys = self._backend.keys
        args: list[str | bytes] = [kind, payload, keys.control, task_id]
        return bool(await self._backend.scripts.request(keys=[keys.task(task_id)[0], keys.inputs(task_id)], args=args))

    async def request_cancel(self, task_id: str) -> bool:
        return await self._request(task_id, "cancel", b"")

    async def request_input(self, task_id: str, responses: dict[str, Any]) -> bool:
        return await self._request(task_id, "input", orjson.dumps(responses))

    async def take_input(self, task_id: str) -> list[dict[str, Any]]:
        answers = await self._backend.scripts.take_input(keys=[self._backend.keys.inputs(task_id)])
        return [orjson.loads(answer) for answer in answers]

    @contextlib.asynccontextmanager
    async def requests(self) -> AsyncIterator[Callable[[], asyncio.Event]]:
        async with self._backend.wake_ups.watching(self._backend.keys.control + self.replica) as watched:
            yield lambda: watched.signal
