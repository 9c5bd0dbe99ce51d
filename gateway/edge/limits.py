"""Per-principal limits (`[auth.limits]`): a request rate, a budget of failed task lookups, concurrent
streams, legacy sessions (counted by `gateway.sessions.SessionRegistry`); and each principal's rate of
calls per tool (`requests_per_s`/`burst` of `[[auth.rules]]`).

Each is kept per principal (the keyed hash), so one caller cannot use up another's share, and
re-initializing a session resets nothing. Over a limit the edge answers HTTP 429 with `Retry-After`
before anything reaches the task service or the upstream. A lookup of an unknown task id and of
another principal's task cost the same budget: they are the same answer. Rate buckets are kept in
bounded tables: a bucket idle long enough to be full again is forgotten. What a limit counts is
taken before any await (a lookup is given back once the task is found), so limits hold exactly
however many requests run at once.

Only enforced with authentication on: with mode = "none" every caller is one principal, whose
limits would be the whole gateway's (the global ceilings of `[server]`/`[tasks]` are those).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

from gateway.config import AuthLimits, AuthRule
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError

LOOKUP_WINDOW_S = 60.0
PRUNE_AT = 10_000
"""Principals whose failed lookups are tracked before those outside the window are forgotten."""
MAX_BUCKETS = 50_000
"""Rate buckets kept per kind (principals; principal and tool pairs), about 200 bytes each. Reaching
it forgets the buckets that are full again and, if more than half are left, the least recently used
down to half (which forgives what they had used)."""
TOOL_NAME_CHARS = 128
"""A tool's bucket is keyed by the first this many characters of its name (MCP names are at most 128):
a client cannot make the gateway keep long names, and names alike that far share one budget."""


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


class TokenBuckets:
    """Token buckets by key, each refilled at its `rate` per second up to its `burst`; at most
    `max_keys` of them. A bucket unused for `refill_s` is full again, as a missing one is, so it can be
    forgotten. A plain dict pruned now and then: a cache with per-entry expiry cost 4 µs a request more."""

    def __init__(self, refill_s: float, clock: Callable[[], float], max_keys: int = MAX_BUCKETS) -> None:
        self._refill_s = refill_s
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[Hashable, tuple[float, float]] = {}
        """key -> (tokens, when they were counted)"""

    def take(self, key: Hashable, rate: float, burst: int) -> float:
        """One token from `key`'s bucket: 0.0 when it had one, else the seconds until it has."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max_keys:
                self._prune(now)
            bucket = (float(burst), now)
        tokens = min(float(burst), bucket[0] + (now - bucket[1]) * rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / rate
        self._buckets[key] = (tokens - 1, now)
        return 0.0

    def _prune(self, now: float) -> None:
        # Down to half at most, so that pruning (a pass over the table) comes once per max_keys / 2 new keys.
        kept = {key: bucket for key, bucket in self._buckets.items() if now - bucket[1] < self._refill_s}
        if len(kept) > self._max_keys // 2:
            by_use = sorted(kept.items(), key=lambda item: item[1][1])
            kept = dict(by_use[len(by_use) - self._max_keys // 2 :])
        self._buckets = kept


@dataclass
class _Lookups:
    window_start: float
    failed: int = 0


class PrincipalLimits:
    def __init__(
        self, config: AuthLimits, clock: Callable[[], float] = time.monotonic, rules: Sequence[AuthRule] = ()
    ) -> None:
        self._clock = clock
        self._lookups: dict[str, _Lookups] = {}
        self._streams: dict[str, int] = {}
        self.configure(config, rules)

    def configure(self, config: AuthLimits, rules: Sequence[AuthRule]) -> None:
        """Enforce `config` and the rules' rates from now on (at start, and on a config reload). What
        principals hold (open streams, failed lookups in the window) is kept; the rate buckets start
        full again."""
        self._config = config
        self._requests = TokenBuckets(config.burst / config.requests_per_s, self._clock)
        refill_s = [rule.burst / rule.requests_per_s for rule in rules if rule.burst and rule.requests_per_s]
        self._tool_calls = TokenBuckets(max(refill_s), self._clock) if refill_s else None

    def admit(self, owner: str) -> None:
        """One request of `owner`: a token from its bucket, or RateLimited."""
        wait = self._requests.take(owner, self._config.requests_per_s, self._config.burst)
        if wait:
            raise RateLimited(
                "rate_limited", "auth.limits.requests_per_s", "this caller's request rate", math.ceil(wait)
            )

    def admit_call(self, owner: str, tool: str, rule: AuthRule) -> None:
        """One `tools/call` of `tool` by `owner`, under `rule` (the tool's `[[auth.rules]]` entry): a token
        from the bucket of that principal and tool when the rule has a rate, or RateLimited."""
        if self._tool_calls is None or rule.requests_per_s is None or rule.burst is None:
            return
        wait = self._tool_calls.take((owner, tool[:TOOL_NAME_CHARS]), rule.requests_per_s, rule.burst)
        if wait:
            raise RateLimited(
                "tool_rate_limited",
                "auth.rules.requests_per_s",
                f"this caller's calls of the tool {tool[:TOOL_NAME_CHARS]}",
                math.ceil(wait),
            )

    def reserve_lookup(self, owner: str) -> Callable[[], None]:
        """Before a request that names a task: one of `owner`'s failed lookups, taken now (before any
        await, so that concurrent lookups cannot all pass the check), or RateLimited once the budget is
        used. The returned function gives it back, once, when the task was found."""
        lookups = self._window(owner)
        if lookups.failed >= self._config.failed_lookups_per_min:
            wait = math.ceil(lookups.window_start + LOOKUP_WINDOW_S - self._clock())
            raise RateLimited(
                "lookup_budget", "auth.limits.failed_lookups_per_min", "too many unknown task ids", max(wait, 1)
            )
        lookups.failed += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:  # to the window it was taken from: a new window owes nothing
                given_back = True
                lookups.failed -= 1

        return give_back

    def lookup_failed(self, owner: str) -> None:
        """A failed lookup with none reserved (found at first, gone by the time it was answered)."""
        self._window(owner).failed += 1

    def _window(self, owner: str) -> _Lookups:
        now = self._clock()
        lookups = self._lookups.get(owner)
        if lookups is None or now - lookups.window_start >= LOOKUP_WINDOW_S:
            if lookups is None and len(self._lookups) >= PRUNE_AT:
                self._lookups = {k: v for k, v in self._lookups.items() if now - v.window_start < LOOKUP_WINDOW_S}
            lookups = self._lookups[owner] = _Lookups(now)
        return lookups

    def check_sessions(self, owner: str, held: int, retry_after_s: int) -> None:
        """Before `owner` opens a legacy session, holding `held`: RateLimited at `max_sessions`."""
        if held >= self._config.max_sessions:
            raise RateLimited(
                "max_sessions",
                "auth.limits.max_sessions",
                "this caller has its maximum of legacy sessions; end those it no longer uses with DELETE",
                retry_after_s,
            )

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
