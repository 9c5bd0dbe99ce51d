"""Whether the upstream is usable, kept current for /readyz without touching the upstream per call.

A check opens a fresh handshake-era upstream conversation (`Upstream.probe_session`) and sends
`initialize`. The upstream is usable when it answers, with a result or with its own JSON-RPC error (a
2026-07-28-only server refuses `initialize` but runs); it is not when the link ends the request itself
(the command cannot start or exits first, the URL does not answer or answers with an HTTP error) or
nothing answers within `server.initialize_timeout_s`.

One background task owns the checks: while the upstream is unusable it checks again with capped
exponential backoff; while usable, when real traffic reports an upstream failure (`Upstream.on_failure`)
and every `recheck_interval_s`. Each change of state is logged once (with the upstream's configured
name in the line's `upstream` field) and told to the `on_change` listeners; /readyz only reads the state.

With several upstreams each has its own `Readiness`, and a `ReadinessSet` says whether the gateway is
ready (`[server] ready_when`: any or all of them) and gives the /readyz body naming each.
`unavailable_error` is what a request for an unusable upstream gets: 503, naming the upstream and why
in words that name no command line, URL or path.

The task store's health (`StoreHealth`) is kept beside it: /readyz answers 503 while the store cannot
be used (its server down, its disk full), whatever the upstream's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from gateway.config import ReadinessConfig, UpstreamConfig
from gateway.metrics import DEFAULT_UPSTREAM, Metrics
from gateway.protocol.jsonrpc import Unavailable
from gateway.upstream.base import Upstream
from gateway.upstream.bridge.eras import UpstreamEras, probe_initialize
from gateway.upstream.bridge.upstream import BridgingUpstream

log = logging.getLogger("gateway.readiness")

Status = Literal["starting", "ready", "unready"]
ReadyWhen = Literal["any", "all"]

UPSTREAM_UNAVAILABLE = "upstream_unavailable"
"""`data.reason` of the error a request for an unusable upstream gets (`unavailable_error`)."""

PROBE_INITIALIZE = probe_initialize("mcp-task-gateway-readiness")


@dataclass(frozen=True, slots=True)
class UpstreamState:
    status: Status
    reason: str | None
    """Why the upstream is not usable (None when it is), for the log and /readyz: it may quote the
    upstream's own words (its last stderr line, an HTTP error body), which may name paths."""
    since: float
    """Wall-clock time of the last change of status."""
    era: UpstreamEras | None = None
    """The eras the upstream speaks, once learnt (an upstream behind the era seam)."""
    client_reason: str | None = None
    """`reason` as clients may be told it: without the upstream's own words."""

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def body(self) -> dict[str, Any]:
        """The /readyz body. It names no command line or URL: /readyz needs no credentials."""
        since = datetime.fromtimestamp(self.since, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        body: dict[str, Any] = {"status": self.status, "since": since}
        if self.reason is not None:
            body["reason"] = self.reason
        if self.era is not None:
            body["era"] = self.era.label
        return body


def retry_delays(initial_s: float, max_s: float) -> Iterator[float]:
    """initial_s, doubling each time, capped at max_s."""
    delay = initial_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


@dataclass(frozen=True, slots=True)
class Unusable:
    """What a check found wrong: `reason` for the log and /readyz, `client_reason` for clients."""

    reason: str
    client_reason: str


def unavailable_error(name: str, state: UpstreamState) -> Unavailable:
    """The 503 (with Retry-After, as the edge answers every `Unavailable`) a request for the upstream
    `name` gets while `state` is not ready. It names the upstream and why, never its address."""
    why = state.client_reason or f"its state is {state.status}"
    error = Unavailable(UPSTREAM_UNAVAILABLE, f"upstream {name!r} is not usable ({why}): see /readyz")
    error.data["upstream"] = name
    return error


def upstream_name(config: UpstreamConfig) -> str:
    """How the log names the upstream: its command line or URL."""
    if config.command:
        return f"command `{shlex.join(config.command)}`"
    return str(config.url)


class BackgroundLoop(ABC):
    """A check that runs as one background task of its own: `start` runs `_run`, `stop` cancels it and
    waits until it has ended."""

    loop_name: ClassVar[str]
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.loop_name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @abstractmethod
    async def _run(self) -> None: ...


ChangeListener = Callable[[str, UpstreamState], None]
"""Told the upstream's configured name and its new state at each change of status. Must not block."""

FIRST_CHECK_PENDING = "the first check of the upstream has not finished"


class Readiness(BackgroundLoop):
    """One upstream's usability, checked in the background (`start`/`stop`) and read by /readyz (`state`).

    `described` names the upstream in log messages (its command line or URL: `upstream_name`); `name` is
    its configured name, the `upstream` label of its metrics and field of its log lines."""

    loop_name = "readiness"

    def __init__(
        self,
        upstream: Upstream,
        described: str,
        config: ReadinessConfig,
        check_timeout_s: float,
        metrics: Metrics,
        *,
        name: str = DEFAULT_UPSTREAM,
    ) -> None:
        self.name = name
        self._upstream = upstream
        self._era: UpstreamEras | None = None
        self._described = described
        self._config = config
        self._check_timeout_s = check_timeout_s
        self._ready_gauge = metrics.upstream_ready.labels(upstream=name)
        self._ready_gauge.set(0)
        self._checks = {
            usable: metrics.upstream_checks.labels(outcome="usable" if usable else "unusable", upstream=name)
            for usable in (True, False)
        }
        self._state = UpstreamState("starting", FIRST_CHECK_PENDING, time.time(), client_reason=FIRST_CHECK_PENDING)
        self._listeners: list[ChangeListener] = []
        self._suspect = asyncio.Event()
        upstream.on_failure(self._on_traffic_failure)

    @property
    def state(self) -> UpstreamState:
        return self._state

    def on_change(self, listener: ChangeListener) -> None:
        """Tell `listener` each change of status from now on (ready, unready; never back to starting)."""
        self._listeners.append(listener)

    def _on_traffic_failure(self, cause: str) -> None:
        self._suspect.set()

    async def check(self) -> Unusable | None:
        """Check the upstream once: None when it is usable, else why not."""
        async with self._upstream.probe_session() as channel:
            exchange = await channel.request(PROBE_INITIALIZE, {})
            try:
                async with asyncio.timeout(self._check_timeout_s):
                    await exchange.collect()
            except TimeoutError:
                await exchange.cancel()
                late = f"initialize not answered within {self._check_timeout_s:g} s"
                return Unusable(late, late)
        if exchange.failure is not None:
            return Unusable(f"initialize failed: {exchange.failure_detail}", f"initialize failed: {exchange.failure}")
        if isinstance(self._upstream, BridgingUpstream):
            self._era = await self._upstream.learn_eras()
        return None

    async def _run(self) -> None:
        delays = retry_delays(self._config.retry_initial_s, self._config.retry_max_s)
        while True:
            self._suspect.clear()
            try:
                problem = await self.check()
            except Exception:  # a bug here must not stop readiness from being kept
                log.exception("the upstream check failed", extra={"upstream": self.name})
                failed = "the upstream check failed (the gateway's log has the cause)"
                problem = Unusable(failed, failed)
            self._record(problem)
            if problem is not None:
                await asyncio.sleep(next(delays))
                continue
            delays = retry_delays(self._config.retry_initial_s, self._config.retry_max_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.recheck_interval_s or None):
                    await self._suspect.wait()
            # A burst of failing requests costs one check per retry_initial_s at most.
            await asyncio.sleep(self._config.retry_initial_s)

    def _record(self, problem: Unusable | None) -> None:
        previous = self._state
        status: Status = "ready" if problem is None else "unready"
        since = previous.since if status == previous.status else time.time()
        if problem is None:
            self._state = UpstreamState(status, None, since, self._era)
        else:
            self._state = UpstreamState(status, problem.reason, since, self._era, problem.client_reason)
        self._ready_gauge.set(1 if problem is None else 0)
        self._checks[problem is None].inc()
        if status == previous.status:
            return
        extra = {"upstream": self.name}
        if problem is None:
            era = f" ({self._era.describe()})" if self._era is not None else ""
            again = "ready" if previous.status == "starting" else "usable again"
            log.info("upstream %s %s%s", self._described, again, era, extra=extra)
        else:
            log.warning(
                "upstream %s not usable%s (%s); checking again in the background, /readyz answers 503 until it is",
                self._described,
                "" if previous.status == "starting" else " any more",
                problem.reason,
                extra=extra,
            )
        for listener in self._listeners:
            try:
                listener(self.name, self._state)
            except Exception:  # a listener's bug must not stop readiness from being kept
                log.exception("a readiness listener failed", extra=extra)


class ReadinessSet:
    """The readiness of every configured upstream: the gateway is ready while any (or all, `ready_when`)
    of them are. Starts and stops their checks together."""

    def __init__(self, readinesses: list[Readiness], ready_when: ReadyWhen) -> None:
        names = [readiness.name for readiness in readinesses]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a ReadinessSet needs upstreams with distinct names, got {names}")
        self._readinesses = {readiness.name: readiness for readiness in readinesses}
        self.ready_when = ready_when

    def start(self) -> None:
        for readiness in self._readinesses.values():
            readiness.start()

    async def stop(self) -> None:
        await asyncio.gather(*(readiness.stop() for readiness in self._readinesses.values()))

    def add(self, readiness: Readiness) -> None:
        """One more upstream (a config reload added it), its checks started."""
        self._readinesses[readiness.name] = readiness
        readiness.start()

    async def remove(self, name: str) -> None:
        """Upstream `name` is served no more (a config reload removed it): its checks stop."""
        await self._readinesses.pop(name).stop()

    def on_change(self, listener: ChangeListener) -> None:
        """Tell `listener` each change of status of any upstream (`Readiness.on_change`)."""
        for readiness in self._readinesses.values():
            readiness.on_change(listener)

    @property
    def ready(self) -> bool:
        states = (readiness.state.ready for readiness in self._readinesses.values())
        return any(states) if self.ready_when == "any" else all(states)

    def state_of(self, name: str) -> UpstreamState:
        """The state of the upstream configured as `name` (KeyError for an unknown name)."""
        return self._readinesses[name].state

    def body(self) -> dict[str, Any]:
        """The /readyz body (200 while `ready`, else 503): the overall status and each upstream's own body."""
        return {
            "status": "ready" if self.ready else "unready",
            "ready_when": self.ready_when,
            "upstreams": {name: readiness.state.body() for name, readiness in self._readinesses.items()},
        }


STORE_PROBE_S = 1.0
"""How often the task store is probed (one read) for /readyz."""
STORE_FAILURE_MEMORY_S = 5.0
"""How long a request's failure to use the store keeps /readyz at "store down" without a probe's
failure (a disk that takes no writes still answers reads)."""


class StoreHealth(BackgroundLoop):
    """Whether the task store can be used, for /readyz: down while the running tasks' writes are held
    (`writes_held`), while the last probe (one read, every `STORE_PROBE_S`) failed, and for
    `STORE_FAILURE_MEMORY_S` after a request found it unusable (`failed`)."""

    loop_name = "store-health"

    def __init__(self, probe: Callable[[], Awaitable[object]], writes_held: Callable[[], bool]) -> None:
        self._probe = probe
        self._writes_held = writes_held
        self._probe_error: str | None = None
        self._failed_at = -math.inf
        self._failure: str | None = None

    def failed(self, error: BaseException) -> None:
        """A request could not use the store."""
        self._failed_at = time.monotonic()
        self._failure = str(error)

    @property
    def problem(self) -> str | None:
        """Why the store cannot be used now, or None."""
        if self._writes_held():
            return "the task store takes no writes; running tasks' writes are held"
        if self._probe_error is not None:
            return f"the task store cannot be read: {self._probe_error}"
        if time.monotonic() - self._failed_at < STORE_FAILURE_MEMORY_S:
            return f"the task store failed a request: {self._failure}"
        return None

    def unready(self) -> dict[str, str] | None:
        """/readyz's 503 body while the store cannot be used, else None."""
        problem = self.problem
        return None if problem is None else {"status": "unready", "store": "down", "reason": problem}

    async def _run(self) -> None:
        while True:
            was = self.problem
            try:
                async with asyncio.timeout(STORE_PROBE_S * 5):
                    await self._probe()
                self._probe_error = None
            except Exception as error:  # any failure to read is the store's state, not a crash
                self._probe_error = str(error) or type(error).__name__
            now = self.problem
            if (was is None) != (now is None):
                if now is None:
                    log.warning("the task store is usable again")
                else:
                    log.warning("the task store cannot be used (%s); /readyz answers 503 until it can", now)
            await asyncio.sleep(STORE_PROBE_S)
