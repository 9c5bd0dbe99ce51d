"""Graceful drain: what a replica does between SIGTERM and its exit.

The first SIGTERM begins the drain (`sigterm_handler`); at once new requests get 503 `draining` with
`Retry-After` (`refusal`), /readyz answers 503 `draining`, and every hosted `tasks/stream` ends with its
normal empty result after its last complete event, so its reader resumes with `after` elsewhere. The
requests in flight (`track`: forwarded calls, legacy `tasks/result` waits) then have up to
`[server] drain_timeout_s` to end (`settle`); after that the gateway stops as on SIGINT: the task runs
are stopped and the owner leases handed over (`gateway.tasks.leases`), so another replica takes the
tasks over at once. Tasks are not waited for: they outlive requests, and a store keeps them. A second
SIGTERM stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from gateway.protocol.jsonrpc import RequestId, Unavailable

log = logging.getLogger("gateway.drain")

DRAINING = "draining"
"""`data.reason` of the 503 a request gets while the replica drains, and /readyz's status then."""
REFUSAL = "this replica is draining before it stops; send new requests to another replica"


def sigterm_handler(requested: asyncio.Event, task: asyncio.Task[None], listening: asyncio.Event) -> Callable[[], None]:
    """The SIGTERM handler of `serve`'s task: the first asks for a drain once the gateway is `listening`
    (before, there is nothing to drain: it stops at once), a second stops at once."""

    def on_sigterm() -> None:
        if requested.is_set() or not listening.is_set():
            task.cancel()
        requested.set()

    return on_sigterm


class Drain:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.started = asyncio.Event()
        """Set when the drain begins: hosted streams end, new requests are refused."""
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.started.is_set()

    def unready(self) -> dict[str, str] | None:
        """/readyz's 503 body while draining (out of the load balancer at once), else None."""
        return {"status": DRAINING, "reason": "the replica is draining before it stops"} if self.draining else None

    def refusal(self, request_id: RequestId | None = None) -> Unavailable | None:
        """The 503 a new request gets while the replica drains, else None."""
        return Unavailable(DRAINING, REFUSAL, request_id=request_id) if self.draining else None

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count a request in flight while the block runs. A hosted `tasks/stream` is counted too: it
        ends at once when the drain begins."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def settle(self) -> None:
        """Begin the drain, then wait until nothing is in flight, at most `timeout_s`."""
        self.started.set()
        log.info(
            "draining: new requests get 503, /readyz answers 503",
            extra={"in_flight": self._in_flight, "drain_timeout_s": self.timeout_s},
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._idle.wait()
            log.info("drained: nothing in flight")
        except TimeoutError:
            log.warning(
                "drain_timeout_s passed with work in flight: stopping it, handing the tasks over",
                extra={"in_flight": self._in_flight},
            )
