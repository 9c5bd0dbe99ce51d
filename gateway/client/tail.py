"""`mcp-task-gateway tail URL TASK_ID`: print a task's events as they arrive, then exit with its outcome.

Events go to stdout (a readable timeline, or one JSON object per line with `--json`); notices
(reconnects, gaps, the outcome) go to stderr, so stdout stays a clean record of the events. It follows
the stream with `GatewayClient.follow`: reconnects, resumes after the last printed seq, de-duplicates.

The timeline's time is when the server recorded the event (its `recordedAt`, shown in local time), so
a replayed event shows when it happened; an event without one (another SEP-2694 server) shows when it
arrived here, marked `~`. `--json` prints each event's params as sent, `_meta` (and recordedAt) included.

The printing, following and exit codes here are shared with `call` and `tasks` (`commands.py`).
Exit codes: 0 completed, 1 failed, 2 unknown task or another error answer (a 401 or 403 of a gateway
with `[auth]` too, a URL whose path answers 404: the notice suggests `…/mcp`) or bad input, 3 cancelled,
4 events no longer retained (events_gone), 5 gateway unreachable, 130 interrupted (Ctrl-C: the notice
gives the last seq and the `tail … --after N` command that resumes). `--header` (and
`MCP_GATEWAY_TOKEN`) go with every request (`headers.py`).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

import orjson

from gateway.client.headers import AUTH_HINT, BadHeader, request_headers
from gateway.client.stream import (
    EndpointNotFound,
    EventsGone,
    GatewayClient,
    GatewayError,
    JsonRpcError,
    StreamGap,
    TransportError,
    recorded_at,
)
from gateway.protocol.era import Era

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_CANCELLED = 3
EXIT_EVENTS_GONE = 4
EXIT_UNREACHABLE = 5
EXIT_NO_TASK = 6
"""`call --task`: the server answered at once with the tool's result, without making a task."""
EXIT_INTERRUPTED = 130
STATUS_EXIT = {"completed": EXIT_COMPLETED, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}

DEFAULT_ERA = Era.LEGACY
"""The era of a command without `--era`."""
DEFAULT_PREFIX = "io.github.mcp-task-gateway."
_LIFECYCLE_SUFFIXES = (".task.created", ".task.status", ".task.terminal")
SUMMARY_WIDTH = 100


def _compact(value: object, width: int = SUMMARY_WIDTH) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Timeline:
    """Formats events as `seq  time  type  summary` lines; `time` is the event's recordedAt in local
    time, or, marked `~`, when it arrived here if the server sent none."""

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
        recorded = recorded_at(event)
        stamp = _clock(recorded) if recorded is not None else "~" + _clock(datetime.fromtimestamp(arrived))
        seq = f"{event.get('seq'):>6}"
        kind_text = f"{kind:<16}"
        if self._color:
            seq, stamp = _ansi("2", seq), _ansi("2", stamp)
            kind_text = _ansi(_kind_color(kind, payload), kind_text)
        return f"{seq}  {stamp}  {kind_text}  {summary}"


def _clock(when: datetime) -> str:
    """`HH:MM:SS.mmm` in local time."""
    local = when.astimezone()
    return f"{local:%H:%M:%S}.{local.microsecond // 1000:03d}"


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
    """Writes each event to `out` (timeline or JSON line) and flushes, so a pipe sees it at once;
    `notice` writes a one-line message to `err`, prefixed with the command's name."""

    def __init__(
        self, out: TextIO, err: TextIO, *, json_lines: bool, after: int | None = None, prog: str = "tail"
    ) -> None:
        self._out = out
        self._err = err
        self._json = json_lines
        self._prog = prog
        self._after = after
        self._timeline = Timeline(color=not json_lines and out.isatty())
        self.count = 0
        self.first: int | None = None
        self.task_id: str | None = None
        """The task being followed (set by `follow_task`)."""

    @property
    def last_seq(self) -> int | None:
        """The seq of the last event printed, else the cursor it started after."""
        return self.first + self.count - 1 if self.first is not None else self._after

    def event(self, event: dict[str, Any]) -> None:
        if self.first is None:
            self.first = event["seq"]
            if self._after is None and self.first > 0:
                self.notice(f"events before seq {self.first} are no longer retained; starting there")
        self.count += 1
        if self._json:
            self._out.write(orjson.dumps(event).decode() + "\n")
        else:
            self._out.write(self._timeline.line(event, time.time()) + "\n")
        self._out.flush()

    def notice(self, text: str) -> None:
        notice(self._err, text, self._prog)


def notice(err: TextIO, text: str, prog: str = "tail") -> None:
    err.write(f"{prog}: {text}\n")
    err.flush()


async def follow_task(
    client: GatewayClient, task_id: str, printer: Printer, *, after: int | None = None, max_reconnects: int = 10
) -> int:
    """Print the task's events to its end (reconnecting as needed), say how it ended; the exit code.

    events_gone is reported here (it needs what was printed); other errors are raised for `failure`."""

    def reconnecting(attempt: int, resume_after: int | None, reason: BaseException) -> None:
        if isinstance(reason, EventsGone):
            printer.notice(
                f"retention dropped the earliest events as the stream started (now seq {reason.earliest_seq}); "
                "asking again for the earliest retained",
            )
            return
        where = "from the earliest retained event" if resume_after is None else f"after seq {resume_after}"
        printer.notice(f"stream interrupted ({reason}); reconnecting {where} (attempt {attempt}/{max_reconnects})")

    printer.task_id = task_id
    try:
        last = await client.follow(
            task_id, after, on_event=printer.event, on_reconnect=reconnecting, max_reconnects=max_reconnects
        )
    except EventsGone as exc:
        earliest = exc.earliest_seq
        hint = f"; rerun with --after {earliest - 1} to accept the gap and continue" if earliest is not None else ""
        if printer.first is not None:
            lost = f"the events after seq {printer.first + printer.count - 1} (the last printed)"
        elif after is not None:
            lost = f"the events after seq {after}"
        else:
            lost = "its earliest events"
        printer.notice(
            f"events_gone: the gateway no longer retains {lost} of task {task_id}; "
            f"earliest retained seq is {earliest}{hint}",
        )
        return EXIT_EVENTS_GONE
    task = (await client.get_task(task_id))["result"]
    status = str(task.get("status"))
    message = task.get("statusMessage")
    seqs = "no events" if last is None else f"{printer.count} events, last seq {last}"
    printer.notice(f"task {task_id} {status}" + (f": {message}" if message else "") + f" ({seqs})")
    return exit_code(status)


