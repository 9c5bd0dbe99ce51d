"""HTTP hygiene the gateway does itself: Host and Origin allow-lists, Accept and Content-Type rules.

Pure functions over header values that raise ProtocolError carrying the documented status. Allow-list
entries are `host[:port]` (Host) or `scheme://host[:port]` (Origin), `:*` for any port, or `*` for
anything. Names compare case-insensitively, and a value without a port has its scheme's default port
(80 for a Host and for http, 443 for https), as browsers omit it.
"""

from __future__ import annotations

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError

JSON = "application/json"
EVENT_STREAM = "text/event-stream"


_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _authority(value: str, *, origin: bool) -> tuple[str, str] | None:
    """`(name, port)` of a Host (`host[:port]`) or an Origin (`scheme://host[:port]`), lower-cased, with
    the scheme's default port filled in (a Host is taken as http); None when it is not one."""
    scheme, rest = "http", value.strip().lower()
    if origin:
        scheme, separator, rest = rest.partition("://")
        if not separator:
            return None
    if rest.startswith("["):  # an IPv6 literal: [::1] or [::1]:8080
        end = rest.find("]") + 1
        host, port_part = rest[:end], rest[end:]
    else:
        host, colon, port = rest.partition(":")
        port_part = colon + port
    if not host or (port_part and not port_part.startswith(":")):
        return None
    port = port_part[1:] if port_part else _DEFAULT_PORTS.get(scheme, "")
    return (f"{scheme}://{host}" if origin else host), port


def _allowed(value: str, allow_list: list[str], *, origin: bool) -> bool:
    wanted = _authority(value, origin=origin)
    if wanted is None or not wanted[1].isdigit():
        return "*" in allow_list
    for entry in allow_list:
        if entry == "*":
            return True
        allowed = _authority(entry, origin=origin)
        if allowed is not None and allowed[0] == wanted[0] and allowed[1] in ("*", wanted[1]):
            return True
    return False


def check_host(host: str | None, allowed_hosts: list[str]) -> None:
    if host is None or not _allowed(host, allowed_hosts, origin=False):
        raise ProtocolError(jsonrpc.INVALID_REQUEST, f"Invalid Host header {host!r}", http_status=421)


def check_origin(origin: str | None, allowed_origins: list[str]) -> None:
    # Non-browser clients send no Origin; a present one must be allowed (DNS-rebinding protection).
    if origin is not None and not _allowed(origin, allowed_origins, origin=True):
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
