"""The replica side of owner leases (shared stores): renew this replica's leases, take over the tasks of
replicas whose leases expired, carry out the requests other replicas recorded for this one, and stop
working on a task another replica took over.

Every `ttl_s / 3`, at once when another replica records a request for this one, and as soon as the
earliest lease of the store expires (so that a dead owner's task is taken over when its lease ends,
not up to a period later), a tick:

- releases the leases of tasks that ended here, and renews the rest (compare-and-set on replica and
  epoch, one round trip for all); a renewal also reports a cancel or input answers waiting, which go
  the local way (`HostedTasks.cancel`, `TaskInput.update`) so the task's log records them;
- claims expired leases of other replicas' unfinished tasks and takes each over as at a restart
  (`takeover.take_over_task`): a hosted task gets `task.owner_lost` then `failed` (or `cancelled`, if a
  cancel was requested), a pass-through one is watched again after `capture.interrupted`.

A renewal that finds the task's epoch moved, or a write the store fenced, means another replica took
the task over: this replica cancels its local run (the upstream call, the watcher) without writing
anything and forgets the task (`TaskRegistry.release`). Only an expired lease is ever claimed: a long
task whose owner renews is never taken. A replica that stops gracefully lets its leases expire at once
(`hand_over`), once its runs are stopped, so the others take its tasks over without waiting a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from gateway.tasks.hosted import HostedTasks
from gateway.tasks.lease_store import LeaseStore, Renewal
from gateway.tasks.registry import Task, TaskRegistry
from gateway.tasks.takeover import LEASE_EXPIRED, PassthroughFor, take_over_task

__all__ = ["OwnerLeases"]

log = logging.getLogger("gateway.tasks.leases")

EXPIRY_SLACK_S = 0.02
"""Past the earliest lease's expiry before the scan it wakes: a timer may fire a little early, and the
store's clock must see the lease expired. Also the least wait between ticks."""


class OwnerLeases:
    def __init__(
        self, store: LeaseStore, registry: TaskRegistry, hosted: HostedTasks, passthrough_for: PassthroughFor
    ) -> None:
        self._store = store
        self._registry = registry
        self._hosted = hosted
        self._passthrough_for = passthrough_for
        self._runner: asyncio.Task[None] | None = None
        self._next_expiry_s: float | None = None
        """Seconds from the last tick's scan until the earliest lease then live expires (None: none)."""
        self._background: set[asyncio.Future[None]] = set()
        """Takeovers in progress, and local runs of tasks another replica took over being stopped: off
        the tick, so that a slow one (an upstream to rejoin) never delays the renewals."""
        store.on_lost = self._lost

    @property
    def period_s(self) -> float:
        return self._store.ttl_s / 3

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="owner-leases")

    async def _run(self) -> None:
        async with self._store.requests() as next_request:
            while True:
                signal = next_request()  # taken before the tick: a request during it wakes the next one
                self._next_expiry_s = None
                try:
                    await self.tick()
                except Exception as error:  # the store is unreachable: try again next period
                    log.warning("owner leases: a tick failed", extra={"error": repr(error)})
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.wait_s()):
                        await signal.wait()

    def wait_s(self) -> float:
        """Until the next tick: a period, or less when a lease expires sooner (see `_next_expiry_s`)."""
        if self._next_expiry_s is None:
            return self.period_s
        return min(self.period_s, self._next_expiry_s + EXPIRY_SLACK_S)

    async def tick(self) -> None:
        """Release, renew, carry out requests, then take over what expired."""
        ended: list[str] = []
        running: list[str] = []
        for task_id in self._store.leased():
            task = self._registry.find(task_id)
            if task is not None and self._registry.orphaned(task_id):
                continue  # no live runner here: not renewed, so another replica takes it over
            (ended if task is None or task.terminal else running).append(task_id)
        await self._store.release(ended)
        for task_id, renewal in (await self._store.renew(running)).items():
            await self._carry_out(task_id, renewal)
        for claim in await self._store.claim_expired():
            record = await self._registry.store.find(claim.task_id)
            if record is None or record.terminal:  # ended (or expired) since the claim
                await self._store.release([claim.task_id])
                continue
            # Adopted here, in the tick: the next tick renews it (a task it cannot find is released).
            self._spawn(self._take_over(self._registry.adopt(record), claim.cancel_requested))
        self._next_expiry_s = await self._store.next_expiry_s()

    async def _carry_out(self, task_id: str, renewal: Renewal) -> None:
        """The requests another replica recorded for a task this one runs, the local way."""
        task = self._registry.find(task_id)
        if task is None or task.terminal:
            return
        if renewal.input_waiting:
            for responses in await self._store.take_input(task_id):
                await self._hosted.input.update(task, responses)
        if renewal.cancel_requested and not task.terminal:
            await self._hosted.cancel(task, "lease-renewal")
            log.info("task cancelled at another replica's request", extra={"task": task_id})

    def _spawn(self, work: Awaitable[None]) -> None:
        future = asyncio.ensure_future(work)
        self._background.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[None]) -> None:
        self._background.discard(future)
        if not future.cancelled() and (error := future.exception()) is not None:
            log.warning("owner leases: background work failed", extra={"error": repr(error)})

    async def _take_over(self, task: Task, cancel_requested: bool) -> None:
        log.warning("taking over a task whose owner's lease expired", extra={"task": task.id})
        try:
            await take_over_task(
                self._registry, self._passthrough_for, task, LEASE_EXPIRED, cancel_requested=cancel_requested
            )
        except Exception as error:  # the store went away midway: let the lease lapse, to be claimed again
            log.warning("taking over a task failed; it will be claimed again", extra={"error": repr(error)})
            self._registry.release(task.id)
            self._store.forget(task.id)

    def _lost(self, task_id: str) -> None:
        """Another replica took the task over: stop its local run (its writes are fenced anyway)."""
        task = self._registry.release(task_id)
        if task is None or task.cancel is None:
            return
        hook, task.cancel = task.cancel, None
        self._spawn(hook())

    async def hand_over(self) -> None:
        """At a graceful stop, after the local runs stopped: the unfinished tasks go to other replicas at
        once (their leases expire now). Best effort: if the store is unreachable, the leases lapse."""
        try:
            await self._store.give_up()
        except Exception as error:
            log.warning("owner leases: could not hand the tasks over", extra={"error": repr(error)})

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for future in list(self._background):
            future.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
