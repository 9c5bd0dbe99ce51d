"""The shapes the modern bridge rewrites between a 2026-07-28 client and a 2025-11-25 session.

Plain functions over raw JSON dicts (no I/O, no SDK models): a 2026 request without its `_meta`
envelope, the legacy capabilities a 2026 client's declared ones become, a legacy result as a 2026 one
(`resultType`, `ttlMs`/`cacheScope`, `serverInfo`, error codes), `server/discover` answered from a
session's `initialize` result, and server-to-client requests as MRTR `inputRequests`.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LOG_LEVEL_KEY
from gateway.protocol.era import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
)
from gateway.protocol.jsonrpc import Message, RequestId

ENVELOPE_KEYS = frozenset({PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, LOG_LEVEL_KEY})
"""`_meta` keys that are the 2026 envelope: the legacy session carries them (or, the log level, the bridge)."""

GATEWAY_CLIENT_INFO = {"name": "mcp-task-gateway", "version": "1"}

FORWARDED_METHODS = frozenset(
    {
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "completion/complete",
    }
)
"""2026-07-28 requests sent on to the legacy session (translated); `server/discover` and
`subscriptions/listen` the bridge answers itself; anything else does not exist in 2026 (-32601)."""
CACHEABLE_METHODS = frozenset(
    {"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read", "server/discover"}
)
MRTR_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
"""The requests an `InputRequiredResult` may answer (SEP-2322)."""
INPUT_CAPABILITY = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""Server-to-client requests that become MRTR input requests, and the client capability each needs."""
LEGACY_CAPABILITIES = ("elicitation", "sampling", "roots")

LEGACY_ONLY_NOTIFICATIONS = frozenset(
    {"notifications/cancelled", "notifications/elicitation/complete", "notifications/tasks/status"}
)
"""What a legacy session may send on a request's stream that 2026-07-28 has no place for there: a
server's cancel (2026 keeps it for ending a stdio listen), URL elicitation's completion (removed), and
SEP-1686 task status (the bridge never asks the session for tasks). Not relayed."""

CACHE_TTL_MS = 0
"""A legacy server promises nothing about how long a list stays true (it may change it at any time,
per session): bridged results are not to be reused."""
RESOURCE_NOT_FOUND = -32002
"""The 2025-11-25 resource-not-found code; 2026-07-28 uses -32602."""

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def client_capabilities(message: Message) -> dict[str, Any]:
    capabilities = jsonrpc.meta_of(message).get(CLIENT_CAPABILITIES_KEY)
    return capabilities if isinstance(capabilities, dict) else {}


def legacy_capabilities(declared: dict[str, Any]) -> dict[str, Any]:
    """What a 2026 client declares, as the capabilities of a 2025-11-25 `initialize`: what the session
    can ask of the client (elicitation, sampling, roots); `extensions` and the rest stay with the gateway."""
    return {key: declared[key] for key in LEGACY_CAPABILITIES if isinstance(declared.get(key), dict)}


def initialize_request(request_id: RequestId, message: Message, version: str) -> Message:
    """The bridge's `initialize` for a session serving `message`'s client."""
    info = jsonrpc.meta_of(message).get(CLIENT_INFO_KEY)
    if not (isinstance(info, dict) and isinstance(info.get("name"), str) and isinstance(info.get("version"), str)):
        info = GATEWAY_CLIENT_INFO
    params = {
        "protocolVersion": version,
        "capabilities": legacy_capabilities(client_capabilities(message)),
        "clientInfo": info,
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}


def legacy_request(message: Message, upstream_id: RequestId) -> Message:
    """`message` for the legacy session: a new id, no envelope, its progress token (if any) the new id
    (so the session's notifications of concurrent calls never collide); other `_meta` keys kept."""
    params = dict(jsonrpc.params_of(message))
    meta = {key: value for key, value in jsonrpc.meta_of(message).items() if key not in ENVELOPE_KEYS}
    if "progressToken" in meta:
        meta["progressToken"] = upstream_id
    params.pop("_meta", None)
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": upstream_id, "method": message["method"], "params": params}


