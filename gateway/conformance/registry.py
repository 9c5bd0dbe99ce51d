"""The kit's check list: one `Check` per MUST and SHOULD of SEP-2694 (and the transport rules the
2026-07-28 era adds), each with a stable id, the sentence it checks and what the kit does to check it,
and `Result`, one check's outcome in one era.

The ids are an interface: reports, CI dashboards and the deliberately broken test servers name them.
Add new checks; never rename or reuse an id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol.era import Era

Level = Literal["MUST", "SHOULD", "MAY"]
Status = Literal["pass", "fail", "skip", "info"]
"""`info`: what a check that cannot fail saw (`capability.retention_fields`)."""

ERAS: tuple[Era, ...] = tuple(Era)
BOTH: frozenset[Era] = frozenset(ERAS)
MODERN_ONLY: frozenset[Era] = frozenset({Era.MODERN})


@dataclass(frozen=True)
class Check:
    id: str
    section: str
    level: Level
    sentence: str
    """The rule, quoted from SEP-2694 (or the 2026-07-28 transport rules where `section` says so)."""
    method: str
    """What the kit sends and what it accepts."""
    eras: frozenset[Era] = BOTH


@dataclass
class Result:
    check: Check
    era: Era
    status: Status
    reason: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    """The requests and the relevant part of each answer, in the order they were made."""


SECTIONS = (
    "setup",
    "capabilities",
    "request validation",
    "sequence",
    "event shape",
    "replay and resume",
    "ending",
    "events_gone",
    "streams",
    "progress",
    "authorization",
    "2026-07-28 envelope",
)

CHECKS: tuple[Check, ...] = (
    Check(
        "setup.run",
        "setup",
        "MUST",
        "(kit precondition) The target answers, and the given tool runs as a task that emits events.",
        "The kit reaches the target, starts the tool as a task and plays every scenario within its time bounds; "
        "when it cannot, this check fails with the reason and the checks not reached are skipped with it. (A "
        "stream that does not end stops the run too, but fails end.terminal_result or end.terminal_immediate "
        "instead.)",
    ),
    Check(
        "method.exists",
        "capabilities",
        "MUST",
        "Clients that call tasks/stream against a receiver that does not support task event streams receive "
        "-32601 (Method not found).",
        "tasks/stream for a task the kit created is not answered -32601 (a target without the method fails here "
        "and every other check is skipped).",
    ),
    Check(
        "capability.event_streams",
        "capabilities",
        "MAY",
        "If Tasks are negotiated through capabilities, implementations MAY advertise this support as an "
        "eventStreams sub-capability of Tasks.",
        "2025-11-25: `initialize` → `capabilities.tasks.eventStreams`; 2026-07-28: `server/discover` → "
        '`capabilities.extensions["io.modelcontextprotocol/tasks"].eventStreams`. Skipped when absent; '
        "when present it must be an object.",
    ),
    Check(
        "capability.retention_fields",
        "capabilities",
        "SHOULD",
        "Receivers SHOULD document: Maximum event age, Maximum events per task, Terminal retention, Payload "
        "size limits.",
        "Reported, never failed (status `info`): SEP-2694 asks for retention to be documented and names no "
        "capability field for it, so the kit shows what the `eventStreams` capability advertises, if anything. "
        "An integer `maxEventsPerTask` there (the name this gateway uses) only tells the kit when early events "
        "may have been dropped.",
    ),
    Check(
        "request.task_id",
        "request validation",
        "MUST",
        "params: { taskId: string; after?: integer } — taskId: the task whose events should be streamed.",
        "tasks/stream without `taskId`, and with `taskId: 42`, each gets JSON-RPC's -32602 (Invalid params) and no "
        "event (2026-07-28: "
        "without `taskId` there is no `Mcp-Name` to send, so the header check's 400 / -32020 is accepted too).",
    ),
    Check(
        "request.unknown_task",
        "request validation",
        "MUST",
        "Implementations MUST apply the same authorization checks to tasks/stream that they apply to tasks/get. "
        "A client that cannot access a task MUST NOT be allowed to stream its events.",
        "tasks/stream and tasks/get for a task id that does not exist both get an error, with the same code, "
        "and the stream delivers no event.",
    ),
    Check(
        "request.after_range",
        "request validation",
        "MUST",
        "Receivers MUST return -32602 (Invalid params) if after is negative, not an integer, or otherwise not "
        "a valid sequence number value.",
        "`after: -1` on the kit's own task gets -32602 and no event.",
    ),
    Check(
        "request.after_type",
        "request validation",
        "MUST",
        "Receivers MUST return -32602 (Invalid params) if after is negative, not an integer, or otherwise not "
        "a valid sequence number value.",
        '`after` as `1.5`, `"1"`, `true` and `null` on the kit\'s own task: each gets -32602 and no event.',
    ),
    Check(
        "seq.starts_at_zero",
        "sequence",
        "MUST",
        "The first event in a task stream MUST use seq: 0.",
        "A stream opened without `after` right after the task was created delivers seq 0 first.",
    ),
    Check(
        "seq.contiguous",
        "sequence",
        "MUST",
        "Each subsequent event for that task MUST increment by exactly 1.",
        "In every stream the kit reads (live, late, resumed), each seq is the previous one plus 1.",
    ),
    Check(
        "seq.ordered",
        "sequence",
        "MUST",
        "Servers MUST deliver events in sequence order.",
        "In every stream the kit reads, no seq is lower than or equal to one delivered before it.",
    ),
    Check(
        "event.fields",
        "event shape",
        "MUST",
        "interface TaskEvent { seq: number; taskId: string; type: string; payload: {...}; _meta?: {...} }",
        "Every `notifications/tasks/event` has params with an integer `seq` >= 0, `taskId` equal to the "
        "streamed task, a string `type` and a `payload`.",
    ),
    Check(
        "event.type_prefixed",
        "event shape",
        "MUST",
        "Implementations MUST NOT emit unprefixed event types such as content.partial, task.status, or "
        "tool.started unless those names are defined by a future MCP standard. Implementation-defined event "
        "types MUST use a vendor-specific prefix, preferably reverse-DNS.",
        "Every `type` starts with a namespace: at least two dotted labels before the name (`com.example.x`), "
        "or a `vendor/` prefix. A two-part name such as `task.status` fails.",
    ),
    Check(
        "event.payload_object",
        "event shape",
        "MUST",
        "Event payloads MUST be JSON objects.",
        "Every event's `payload` is a JSON object.",
    ),
    Check(
        "event.related_task_meta",
        "event shape",
        "MUST",
        "Receivers MUST include io.modelcontextprotocol/related-task metadata on task event notifications. "
        "The metadata task ID MUST match params.taskId.",
        'Every event has `_meta["io.modelcontextprotocol/related-task"].taskId` equal to `params.taskId`.',
    ),
    Check(
        "history.late_joiner",
        "replay and resume",
        "MUST",
        "If after is omitted, the receiver MUST start at the earliest event it still retains for the task, then "
        "continue with live events.",
        "After the task ended, a new stream without `after` delivers the live stream's events from its first "
        "seq on, identical (seq, type, payload), starting at 0 when the history fits the advertised "
        "`maxEventsPerTask`.",
    ),
    Check(
        "resume.after_cursor",
        "replay and resume",
        "MUST",
        "Deliver retained events with seq greater than the supplied value, then continue with live events. "
        "Receivers MUST NOT silently skip retained events after the requested cursor.",
        "After the task ended, `after: k` (a retained event in the middle) delivers exactly the live stream's "
        "events k+1 … last: none <= k repeated, none skipped.",
    ),
    Check(
        "end.terminal_result",
        "ending",
        "MUST",
        "When the receiver closes the stream normally, it returns an empty result (TaskStreamResult = EmptyResult).",
        "The live stream of a task that ends closes with the era's empty result: `{}` (2025-11-25) or "
        '`{"resultType": "complete"}` (2026-07-28), `_meta` allowed. Any stream the kit reads (live, late, resumed) '
        "must end within `--timeout` after tasks/get shows its task terminal; one that does not fails here and "
        "stops the era's run (every later stream would wait as long), its remaining checks skipped with the reason.",
    ),
    Check(
        "end.terminal_immediate",
        "ending",
        "MUST",
        "If the receiver has no retained events with seq greater than the supplied value and the task has "
        "reached a terminal state, the receiver MUST return TaskStreamResult immediately with no event "
        "notifications.",
        "On the ended task, `after` = its last seq is answered with the era's empty result and no event, within "
        "`--timeout`.",
    ),
    Check(
        "events_gone.not_silent",
        "events_gone",
        "MUST",
        "If the receiver cannot provide a gap-free stream after the cursor, it MUST return events_gone. Once a "
        "receiver drops an event needed to resume a stream, it MUST return events_gone for clients that resume "
        "from before the retained range.",
        "When the late joiner shows that events were dropped (it starts at E >= 2), `after: E - 2` gets an "
        "error, not a stream that starts past the cursor. Skipped when the advertised `maxEventsPerTask` is not "
        "below the number of events the tool emits (retention cannot be overrun in bounded time).",
    ),
    Check(
        "events_gone.error_shape",
        "events_gone",
        "MUST",
        "When a cursor is too old to resume, receivers return a JSON-RPC error using the implementation-defined "
        'server error range: {"code": -32010, "message": "Task events are no longer available", "data": '
        '{"reason": "events_gone", "taskId": ...}}',
        'That error has code -32010, a non-empty message, `data.reason: "events_gone"` and `data.taskId` '
        "equal to the task. Skipped like events_gone.not_silent.",
    ),
    Check(
        "events_gone.earliest_seq",
        "events_gone",
        "MUST",
        "The earliestSeq field tells the client the oldest event the receiver still retains.",
        "`data.earliestSeq` is an integer equal to the first seq a stream without `after` delivers. Skipped "
        "like events_gone.not_silent.",
    ),
    Check(
        "events_gone.resume_from_earliest",
        "events_gone",
        "MUST",
        "Clients can use this to decide how to recover: call tasks/stream with after set to earliestSeq - 1 to "
        "resume from the earliest retained event.",
        "`after: earliestSeq - 1` delivers the retained events from `earliestSeq` on, gap-free, then the empty "
        "result. Skipped like events_gone.not_silent.",
    ),
    Check(
        "stream.one_per_task",
        "streams",
        "MUST",
        "A receiver MUST allow at most one active tasks/stream request per task per connection. If a client "
        "sends a second tasks/stream for a task that already has an active stream on the same connection, the "
        "receiver MUST return -32602 (Invalid params).",
        "2025-11-25: while a stream of a running task is delivering, a second tasks/stream for it on the same "
        "session gets -32602. Skipped in 2026-07-28, where each POST is its own connection.",
    ),
    Check(
        "cancel.task_survives",
        "streams",
        "MUST",
        "Cancellation stops event delivery but does not cancel the underlying task.",
        "The stream of a running task is cancelled (2025-11-25: `notifications/cancelled` for its request id, "
        "then the connection is closed; 2026-07-28: the POST is closed); tasks/get then shows the task not "
        "cancelled, and it ends on its own as anything but `cancelled`.",
    ),
    Check(
        "progress.not_events",
        "progress",
        "MUST",
        "Implementations MAY continue to emit progress notifications ... for a tasks/stream request if a "
        "client supplies a progressToken. Such progress notifications MUST NOT be treated as task event "
        "records and do not affect task event seq values.",
        "A stream opened with `_meta.progressToken` delivers the same events (seq, type, payload) as one "
        "opened without; progress for that token arrives, if at all, as `notifications/progress`.",
    ),
    Check(
        "auth.same_as_tasks_get",
        "authorization",
        "MUST",
        "Implementations MUST apply the same authorization checks to tasks/stream that they apply to tasks/get. "
        "A client that cannot access a task MUST NOT be allowed to stream its events.",
        "With the second credential set (`--other-header`), tasks/get and tasks/stream of the kit's task agree: "
        "both refused (and no event delivered), or both allowed. Skipped without `--other-header`.",
    ),
    Check(
        "modern.extension_required",
        "2026-07-28 envelope",
        "MUST",
        "(2026-07-28, SEP-2663) A client that did not declare the extension gets -32021 when it calls tasks/*.",
        "tasks/stream whose `_meta` envelope declares no `io.modelcontextprotocol/tasks` extension gets -32021 "
        "and no event.",
        MODERN_ONLY,
    ),
    Check(
        "modern.name_header",
        "2026-07-28 envelope",
        "MUST",
        "(2026-07-28 transport) A server that processes the body MUST check that the headers agree with it, and "
        "answer 400 + -32020 if they do not. (SEP-2694 gives tasks/stream no routing header; SEP-2663 requires "
        "Mcp-Name: <taskId> on tasks/get, tasks/update and tasks/cancel, and a server may require it on "
        "tasks/stream by analogy.)",
        "tasks/stream with an `Mcp-Name` header other than its `taskId`: a target that refuses it answers HTTP "
        "400 and -32020, with no event. Skipped when the target serves the stream anyway (it does not read "
        "`Mcp-Name` on tasks/stream, which neither SEP requires).",
        MODERN_ONLY,
    ),
    Check(
        "modern.envelope_required",
        "2026-07-28 envelope",
        "MUST",
        "(2026-07-28) Every request carries a _meta envelope (protocol version and client capabilities).",
        "tasks/stream without the `_meta` envelope gets an error and no event.",
        MODERN_ONLY,
    ),
)

BY_ID: dict[str, Check] = {check.id: check for check in CHECKS}


def checks_for(era: Era) -> list[Check]:
    """The checks that apply to `era`, in report order (by section, then as listed)."""
    return sorted((c for c in CHECKS if era in c.eras), key=lambda c: SECTIONS.index(c.section))
