"""Server-Sent Events framing: encoding frames and parsing a byte stream into events.

Sans-I/O: callers hand in bytes and get bytes or `SseEvent`s back. Parsing follows the WHATWG
event-stream rules (any of CRLF, LF and CR end a line, even split across chunks). This module must not
do I/O or know about JSON-RPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_EVENT_BYTES = 64 * 1024 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
COLON = ord(":")


def encode_message(data: bytes, event_id: str | None = None) -> bytes:
    """One `message` event carrying `data`, which must not contain a newline (one JSON document), with
    an `id` field when `event_id` is given (it must not contain a newline or NUL either)."""
    if event_id is None:
        return b"event: message\r\ndata: " + data + b"\r\n\r\n"
    return b"id: " + event_id.encode() + b"\r\nevent: message\r\ndata: " + data + b"\r\n\r\n"


def encode_priming(event_id: str, retry_ms: int) -> bytes:
    """A priming event (SEP-1699): an id and empty data, so a client can resume from the start, and the
    reconnection delay in milliseconds."""
    return b"id: " + event_id.encode() + b"\r\ndata: \r\nretry: " + str(retry_ms).encode() + b"\r\n\r\n"


def encode_comment(text: str) -> bytes:
    """A comment frame (a keep-alive); clients ignore it. `text` must not contain a newline."""
    return b": " + text.encode() + b"\r\n\r\n"


@dataclass(slots=True)
class SseEvent:
    """One dispatched event. `id` and `retry` are the fields set in this event, None when absent."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None
    size: int = field(default=0, compare=False)
    """Bytes of the event's lines on the wire (as received, before decoding)."""
    raw: bytes = field(default=b"", compare=False)
    """`data` as received, undecoded: what a relay passes on when it needs no rewrite."""


class SseError(ValueError):
    """An event larger than `max_event_bytes`; the parser is unusable afterwards (drop the stream)."""


class SseParser:
    """Incremental event-stream parser: `feed` bytes as they arrive, get the completed events.

    An event is dispatched at a blank line when it had a `data` field, or an `id`/`retry` field: the
    latter is a "priming" event with empty data that callers use only to remember the id and retry.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None
        self._max_event_bytes = max_event_bytes
        # Bytes of the line in progress; kept as pieces so a large event arriving in many chunks stays linear.
        self._pieces: list[bytes] = []
        self._line_bytes = 0
        self._data_bytes = 0
        self._event_bytes = 0
        # A chunk that ended in CR: an LF opening the next chunk belongs to that same line ending.
        self._skip_lf = False
        self._first_line = True
        self._data: list[bytes] = []
        self._has_data = False
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume `chunk` and return the events it completed, in order."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            return []
        self._skip_lf = chunk.endswith(b"\r")
        if b"\n" not in chunk and b"\r" not in chunk:
            self._pieces.append(chunk)
            self._line_bytes += len(chunk)
            self._check_size()
            return []
        if self._pieces:
            self._pieces.append(chunk)
            buffer = b"".join(self._pieces)
            self._pieces.clear()
        else:
            buffer = chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        tail = lines.pop()
        events: list[SseEvent] = []
        for line in lines:
            self._event_bytes += len(line) + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        if tail:
            self._pieces.append(tail)
        self._line_bytes = len(tail)
        self._check_size()
        return events

    def _check_size(self) -> None:
        if self._line_bytes + self._data_bytes > self._max_event_bytes:
            raise SseError(f"SSE event larger than {self._max_event_bytes} bytes")

    def _line(self, line: bytes) -> SseEvent | None:
        # Bytes, not text: only `event` and `id` values are decoded, so `data` reaches a relay as received.
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(UTF8_BOM)
        if not line:
            return self._dispatch()
        if line[0] == COLON:
            return None
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._has_data = True
            self._data_bytes += len(value)
            self._check_size()
        elif field == b"event":
            self._event = value.decode("utf-8", errors="replace")
        elif field == b"id":
            if b"\0" not in value:
                self._id = value.decode("utf-8", errors="replace")
                self.last_event_id = self._id
        elif field == b"retry" and value.isdigit():  # bytes.isdigit: ASCII digits only
            self._retry = int(value)
            self.retry_ms = self._retry
        return None

    def _dispatch(self) -> SseEvent | None:
        event = None
        if self._has_data or self._id is not None or self._retry is not None:
            raw = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
            event = SseEvent(
                data=raw.decode("utf-8", errors="replace"),
                event=self._event or "message",
                id=self._id,
                retry=self._retry,
                size=self._event_bytes,
                raw=raw,
            )
        self._event_bytes = 0
        self._data = []
        self._data_bytes = 0
        self._has_data = False
        self._event = ""
        self._id = None
        self._retry = None
        return event
