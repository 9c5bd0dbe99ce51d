"""Taking over at start-up: what becomes of the tasks a previous process on the same stores left unfinished.

A gateway-hosted task cannot be resumed: its upstream call (a stdio child's, or a 2026-07-28 request)
died with the process that made it. Nor can a task that lived in a stdio upstream (the gateway's child
process). Each gets a `task.owner_lost` event saying why, then `failed` with an error outcome
(`data.reason` "owner_lost"). A task an HTTP upstream holds is watched again under its stored upstream
id (a 2025-11-25 one on its stored upstream session), after a `capture.interrupted` event
(`Passthrough.resume`). Clients resume their streams with `after` as after any disconnect.
"""

from __future__ import annotations

import logging

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import Task, TaskRegistry

log = logging.getLogger("gateway.tasks.takeover")

OWNER_LOST = "task.owner_lost"
"""The event recorded before a task the gateway lost turns `failed`."""
OWNER_LOST_REASON = "owner_lost"
"""`data.reason` of the error kept as the outcome of a task the gateway lost."""


async def take_over(registry: TaskRegistry, passthrough: Passthrough) -> None:
    """Fail or watch again every task the stores hold unfinished. Once, before the gateway serves."""
    for task in await registry.adopt_unfinished():
        if task.record.upstream is not None and await passthrough.resume(task):
            log.info("watching an upstream task again after a restart", extra={"task": task.id})
        else:
            await lose(registry, task, _cause(task))


def _cause(task: Task) -> str:
    if task.record.upstream is None:
        return "the gateway process running the task ended, and its upstream call with it: it cannot be resumed"
    return (
        "the gateway process watching the task ended, and the upstream conversation that held the task "
        "ended with it: it cannot be watched again"
    )


async def lose(registry: TaskRegistry, task: Task, cause: str) -> None:
    """Record that the gateway lost `task` (`task.owner_lost`), then fail it with an outcome saying why."""
    hosted_by = "gateway" if task.record.upstream is None else "upstream"
    await registry.record(task, registry.capture.lifecycle(OWNER_LOST, cause=cause, hostedBy=hosted_by))
    await registry.set_status(task, TaskStatus.FAILED, cause, outcome=lost_outcome(cause))
    log.warning("task lost with the process that ran it", extra={"task": task.id})


def lost_outcome(cause: str) -> Message:
    """The outcome kept for a task the gateway lost: -32603 with `data.reason` "owner_lost"."""
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": cause, "data": {"reason": OWNER_LOST_REASON}}}
