"""How many bytes of upstream messages wait for clients: each stream's bound and the gateway-wide budget.

Every Exchange (one forwarded request's messages, a legacy session's GET stream) counts the wire size
of the messages it holds, from the moment they are queued until its consumer has written them (it
comes back for more, or lets go). Sizes come from the links, which hold each message's raw bytes when
they parse it: nothing is serialised again to be measured. A stream at `stream_bytes` (or
`stream_messages`) makes its upstream reader wait. The gateway-wide total is checked only when new
streaming work starts, which is refused over `budget_bytes`: a slow client never stalls the others.
This module does no I/O.
"""

from __future__ import annotations

from gateway.metrics import Metrics
from gateway.protocol.jsonrpc import Overloaded, RequestId

MiB = 1024 * 1024

BUDGET_KEY = "server.buffered_bytes_budget"


class BufferBudget:
    """The per-stream bounds every exchange applies, and the bytes all of them hold right now."""

    def __init__(
        self,
        *,
        stream_messages: int = 1024,
        stream_bytes: int = 4 * MiB,
        budget_bytes: int | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.stream_messages = stream_messages
        self.stream_bytes = stream_bytes
        self.budget_bytes = budget_bytes
        self.held = 0
        """Bytes held by every exchange together; exchanges add and subtract directly (hot path)."""
        self._metrics = metrics
        if metrics is not None:
            metrics.buffered_bytes.set_function(lambda: self.held)

    def admit(self, request_id: RequestId | None) -> None:
        """Refuse new streaming work while the held total is at or over the budget: `Overloaded` (HTTP
        503 with Retry-After, counted by the edge like every other ceiling)."""
        if self.budget_bytes is None or self.held < self.budget_bytes:
            return
        raise Overloaded(
            BUDGET_KEY,
            f"the gateway holds {self.held} bytes for clients that have not read them yet, at or over its "
            f"budget of {self.budget_bytes}",
            "retry later: buffers drain as their clients read, or when slow ones are cut (server.write_timeout_s)",
            request_id=request_id,
        )

    def dropped(self, messages: int) -> None:
        """Count upstream messages discarded because their client went away or was cut."""
        if messages and self._metrics is not None:
            self._metrics.messages_dropped.inc(messages)
