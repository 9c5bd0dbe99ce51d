"""JSON-RPC 2.0 message kinds, error codes and error construction.

Messages stay plain dicts parsed by orjson: the gateway routes on a few fields and forwards the rest
untouched. One parsed from an upstream (`received`) also keeps its bytes, and `encode` writes those
bytes again while nothing has rewritten it, instead of serialising it. This module must not do I/O or
know about transports.
"""

from __future__ import annotations

import enum
from typing import Any

import orjson

Message = dict[str, Any]
RequestId = str | int

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022
EVENTS_GONE = -32010
"""SEP-2694: the events a `tasks/stream` asks for are no longer retained (or never will be)."""


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


class ProtocolError(Exception):
    """A JSON-RPC error the gateway itself answers with, plus the HTTP status that carries it."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        http_status: int = 400,
        data: Any = None,
        request_id: RequestId | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status
        self.data = data
        self.request_id = request_id

    def to_message(self) -> Message:
        return error_response(self.request_id, self.code, self.message, self.data)


class Overloaded(ProtocolError):
    """A ceiling (or the buffered-bytes budget) is reached: HTTP 503 in both eras, the one shape of
    "overloaded" (the edge adds `Retry-After: [server] retry_after_s` and counts it).

    `limit` is the config key of the ceiling, also `data.limit` and the `limit` label of
    `mcp_gateway_rejected_total`; `what` says what is full and `remedy` what the caller can do."""

    def __init__(self, limit: str, what: str, remedy: str, *, request_id: RequestId | None = None) -> None:
        super().__init__(
            INTERNAL_ERROR,
            f"Service Unavailable: {what} ({limit}); {remedy}",
            http_status=503,
            data={"reason": "overloaded", "limit": limit},
            request_id=request_id,
        )
        self.limit = limit


class Unavailable(ProtocolError):
    """A part the gateway needs for this request cannot be used now (the task store: its server down,
    its disk full): HTTP 503 in both eras, with `Retry-After` (`[server] retry_after_s`), and
    `data.reason` naming what is down (`store_unavailable`)."""

    def __init__(self, reason: str, what: str, *, request_id: RequestId | None = None) -> None:
        super().__init__(
            INTERNAL_ERROR,
            f"Service Unavailable: {what}; retry later",
            http_status=503,
            data={"reason": reason},
            request_id=request_id,
        )


def error_response(request_id: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


DEFAULT_MAX_DEPTH = 64


def parse_message(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """Parse one JSON-RPC message from bytes, or raise ProtocolError (-32700 / -32600).

    Arrays and objects nested deeper than `max_depth` are refused (-32600): past a few hundred levels
    orjson cannot serialize the message again and SDK servers drop it without an answer."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit"):  # orjson's own limit (1,024 levels), above any sane one
            raise _too_deep(max_depth) from None
        raise ProtocolError(PARSE_ERROR, f"Parse error: body is not valid JSON ({exc})") from None
    # Only a body with more brackets than the limit can nest deeper: most messages skip the walk.
    if body.count(b"[") + body.count(b"{") > max_depth and depth_exceeds(value, max_depth):
        raise _too_deep(max_depth, _safe_id(value) if isinstance(value, dict) else None)
    if isinstance(value, list):
        raise ProtocolError(INVALID_REQUEST, "Invalid request: JSON-RPC batches are not supported; send one message")
    if not isinstance(value, dict):
        raise ProtocolError(INVALID_REQUEST, "Invalid request: the body must be a JSON-RPC object")
    classify(value)
    return value


def _too_deep(max_depth: int, request_id: RequestId | None = None) -> ProtocolError:
    return ProtocolError(
        INVALID_REQUEST,
        f"Invalid request: arrays and objects nested deeper than {max_depth} levels (server.max_json_depth)",
        request_id=request_id,
    )


