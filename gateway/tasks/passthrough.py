"""Pass-through tasks: tasks the upstream hosts itself, forwarded as they are and observed into a log.

Ids. An upstream's task id is unique only within its conversation (a stdio process, an HTTP session),
so clients see `<channel tag>.<upstream id>`: the channel's random tag namespaces it, and it can never
equal a gateway-hosted id (32 hex digits, no dot). Clients must treat it as opaque. Ids are rewritten
to the client's form on everything the upstream sends (the channel `Tap`, `observe`) and back on the
client's task requests (`route`; the mapping itself is `task_ids`).

Learning. A task is known from the CreateTaskResult the gateway forwards (`adopt`), which binds it to
the caller. Messages about it that arrive first (server-everything pushes a status before it answers)
wait briefly in a stash. A task the gateway never saw created stays unknown: `-32602`, like any id.

An upstream that serves tasks/stream itself (SEP-2694 native) streams its own log: its task events
pass with their ids mapped and are never captured (every replay would copy them again).

Capture. For known tasks the tap records status pushes (`notifications/tasks/status`,
`notifications/tasks`) and status answers (`tasks/get`, legacy `tasks/cancel`) as `task.status` events
when status or statusMessage changed, newly shown `inputRequests`, progress for the creating request's
token, notifications with related-task `_meta`, and the upstream's requests for the task
(`input.requested`; the client's answer is `input.answered`). What a view says of the task's status
is a lifecycle event (`status_event`); one watcher per task (`watcher`) polls, and fails the task
when the upstream loses it.

Outcome. When the upstream says a task ended, its outcome goes into the task record before the record
turns terminal: inlined in a 2026-07-28 view, else fetched at once by the watcher (2025-11-25
`tasks/result`, answered exactly as the upstream gave it; or a `tasks/get` when a 2026-07-28 view left
it out), within `ASK_TIMEOUT_S`; a failed fetch keeps an error saying why. From then on the record
answers the task's requests (see the endpoint), so they work after the upstream conversation is gone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from cachetools import TTLCache

from gateway.config import TasksConfig
from gateway.events.summaries import method_of, summarize_answer, summarize_request
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import TASK_EVENT, Dialect, dialect_of, unknown_task
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.lifecycle import Event, Phase
from gateway.tasks.pushes import ACKNOWLEDGED
from gateway.tasks.records import TaskStatus, UpstreamTaskRef
from gateway.tasks.registry import Task, TaskLimitReached, TaskRegistry
from gateway.tasks.store import TaskExists
from gateway.tasks.task_ids import STATUS_PUSHES, map_task_ids
from gateway.tasks.watch import UpstreamTask
from gateway.tasks.watcher import ASK_TIMEOUT_S, Hold, TaskWatcher, watched
from gateway.upstream.base import Upstream, UpstreamChannel
from gateway.waiting import wait_any

log = logging.getLogger("gateway.tasks.passthrough")

_STATUS_ANSWERS = frozenset({"tasks/get", "tasks/cancel"})
CAPTURE_INTERRUPTED = "capture.interrupted"
"""The event marking a gap in a task's capture: the process watching it ended, this one watches again."""
STASH_TTL_S = 60.0
STASH_PER_TASK = 64


