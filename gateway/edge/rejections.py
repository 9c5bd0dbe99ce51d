"""Requests the gateway refuses: counted by reason, and logged quietly enough that a flood cannot fill the log.

A fuzzer, a broken client or a TLS handshake sent to the plain-HTTP port can send thousands of bad
requests a second. Each refusal is counted in `mcp_gateway_rejected_requests_total{reason}` and logged
without a traceback, at most once per reason per `[logging] rejected_log_interval_s`, saying how many
were left out since the last line. Only the gateway's own faults log tracebacks.

Two sources: the edge's own refusals (`Rejections.refused`, with the documented HTTP status; once the
caller is authenticated and the body parsed, the line names its principal hash, method and tool), and
malformed HTTP that aiohttp's parser rejects before any handler runs, which aiohttp logs at error level
with a traceback; `FramingErrors` is a filter on aiohttp's server logger that turns those records into
counted, rate-limited warnings.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import unknown_task
from gateway.protocol.jsonrpc import Message, ProtocolError

log = logging.getLogger("gateway.edge.rejected")

FRAMING = "framing"
MAX_LOGGED_CHARS = 300
"""Refusal messages may quote client headers (up to aiohttp's 8 KiB each); the log keeps their start."""
MAX_LOGGED_NAME_CHARS = 128
"""The method and tool names a refusal's log line keeps (they come from the client)."""
UNKNOWN_TASK_MESSAGE = unknown_task(None).message
"""The answer to an unknown (or another principal's) task id, in both eras."""

AUTH_REASONS = frozenset(
    {
        "unauthorized",
        "invalid_token",
        "invalid_request",
        "insufficient_scope",
        "claim_mismatch",
        "rate_limited",
        "tool_rate_limited",
        "lookup_budget",
        "max_streams",
    }
)
"""What `gateway.edge.auth.AuthRefused` and `gateway.edge.limits.RateLimited` say in `data.reason`: each its
own label."""
_REASON_BY_STATUS = {
    403: "origin",
    408: "body_timeout",
    404: "not_found",
    405: "http_method",
    406: "accept",
    409: "conflict",
    410: "events_gone",
    413: "body_too_large",
    415: "content_type",
    421: "host",
    503: "unavailable",
    504: "upstream_timeout",
}
_REASON_BY_CODE = {
    jsonrpc.PARSE_ERROR: "parse_error",
    jsonrpc.INVALID_REQUEST: "invalid_request",
    jsonrpc.INVALID_PARAMS: "invalid_params",
    jsonrpc.HEADER_MISMATCH: "header_mismatch",
    jsonrpc.UNSUPPORTED_PROTOCOL_VERSION: "unsupported_version",
}


def reason_of(error: ProtocolError) -> str:
    """The metric label for a refusal: a small fixed set, from its HTTP status and JSON-RPC code."""
    if isinstance(error.data, dict) and error.data.get("reason") in AUTH_REASONS:
        return str(error.data["reason"])
    if error.message == UNKNOWN_TASK_MESSAGE:
        return "unknown_task"  # an unknown or another principal's task id: one answer, one label
    return _REASON_BY_STATUS.get(error.http_status) or _REASON_BY_CODE.get(error.code, "invalid")


class RateLimitedLog:
    """At most one line per kind per `interval_s`; the next line says how many were left out."""

    def __init__(self, logger: logging.Logger, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._left_out: Counter[str] = Counter()

    def log(self, level: int, kind: str, message: str, **extra: object) -> None:
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval_s:
            self._left_out[kind] += 1
            return
        self._last[kind] = now
        left_out = self._left_out.pop(kind, 0)
        if left_out and last is not None:
            message += f" (and {left_out} more not logged in the last {now - last:.0f} s)"
        self._logger.log(level, message, extra={"reason": kind, **extra})


class Rejections:
    """Counts and logs the requests the gateway refuses."""

    def __init__(self, metrics: Metrics, log_interval_s: float) -> None:
        self._metrics = metrics
        self._log = RateLimitedLog(log, log_interval_s)

    def refused(
        self,
        error: ProtocolError,
        remote: str | None,
        principal: str | None = None,
        message: Message | None = None,
        status: int | None = None,
    ) -> None:
        """The edge answered a request with `error` (a client mistake, not a gateway fault); `principal`
        is the caller's keyed hash once it was authenticated, `message` the request once parsed, `status`
        the HTTP status answered when the era's mapping changed it (a legacy JSON-RPC error is a 200)."""
        reason = reason_of(error)
        self._metrics.rejected_requests.labels(reason=reason).inc()
        text = f"refused a request: HTTP {status or error.http_status} {error.message}"
        method = message.get("method") if message is not None else None
        tool = jsonrpc.params_of(message).get("name") if message is not None and method == "tools/call" else None
        self._log.log(
            logging.INFO,
            reason,
            text[:MAX_LOGGED_CHARS],
            remote=remote,
            principal=principal,
            method=method[:MAX_LOGGED_NAME_CHARS] if isinstance(method, str) else None,
            tool=tool[:MAX_LOGGED_NAME_CHARS] if isinstance(tool, str) else None,
        )

    def malformed_http(self, error: HttpProcessingError, remote: object) -> None:
        """aiohttp's parser refused what a client sent (answered 400 and closed by aiohttp)."""
        self._metrics.rejected_requests.labels(reason=FRAMING).inc()
        text = f"malformed HTTP request: {describe_malformed(error)}"
        self._log.log(logging.WARNING, FRAMING, text[:MAX_LOGGED_CHARS], remote=str(remote))


def describe_malformed(error: HttpProcessingError) -> str:
    """What aiohttp's parser found wrong, without its quote of the offending bytes (which may be part of
    a credential): its message up to the first quote or colon, e.g. "Got more than 8190 bytes when
    reading", "Invalid header value char"."""
    first_line = str(error.message).strip().splitlines()[0] if error.message else ""
    words = re.split(r"[:'\"]| b'", first_line, maxsplit=1)[0].strip()
    return words or type(error).__name__


class FramingErrors(logging.Filter):
    """On aiohttp's server logger: a record caused by malformed HTTP becomes `Rejections.malformed_http`
    (and is dropped); every other record, such as an unhandled exception in the gateway, passes."""

    def __init__(self, rejections: Rejections) -> None:
        super().__init__()
        self._rejections = rejections

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        # aiohttp logs "Error handling request from %s" with the peer's address as the argument.
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
        self._rejections.malformed_http(error, remote)
        return False
