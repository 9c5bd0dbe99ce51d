"""Input mid-task for gateway-hosted tasks: the upstream asks, the client answers, the call goes on.

2025-11-25: the upstream sends server-to-client requests (elicitation, sampling) on the task's call;
the task goes `input_required`, each request waits (`PendingRequest`) until an open `tasks/result`
stream, else the owning session's GET stream, carries it to the client, and the client's response goes
back upstream on the call's channel. 2026-07-28 (MRTR): the call ends with `resultType:
"input_required"`; the task shows the round's `inputRequests` under keys unique over its life, collects
answers through `tasks/update`, and the call is retried upstream with `inputResponses` and the echoed
`requestState`. Every step is an `input.*` event in the task's log. No HTTP here: the service's plans
carry the requests to the client (`plans.AwaitResult`, or the session's GET stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.events.summaries import method_of, summarize_answer, summarize_request
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.protocol.names import RELATED_TASK_KEY
from gateway.tasks.lifecycle import Event
from gateway.tasks.registry import InputRound, PendingRequest, Task, TaskRegistry
from gateway.upstream.base import UpstreamChannel
from gateway.waiting import wait_any

log = logging.getLogger("gateway.tasks.input")

MAX_INPUT_ROUNDS = 32
"""How many times a 2026-07-28 task's call may answer `input_required` before the task fails."""
STATE_ONLY_RETRY_S = 0.2
"""Pause before retrying an `input_required` round that asks for nothing (only `requestState`)."""


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A task's tools/call as the upstream first got it, and the channel it runs on.

    The task holds the channel until it ends, so an `input_required` retry goes to the same upstream:
    the SDK's default `requestState` key lives in one process, and another pooled process would refuse
    the echoed state."""

    channel: UpstreamChannel
    message: Message
    headers: Mapping[str, str]


def input_required(outcome: Message | None) -> bool:
    """Whether a 2026-07-28 response asks for input (MRTR) rather than ending the call."""
    result = outcome.get("result") if outcome is not None else None
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def with_related_task(message: Message, task_id: str) -> Message:
    params = jsonrpc.params_of(message)
    meta = {**jsonrpc.meta_of(message), RELATED_TASK_KEY: {"taskId": task_id}}
    return {**message, "params": {**params, "_meta": meta}}


def input_responses(params: dict[str, Any], request_id: RequestId) -> dict[str, Any]:
    """The `inputResponses` of a tasks/update (none: empty), or -32602 when they are not key -> object."""
    responses = params.get("inputResponses")
    if responses is None:
        return {}
    if not isinstance(responses, dict) or not all(isinstance(value, dict) for value in responses.values()):
        raise ProtocolError(
            jsonrpc.INVALID_PARAMS,
            "Invalid params: inputResponses must map input keys to response objects",
            request_id=request_id,
        )
    return responses


def fresh_key(key: str, number: int, used: set[str]) -> str:
    """An input key the task has not used yet: the upstream's, else namespaced by round (`r2.<key>`)."""
    candidate, n = key, 1
    while candidate in used:
        candidate = f"r{number}.{key}" if n == 1 else f"r{number}.{n}.{key}"
        n += 1
    return candidate