def depth_exceeds(value: object, max_depth: int) -> bool:
    """Whether arrays and objects in a parsed JSON value nest deeper than `max_depth` (iteratively)."""
    # Level by level: each pass keeps the containers one level deeper (no per-node depth bookkeeping).
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(max_depth):
        if not level:  # the whole value is shallower than the limit
            return False
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
    return bool(level)


def classify(message: Message) -> Kind:
    """Tell a request, a notification and a response apart, or raise ProtocolError (-32600)."""

    def invalid(reason: str) -> ProtocolError:
        return ProtocolError(INVALID_REQUEST, f"Invalid request: {reason}", request_id=_safe_id(message))

    if message.get("jsonrpc") != "2.0":
        raise invalid('"jsonrpc" must be "2.0"')
    method = message.get("method")
    has_id = "id" in message
    if method is not None:
        if not isinstance(method, str):
            raise invalid('"method" must be a string')
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            raise invalid('"params" must be an object')
        if not has_id:
            return Kind.NOTIFICATION
        if not _valid_id(message["id"]):
            raise invalid('"id" must be a string or an integer')
        return Kind.REQUEST
    if has_id and ("result" in message or "error" in message):
        return Kind.RESPONSE
    raise invalid("neither a request, a notification nor a response")


def _valid_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _safe_id(message: Message) -> RequestId | None:
    value = message.get("id")
    return value if _valid_id(value) else None


def params_of(message: Message) -> dict[str, Any]:
    params = message.get("params")
    return params if isinstance(params, dict) else {}


def meta_of(message: Message) -> dict[str, Any]:
    meta = params_of(message).get("_meta")
    return meta if isinstance(meta, dict) else {}


def is_final(message: Message) -> bool:
    """True for a response (result or error), the last message of an exchange."""
    return "method" not in message and ("result" in message or "error" in message)


def dumps(message: Message) -> bytes:
    return orjson.dumps(message)


class Received(dict[str, Any]):
    """A message parsed from an upstream that still holds the bytes it was parsed from.

    Relaying it unchanged writes those bytes (`encode`) instead of serialising the dict again. Every
    rewrite in the gateway builds a new dict (`{**message, "id": ...}`), which is a plain `Message` and
    is serialised; a top-level change made in place drops the bytes too. Nested values must not be
    changed in place (nothing in the gateway does: rewrites copy)."""

    __slots__ = ("raw",)
    raw: bytes | None
    """Set by `holding`; None once the message changed. (No `__init__` of its own: dict's is faster.)"""

    def _changed(self) -> None:
        self.raw = None

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        # A copy (or a pickle) is a plain dict: it may be changed, and it is serialised when written.
        return (dict, (dict(self),))

    def __setitem__(self, key: str, value: Any) -> None:
        self._changed()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._changed()
        super().__delitem__(key)

    def __ior__(self, other: Any) -> Received:  # type: ignore[override,misc]
        self._changed()
        return super().__ior__(other)

    def pop(self, *args: Any) -> Any:
        self._changed()
        return super().pop(*args)

    def popitem(self) -> tuple[str, Any]:
        self._changed()
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._changed()
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self._changed()
        super().clear()


def received(raw: bytes) -> Message | None:
    """The JSON object in `raw` (valid UTF-8), holding `raw` for `encode` when it is one line (so it
    fits an SSE data field); None when `raw` is not a JSON object."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return holding(value, raw) if isinstance(value, dict) else None


def holding(value: dict[str, Any], raw: bytes) -> Message:
    """`value`, parsed from `raw`, holding `raw` for `encode` when it is one line (so it fits an SSE
    data field); a message received over several lines is serialised again when written."""
    if b"\n" in raw or b"\r" in raw:
        return value
    message = Received(value)
    message.raw = raw
    return message


def encode(message: object) -> bytes:
    """`message` as one line of JSON: the bytes it was received as when it is unchanged, else serialised."""
    if type(message) is Received and message.raw is not None:
        return message.raw
    return orjson.dumps(message)
