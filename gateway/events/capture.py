"""Capture: turns upstream notifications and the gateway's own lifecycle facts into task events.

The ordered `[[rules]]` decide how a notification becomes an event: the first rule whose method
(a glob) and `match` fields fit wins; it drops the notification or names the event type (always
under the configured vendor prefix) and its payload (params without `_meta`, selected fields, or the
whole message). Payloads over `max_payload_bytes` become a `<prefix>.payload.omitted` event, so seq
stays gap-free. An event's audit fields (`task.created`: who created the task, a digest of its
arguments) are fixed-size values the gateway computes: they are added on top of the bound and kept in a
`payload.omitted` event too, so a small bound never loses them. Pure functions over dicts; appending to
the log is the caller's business.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.config import CaptureRule
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.protocol.names import RELATED_TASK_KEY


@dataclass(frozen=True, slots=True)
class TaskEvent:
    type: str
    payload: dict[str, Any]
    audit: Mapping[str, str] = field(default_factory=dict)
    """Fixed-size fields merged into the payload outside `max_payload_bytes` (see the module docstring)."""


class Capture:
    def __init__(self, rules: Sequence[CaptureRule], prefix: str, max_payload_bytes: int) -> None:
        self._rules = list(rules)
        self.prefix = prefix
        self._max_payload_bytes = max_payload_bytes

    def event_type(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def from_notification(self, message: Message, upstream: str | None = None) -> TaskEvent | None:
        """The event a notification maps to, or None when a rule drops it or none matches. `upstream`:
        the named upstream it came from (several upstreams): only its scoped rules and the unscoped
        ones apply, and the event records it (an audit field)."""
        method = message.get("method", "")
        params = jsonrpc.params_of(message)
        for rule in self._rules:
            if rule.upstream is not None and rule.upstream != upstream:
                continue
            if not fnmatch.fnmatchcase(method, rule.method) or not _fields_match(params, rule.match):
                continue
            if rule.drop or rule.type is None:
                return None
            audit = {"upstream": upstream} if upstream is not None else {}
            return TaskEvent(self.event_type(rule.type), _payload(rule, method, params), audit)
        return None

    def lifecycle(self, name: str, **payload: Any) -> TaskEvent:
        """An event the gateway records itself (task.created, task.status, task.terminal, input.*)."""
        return TaskEvent(self.event_type(name), payload)

    def encode(self, event: TaskEvent) -> bytes:
        """The stored body of an event: its `type` and `payload` members, size-limited (the payload
        without its audit fields)."""
        payload = orjson.dumps(event.payload)
        if len(payload) > self._max_payload_bytes:
            omitted = {"originalType": event.type, "size": len(payload), "limit": self._max_payload_bytes}
            return encode_body(self.event_type("payload.omitted"), orjson.dumps({**omitted, **event.audit}))
        if event.audit:
            payload = orjson.dumps({**event.payload, **event.audit})
        return encode_body(event.type, payload)


def encode_body(event_type: str, payload_json: bytes) -> bytes:
    return b'"type":' + orjson.dumps(event_type) + b',"payload":' + payload_json


def _fields_match(params: dict[str, Any], wanted: dict[str, Any]) -> bool:
    for path, value in wanted.items():
        current: Any = params
        for part in path.split("."):
            if not isinstance(current, dict) or part not in current:
                return False
            current = current[part]
        if current != value:
            return False
    return True


def _payload(rule: CaptureRule, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {key: value for key, value in params.items() if key != "_meta"}
    if rule.fields is not None:
        return {key: body[key] for key in rule.fields if key in body}
    if rule.payload == "message":
        return {"method": method, "params": body}
    return body


def related_task_id(message: Message) -> str | None:
    related = jsonrpc.meta_of(message).get(RELATED_TASK_KEY)
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None
