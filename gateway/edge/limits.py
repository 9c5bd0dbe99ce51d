"""Per-principal limits (`[auth.limits]`): a request rate, a budget of failed task lookups, concurrent streams.

Each is kept per principal (the keyed hash), so one caller cannot use up another's share, and
re-initializing a session resets nothing. Over a limit the edge answers HTTP 429 with `Retry-After`
before anything reaches the task service or the upstream. A lookup of an unknown task id and of
another principal's task cost the same budget: they are the same answer.

Only enforced with authentication on: with mode = "none" every caller is one principal, whose
limits would be the whole gateway's (the global ceilings of `[server]`/`[tasks]` are those).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.config import AuthLimits
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError

LOOKUP_WINDOW_S = 60.0
PRUNE_AT = 10_000
"""Principals tracked before the idle ones are forgotten (a forgotten bucket is a full one)."""


class RateLimited(ProtocolError):
    """HTTP 429 with `Retry-After`; `data.reason` is the metric label, `data.limit` the config key."""

    def __init__(self, reason: str, limit: str, what: str, retry_after_s: int) -> None:
        super().__init__(
            jsonrpc.INVALID_REQUEST,
            f"Too Many Requests: {what} ({limit}); retry after {retry_after_s} s",
            http_status=429,
            data={"reason": reason, "limit": limit},
        )
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Lookups:
    window_start: float
    failed: int = 0


class PrincipalLimits:
    def __init__(self, config: AuthLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lookups: dict[str, _Lookups] = {}
        self._streams: dict[str, int] = {}

    def admit(self, owner: str) -> None:
        """One request of `owner`: a token from its bucket, or RateLimited."""
        now = self._clock()
        rate, burst = self._config.requests_per_s, self._config.burst
        bucket = self._buckets.get(owner)
        if bucket is None:
            if len(self._buckets) >= PRUNE_AT:
                self._buckets = {key: b for key, b in self._buckets.items() if now - b.at < burst / rate}
            bucket = self._buckets[owner] = _Bucket(float(burst), now)
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1:
            wait = math.ceil((1 - bucket.tokens) / rate)
            raise RateLimited("rate_limited", "auth.limits.requests_per_s", "this caller's request rate", wait)
        bucket.tokens -= 1

    def check_lookups(self, owner: str) -> None:
        """Before a request that names a task: RateLimited once `owner` used its failed-lookup budget."""
        lookups = self._window(owner)
        if lookups.failed >= self._config.failed_lookups_per_min:
            wait = math.ceil(lookups.window_start + LOOKUP_WINDOW_S - self._clock())
            raise RateLimited(
                "lookup_budget", "auth.limits.failed_lookups_per_min", "too many unknown task ids", max(wait, 1)
            )

    def lookup_failed(self, owner: str) -> None:
        self._window(owner).failed += 1

    def _window(self, owner: str) -> _Lookups:
        now = self._clock()
        lookups = self._lookups.get(owner)
        if lookups is None or now - lookups.window_start >= LOOKUP_WINDOW_S:
            if lookups is None and len(self._lookups) >= PRUNE_AT:
                self._lookups = {k: v for k, v in self._lookups.items() if now - v.window_start < LOOKUP_WINDOW_S}
            lookups = self._lookups[owner] = _Lookups(now)
        return lookups

    @contextlib.contextmanager
    def stream(self, owner: str, retry_after_s: int) -> Iterator[None]:
        """Hold one of `owner`'s concurrent `tasks/stream` slots while the stream is served."""
        open_streams = self._streams.get(owner, 0)
        if open_streams >= self._config.max_streams:
            raise RateLimited(
                "max_streams", "auth.limits.max_streams", "this caller has its maximum of open streams", retry_after_s
            )
        self._streams[owner] = open_streams + 1
        try:
            yield
        finally:
            left = self._streams[owner] - 1
            if left:
                self._streams[owner] = left
            else:
                del self._streams[owner]
