"""A legacy `tasks/result` of a gateway-hosted task still running: the wait the edge carries out (the
`ResultWait` of a `plans.AwaitResult`), and how the task's server-to-client requests reach the client's
session and its answers come back to the task (`route_answer`).

No HTTP: the edge writes keep-alives while `next` waits, the requests it returns, and the final answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from gateway.events.log import StoreUnavailable
from gateway.events.stream import STORE_RETRY_MAX_S
from gateway.protocol.dialect import unknown_task
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.sessions import Session
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.records import TaskRecord
from gateway.tasks.registry import PendingRequest, Task
from gateway.waiting import wait_any


class TaskResultWait:
    """Wait until the task ends, then answer exactly the outcome the store keeps (`HostedTasks.result`).

    A task this process runs (`task`) wakes the wait when it ends, and its server-to-client requests
    are carried to the client as they come (SEP-1686 input_required); the wait holds the task's
    `result_streams` until `close`. A task another process runs (`task` None) is watched through its
    log, which that process seals when the task ends, then read again from the store; its requests
    reach the client only through that process."""

    def __init__(
        self, hosted: HostedTasks, record: TaskRecord, task: Task | None, session: Session, request_id: RequestId
    ) -> None:
        self._hosted = hosted
        self._record = record
        self._task = task
        self._session = session
        self._request_id = request_id
        self._carrying = True
        self._claimed = False
        if task is not None:
            task.result_streams += 1

    async def next(self, wait_s: float) -> tuple[list[Message], Message | None]:
        """The task's requests to carry to the client now, or the final answer; ([], None) when
        `wait_s` passed with neither (time for a keep-alive)."""
        task = self._task
        while True:
            claimed = self._hosted.input.claim_undelivered(task) if task is not None else []
            if claimed:
                assert task is not None
                for pending in claimed:
                    route_answer(self._hosted, self._session, task, pending)
                    pending.carried_by = self._carries
                self._claimed = True
                return [pending.request for pending in claimed], None
            try:
                record = await self._hosted.reads.record(self._record.owner, self._record.id)
            except StoreUnavailable:  # wait for the store, with keep-alives, as a stream does
                await asyncio.sleep(min(wait_s, STORE_RETRY_MAX_S))
                return [], None
            if record is None:  # its ttl ran out meanwhile
                return [], unknown_task(self._request_id).to_message()
            if record.terminal:
                return [], await self._hosted.result(record, self._request_id)
            self._record = record
            woken = await (wait_any((task.done, task.undelivered), wait_s) if task is not None else self._watch(wait_s))
            if not woken:
                return [], None

    async def _watch(self, wait_s: float) -> bool:
        """Wait for the log of a task another process runs to grow or be sealed."""
        log, record = self._hosted.reads.log, self._record
        with contextlib.suppress(StoreUnavailable):  # read again after the poll interval
            bounds = await log.bounds(record.id)
            if bounds is not None and not bounds.sealed:
                return await log.wait(record.id, bounds.next_seq - 1, wait_s)
        # Sealed a moment before the record turns terminal (the log is written first), or gone with the
        # record: read the store again after the task's poll interval, not in a busy loop.
        await asyncio.sleep(min(wait_s, record.poll_interval_ms / 1000))
        return False

    def _carries(self) -> bool:
        return self._carrying

    def close(self) -> None:
        task = self._task
        self._carrying = False
        if task is None:
            return
        task.result_streams -= 1
        if self._claimed and any(not pending.delivered for pending in task.pending_requests.values()):
            task.undelivered.set()  # unanswered: another (or the next) tasks/result carries them


def route_answer(hosted: HostedTasks, session: Session, task: Task, pending: PendingRequest) -> None:
    """The client's response to `pending`, POSTed on `session`, goes to the task (and on upstream)."""

    async def route(message: Message, headers: Mapping[str, str]) -> None:
        await hosted.input.answer(task, message, headers)

    session.note_outgoing(pending.request, route)
    pending.forget.append(lambda: session.forget_response(pending.id, route))
