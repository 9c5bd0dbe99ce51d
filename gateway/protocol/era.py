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
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"
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

    # -- what differs by era, named for the code that asks -----------------------------------------
    # The edge, the task service, the client and the conformance kit ask these instead of comparing
    # eras; the shapes of task messages are the Dialect's (protocol/dialect.py).

    @classmethod
    def parse(cls, text: str) -> Era:
        """The era a user names on a command line: `legacy` or `modern`, or its protocol version."""
        for era in cls:
            if text in (era.label, era.value):
                return era
        raise ValueError(f"unknown era {text!r}: legacy (2025-11-25) or modern (2026-07-28)")

    @property
    def label(self) -> str:
        """`legacy` or `modern`: the era's name on command lines and in reports."""
        return self.name.lower()

    @property
    def has_sessions(self) -> bool:
        """2025-11-25: `initialize` opens a session (`Mcp-Session-Id`, a GET stream, DELETE ends it), the
        server may send requests on a response stream (elicitation) and the client answers them, and a
        request is cancelled with `notifications/cancelled`. In 2026-07-28 each POST stands alone."""
        return self is Era.LEGACY

    @property
    def has_envelope(self) -> bool:
        """2026-07-28: every request and notification carries the `_meta` envelope (protocol version,
        client capabilities), and a request the `Mcp-Method`/`Mcp-Name` headers that mirror its body."""
        return self is Era.MODERN

    @property
    def client_asks_for_task(self) -> bool:
        """2025-11-25 (SEP-1686): a tools/call becomes a task only when the client asks with `params.task`.
        2026-07-28 (SEP-2663): the server decides, for any call of a client that declares the extension."""
        return self is Era.LEGACY

    @property
    def default_task_support(self) -> str | None:
        """A tool's `execution.taskSupport` when it does not say: `forbidden` in 2025-11-25; None in
        2026-07-28, where the server decides per call."""
        return "forbidden" if self is Era.LEGACY else None

    @property
    def tasks_capability_path(self) -> str:
        """Where a server declares its tasks capability in its `initialize` (2025-11-25) or `server/discover`
        (2026-07-28) result, for messages."""
        return "capabilities.tasks" if self is Era.LEGACY else f'capabilities.extensions["{TASKS_EXTENSION}"]'

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