def says_session_unknown(final: Message) -> bool:
    """Whether a legacy server's error response says it does not know the request's session. The
    TypeScript example servers answer an unknown `Mcp-Session-Id` with HTTP 400 and -32000 "No valid
    session ID provided", not the 404 the transport specifies (which the HTTP link reports as a loss)."""
    error = final.get("error")
    return (
        isinstance(error, dict) and error.get("code") == -32000 and "session" in str(error.get("message", "")).lower()
    )


def log_level(message: Message) -> int | None:
    """The index of the log level the request opted in to (`_meta` logLevel); None: no logs."""
    level = jsonrpc.meta_of(message).get(LOG_LEVEL_KEY)
    return LOG_LEVELS.index(level) if level in LOG_LEVELS else None


def wants_log(message: Message, threshold: int | None) -> bool:
    """Whether a `notifications/message` reaches a request that opted in at `threshold`."""
    if threshold is None:
        return False
    level = jsonrpc.params_of(message).get("level")
    return level in LOG_LEVELS and LOG_LEVELS.index(level) >= threshold


def with_meta(result: dict[str, Any], server_info: Any) -> dict[str, Any]:
    meta = result.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if server_info is not None:
        meta[SERVER_INFO_KEY] = server_info
    return {**result, "_meta": meta}


def modern_final(final: Message, client_id: RequestId, method: str, server_info: Any) -> Message:
    """The legacy session's response to a request, as the 2026 client's response."""
    error = final.get("error")
    if isinstance(error, dict):
        if error.get("code") == RESOURCE_NOT_FOUND:
            error = {**error, "code": jsonrpc.INVALID_PARAMS}
        return {"jsonrpc": "2.0", "id": client_id, "error": error}
    result = final.get("result")
    result = dict(result) if isinstance(result, dict) else {}
    result["resultType"] = "complete"
    if method in CACHEABLE_METHODS:
        result["ttlMs"] = CACHE_TTL_MS
        result["cacheScope"] = "private"  # a session's answer: never shared across principals
    return {"jsonrpc": "2.0", "id": client_id, "result": with_meta(result, server_info)}


def discover_result(initialized: dict[str, Any]) -> dict[str, Any]:
    """`server/discover`, answered from the session's `initialize` result. The legacy `tasks`
    capability is left out: 2026-07-28 clients get the gateway's hosted tasks, which work over the
    session's plain calls (the session's own SEP-1686 tasks have no 2026 shape)."""
    capabilities = initialized.get("capabilities")
    capabilities = {key: value for key, value in (capabilities or {}).items() if key != "tasks"}
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": capabilities,
        "ttlMs": CACHE_TTL_MS,
        "cacheScope": "private",
    }
    if isinstance(initialized.get("instructions"), str):
        result["instructions"] = initialized["instructions"]
    return with_meta(result, initialized.get("serverInfo"))


def input_request(request: Message) -> dict[str, Any]:
    """A server-to-client request as an MRTR input request (`{method, params}`). A 2025-11-25
    elicitation may leave out `mode`; 2026-07-28 requires it (form is the legacy default)."""
    params = dict(jsonrpc.params_of(request))
    if request.get("method") == "elicitation/create" and "mode" not in params:
        params["mode"] = "url" if "url" in params else "form"
    return {"method": request["method"], "params": params}


def input_response(request_id: RequestId, answer: dict[str, Any]) -> Message:
    """The client's MRTR answer to one input request, as the response to the session's request."""
    result = {key: value for key, value in answer.items() if key != "resultType"}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def input_required(client_id: RequestId, requests: dict[str, Any], state: str, server_info: Any) -> Message:
    result = {"resultType": "input_required", "inputRequests": requests, "requestState": state}
    return {"jsonrpc": "2.0", "id": client_id, "result": with_meta(result, server_info)}
