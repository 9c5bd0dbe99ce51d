"""Logging setup: one JSON object per line, or a human format on a terminal.

Fields passed with `extra=` (pid, session, request_id, ...) become JSON keys; while tracing is on, a line
logged under a span carries its `trace_id` and `span_id` (`gateway.telemetry.TraceIds`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from gateway.telemetry import TraceIds

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({key: value for key, value in record.__dict__.items() if key not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class HumanFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{key}={value}" for key, value in record.__dict__.items() if key not in _STANDARD)
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} {record.name}: "
        line += record.getMessage() + (f"  [{extras}]" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    human = fmt == "human" or (fmt == "auto" and sys.stderr.isatty())
    handler.setFormatter(HumanFormatter() if human else JsonFormatter())
    handler.addFilter(TraceIds())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