class Passthrough:
    def __init__(self, registry: TaskRegistry, upstream: Upstream, config: TasksConfig, metrics: Metrics) -> None:
        self.registry = registry
        self._upstream = upstream
        self._config = config
        self._tokens: dict[tuple[str, object], Task] = {}
        """(channel tag, progress token of the creating request) -> task."""
        self._asked: TTLCache[tuple[str, RequestId], tuple[Task, str]] = TTLCache(4096, 3600)
        """(channel tag, request id) -> the task an upstream request was for, and its method."""
        self._stash: TTLCache[str, list[tuple[str | None, Message]]] = TTLCache(1024, STASH_TTL_S)
        self._watcher = TaskWatcher(registry, upstream, config, metrics, self.observe)
        self._renamed: dict[tuple[str, str], str] = {}
        """(channel tag, upstream id) -> the client's id of a task watched again after a restart: it
        was named after a conversation of the process that learned it."""

    # -- upstream to client: the channel tap ------------------------------------------------------

    async def observe(self, channel: UpstreamChannel, method: str | None, message: Message) -> Message:
        """The `Tap` of channels whose upstream hosts tasks. Never raises: a capture bug must not
        break the link that called it."""
        try:
            return await self._observe(channel, method, message)
        except Exception:
            log.exception("capturing an upstream task message failed")
            return message

    async def _observe(self, channel: UpstreamChannel, method: str | None, message: Message) -> Message:
        tag = channel.tag
        seen_ids: list[str] = []

        def to_client(upstream_id: str) -> str:
            client_id = self._renamed.get((tag, upstream_id)) or f"{tag}.{upstream_id}"
            seen_ids.append(client_id)
            return client_id

        message = map_task_ids(message, method, to_client)
        if message.get("method") == ACKNOWLEDGED:
            return message
        task: Task | None = None
        if seen_ids and method != "tasks/list":
            task = self.registry.find(seen_ids[-1])
            if task is None and "method" in message:
                stash = self._stash.setdefault(seen_ids[-1], [])
                if len(stash) < STASH_PER_TASK:
                    stash.append((method, message))
        elif message.get("method") == "notifications/progress":
            task = self._tokens.get((tag, jsonrpc.params_of(message).get("progressToken")))
        if task is not None and task.upstream is not None:
            await self._capture(task, method, message)
        return message

    async def _capture(self, task: Task, method: str | None, message: Message) -> None:
        ref = watched(task)
        kind = message.get("method")
        if kind == TASK_EVENT:
            # A native upstream's stream: its own log, replayed at will; the gateway's log takes no copy.
            return
        if kind in STATUS_PUSHES:
            await self._observe_status(task, jsonrpc.params_of(message), pushed=True)
        elif isinstance(kind, str) and "id" in message:
            self._asked[(ref.channel.tag, message["id"])] = (task, kind)
            await self._record_lifecycle(
                task, "input.requested", method=kind, requestId=message["id"], **summarize_request(message)
            )
        elif kind is not None:
            if (event := self.registry.capture_from(task, message)) is not None:
                await self.registry.record(task, event)
        elif method in _STATUS_ANSWERS and isinstance(message.get("result"), dict):
            await self._observe_status(task, message["result"], pushed=False)
        elif method == "tasks/result":  # the upstream says it ended: learn how with a tasks/get now
            await self._watcher.feed(task, Event.RESULT_ANSWERED)

    async def _observe_status(self, task: Task, view: Mapping[str, Any], *, pushed: bool) -> None:
        ref = watched(task)
        if pushed:
            ref.heard_at = time.monotonic()
        try:
            status = TaskStatus(str(view.get("status")))
        except ValueError:
            return
        updated = view.get("lastUpdatedAt")
        if isinstance(updated, str):
            if updated < ref.last_updated_at:
                return  # an older view than one already observed (a poll crossed a push)
            ref.last_updated_at = updated
        interval = view.get(ref.dialect.poll_key)
        if isinstance(interval, int) and interval > 0:
            ref.poll_interval_ms = interval
        text = view.get("statusMessage")
        seen = (status, text if isinstance(text, str) else None)
        async with ref.observing:
            if seen != ref.seen:
                outcome = ref.dialect.inlined_outcome(view)
                event = status_event(status, outcome, ref.dialect)
                # While the outcome is fetched the table ignores later views: `seen` keeps the end told.
                if await self._watcher.feed(task, event, status, seen[1], outcome=outcome) is not None:
                    ref.seen = seen
        requests = view.get("inputRequests")
        if status is TaskStatus.INPUT_REQUIRED and isinstance(requests, dict):
            for key, request in requests.items():
                if key not in ref.input_keys:
                    ref.input_keys.add(key)
                    await self._record_lifecycle(
                        task, "input.requested", key=key, method=method_of(request), **summarize_request(request)
                    )

    async def caught_up(self, task: Task) -> None:
        """Return once the record shows the end a forwarded answer about `task` just told of (or after
        ASK_TIMEOUT_S), so the client's next request, answered from the records (tasks/list, a later
        session, another replica), never contradicts that answer.

        2025-11-25 only: there the watcher asks on the session's channel, beside the forwarded request.
        A 2026-07-28 view that tells an end inlines the outcome (the tap made the record terminal
        already); one that leaves it out is fetched on the pooled process the forwarded request holds
        until its answer is written, so waiting there would stall both."""
        ref = watched(task)
        # Only 2025-11-25 waits: see above.
        if ref.dialect.tasks_in_session and task.phase in (Phase.END_TOLD, Phase.FETCHING_OUTCOME):
            await wait_any((task.done,), ASK_TIMEOUT_S)

    async def _record_lifecycle(self, task: Task, name: str, **payload: Any) -> None:
        await self.registry.record(task, self.registry.capture.lifecycle(name, **payload))

    async def answered(self, channel: UpstreamChannel, response: Message) -> None:
        """The client's response to an upstream request, on its way to `channel`: an event if the
        request was for a task."""
        asked = self._asked.pop((channel.tag, response.get("id")), None)  # type: ignore[arg-type]
        if asked is not None:
            task, method = asked
            await self._record_lifecycle(
                task, "input.answered", method=method, requestId=response.get("id"), **summarize_answer(response)
            )

    # -- client to upstream ----------------------------------------------------------------------

    def route_listen(self, owner: str, message: Message) -> Message:
        """A client's subscriptions/listen as the upstream must get it: the `taskIds` it names in the
        upstream's ids (ids the caller does not own are left out, so the acknowledgement omits them)."""
        params = jsonrpc.params_of(message)
        filters = params.get("notifications")
        wanted = filters.get("taskIds") if isinstance(filters, dict) else None
        if not isinstance(wanted, list):
            return message
        assert isinstance(filters, dict)
        tasks = [self.registry.get(owner, task_id) for task_id in wanted]
        ids = [task.upstream.upstream_id for task in tasks if task is not None and task.upstream is not None]
        return {**message, "params": {**params, "notifications": {**filters, "taskIds": ids}}}

    def route(self, owner: str, message: Message, headers: Mapping[str, str]) -> tuple[Task, Message, dict[str, str]]:
        """A task request as the upstream must get it (its own id in params and `Mcp-Name`), and the
        task: -32602 for ids the caller does not own or the gateway never saw created."""
        params = jsonrpc.params_of(message)
        task = self.registry.get(owner, params.get("taskId"))
        if task is None or task.upstream is None:
            raise unknown_task(message["id"])
        ref = watched(task)
        rewritten = {**message, "params": {**params, "taskId": ref.upstream_id}}
        upstream_headers = {
            name: ref.upstream_id if name.lower() == "mcp-name" else value for name, value in headers.items()
        }
        # 2026-07-28 requests go to pooled channels: this one must reach the channel that holds the task.
        if not ref.dialect.tasks_in_session:
            self._upstream.pin(task.id, ref.channel)
        return task, rewritten, upstream_headers

    # -- learning a task -------------------------------------------------------------------------

    async def adopt(
        self,
        owner: str,
        channel: UpstreamChannel,
        era: Era,
        request: Message,
        final: Message,
        earlier: list[Message],
        headers: Mapping[str, str],
        hold: Hold | None = None,
    ) -> Task | None:
        """Learn the task a forwarded tools/call created (its answer `final`, already in client ids),
        record what came before it, and start watching it. None when `final` created no task."""
        dialect = dialect_of(era)
        view = dialect.created_task(final)
        prefix = f"{channel.tag}."
        if view is None or not view["taskId"].startswith(prefix):
            return None
        upstream_id = view["taskId"][len(prefix) :]
        task = await self._record_created(owner, channel, era, request, view, upstream_id)
        if task is None:
            return None
        token = jsonrpc.meta_of(request).get("progressToken")
        ref = UpstreamTask(channel, upstream_id, era, dict(headers), task.poll_interval_ms, token)
        task.upstream = ref
        notes = [
            event for message in earlier if "id" not in message and (event := self.registry.capture_from(task, message))
        ]
        if notes:
            await self.registry.record(task, *notes)
        # Then its state: what waited in the stash (mostly pushes sent before the answer), then the
        # answer's own view, each recorded only if newer and different; task.created said `working`.
        ref.seen = (task.status, None)
        for method, message in self._stash.pop(task.id, []):
            await self._capture(task, method, message)
        await self._observe_status(task, view, pushed=False)
        if token is not None:
            self._tokens[(channel.tag, token)] = task

        async def release() -> None:
            self._tokens.pop((channel.tag, token), None)
            if hold is not None:
                await hold()

        self._watcher.start(task, channel, release)
        return task

    async def _record_created(
        self, owner: str, channel: UpstreamChannel, era: Era, request: Message, view: dict[str, Any], upstream_id: str
    ) -> Task | None:
        """The record of a task the upstream created (`view`: its Task, in client ids); None when the
        gateway cannot hold one more (it is forwarded uncaptured)."""
        dialect = dialect_of(era)
        params = jsonrpc.params_of(request)
        ttl = view.get(dialect.ttl_key)
        poll = view.get(dialect.poll_key)
        created_at = view.get("createdAt")
        try:
            return await self.registry.create(
                owner,
                str(params.get("name")),
                ttl if isinstance(ttl, int) else self._config.max_ttl_ms,
                dialect=era.value,
                task_id=view["taskId"],
                poll_interval_ms=poll if isinstance(poll, int) and poll > 0 else None,
                # The record tells the upstream's times, as it would.
                created_at=created_at if isinstance(created_at, str) else None,
                upstream=UpstreamTaskRef(upstream_id, channel.tag, channel.rejoin_handle),
                arguments=params.get("arguments"),
                hostedBy="upstream",
            )
        except (TaskLimitReached, TaskExists) as exc:
            log.warning("not capturing an upstream task: %s", exc)
            return None

    async def resume(self, task: Task) -> bool:
        """Watch again a task a previous process on these stores watched, under its stored upstream
        id, after a `capture.interrupted` event (what happened upstream meanwhile was not captured; the
        first poll, at once, records where the task stands now). False when its conversation ended with
        that process: a 2026-07-28 task on an upstream that does not outlive the gateway (a stdio child),
        a 2025-11-25 one whose session cannot be rejoined."""
        stored = task.record.upstream
        assert stored is not None
        era = Era(task.record.dialect)
        rejoined = await self._rejoin(task.id, era, stored)
        if rejoined is None:
            return False
        channel, hold = rejoined
        channel.tap = self.observe
        renamed = (channel.tag, stored.upstream_id)
        self._renamed[renamed] = task.id
        headers = dict(dialect_of(era).session_headers)
        ref = UpstreamTask(channel, stored.upstream_id, era, headers, task.poll_interval_ms)
        ref.seen = (task.status, task.status_message)
        ref.last_updated_at = task.last_updated_at
        task.upstream = ref
        cause = "the gateway process that watched the task ended; what happened meanwhile was not captured"
        await self._record_lifecycle(task, CAPTURE_INTERRUPTED, cause=cause)
        ref.wake.set()

        async def release() -> None:
            self._renamed.pop(renamed, None)
            await hold()

        self._watcher.start(task, channel, release)
        return True

    async def _rejoin(self, task_id: str, era: Era, stored: UpstreamTaskRef) -> tuple[UpstreamChannel, Hold] | None:
        """The conversation holding a task a previous process watched, and what releases it; None if gone."""
        if not dialect_of(era).tasks_in_session:
            if not self._upstream.outlives_gateway:
                return None
            holder = contextlib.AsyncExitStack()
            return await holder.enter_async_context(self._upstream.stateless(task_id)), holder.aclose
        channel = None if stored.session is None else self._upstream.rejoin(stored.session, era.value)
        return None if channel is None else (channel, channel.close)

    async def stop(self) -> None:
        await self._watcher.stop()


def status_event(status: TaskStatus, outcome: Message | None, dialect: Dialect) -> Event:
    """The lifecycle event of an upstream view saying `status` (with `outcome` inlined, or None): an
    end whose outcome is left out is fetched, except a cancel the dialect gives no outcome for."""
    if not status.terminal:
        return Event.UPSTREAM_STATUS
    if outcome is not None or (status is TaskStatus.CANCELLED and not dialect.cancelled_has_outcome):
        return Event.UPSTREAM_ENDED
    return Event.UPSTREAM_ENDED_UNFETCHED
