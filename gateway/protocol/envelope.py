"""Validation of a 2026-07-28 request: the `_meta` envelope and the headers that mirror the body.

Order follows the reference SDK: the envelope (-32602), then header agreement (-32020), then the
version (-32022). Pure functions over a parsed message and a header lookup; no I/O.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from gateway.protocol import jsonrpc
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, MODERN_VERSIONS, PROTOCOL_VERSION_KEY
from gateway.protocol.jsonrpc import Message, ProtocolError

HeaderValues = Callable[[str], list[str]]
"""All values of one request header (case-insensitive name)."""

# Which param the `Mcp-Name` header mirrors, per method.
NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}


def check_modern_request(message: Message, header_values: HeaderValues) -> None:
    """Raise ProtocolError unless `message` is a well-formed modern request whose headers agree."""
    request_id = message.get("id")
    meta = jsonrpc.meta_of(message)
    missing = [key for key in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise ProtocolError(
            jsonrpc.INVALID_PARAMS,
            f"Invalid params: the request's params._meta envelope lacks {', '.join(missing)}",
            request_id=request_id,
        )
    version = meta[PROTOCOL_VERSION_KEY]
    _expect_header(header_values, "MCP-Protocol-Version", version, request_id)
    _expect_header(header_values, "Mcp-Method", message["method"], request_id)
    name_param = NAME_PARAM.get(message["method"])
    if name_param is not None:
        name = jsonrpc.params_of(message).get(name_param)
        if name is None:
            reason = (
                f"{message['method']} needs params.{name_param} (the Mcp-Name header repeats it); the request has none"
            )
            raise _mismatch(reason, request_id)
        _expect_header(header_values, "Mcp-Name", name, request_id)
    if version not in MODERN_VERSIONS:
        raise ProtocolError(
            jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
            f"Unsupported protocol version {version!r}",
            data={"supported": list(MODERN_VERSIONS), "requested": version},
            request_id=request_id,
        )


def _expect_header(header_values: HeaderValues, name: str, expected: object, request_id: object) -> None:
    values = header_values(name)
    if len(values) > 1:
        raise _mismatch(f"the {name} header appears {len(values)} times", request_id)
    if not values:
        raise _mismatch(f"the {name} header is required and must equal {expected!r}", request_id)
    actual = decode_header_value(values[0])
    if actual != (str(expected) if isinstance(expected, int | float) else expected):
        raise _mismatch(f"the {name} header {actual!r} does not match the body's {expected!r}", request_id)


def _mismatch(reason: str, request_id: object) -> ProtocolError:
    return ProtocolError(jsonrpc.HEADER_MISMATCH, f"Header mismatch: {reason}", request_id=request_id)  # type: ignore[arg-type]


def decode_header_value(value: str) -> str:
    """Undo the `=?base64?…?=` encoding the 2026 transport uses for values that are not plain ASCII."""
    if value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return value
    return value
