"""Watching the tasks an upstream hosts, one watcher per task, until each ends.

A watcher polls `tasks/get` when no push came for a poll interval (rarely, while a 2026-07-28
subscription covers the task: see `pushes`), keeps the upstream conversation open until the task
ends, fetches an ended task's outcome when the upstream's view left it out (within `ASK_TIMEOUT_S`; a
failed fetch keeps an error saying why), and fails the task, naming the cause, when the upstream
loses it. What it learns goes to the lifecycle (`feed`), whose watcher commands it carries out: poll
now, fetch the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping

from gateway.config import TasksConfig
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.tasks.lifecycle import Command, Event, Phase, Transition
from gateway.tasks.pushes import Covered, TaskPushes
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import Task, TaskRegistry
from gateway.tasks.watch import UpstreamTask
from gateway.upstream.base import Tap, Upstream, UpstreamChannel
from gateway.waiting import wait_any

ASK_ID_PREFIX = "mcp-task-gateway-"
"""The gateway's own requests about a task: `mcp-task-gateway-poll-N` (tasks/get), `-result-N`."""
ASK_TIMEOUT_S = 10.0
RESULT_UNAVAILABLE = "result_unavailable"
"""`data.reason` of the error kept when the gateway could not fetch an ended task's outcome."""
POLL_FAILURES = 3
"""Failed polls in a row (no answer, transport errors) after which the task is failed."""

Hold = Callable[[], Awaitable[None]]
"""Releases what keeps the task's upstream conversation open (a session's channel), once it ended."""


