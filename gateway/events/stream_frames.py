"""`notifications/tasks/event` SSE frames of stored events: the bytes every tasks/stream writes.

One task's frames differ only in seq, body and recording time; they are built by joining fixed parts
around those, never through a JSON encoder, so that a block of events costs one join.
"""

from __future__ import annotations

import functools
import time

import orjson

from gateway.events.log import StoredEvent
from gateway.protocol import sse
from gateway.protocol.names import RECORDED_AT_KEY, RELATED_TASK_KEY


def recorded_at(created: float) -> bytes:
    """`created` (seconds since the epoch) as UTC ISO 8601 with milliseconds, e.g. ``2026-12-01T09:43:00.123Z``.

    Rounding is monotonic, so times that never decrease keep never decreasing once formatted.
    """
    return _millisecond_stamp(round(created * 1000))


def _millisecond_stamp(millis: int) -> bytes:
    second, millisecond = divmod(millis, 1000)
    return b"%s.%03dZ" % (_utc_second(second), millisecond)


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> bytes:
    # A replay formats many events of the same second: strftime once per second, not once per event.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()


class EventFrames:
    """Builds `notifications/tasks/event` SSE frames for one task from stored event bodies.

    Each event's `_meta` carries the related task (SEP-2694's MUST) and the time the gateway recorded it.
    """

    def __init__(self, task_id: str) -> None:
        quoted = orjson.dumps(task_id)
        head = b'{"jsonrpc":"2.0","method":"notifications/tasks/event","params":{"seq":'
        self._middle = b',"taskId":' + quoted + b","
        meta = b',"_meta":{"' + RELATED_TASK_KEY.encode() + b'":{"taskId":' + quoted + b"}"
        self._meta_open = meta + b',"' + RECORDED_AT_KEY.encode() + b'":"'
        # The same frame as sse.encode_message(message), split around the varying parts.
        self._open_frame, close_frame = sse.encode_message(head + b"\0").split(b"\0")
        self._meta_close = b'"}}}' + close_frame

    def frames(self, events: list[StoredEvent]) -> bytes:
        """SSE frames for a batch, joined once (the replay hot path: no per-event concatenation)."""
        open_frame, middle, meta_open, meta_close = self._open_frame, self._middle, self._meta_open, self._meta_close
        parts: list[bytes] = []
        # The events of a burst share their millisecond: format each distinct one once.
        last_millis, stamp = -1, b""
        for event in events:
            millis = round(event.created * 1000)
            if millis != last_millis:
                last_millis, stamp = millis, _millisecond_stamp(millis)
            parts += (open_frame, b"%d" % event.seq, middle, event.body, meta_open, stamp, meta_close)
        return b"".join(parts)
