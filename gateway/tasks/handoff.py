"""A 2026-07-28 tools/call the gateway may turn into a task it hosts, as the edge relays it.

The service plans the call as a forward whose `RelayHooks.handoff` is a `TaskHandoff` (the
`plans.CallHandoff` the relay calls back): until the policy's deadline the upstream's answer reaches
the client as it is (or, under `always`/`required`, as a task that already ended: `result_as_task`);
a call still running at the deadline becomes a task, which takes the upstream exchange over and runs it
to its end (`take_over`). What the upstream sent before (its progress and log notifications) becomes
the task's first events; the client sees live only the notifications it asked for.

No HTTP: the edge decides nothing here, it only says when the deadline came and what passed.
"""

from __future__ import annotations

import math
import time

from gateway.events.log import StoreUnavailable
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LOG_LEVEL_KEY
from gateway.protocol.jsonrpc import Message, Unavailable
from gateway.tasks.hosted import Caller, HostedTasks
from gateway.tasks.input import UpstreamCall, input_required
from gateway.tasks.plans import TaskCall
from gateway.tasks.registry import STORE_UNAVAILABLE, Task, TaskLimitReached
from gateway.upstream.base import Exchange


class TaskHandoff:
    """One forwarded call, the hosted tasks it may become one of, and what the upstream sent so far."""

    def __init__(self, hosted: HostedTasks, call: TaskCall, upstream: UpstreamCall, wait_s: float) -> None:
        self.deadline = time.monotonic() + wait_s
        """When (time.monotonic()) a call still running becomes a task; math.inf once none can be."""
        self._hosted = hosted
        self._call = call
        self._caller = Caller(call.owner, call.era)
        self._upstream = upstream
        self._observed: list[Message] = []
        meta = jsonrpc.meta_of(call.message)
        # The gateway asks the upstream for progress and logs to record them: the client sees only its own.
        self._client_progress, self._client_logs = "progressToken" in meta, LOG_LEVEL_KEY in meta

    def observe(self, messages: list[Message]) -> list[Message]:
        """Keep what the upstream sent before its answer (the task's first events, if one is made);
        the ones the client asked for, to relay now."""
        self._observed.extend(messages)
        return [message for message in messages if self._client_asked(message)]

    async def take_over(self, exchange: Exchange) -> Message | None:
        """The deadline came with the call still running: a task takes the exchange over, and the client
        gets its CreateTaskResult (or, with the store down, the call ends with a 503 error). None, without
        waiting: no room for a task (a ceiling), the call carries on as a plain call."""
        if not self._room_for_task():
            self.deadline = math.inf
            return None
        try:
            task = await self._adopt()
        except StoreUnavailable:  # no task can hold the call: it ends here, and the client is told
            await exchange.cancel()
            what = "the task store cannot be used now"
            return Unavailable(STORE_UNAVAILABLE, what, request_id=self._call.message["id"]).to_message()
        self._hosted.run(task, self._caller, self._upstream, exchange, self._call.keep_resources())
        return self._hosted.created(self._caller, task, self._call.message["id"])

    async def result_as_task(self, final: Message) -> Message:
        """The upstream's answer within the deadline, as a task that already ended: a result `completed`,
        a JSON-RPC error `failed` (inlined). SEP-2663 has only an InputRequiredResult come before a task,
        so that one, and any answer once tasks made since the call came in filled the room (checked
        then), reach the client as they are; so does an answer with the store down."""
        if input_required(final) or not self._room_for_task():
            return final
        try:
            task = await self._adopt()
        except StoreUnavailable:
            return final
        await self._hosted.finish(task, self._caller, final)
        return self._hosted.created(self._caller, task, self._call.message["id"])

    async def _adopt(self) -> Task:
        """The call's task, with the notifications relayed so far as its first events."""
        task = await self._hosted.create(self._caller, self._call.message)
        registry = self._hosted.registry
        events = [event for message in self._observed if (event := registry.capture_from(task, message)) is not None]
        if events:
            await registry.record(task, *events)
        return task

    def _room_for_task(self) -> bool:
        try:
            self._hosted.registry.check_room(self._caller.owner)
        except TaskLimitReached:
            return False
        return True

    def _client_asked(self, message: Message) -> bool:
        method = message.get("method")
        return (method != "notifications/progress" or self._client_progress) and (
            method != "notifications/message" or self._client_logs
        )
