"""`mcp-task-gateway tail URL TASK_ID`: print a task's events as they arrive, then exit with its outcome.

Events go to stdout (a readable timeline, or one JSON object per line with `--json`); notices
(reconnects, gaps, the outcome) go to stderr, so stdout stays a clean record of the events. It follows
the stream with `GatewayClient.follow`: reconnects, resumes after the last printed seq, de-duplicates.

Exit codes: 0 completed, 1 failed, 2 unknown task or another error answer, 3 cancelled,
4 events no longer retained (events_gone), 5 gateway unreachable, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, TextIO

import orjson

from gateway.client.stream import (
    EraName,
    EventsGone,
    GatewayClient,
    JsonRpcError,
    StreamGap,
    TransportError,
)

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_CANCELLED = 3
EXIT_EVENTS_GONE = 4
EXIT_UNREACHABLE = 5
EXIT_INTERRUPTED = 130
STATUS_EXIT = {"completed": EXIT_COMPLETED, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}

DEFAULT_PREFIX = "io.github.mcp-task-gateway."
_LIFECYCLE_SUFFIXES = (".task.created", ".task.status", ".task.terminal")
SUMMARY_WIDTH = 100


def _compact(value: object, width: int = SUMMARY_WIDTH) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Timeline:
    """Formats events as `seq  time  type  summary` lines; `time` is when the event arrived here."""

    def __init__(self, color: bool) -> None:
        self._color = color
        self._prefixes = [DEFAULT_PREFIX]

    def short_type(self, event_type: str) -> str:
        """The type without its vendor prefix (the gateway's, or one learned from lifecycle events)."""
        for suffix in _LIFECYCLE_SUFFIXES:
            if event_type.endswith(suffix):
                prefix = event_type[: -len(suffix)] + "."
                if prefix not in self._prefixes:
                    self._prefixes.append(prefix)
        for prefix in self._prefixes:
            if event_type.startswith(prefix) and len(event_type) > len(prefix):
                return event_type[len(prefix) :]
        return event_type

    def summary(self, kind: str, payload: dict[str, Any]) -> str:
        if kind == "progress":
            done, total, message = payload.get("progress"), payload.get("total"), payload.get("message")
            head = f"{done}/{total}" if total is not None else f"{done}"
            return f"{head}  {_compact(message)}" if message else head
        if kind == "log":
            level, logger, data = payload.get("level", "?"), payload.get("logger"), payload.get("data")
            return f"{level:<7} " + (f"{logger}: " if logger else "") + _compact(data)
        if kind == "task.created":
            return f"tool={payload.get('tool')} status={payload.get('status')}"
        if kind == "task.status":
            message = payload.get("statusMessage")
            return f"-> {payload.get('status')}" + (f"  ({_compact(message)})" if message else "")
        if kind == "task.terminal":
            parts = [str(payload.get("status"))]
            error = payload.get("error")
            if isinstance(error, dict):
                parts.append(f"error {error.get('code')}: {_compact(error.get('message'))}")
            elif payload.get("isError"):
                parts.append("isError")
            content = payload.get("content")
            if isinstance(content, list) and content:
                parts.append(", ".join(f"{block.get('type')} ({block.get('bytes')} B)" for block in content))
            return "  ".join(parts)
        if kind == "payload.omitted":
            original = self.short_type(str(payload.get("originalType", "?")))
            return f"{original} payload omitted: {payload.get('size')} B > limit {payload.get('limit')} B"
        return _compact(payload)

    def line(self, event: dict[str, Any], arrived: float) -> str:
        kind = self.short_type(str(event.get("type", "?")))
        payload = event.get("payload")
        summary = self.summary(kind, payload if isinstance(payload, dict) else {})
        stamp = time.strftime("%H:%M:%S", time.localtime(arrived)) + f".{int(arrived % 1 * 1000):03d}"
        seq = f"{event.get('seq'):>6}"
        kind_text = f"{kind:<16}"
        if self._color:
            seq, stamp = _ansi("2", seq), _ansi("2", stamp)
            kind_text = _ansi(_kind_color(kind, payload), kind_text)
        return f"{seq}  {stamp}  {kind_text}  {summary}"


def _kind_color(kind: str, payload: object) -> str:
    if kind.startswith("task."):
        status = payload.get("status") if isinstance(payload, dict) else None
        return {"completed": "1;32", "failed": "1;31", "cancelled": "1;33"}.get(str(status), "1")
    if kind == "log" and isinstance(payload, dict) and payload.get("level") in ("warning", "error", "critical"):
        return "33"
    return "36"


def _ansi(code: str, text: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m"


class Printer:
    """Writes each event to `out` (timeline or JSON line) and flushes, so a pipe sees it at once."""

    def __init__(self, out: TextIO, err: TextIO, *, json_lines: bool, after: int | None) -> None:
        self._out = out
        self._err = err
        self._json = json_lines
        self._after = after
        self._timeline = Timeline(color=not json_lines and out.isatty())
        self.count = 0
        self.first: int | None = None

    def event(self, event: dict[str, Any]) -> None:
        if self.first is None:
            self.first = event["seq"]
            if self._after is None and self.first > 0:
                notice(self._err, f"events before seq {self.first} are no longer retained; starting there")
        self.count += 1
        if self._json:
            self._out.write(orjson.dumps(event).decode() + "\n")
        else:
            self._out.write(self._timeline.line(event, time.time()) + "\n")
        self._out.flush()


def notice(err: TextIO, text: str) -> None:
    err.write(f"tail: {text}\n")
    err.flush()


async def tail(
    url: str,
    task_id: str,
    *,
    after: int | None = None,
    json_lines: bool = False,
    era: EraName = "legacy",
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    max_reconnects: int = 10,
) -> int:
    """Follow the task's events to its end; return the exit code (see the module docstring)."""
    printer = Printer(out, err, json_lines=json_lines, after=after)

    def reconnecting(attempt: int, resume_after: int | None, reason: BaseException) -> None:
        if isinstance(reason, EventsGone):
            notice(
                err,
                f"retention dropped the earliest events as the stream started (now seq {reason.earliest_seq}); "
                "asking again for the earliest retained",
            )
            return
        where = "from the earliest retained event" if resume_after is None else f"after seq {resume_after}"
        notice(err, f"stream interrupted ({reason}); reconnecting {where} (attempt {attempt}/{max_reconnects})")

    try:
        async with GatewayClient(url, era=era) as client:
            last = await client.follow(
                task_id, after, on_event=printer.event, on_reconnect=reconnecting, max_reconnects=max_reconnects
            )
            task = (await client.get_task(task_id))["result"]
    except EventsGone as exc:
        earliest = exc.earliest_seq
        hint = f"; rerun with --after {earliest - 1} to accept the gap and continue" if earliest is not None else ""
        if printer.first is not None:
            lost = f"the events after seq {printer.first + printer.count - 1} (the last printed)"
        elif after is not None:
            lost = f"the events after seq {after}"
        else:
            lost = "its earliest events"
        notice(
            err,
            f"events_gone: the gateway no longer retains {lost} of task {task_id}; "
            f"earliest retained seq is {earliest}{hint}",
        )
        return EXIT_EVENTS_GONE
    except StreamGap as exc:
        notice(err, f"{exc}")
        return EXIT_EVENTS_GONE
    except JsonRpcError as exc:
        notice(err, f"task {task_id}: {exc.message} (code {exc.code})")
        return EXIT_ERROR
    except TransportError as exc:
        notice(err, f"cannot follow task {task_id}: {exc}")
        return EXIT_UNREACHABLE
    status = str(task.get("status"))
    message = task.get("statusMessage")
    seqs = "no events" if last is None else f"{printer.count} events, last seq {last}"
    notice(err, f"task {task_id} {status}" + (f": {message}" if message else "") + f" ({seqs})")
    return STATUS_EXIT.get(status, EXIT_ERROR)


def main(url: str, task_id: str, *, after: int | None = None, json_lines: bool = False, era: EraName = "legacy") -> int:
    """Entry point of `mcp-task-gateway tail`."""
    try:
        return asyncio.run(tail(url, task_id, after=after, json_lines=json_lines, era=era))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`tail ... | head`): stop quietly, and keep the interpreter from
        # complaining when it flushes stdout on exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_COMPLETED