class TaskInput:
    """The input rounds of running hosted tasks, recorded in their logs."""

    def __init__(self, registry: TaskRegistry) -> None:
        self._registry = registry
        self._calls: dict[str, UpstreamCall] = {}
        """Task id -> the upstream call a legacy answer goes back on, while the task's call runs."""

    def running(self, task: Task, call: UpstreamCall) -> None:
        self._calls[task.id] = call

    def ended(self, task: Task) -> None:
        self._calls.pop(task.id, None)

    # -- 2025-11-25: server-to-client requests ---------------------------------------------------

    async def request(self, task: Task, message: Message) -> None:
        """A request the upstream sends on the task's call (elicitation, sampling, roots): the task
        waits for the client's answer; the request reaches the client on a stream that carries it."""
        method = str(message.get("method"))
        pending = PendingRequest(with_related_task(message, task.id))
        task.pending_requests[pending.id] = pending
        await self._registry.feed(task, Event.INPUT_REQUESTED, None, f"waiting for the client to answer {method}")
        requested = self._registry.capture.lifecycle(
            "input.requested", method=method, requestId=pending.id, **summarize_request(message)
        )
        await self._registry.record(task, requested)
        if task.result_streams == 0 and task.on_input is not None:
            await task.on_input(task, pending)
        if not pending.delivered:
            task.undelivered.set()  # an open (or the next) tasks/result stream carries it

    def claim_undelivered(self, task: Task) -> list[PendingRequest]:
        """The task's pending requests no open stream carries; the caller delivers them."""
        task.undelivered.clear()
        return [pending for pending in task.pending_requests.values() if not pending.delivered]

    async def answer(self, task: Task, response: Message, headers: Mapping[str, str]) -> None:
        """The client's JSON-RPC response to one of the task's requests: record it, send it upstream."""
        pending = task.pending_requests.pop(response["id"], None)
        call = self._calls.get(task.id)
        if pending is None or call is None:
            log.info("dropping a response for a settled task request", extra={"task": task.id})
            return
        pending.settle()
        method = str(pending.request.get("method"))
        answered = self._registry.capture.lifecycle(
            "input.answered", method=method, requestId=pending.id, **summarize_answer(response)
        )
        await self._registry.record(task, answered)
        if not task.pending_requests:
            await self._registry.feed(task, Event.INPUT_ANSWERED)
        await call.channel.respond(response, headers)

    # -- 2026-07-28: input_required rounds (MRTR) ----------------------------------------------------

    async def round(self, task: Task, call: UpstreamCall, outcome: Message, number: int) -> Message | None:
        """Show the round's `inputRequests`, wait for `tasks/update` to answer them all, and return the
        retry of the call; None when the task ended meanwhile."""
        result = outcome["result"]
        requests = result.get("inputRequests")
        state = result.get("requestState")
        answers: dict[str, Any] = {}
        if isinstance(requests, dict) and requests:
            shown: dict[str, Any] = {}
            upstream_keys: dict[str, str] = {}
            for key, request in requests.items():
                fresh = fresh_key(key, number, task.input_keys)
                task.input_keys.add(fresh)
                shown[fresh], upstream_keys[fresh] = request, key
            round_ = InputRound(shown, upstream_keys)
            task.input_round = round_
            stopped = asyncio.Event()

            async def stop() -> None:
                stopped.set()

            task.cancel = stop
            await self._registry.feed(
                task, Event.INPUT_REQUESTED, None, "waiting for input: answer inputRequests with tasks/update"
            )
            capture = self._registry.capture
            await self._registry.record(
                task,
                *(
                    capture.lifecycle(
                        "input.requested", key=key, method=method_of(request), **summarize_request(request)
                    )
                    for key, request in shown.items()
                ),
            )
            await wait_any((round_.answered, task.done, stopped))
            task.input_round = None
            if not round_.answered.is_set() or task.terminal:
                return None
            answers = {upstream_keys[key]: response for key, response in round_.responses.items()}
        else:
            await asyncio.sleep(STATE_ONLY_RETRY_S)
            if task.terminal:
                return None
        params = {
            key: value
            for key, value in jsonrpc.params_of(call.message).items()
            if key not in ("inputResponses", "requestState")
        }
        if answers:
            params["inputResponses"] = answers
        if state is not None:
            params["requestState"] = state
        return {**call.message, "id": f"gateway-task-{task.id}-{number}", "params": params}

    async def update(self, task: Task, responses: dict[str, Any]) -> None:
        """tasks/update's `input_responses`: store answers to outstanding input requests; unknown and
        already-answered keys are ignored. The answer that completes the round sends the task back to
        working."""
        round_ = task.input_round
        if round_ is None or task.terminal or round_.answered.is_set():
            return
        fresh = {key: value for key, value in responses.items() if key in round_.outstanding}
        round_.responses.update(fresh)
        complete = bool(fresh) and not round_.outstanding  # decided before any await: exactly one update
        capture = self._registry.capture
        events = [
            capture.lifecycle(
                "input.answered", key=key, method=method_of(round_.requests[key]), **summarize_answer(value)
            )
            for key, value in fresh.items()
        ]
        if events:
            await self._registry.record(task, *events)
        if complete:
            await self._registry.feed(task, Event.INPUT_ANSWERED)
            round_.answered.set()
