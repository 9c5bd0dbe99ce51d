"""HTTP hygiene the gateway does itself: Host and Origin allow-lists, Accept and Content-Type rules.

Pure functions over header values that raise ProtocolError carrying the documented status. Allow-list
entries are exact values or end in `:*` to allow any port.
"""

from __future__ import annotations

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError

JSON = "application/json"
EVENT_STREAM = "text/event-stream"


def _allowed(value: str, allow_list: list[str]) -> bool:
    for entry in allow_list:
        if entry == "*" or entry == value:
            return True
        if entry.endswith(":*"):
            prefix = entry[:-1]
            if value.startswith(prefix) and value[len(prefix) :].isdigit():
                return True
    return False


def check_host(host: str | None, allowed_hosts: list[str]) -> None:
    if host is None or not _allowed(host, allowed_hosts):
        raise ProtocolError(jsonrpc.INVALID_REQUEST, f"Invalid Host header {host!r}", http_status=421)


def check_origin(origin: str | None, allowed_origins: list[str]) -> None:
    # Non-browser clients send no Origin; a present one must be allowed (DNS-rebinding protection).
    if origin is not None and not _allowed(origin, allowed_origins):
        raise ProtocolError(jsonrpc.INVALID_REQUEST, f"Invalid Origin header {origin!r}", http_status=403)


def _media_types(accept: str) -> set[str]:
    return {part.split(";", 1)[0].strip().lower() for part in accept.split(",") if part.strip()}


def _accepts(types: set[str], wanted: str) -> bool:
    major = wanted.split("/", 1)[0]
    return bool(types & {wanted, f"{major}/*", "*/*"})


def check_accept_post(accept: str | None) -> None:
    types = _media_types(accept or "")
    if not (_accepts(types, JSON) and _accepts(types, EVENT_STREAM)):
        raise ProtocolError(
            jsonrpc.INVALID_REQUEST,
            f"Not Acceptable: the Accept header must list both {JSON} and {EVENT_STREAM}",
            http_status=406,
        )


def check_accept_stream(accept: str | None) -> None:
    if not _accepts(_media_types(accept or ""), EVENT_STREAM):
        raise ProtocolError(
            jsonrpc.INVALID_REQUEST, f"Not Acceptable: the Accept header must list {EVENT_STREAM}", http_status=406
        )


def check_content_type(content_type: str | None) -> None:
    if content_type is None or content_type.split(";", 1)[0].strip().lower() != JSON:
        raise ProtocolError(
            jsonrpc.INVALID_REQUEST,
            f"Unsupported Media Type: Content-Type must be {JSON}, got {content_type!r}",
            http_status=415,
        )
