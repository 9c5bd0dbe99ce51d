"""The types of the request fields the gateway itself reads, checked once at the edge.

The gateway routes on a few fields of a client's message (a tool's name, a task id, `_meta`, a
progress token, the request a cancellation names). A value of the wrong type there is refused up front
with -32602 and HTTP 400, in both eras, so nothing downstream meets it and nothing malformed is
forwarded on the gateway's account. Absent fields are not this module's business. Pure; no I/O.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, ProtocolError

_STRING = (str,)
_ID = (str, int)  # a JSON-RPC id or a progress token
_OBJECT = (dict,)
_NUMBER = (int, float)
_NAMES = {str: "a string", int: "an integer", float: "a number", dict: "an object"}

Field = tuple[tuple[str, ...], tuple[type, ...]]

_EVERY_MESSAGE: list[Field] = [(("_meta",), _OBJECT), (("_meta", "progressToken"), _ID)]
_TASK_ID: list[Field] = [(("taskId",), _STRING)]
_CURSOR: list[Field] = [(("cursor",), _STRING)]
_BY_METHOD: dict[str, list[Field]] = {
    "tools/call": [(("name",), _STRING), (("arguments",), _OBJECT), (("task",), _OBJECT), (("task", "ttl"), _NUMBER)],
    "prompts/get": [(("name",), _STRING)],
    "resources/read": [(("uri",), _STRING)],
    "tasks/get": _TASK_ID,
    "tasks/result": _TASK_ID,
    "tasks/cancel": _TASK_ID,
    "tasks/update": [*_TASK_ID, (("requestState",), _STRING), (("inputResponses",), _OBJECT)],
    "tasks/stream": _TASK_ID,
    "tasks/list": _CURSOR,
    "tools/list": _CURSOR,
    "resources/list": _CURSOR,
    "prompts/list": _CURSOR,
    "notifications/cancelled": [(("requestId",), _ID)],
    "notifications/progress": [(("progressToken",), _ID)],
}


def check_fields(message: Message) -> None:
    """Raise ProtocolError (-32602, HTTP 400) if a field the gateway reads has the wrong type."""
    params = jsonrpc.params_of(message)
    method = message.get("method")
    for path, types in _EVERY_MESSAGE + _BY_METHOD.get(method if isinstance(method, str) else "", []):
        present, value = _lookup(params, path)
        if present and not _is(value, types):
            expected = " or ".join(_NAMES[kind] for kind in types)
            raise ProtocolError(
                jsonrpc.INVALID_PARAMS,
                f"Invalid params: params.{'.'.join(path)} must be {expected}",
                request_id=message.get("id") if "id" in message else None,
            )


def _lookup(params: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, object]:
    node: object = params
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _is(value: object, types: tuple[type, ...]) -> bool:
    # JSON true/false are Python bools, which are ints: never a valid id, number or token.
    return isinstance(value, types) and not isinstance(value, bool)
