"""The tasks dialect of each era: every task shape and name that differs between them, in one table.

2025-11-25 speaks SEP-1686 (a client asks for a task with `params.task`; `ttl`, `pollInterval`; the
tasks capability in `initialize`; `tasks/result` for the outcome). 2026-07-28 speaks SEP-2663 (the
server decides for a client that declares the tasks extension; `ttlMs`, `pollIntervalMs`;
`resultType`; the outcome inlined in `tasks/get`; a per-request `_meta` envelope). Code outside
`protocol/` asks `dialect_of(era)` for a shape or a name instead of branching on the era; only where
behaviour differs (sessions, pooled channels, input mid-call) does it branch, saying why.

Pure data and functions over plain dicts; no I/O, and nothing from the task machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.protocol import jsonrpc
from gateway.protocol.envelope import NAME_PARAM
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, MODERN_VERSIONS, PROTOCOL_VERSION_KEY, TASKS_EXTENSION, Era
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId

LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
TASK_TOOL_KEY = "io.github.mcp-task-gateway/tool"
"""`_meta` key of each task `tasks/list` answers: the tool the task runs (for `mcp-task-gateway tasks list`)."""
TASK_UPSTREAM_KEY = "io.github.mcp-task-gateway/upstream"
"""`_meta` key of each task `tasks/list` answers with several upstreams: the upstream that runs it (for /ui)."""
TASK_EVENT = "notifications/tasks/event"
"""SEP-2694's task event, the same in both eras; sent on the tasks/stream request that asked for it."""
HOSTED_TASKS_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
"""The 2025-11-25 tasks capability the gateway declares when it hosts tasks itself."""


