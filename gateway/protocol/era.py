"""The two protocol eras and every rule that differs between them, in one place.

2025-11-25 and older (legacy): initialize handshake, sessions, server-to-client requests,
`notifications/cancelled` for cancellation, JSON-RPC errors on HTTP 200.
2026-07-28 (modern): per-request `_meta` envelope, no sessions, POST only, a dropped POST is the
cancel, JSON-RPC error codes map onto HTTP statuses.
"""

from __future__ import annotations

import enum

from gateway.protocol import jsonrpc

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[-1]

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

_MODERN_STATUS = {
    jsonrpc.PARSE_ERROR: 400,
    jsonrpc.INVALID_REQUEST: 400,
    jsonrpc.METHOD_NOT_FOUND: 404,
    jsonrpc.INVALID_PARAMS: 400,
    jsonrpc.HEADER_MISMATCH: 400,
    jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    jsonrpc.UNSUPPORTED_PROTOCOL_VERSION: 400,
}


class Era(enum.Enum):
    LEGACY = "2025-11-25"
    MODERN = "2026-07-28"

    @classmethod
    def for_header(cls, protocol_version: str | None) -> Era:
        """Route like the reference SDK: absent or a handshake version is legacy, anything else modern."""
        if protocol_version is None or protocol_version in HANDSHAKE_VERSIONS:
            return cls.LEGACY
        return cls.MODERN

    def status_for_response(self, message: jsonrpc.Message) -> int:
        """The HTTP status of a single JSON response carrying `message`."""
        error = message.get("error")
        if self is Era.LEGACY or not isinstance(error, dict):
            return 200
        return _MODERN_STATUS.get(error.get("code"), 200)  # type: ignore[arg-type]

    # -- behaviour that differs by era, named for the code that asks (issue 18) ----------------------

    @property
    def has_sessions(self) -> bool:
        """2025-11-25 requests live in sessions (initialize, `Mcp-Session-Id`, a GET stream, DELETE,
        client responses); 2026-07-28 ones stand alone, on POST only."""
        return self is Era.LEGACY

    @property
    def drop_cancels(self) -> bool:
        """A client that drops a request's response cancels the request (2026-07-28: closing the POST is
        the cancel); a 2025-11-25 call outlives its stream (its output is discarded)."""
        return self is Era.MODERN


# -- what a legacy session asks of its protocol version (issue 18) -------------------------------------


def primes_streams(protocol_version: str) -> bool:
    """Whether a legacy session's SSE streams open with a priming event: SEP-1699 (2025-11-25) added
    them, and older clients would try to parse their empty data."""
    return protocol_version >= LATEST_HANDSHAKE_VERSION