class TaskWatcher:
    """The watchers of the pass-through tasks this process follows, and what they share: the
    conversations' loss listeners and the 2026-07-28 subscriptions."""

    def __init__(self, registry: TaskRegistry, upstream: Upstream, config: TasksConfig, metrics: Metrics, tap: Tap):
        self.registry = registry
        self._upstream = upstream
        self._config = config
        self._metrics = metrics
        self._tap = tap
        """Set on the pooled channels the watcher asks on, so their answers are captured too."""
        self._live: weakref.WeakKeyDictionary[UpstreamChannel, set[Task]] = weakref.WeakKeyDictionary()
        """Each conversation's tasks not yet terminal (a lost conversation fails them); an entry goes
        with its channel (a closed session's)."""
        self._watchers: set[asyncio.Task[None]] = set()
        self._pushes: dict[str, TaskPushes] = {}
        """Channel tag -> the task subscription on that (shared, 2026-07-28) channel."""
        self._pushed: set[str] = set()
        """Tasks an upstream subscription pushes the changes of (2026-07-28): polls become a rare check."""
        self._ask_ids = itertools.count(1)

    def start(self, task: Task, channel: UpstreamChannel, hold: Hold | None) -> None:
        """Watch `task` on `channel` until it ends: pushes where the upstream sends them, polls, and
        the conversation's loss."""
        ref = watched(task)
        # 2026-07-28: pooled channels (pinned to the task), and pushes only on a subscriptions/listen.
        if not ref.dialect.tasks_in_session:
            self._upstream.pin(task.id, channel)
            if self._upstream.shared_stateless:
                if channel.tag not in self._pushes:
                    self._pushes[channel.tag] = TaskPushes(channel, self._covered_on(channel))
                self._pushes[channel.tag].watch(task.id, ref.upstream_id)
        if channel not in self._live:
            self._live[channel] = set()
            channel.on_loss(self._loss_listener(channel))
        self._live[channel].add(task)
        watcher = asyncio.create_task(self._watch(task, hold), name=f"watch-{task.id}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        task.cancel = _canceller(watcher)

    def _interval_s(self, task: Task, ref: UpstreamTask) -> float:
        low, high = self._config.upstream_poll_min_ms, self._config.upstream_poll_max_ms
        if task.id in self._pushed:  # a poll only checks, now and then, that the subscription still works
            return high / 1000
        return min(max(ref.poll_interval_ms, low), high) / 1000

    def _covered_on(self, channel: UpstreamChannel) -> Covered:
        def covered(client_ids: set[str], fresh: bool) -> None:
            for task in self._live.get(channel, ()):
                if task.id not in client_ids:
                    self._pushed.discard(task.id)
                elif task.id not in self._pushed:
                    self._pushed.add(task.id)
                    if fresh:  # one poll: changes before the subscription were not pushed
                        watched(task).wake.set()

        return covered

    async def _watch(self, task: Task, hold: Hold | None) -> None:
        ref = watched(task)
        self._metrics.upstream_tasks.inc()
        try:
            while not task.terminal:
                if fetching(task):
                    await self._end(task, await self._fetch_outcome(task))
                    break
                # Due one interval after the upstream last said something (a push, or the start of
                # the last poll, so the poll's own round trip does not stretch the period).
                wait = max(ref.heard_at, ref.polled_at) + self._interval_s(task, ref) - time.monotonic()
                if wait > 0 and not await wait_any((task.done, ref.wake), wait):
                    continue  # waited it out: due now, unless a push came meanwhile (recomputed)
                if task.terminal or fetching(task):
                    continue
                ref.wake.clear()
                ref.polled_at = time.monotonic()
                await self._poll(task)
        finally:
            self._metrics.upstream_tasks.dec()
            if (pushes := self._pushes.get(ref.channel.tag)) is not None:
                pushes.unwatch(task.id)
            self._live.get(ref.channel, set()).discard(task)
            self._pushed.discard(task.id)
            if hold is not None:
                await hold()

    async def _poll(self, task: Task) -> None:
        ref = watched(task)
        self._metrics.upstream_task_polls.inc()
        final = await self._ask_upstream(task, "tasks/get")
        error = final.get("error") if final is not None else {"message": f"no answer within {ASK_TIMEOUT_S:g} s"}
        if not isinstance(error, dict):
            ref.failures = 0
            return
        if error.get("code") == jsonrpc.INVALID_PARAMS:
            await self.fail(task, "the upstream no longer knows the task")
            return
        ref.failures += 1
        if ref.failures >= POLL_FAILURES:
            await self.fail(task, f"tasks/get failed {ref.failures} times in a row: {error.get('message')}")

    async def _fetch_outcome(self, task: Task) -> Message:
        """The ended task's outcome from the upstream: a 2025-11-25 `tasks/result` answer as it is, the
        result or error inlined in a 2026-07-28 `tasks/get`; else an error saying why there is none."""
        ref = watched(task)
        method = ref.dialect.outcome_method
        final = await self._ask_upstream(task, method)
        if final is None:
            return unavailable(f"the upstream did not answer {method} within {ASK_TIMEOUT_S:g} s")
        outcome = ref.dialect.answered_outcome(final)
        if outcome is not None:
            return outcome
        error = final.get("error")
        cause = error.get("message") if isinstance(error, dict) else f"its {method} carried neither result nor error"
        return unavailable(f"the upstream said the task ended, but {cause}")

    async def _end(self, task: Task, outcome: Message) -> None:
        """The record turns terminal as the upstream told, with `outcome` kept."""
        told = watched(task).seen
        assert told is not None
        await self.feed(task, Event.OUTCOME_FETCHED, told[0], told[1], outcome=outcome)

    async def _ask_upstream(self, task: Task, method: str) -> Message | None:
        """Ask the upstream `method` about the task on its conversation (2026-07-28: the pooled channel
        it is pinned to); its answer, or None after ASK_TIMEOUT_S."""
        ref = watched(task)
        kind = "poll" if method == "tasks/get" else method.removeprefix("tasks/")
        request_id = f"{ASK_ID_PREFIX}{kind}-{next(self._ask_ids)}"
        message, headers = ref.dialect.gateway_request(request_id, method, {"taskId": ref.upstream_id})
        # A 2025-11-25 task lives in its session: asked there, with the session's headers.
        if ref.dialect.tasks_in_session:
            return await self._ask(ref.channel, message, {**ref.headers, **headers})
        async with self._upstream.stateless(task.id) as channel:
            channel.tap = self._tap
            self._upstream.pin(task.id, channel)
            return await self._ask(channel, message, headers)

    async def _ask(self, channel: UpstreamChannel, message: Message, headers: Mapping[str, str]) -> Message | None:
        exchange = await channel.request(message, headers)
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                return (await exchange.collect())[-1]
        except TimeoutError:
            await exchange.cancel()
            return None

    async def fail(self, task: Task, cause: str) -> None:
        """The task cannot end normally any more: a terminal `failed` naming the cause; or, when the
        upstream already said it ended, that end with an outcome saying why it is unavailable."""
        if fetching(task):  # it ended as told, without the outcome
            await self._end(task, unavailable(cause))
            return
        outcome = jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, cause)
        await self.registry.feed(task, Event.UPSTREAM_LOST, None, cause, outcome=outcome)

    async def feed(
        self,
        task: Task,
        event: Event,
        told: TaskStatus | None = None,
        message: str | None = None,
        *,
        outcome: Message | None = None,
    ) -> Transition | None:
        """Feed what the upstream said to the lifecycle (at the upstream's time), and carry out the
        watcher's commands: wake it to poll, or to fetch the outcome."""
        ref = watched(task)
        transition = await self.registry.feed(
            task, event, told, message, outcome=outcome, updated_at=ref.last_updated_at or None
        )
        if transition is not None and {Command.POLL_UPSTREAM, Command.FETCH_OUTCOME} & set(transition.commands):
            ref.wake.set()
        return transition

    def _loss_listener(self, channel: UpstreamChannel) -> Callable[[str], Awaitable[None]]:
        async def lost(cause: str) -> None:
            for task in list(self._live.get(channel, ())):
                await self.fail(task, cause)

        return lost

    async def stop(self) -> None:
        """Stop watching (a graceful stop). The conversations of tasks still running are left open
        upstream: the process that takes them over (another replica, this one after a restart) rejoins
        them to watch on (`Passthrough.resume`)."""
        for channel, tasks in self._live.items():
            if any(not task.terminal for task in tasks):
                channel.leave_open()
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for pushes in self._pushes.values():
            await pushes.stop()


def watched(task: Task) -> UpstreamTask:
    """The upstream side of a task this module watches (set when it learns the task)."""
    assert task.upstream is not None
    return task.upstream


def fetching(task: Task) -> bool:
    """The upstream said the task ended, and the watcher fetches its outcome."""
    return task.phase is Phase.FETCHING_OUTCOME


def unavailable(cause: str) -> Message:
    """The outcome kept for an ended task whose result the gateway could not fetch: -32603 saying why."""
    text = f"the task's result is unavailable: {cause}"
    return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": text, "data": {"reason": RESULT_UNAVAILABLE}}}


def _canceller(watcher: asyncio.Task[None]) -> Callable[[], Awaitable[None]]:
    """What the registry calls when the task's record expires: stop watching (the upstream's task is
    the upstream's business)."""

    async def stop() -> None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    return stop