class TaskFacts(Protocol):
    """What a Task view shows of a task: a stored `TaskRecord`, or the registry's `Task`."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def status_message(self) -> str | None: ...
    @property
    def created_at(self) -> str: ...
    @property
    def last_updated_at(self) -> str: ...
    @property
    def ttl_ms(self) -> int: ...
    @property
    def poll_interval_ms(self) -> int: ...


class TaskDetails(TaskFacts, Protocol):
    """What a 2026-07-28 `tasks/get` shows besides: the open input requests and the kept outcome
    (the registry's `Task` has them, and so does a task read back from the stores)."""

    @property
    def input_requests(self) -> dict[str, Any]:
        """The input requests still waiting for an answer (2026-07-28 rounds)."""
        ...

    @property
    def outcome(self) -> Message | None:
        """Once terminal, `{"result": …}` or `{"error": …}` (None: none kept)."""
        ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """One era's tasks dialect: the shapes and names its task messages use."""

    era: Era
    ttl_key: str
    poll_key: str
    task_requests: frozenset[str]
    """The client's requests that name one task (`params.taskId`)."""
    task_methods: frozenset[str]
    """The task methods of the era's tasks dialect."""
    empty_result: Mapping[str, str]
    """The result of a request that returns nothing (a closed `tasks/stream`, a modern `tasks/cancel`)."""
    outcome_method: str
    """What asks an upstream for an ended task's outcome."""
    cancelled_has_outcome: bool
    """Whether the upstream tells how a cancelled task ended: SEP-1686 `tasks/result` answers for it, a
    SEP-2663 cancelled task carries neither result nor error."""
    ended_cancel_is_error: bool
    """Whether `tasks/cancel` of an ended task is refused (-32602, SEP-1686) or does nothing (SEP-2663)."""
    tool_error_fails_task: bool
    """Whether a tool result with `isError` makes a hosted task `failed` (SEP-1686) rather than
    `completed` with that result (SEP-2663)."""
    detailed_views: bool
    """Whether `tasks/get` shows the DetailedTask (SEP-2663: the open `inputRequests`, the outcome
    inlined once terminal) or the plain Task (SEP-1686 keeps the outcome for `tasks/result`)."""
    capability_key: str
    """The tasks capability's key in `capabilities` (2025-11-25) or `capabilities.extensions`."""
    hosted_capability: Mapping[str, Any]
    """The tasks capability the gateway declares for an upstream that has none."""
    upstream_call_meta: Mapping[str, str]
    """`_meta` a hosted task's upstream call gets unless the client set it (what asks for its logs)."""
    input_by_retry: bool
    """Whether a call asks for input by ending `input_required` and being retried with the answers
    (SEP-2663's MRTR) rather than with server-to-client requests on the way (2025-11-25), which a client
    of this era cannot be sent."""
    tasks_in_session: bool
    """Whether an upstream's task lives in the session that created it (2025-11-25: the gateway asks
    about it on that session's channel, with `session_headers`, and a restarted gateway rejoins that
    session) rather than anywhere on the upstream (2026-07-28: requests about it go to pooled channels,
    pinned to the task, and its pushes come on a `subscriptions/listen`)."""
    session_headers: Mapping[str, str]
    """The headers of the gateway's own requests in a session it rejoins (its protocol version)."""

    # -- task views ------------------------------------------------------------------------------

    def task(self, task: TaskFacts) -> dict[str, Any]:
        """The era's Task object (what a CreateTaskResult and a status push carry)."""
        view: dict[str, Any] = {
            "taskId": task.id,
            "status": str(task.status),
            "createdAt": task.created_at,
            "lastUpdatedAt": task.last_updated_at,
            self.ttl_key: task.ttl_ms,
            self.poll_key: task.poll_interval_ms,
        }
        if task.status_message is not None:
            view["statusMessage"] = task.status_message
        return view

    def detailed_task(self, task: TaskDetails) -> dict[str, Any]:
        """What `tasks/get` shows: the Task; in 2026-07-28 the DetailedTask, with the outstanding
        `inputRequests` while input_required and the outcome inlined once terminal."""
        view = self.task(task)
        if not self.detailed_views:
            return view
        status = str(task.status)
        if status == "input_required":
            view["inputRequests"] = task.input_requests
        outcome = task.outcome if status in ("completed", "failed") else None
        if outcome is not None and status == "completed" and "result" in outcome:
            view["result"] = outcome["result"]
        if outcome is not None and "error" in outcome:
            # A failure, or a completed task whose result the gateway could not keep (it says why).
            view["error"] = outcome["error"]
        return view

    def get_result(self, task: TaskDetails) -> dict[str, Any]:
        """The result of `tasks/get`."""
        return {**self.empty_result, **self.detailed_task(task)}

    def cancel_result(self, task: TaskFacts) -> dict[str, Any]:
        """The result of `tasks/cancel`: the Task (SEP-1686), or nothing (SEP-2663)."""
        return self.task(task) if self.era is Era.LEGACY else dict(self.empty_result)

    def created_result(self, task: TaskFacts) -> dict[str, Any]:
        """The CreateTaskResult for `task`: `{"task": …}`, or the Task with `resultType: "task"`."""
        if self.era is Era.LEGACY:
            return {"task": self.task(task)}
        return {"resultType": "task", **self.task(task)}

    def created_task(self, final: Message) -> dict[str, Any] | None:
        """The Task a tools/call answer creates, if it is a CreateTaskResult of this dialect."""
        result = final.get("result")
        if not isinstance(result, dict):
            return None
        if self.era is Era.MODERN and result.get("resultType") != "task":
            return None
        view = result.get("task") if self.era is Era.LEGACY else result
        return view if isinstance(view, dict) and isinstance(view.get("taskId"), str) else None

    def inlined_outcome(self, view: Mapping[str, Any]) -> Message | None:
        """The outcome a task view carries: a 2026-07-28 DetailedTask's `result` when completed, its
        `error` when failed; a 2025-11-25 Task never carries one."""
        if not self.detailed_views:
            return None
        if view.get("status") == "completed" and "result" in view:
            return {"result": view["result"]}
        if view.get("status") == "failed" and "error" in view:
            return {"error": view["error"]}
        return None

    def answered_outcome(self, final: Message) -> Message | None:
        """The outcome in the upstream's answer to `outcome_method`: a `tasks/result` answer as it is,
        or what a `tasks/get` view inlines (None: it carries neither result nor error)."""
        if self.era is Era.LEGACY:
            return {"error": final["error"]} if "error" in final else {"result": final.get("result")}
        view = final.get("result")
        return self.inlined_outcome(view) if isinstance(view, dict) else None

    # -- requests --------------------------------------------------------------------------------

    def may_create_task(self, message: Message) -> bool:
        """Whether a tools/call may be answered with a task: asked for with `params.task` (SEP-1686),
        or from a client that declares the tasks extension (SEP-2663, the server decides)."""
        if self.era is Era.LEGACY:
            return "task" in jsonrpc.params_of(message)
        return declares_tasks_extension(message)

    def check_tasks_declared(self, message: Message) -> None:
        """Raise -32021 for a task request from a 2026-07-28 client that did not declare the tasks
        extension (a 2025-11-25 client negotiated tasks at initialize)."""
        if self.era is Era.MODERN and not declares_tasks_extension(message):
            raise missing_extension(message.get("id"))

    def gateway_request(
        self,
        request_id: RequestId,
        method: str,
        params: Mapping[str, Any],
        capabilities: Mapping[str, Any] | None = None,
    ) -> tuple[Message, dict[str, str]]:
        """A request the gateway sends upstream, and its headers: in 2026-07-28 with the `_meta` envelope
        (the params' own `_meta` kept; `capabilities` declared, by default the tasks extension) and the
        headers that mirror it; a 2025-11-25 request carries neither (its session does)."""
        if self.era is Era.LEGACY:
            return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}, {}
        version = MODERN_VERSIONS[0]
        declared = {"extensions": {TASKS_EXTENSION: {}}} if capabilities is None else capabilities
        meta = {**(params.get("_meta") or {}), PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: declared}
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}
        headers = {"MCP-Protocol-Version": version, "Mcp-Method": method}
        name = params.get(NAME_PARAM.get(method, ""))
        if isinstance(name, str):
            headers["Mcp-Name"] = name
        return message, headers

    # -- responses -------------------------------------------------------------------------------

    def declared_tasks(self, result: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The tasks capability an upstream's `initialize` (2025-11-25) or `server/discover` (2026-07-28)
        result declares (`{}` when it is not an object), or None: it declares none."""
        holder = result.get("capabilities")
        if self.era is Era.MODERN:  # SEP-2663 tasks are an extension
            holder = holder.get("extensions") if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or self.capability_key not in holder:
            return None
        settings = holder[self.capability_key]
        return settings if isinstance(settings, dict) else {}

    def declares_event_streams(self, result: Mapping[str, Any]) -> bool:
        """Whether the upstream serves `tasks/stream` itself (SEP-2694 native): its tasks capability
        has an `eventStreams` object."""
        settings = self.declared_tasks(result)
        return settings is not None and isinstance(settings.get("eventStreams"), dict)

    def stream_end(self, request_id: RequestId) -> Message:
        """The answer that closes a `tasks/stream` normally (SEP-2694: an empty result)."""
        return {"jsonrpc": "2.0", "id": request_id, "result": dict(self.empty_result)}

    def advertise(self, result: dict[str, Any], event_streams: dict[str, int] | None) -> dict[str, Any]:
        """An `initialize` / `server/discover` result with the tasks capability: the upstream's own if
        it declares one, else the one the gateway hosts; with `eventStreams` in it when given, unless the
        upstream advertises its own (it serves those streams: the gateway forwards them)."""
        capabilities = dict(result.get("capabilities") or {})
        holder = capabilities
        if self.era is Era.MODERN:  # SEP-2663 tasks are an extension
            holder = capabilities["extensions"] = dict(capabilities.get("extensions") or {})
        key = self.capability_key
        settings = dict(holder[key] or {}) if key in holder else dict(self.hosted_capability)
        if event_streams is not None and not isinstance(settings.get("eventStreams"), dict):
            settings["eventStreams"] = event_streams
        holder[key] = settings
        return {**result, "capabilities": capabilities}


LEGACY = Dialect(
    era=Era.LEGACY,
    ttl_key="ttl",
    poll_key="pollInterval",
    task_requests=frozenset({"tasks/get", "tasks/result", "tasks/cancel"}),
    task_methods=frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"}),
    empty_result={},
    outcome_method="tasks/result",
    cancelled_has_outcome=True,
    ended_cancel_is_error=True,
    tool_error_fails_task=True,
    detailed_views=False,
    capability_key="tasks",
    hosted_capability=HOSTED_TASKS_CAPABILITY,
    upstream_call_meta={},
    input_by_retry=False,
    tasks_in_session=True,
    session_headers={"MCP-Protocol-Version": Era.LEGACY.value},
)
MODERN = Dialect(
    era=Era.MODERN,
    ttl_key="ttlMs",
    poll_key="pollIntervalMs",
    task_requests=frozenset({"tasks/get", "tasks/update", "tasks/cancel"}),
    task_methods=frozenset({"tasks/get", "tasks/update", "tasks/cancel"}),
    empty_result={"resultType": "complete"},
    outcome_method="tasks/get",
    cancelled_has_outcome=False,
    ended_cancel_is_error=False,
    tool_error_fails_task=False,
    detailed_views=True,
    capability_key=TASKS_EXTENSION,
    hosted_capability={},
    upstream_call_meta={LOG_LEVEL_KEY: "info"},
    input_by_retry=True,
    tasks_in_session=False,
    session_headers={},
)
_DIALECTS = {Era.LEGACY: LEGACY, Era.MODERN: MODERN}


def dialect_of(era: Era) -> Dialect:
    return _DIALECTS[era]


def declares_tasks_extension(message: Message) -> bool:
    capabilities = jsonrpc.meta_of(message).get(CLIENT_CAPABILITIES_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def missing_extension(request_id: RequestId | None, why: str = "") -> ProtocolError:
    """-32021 for a client that did not declare the tasks extension; `why` (a clause) says what needs it."""
    return ProtocolError(
        jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"Missing required client capability: {why}declare the {TASKS_EXTENSION} extension in clientCapabilities",
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        request_id=request_id,
    )


def unknown_task(request_id: RequestId | None) -> ProtocolError:
    # One message for unknown and foreign tasks, so ids cannot be probed.
    return ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: no such task", request_id=request_id)
