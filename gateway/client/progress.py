"""What a running `call` shows on stderr: the tool's progress and log notifications.

On a terminal, progress is one bar redrawn in place (`[######----] 3/5  step 3/5`; a count without a
bar when the server gives no total); elsewhere (a pipe, a file) each notification is a plain line
(`call: progress 3/5  step 3/5`). Log messages are lines in both (`call: log info    builder: …`).
`quiet` shows nothing. Nothing here goes to stdout, which carries only the result.

Notifications come live on the call's response (`notification`), or, for a 2026-07-28 call the
server turned into a task, as the task's events (`event`), which may repeat what was shown live.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

from gateway.client.tail import Timeline

BAR_WIDTH = 24


class ProgressDisplay:
    """Shows progress and log notifications on `err` (a bar on a terminal, lines elsewhere)."""

    def __init__(self, err: TextIO, prog: str, *, quiet: bool = False) -> None:
        self._err = err
        self._prog = prog
        self._quiet = quiet
        self._terminal = err.isatty()
        self._timeline = Timeline(color=False)
        self._bar_shown = ""
        self._last_progress: float | None = None
        self._logs_shown: Counter[bytes] = Counter()
        """Log messages shown live, so the same ones replayed as a task's events are not shown twice."""

    def notification(self, message: Mapping[str, Any]) -> None:
        """A notification on the call's response: progress and log messages are shown."""
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if message.get("method") == "notifications/progress":
            self._progress(params)
        elif message.get("method") == "notifications/message":
            self._logs_shown[_log_key(params)] += 1
            self._log(params)

    def event(self, event: Mapping[str, Any]) -> None:
        """A task event: its progress and log events are shown, unless shown live already."""
        kind = self._timeline.short_type(str(event.get("type", "")))
        payload = event.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        if kind == "progress":
            progress = payload.get("progress")
            # Progress only increases (MCP): one not above the last shown is a replay.
            if isinstance(progress, int | float) and (self._last_progress is None or progress > self._last_progress):
                self._progress(payload)
        elif kind == "log":
            key = _log_key(payload)
            if self._logs_shown[key] > 0:
                self._logs_shown[key] -= 1
            else:
                self._log(payload)

    def clear(self) -> None:
        """Take the bar off the terminal (before a prompt or the result); the next update draws it again."""
        if self._bar_shown:
            self._err.write("\r\x1b[K")
            self._err.flush()
            self._bar_shown = ""

    def _progress(self, params: Mapping[str, Any]) -> None:
        progress = params.get("progress")
        if isinstance(progress, int | float):
            self._last_progress = progress
        if self._quiet:
            return
        summary = self._timeline.summary("progress", dict(params))
        if not self._terminal:
            self._line(f"progress {summary}")
            return
        total = params.get("total")
        if isinstance(progress, int | float) and isinstance(total, int | float) and total > 0:
            filled = round(BAR_WIDTH * min(1.0, max(0.0, progress / total)))
            summary = "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "] " + summary
        width = shutil.get_terminal_size().columns - 1
        self._bar_shown = summary if len(summary) <= width else summary[: max(1, width - 1)] + "…"
        self._err.write("\r\x1b[K" + self._bar_shown)
        self._err.flush()

    def _log(self, params: Mapping[str, Any]) -> None:
        if not self._quiet:
            self._line("log " + self._timeline.summary("log", dict(params)))

    def _line(self, text: str) -> None:
        bar = self._bar_shown
        self.clear()
        self._err.write(f"{self._prog}: {text}\n")
        if bar:
            self._err.write(bar)
            self._bar_shown = bar
        self._err.flush()


def _log_key(params: Mapping[str, Any]) -> bytes:
    return orjson.dumps([params.get("level"), params.get("logger"), params.get("data")])
