"""The native reference server (``examples/native_stream_server.py``) with exactly one deliberate SEP-2694
defect, for proving that the conformance kit catches it.

Usage::

    python tests/servers/broken_native_server.py --variant NAME [--port N] [any native_stream_server option]

Each variant overrides one seam of ``NativeTasks`` (the method that carries one rule of the SEP); the rest
of the server is the reference one. ``VARIANTS`` maps each name to its class; the docstring of each class
says the defect and the kit check that must fail on it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

# The examples directory is not a package: import the reference server as a top-level module.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from native_stream_server import (
    EVENT_PREFIX,
    TERMINAL,
    NativeTasks,
    Task,
    TaskEvent,
    argument_parser,
    serve,
)


class FirstSeq1(NativeTasks):
    """seq starts at 1 (check ``seq.starts_at_zero``)."""

    def wire_event(self, task: Task, event: TaskEvent) -> dict[str, Any]:
        return {**super().wire_event(task, event), "seq": event.seq + 1}


class SkippedSeq(NativeTasks):
    """seq 2 is never sent: the third event is numbered 3 (check ``seq.contiguous``)."""

    def wire_event(self, task: Task, event: TaskEvent) -> dict[str, Any]:
        return {**super().wire_event(task, event), "seq": event.seq + (event.seq >= 2)}


class DuplicatesAfterResume(NativeTasks):
    """A resume with ``after`` repeats event ``after`` (check ``resume.after_cursor``)."""

    def first_seq(self, task: Task, after: int | None) -> int:
        return super().first_seq(task, after) if after is None else after


class EventsGoneWrongCode(NativeTasks):
    """``events_gone`` with -32000 instead of -32010 (check ``events_gone.error_shape``)."""

    def events_gone(self, task: Task) -> int:
        try:
            return super().events_gone(task)
        except MCPError as exc:
            raise MCPError(-32000, exc.message, exc.error.data) from None


class EventsGoneNoEarliest(NativeTasks):
    """``events_gone`` without ``data.earliestSeq`` (check ``events_gone.earliest_seq``)."""

    def events_gone(self, task: Task) -> int:
        try:
            return super().events_gone(task)
        except MCPError as exc:
            data = {k: v for k, v in (exc.error.data or {}).items() if k != "earliestSeq"}
            raise MCPError(exc.code, exc.message, data) from None


class EventsGoneSilentSkip(NativeTasks):
    """A cursor before the retained range replays from the earliest retained event instead of failing
    (check ``events_gone.not_silent``)."""

    def events_gone(self, task: Task) -> int:
        return task.log.earliest_seq


class NoTerminalResult(NativeTasks):
    """The stream never ends: every event (the terminal ``task.status`` one too), then no TaskStreamResult:
    the request never returns after the terminal status (check ``end.terminal_result``)."""

    async def stream_result(self) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class StreamNeverEnds(NativeTasks):
    """The stream withholds the task's terminal ``task.status`` event and so never ends: no terminal event,
    no TaskStreamResult, though tasks/get shows the task ended (check ``end.terminal_result``, within the
    kit's ``--timeout``)."""

    def events_from(self, task: Task, seq: int) -> list[TaskEvent]:
        ending = f"{EVENT_PREFIX}.task.status"
        return [e for e in super().events_from(task, seq) if e.type != ending or e.payload["status"] not in TERMINAL]


class CancelCancelsTask(NativeTasks):
    """Cancelling a stream cancels its task (check ``cancel.task_survives``)."""

    def stream_cancelled(self, task: Task) -> None:
        task.cancel("cancelled with its stream")


class UnprefixedTypes(NativeTasks):
    """Event types without the vendor prefix (``progress``, ``task.status``) (check ``event.type_prefixed``)."""

    def wire_event(self, task: Task, event: TaskEvent) -> dict[str, Any]:
        return {**super().wire_event(task, event), "type": event.type.removeprefix(f"{EVENT_PREFIX}.")}


class PayloadNotObject(NativeTasks):
    """Each payload is sent as a JSON string instead of an object (check ``event.payload_object``)."""

    def wire_event(self, task: Task, event: TaskEvent) -> dict[str, Any]:
        return {**super().wire_event(task, event), "payload": json.dumps(event.payload)}


class ConcurrentStreamsAllowed(NativeTasks):
    """A second active stream for the same task on the same connection is accepted (check
    ``stream.one_per_task``)."""

    def claim_stream(self, key: tuple[Hashable, str]) -> None:
        pass


class ForeignCallerAllowed(NativeTasks):
    """Any principal may stream any task (``tasks/get`` still refuses it) (check ``auth.same_as_tasks_get``)."""

    def stream_task(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        return self.tasks.get(task_id) or super().stream_task(ctx, task_id)


VARIANTS: dict[str, type[NativeTasks]] = {
    "first_seq_1": FirstSeq1,
    "skipped_seq": SkippedSeq,
    "duplicates_after_resume": DuplicatesAfterResume,
    "events_gone_wrong_code": EventsGoneWrongCode,
    "events_gone_no_earliest": EventsGoneNoEarliest,
    "events_gone_silent_skip": EventsGoneSilentSkip,
    "no_terminal_result": NoTerminalResult,
    "stream_never_ends": StreamNeverEnds,
    "cancel_cancels_task": CancelCancelsTask,
    "unprefixed_types": UnprefixedTypes,
    "payload_not_object": PayloadNotObject,
    "concurrent_streams_allowed": ConcurrentStreamsAllowed,
    "foreign_caller_allowed": ForeignCallerAllowed,
}


def main() -> None:
    parser = argument_parser()
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS), help="the one defect to have")
    args = parser.parse_args()
    serve(args, VARIANTS[args.variant])


if __name__ == "__main__":
    main()
