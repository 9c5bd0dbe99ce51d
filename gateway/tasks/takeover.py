"""Taking over: what becomes of the tasks a previous process on the same stores left unfinished.

The same happens to a task of a replica on a shared store (Redis) whose owner lease expired, when
another replica claims it (`gateway.tasks.leases`).

A gateway-hosted task cannot be resumed: its upstream call (a stdio child's, or a 2026-07-28 request)
died with the process that made it. Nor can a task that lived in a stdio upstream (the gateway's child
process). Each gets a `task.owner_lost` event saying why, then `failed` with an error outcome
(`data.reason` "owner_lost"). A task an HTTP upstream holds is watched again under its stored upstream
id (a 2025-11-25 one on its stored upstream session), after a `capture.interrupted` event
(`Passthrough.resume`). Clients resume their streams with `after` as after any disconnect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.tasks.lifecycle import Event
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import Task, TaskRegistry
from gateway.upstream.base import CLIENT_CANCEL_REASON

log = logging.getLogger("gateway.tasks.takeover")

OWNER_LOST = "task.owner_lost"
"""The event recorded before a task the gateway lost turns `failed`."""
OWNER_LOST_REASON = "owner_lost"
"""`data.reason` of the error kept as the outcome of a task the gateway lost."""


PassthroughFor = Callable[[Task], Passthrough | None]
"""The pass-through watcher of the endpoint a task was created on (None: no endpoint serves it now,
e.g. its upstream left the configuration)."""


async def take_over(registry: TaskRegistry, passthrough_for: PassthroughFor) -> None:
    """Fail or watch again every task the stores hold unfinished. Once, before the gateway serves."""
    for task in await registry.adopt_unfinished():
        await take_over_task(registry, passthrough_for, task, RESTARTED)


async def take_over_task(
    registry: TaskRegistry, passthrough_for: PassthroughFor, task: Task, gone: str, *, cancel_requested: bool = False
) -> None:
    """What becomes of one task whose owner is `gone` (a sentence: why it no longer runs the task), at a
    restart or when another replica's lease expired: watched again if the upstream holds it, else lost;
    `cancelled` instead of `failed` when a client had asked to cancel it."""
    passthrough = passthrough_for(task) if task.record.upstream is not None else None
    if passthrough is not None and await passthrough.resume(task):
        log.info("watching an upstream task again", extra={"task": task.id})
    else:
        await lose(registry, task, _cause(task, gone), cancelled=cancel_requested)


RESTARTED = "the gateway process running the task ended"
LEASE_EXPIRED = "the gateway replica running the task stopped renewing its lease"


def _cause(task: Task, gone: str) -> str:
    if task.record.upstream is None:
        return f"{gone}, and its upstream call with it: it cannot be resumed"
    return f"{gone}, and the upstream conversation that held the task ended with it: it cannot be watched again"


async def lose(registry: TaskRegistry, task: Task, cause: str, *, cancelled: bool = False) -> None:
    """Record that the gateway lost `task` (`task.owner_lost`), then fail it with an outcome saying why
    (or, if a client had asked to cancel it, cancel it)."""
    hosted_by = "gateway" if task.record.upstream is None else "upstream"
    note = registry.capture.lifecycle(OWNER_LOST, cause=cause, hostedBy=hosted_by)
    if cancelled:
        await registry.feed(task, Event.OWNER_LOST, TaskStatus.CANCELLED, CLIENT_CANCEL_REASON, note=note)
    else:
        await registry.feed(task, Event.OWNER_LOST, TaskStatus.FAILED, cause, outcome=lost_outcome(cause), note=note)
    log.warning("task lost with the process that ran it", extra={"task": task.id})


def lost_outcome(cause: str) -> Message:
    """The outcome kept for a task the gateway lost: -32603 with `data.reason` "owner_lost"."""
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": cause, "data": {"reason": OWNER_LOST_REASON}}}