def exit_code(status: str) -> int:
    """The exit code for a task that ended with `status` (2 for anything not terminal)."""
    return STATUS_EXIT.get(status, EXIT_ERROR)


def failure(exc: GatewayError, say: Callable[[str], None], subject: str) -> int:
    """Say in one line why a command stopped (`subject`: what it was doing, e.g. "task ID"); the exit code."""
    if isinstance(exc, StreamGap):
        say(f"{exc}")
        return EXIT_EVENTS_GONE
    if isinstance(exc, EndpointNotFound):
        say(f"{subject}: {exc}")
        return EXIT_ERROR
    if isinstance(exc, JsonRpcError):
        status = f"HTTP {exc.http_status}: " if exc.http_status in (401, 403) else ""
        hint = f"; {AUTH_HINT}" if exc.http_status == 401 else ""
        say(f"{subject}: {status}{exc.message} (code {exc.code}){hint}")
        return EXIT_ERROR
    if isinstance(exc, TransportError):
        say(f"{subject}: {exc}")
        return EXIT_UNREACHABLE
    say(f"{subject}: {exc}")
    return EXIT_ERROR


async def tail(
    url: str,
    task_id: str,
    *,
    after: int | None = None,
    json_lines: bool = False,
    era: Era = DEFAULT_ERA,
    headers: Mapping[str, str] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    max_reconnects: int = 10,
    printer: Printer | None = None,
) -> int:
    """Follow the task's events to its end; return the exit code (see the module docstring)."""
    printer = printer or Printer(out, err, json_lines=json_lines, after=after)
    try:
        async with GatewayClient(url, era=era, headers=headers) as client:
            return await follow_task(client, task_id, printer, after=after, max_reconnects=max_reconnects)
    except GatewayError as exc:
        return failure(exc, printer.notice, f"task {task_id}")


class UsageError(Exception):
    """Bad input on the command line: reported in one line (`usage_error`), exit 2."""


def check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{url!r} is not an http(s) URL; the gateway's endpoint looks like http://127.0.0.1:8765/mcp")


def parse_era(text: str) -> Era:
    """`--era`: `legacy` or `modern` (or the era's protocol version), parsed once at the command's edge."""
    try:
        return Era.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def usage_error(exc: UsageError | BadHeader, prog: str) -> int:
    notice(sys.stderr, str(exc), prog)
    return EXIT_ERROR


def resume_command(url: str, printer: Printer, *, era: Era, json_lines: bool, headers: Sequence[str]) -> str | None:
    """The `tail` command line that goes on where `printer` stopped (None before a task was followed).

    Headers go in it except credentials (Authorization, Cookie...), which are not printed: they come
    from MCP_GATEWAY_TOKEN or must be given again."""
    if printer.task_id is None:
        return None
    words = ["mcp-task-gateway", "tail", url, printer.task_id]
    if printer.last_seq is not None:
        words += ["--after", str(printer.last_seq)]
    if era is not DEFAULT_ERA:  # like every option, left out at its default
        words += ["--era", era.label]
    if json_lines:
        words.append("--json")
    for value in headers:
        name = value.partition(":")[0].strip().lower()
        if name not in CREDENTIAL_HEADERS:
            words += ["--header", value]
    return shlex.join(words)


CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def interrupted_notice(
    url: str, printer: Printer, *, era: Era, json_lines: bool, headers: Sequence[str]
) -> Callable[[], None]:
    """What Ctrl-C on a followed task says: the last seq printed and the command that resumes."""

    def notice() -> None:
        resume = resume_command(url, printer, era=era, json_lines=json_lines, headers=headers)
        if resume is not None:
            where = "before any event" if printer.last_seq is None else f"after seq {printer.last_seq}"
            printer.notice(f"interrupted {where} of task {printer.task_id}; resume with: {resume}")

    return notice


def run(command: Coroutine[Any, Any, int], on_interrupt: Callable[[], None] | None = None) -> int:
    """Run a command's coroutine to its exit code; Ctrl-C is 130 (after `on_interrupt`), a reader that
    went away is not an error."""
    try:
        return asyncio.run(command)
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`tail ... | head`): stop quietly, and keep the interpreter from
        # complaining when it flushes stdout on exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_COMPLETED


def main(
    url: str,
    task_id: str,
    *,
    after: int | None = None,
    json_lines: bool = False,
    era: str = DEFAULT_ERA.label,
    headers: Sequence[str] = (),
) -> int:
    """Entry point of `mcp-task-gateway tail`; `era` is the `--era` the user typed."""
    try:
        check_url(url)
        chosen = parse_era(era)
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "tail")
    printer = Printer(sys.stdout, sys.stderr, json_lines=json_lines, after=after)
    printer.task_id = task_id
    return run(
        tail(url, task_id, after=after, json_lines=json_lines, era=chosen, headers=sent, printer=printer),
        interrupted_notice(url, printer, era=chosen, json_lines=json_lines, headers=headers),
    )
