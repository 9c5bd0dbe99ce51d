"""The retained per-task event log: its interface (``EventLog``) and the embedded in-memory store.

Each task has its own log of opaque byte bodies numbered by ``seq`` from 0, incrementing by exactly 1
(SEP-2694). A log carries its own end and deletion: ``seal`` ends it (a reader caught up with a sealed
log is done), and ``delete`` drops its events but leaves a tombstone that keeps ``next_seq``, so a seq
is never reused. Retention is per task and happens where the task's log is touched (append, read,
bounds): at most ``max_events_per_task`` events, none older than ``max_event_age_s``; no sweeper walks
the whole store. Readers are cursors, not queues: the log keeps no per-reader state and wakes every
waiter of a task when it grows or is sealed or deleted.

The interface is kept as small as Redis Streams', and each operation maps onto the other stores:

- ``append`` (batched, optionally sealing): Redis, one script that checks the meta hash (sealed,
  deleted), runs ``XADD key MAXLEN ~ N 0-<seq+1> t <time> d <body>`` per body, drops head entries whose time
  field is older than the age (``XTRIM MINID 0-<first kept seq + 1>``; ``0-N`` ids carry no time), sets
  ``sealed`` and publishes a wake-up; SQLite, one transaction that inserts rows ``(task, seq, ts, body)``,
  updates the task's row (``next_seq``, ``sealed``) and deletes the rows over the count or the age.
- ``read``: ``XRANGE key (0-<after+1> + COUNT n`` / ``SELECT … WHERE task = ? AND seq > ? LIMIT n``,
  dropping entries older than the age (and trimming them).
- ``bounds``: the meta hash (``next_seq``, ``sealed``) plus the first entry / the task row plus
  ``MIN(seq)``.
- ``wait``: the wake-up subscription (or ``XREAD BLOCK``) / an in-process condition plus polling.
- ``seal``: ``HSET meta sealed 1`` and a wake-up / ``UPDATE``.
- ``delete``: ``DEL`` the stream, keep the meta hash as the tombstone with ``EXPIRE tombstone_ttl_s`` /
  delete the rows, keep the task row (``deleted``, expiry time) until it expires.

This module must not know JSON-RPC, HTTP or the event envelope: bodies are bytes it never parses.
"""

from __future__ import annotations

import asyncio
import math
import time
from abc import ABC, abstractmethod
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

__all__ = [
    "EventLog",
    "LogBounds",
    "LogSealed",
    "MemoryEventLog",
    "StoreUnavailable",
    "StoredEvent",
    "check_retention",
]

DEFAULT_TOMBSTONE_TTL_S = 86_400.0
"""How long a deleted log's tombstone lives unless the store is told otherwise: the longest task TTL
(``[tasks] max_ttl_ms``), so a tombstone outlives every record that could ask for its ``next_seq``."""

_DROPPED = b""
"""Stands in for a trimmed body until the dead prefix is compacted away (frees the body at once)."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One retained event as read back from a log."""

    seq: int
    created: float
    """``time.time()`` (or the injected clock) at append, raised if need be to the ``created`` of the task's
    last retained event, so it never decreases within a task's log."""
    body: bytes
    """Opaque to the log; the caller stores an encoded JSON fragment."""


@dataclass(frozen=True, slots=True)
class LogBounds:
    """What a task's log holds: the earliest retained seq and the seq the next append will get."""

    earliest: int | None
    """Seq of the earliest retained event; ``None`` when nothing is retained."""
    next_seq: int
    """Seq the next append will get (== number of events ever appended to this log)."""
    sealed: bool = False
    """The log has ended (sealed, or deleted): a reader that has read up to ``next_seq`` is done."""

    @property
    def retained_from(self) -> int:
        """The first seq a reader can still get: ``earliest``, or ``next_seq`` when nothing is retained."""
        return self.earliest if self.earliest is not None else self.next_seq


class LogSealed(Exception):
    """An append to a log that is sealed (the task has ended) or deleted (only its tombstone is left)."""


class StoreUnavailable(Exception):
    """The store cannot be used now: its server is unreachable, its disk full, its file unreadable. Any
    operation of an `EventLog` or a `TaskStore` may raise it; a write that raises it wrote nothing the
    caller cannot write again (a retried append is the caller's to make). The message is one line."""


class EventLog(ABC):
    """A store of per-task event logs. Every method is safe for many concurrent readers and writers on one loop.

    Seqs are dense per task: a reader that asked for events after ``c`` and receives a first event whose
    seq is not ``c + 1`` knows that events were trimmed in between (``events_gone``); the log never
    renumbers or reuses a seq, also after ``delete`` (while its tombstone lives).
    """

    _max_events: int
    _max_age: float

    def retain(self, max_events_per_task: int, max_event_age_s: float = math.inf) -> None:
        """Bound every log by these from now on (at start, and on a config reload): a log over them is
        trimmed at its next append (and, by age, as it is read)."""
        check_retention(max_events_per_task, max_event_age_s)
        self._max_events = max_events_per_task
        self._max_age = max_event_age_s

    @abstractmethod
    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        key: str | None = None,
    ) -> int:
        """Append ``bodies`` in order and return the seq given to ``bodies[0]``; with ``seal``, seal the
        log in the same step (so no reader sees the last events without the seal, or the reverse).

        Seqs are contiguous and start at 0 for a task's first event. Creates the task's log on first
        append, trims the task's log (count and age) and wakes the task's waiters. An empty batch
        creates the log if needed and returns the current ``next_seq``. Raises ``LogSealed`` if the log is
        deleted, or sealed and this is not an ``epilogue``: a note about the ended task (its kept result
        evicted) that the log takes after its seal and stays sealed.

        ``key`` names this append for a retry after ``StoreUnavailable``, whose outcome the caller does
        not know: a store whose write can land after it reported a failure (a Redis command the server
        ran after the client gave up) answers a retried ``key`` with the seq it gave the first time,
        instead of appending twice. Memory and SQLite writes fail whole, and ignore it.
        """

    @property
    def resets(self) -> int:
        """How many times this process found the store's data set replaced under it (a Redis server
        restarted empty, flushed, or failed over to an empty replica): a reader that sees it change
        while it follows a log knows the log is gone, not ended. Only a shared server's store can be
        reset; an embedded one never is (0)."""
        return 0

    @abstractmethod
    async def create(self, task_id: str) -> None:
        """Create an empty log (bounds: earliest ``None``, next_seq 0); a no-op if the log or its tombstone exists."""

    @abstractmethod
    async def seal(self, task_id: str) -> None:
        """End the task's log: later appends fail (but epilogues), ``bounds`` says ``sealed`` and ``wait``
        returns at once. Creates the log (empty, sealed) if it has none; a no-op if it is sealed already."""

    @abstractmethod
    async def bounds(self, task_id: str) -> LogBounds | None:
        """The task's log bounds, or ``None`` if the task has no log (nor a tombstone of one)."""

    @abstractmethod
    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        """Retained events with ``seq > after``, ascending and contiguous, at most ``limit`` of them.

        The run starts at ``max(after + 1, earliest)``: a first seq greater than ``after + 1`` means the
        events in between were trimmed. Returns ``[]`` if there are none, or if the task has no log.
        """

    @abstractmethod
    async def wait(self, task_id: str, after: int, timeout: float) -> bool:
        """Wait until an event with ``seq > after`` has been appended; ``True`` if so, ``False`` on timeout.

        Returns ``True`` at once if such an event was already appended (even if it has since been trimmed:
        the caller's next read or bounds call tells it ``events_gone``). Returns at once on a sealed log
        (``True`` only if such an event exists), and ``False`` promptly if the task's log is deleted (or
        the store closed), also while waiting. If the task has no log yet, waits for one to be created and
        to grow, within the same timeout.
        """

    @abstractmethod
    async def delete(self, task_id: str) -> None:
        """Drop the task's events, leaving a sealed tombstone that keeps ``next_seq`` (its waiters wake
        and get ``False``); a no-op if it has no log. The tombstone lives at least the store's
        ``tombstone_ttl_s``: as long as anything may still ask for the task."""

    @abstractmethod
    async def close(self) -> None:
        """Release the store: wake every waiter (they get ``False``); later appends and creates fail."""


def check_retention(max_events_per_task: int, max_event_age_s: float) -> None:
    """Raise ValueError unless the per-task limits can be kept (every store checks them alike)."""
    if max_events_per_task < 1:
        raise ValueError(f"max_events_per_task must be at least 1, got {max_events_per_task}")
    if not max_event_age_s > 0:
        raise ValueError(f"max_event_age_s must be positive, got {max_event_age_s}")


_new = object.__new__
_set_seq: Callable[[StoredEvent, int], None] = vars(StoredEvent)["seq"].__set__
_set_created: Callable[[StoredEvent, float], None] = vars(StoredEvent)["created"].__set__
_set_body: Callable[[StoredEvent, bytes], None] = vars(StoredEvent)["body"].__set__
assert tuple(f.name for f in fields(StoredEvent)) == ("seq", "created", "body"), "update _stored_events"


def _stored_events(base: int, times: array[float], bodies: list[bytes], start: int, stop: int) -> list[StoredEvent]:
    """``StoredEvent``s for list indexes ``start:stop``, built through the slot descriptors.

    The frozen dataclass ``__init__`` sets each field via ``object.__setattr__``; writing the slots directly
    does the same thing about twice as fast, and reads are the hot path (every reader builds its own events).
    """
    out: list[StoredEvent] = []
    append = out.append
    for i in range(start, stop):
        event = _new(StoredEvent)
        _set_seq(event, base + i)
        _set_created(event, times[i])
        _set_body(event, bodies[i])
        append(event)
    return out


class _TaskLog:
    """One task's retained events: parallel ``bodies``/``times`` with a dead prefix of ``offset`` entries.

    The entry at list index ``i`` has seq ``base + i``; live entries are ``offset <= i < len(bodies)``.
    Trimming blanks bodies and advances ``offset``; the prefix is compacted once it is over half the list,
    so a trim costs amortised O(1) per event and a seek is an index computation.
    """

    __slots__ = ("base", "bodies", "changed", "deleted", "offset", "sealed", "times")

    def __init__(self) -> None:
        self.base = 0
        self.offset = 0
        self.bodies: list[bytes] = []
        self.times = array("d")
        self.changed: asyncio.Event | None = None
        """Set (and replaced) on growth, sealing or deletion; created only when someone waits."""
        self.sealed = False
        self.deleted = False
        """Only the tombstone is left: no events, ``base`` is the ``next_seq`` it keeps; also sealed."""

    @property
    def next_seq(self) -> int:
        return self.base + len(self.bodies)

    def has_after(self, after: int) -> bool:
        """Whether an event with ``seq > after`` was ever appended (retained or not)."""
        return self.next_seq > max(after + 1, 0)

    def bounds(self) -> LogBounds:
        n = len(self.bodies)
        return LogBounds(self.base + self.offset if self.offset < n else None, self.base + n, self.sealed)

    def drop_older_than(self, cutoff: float) -> None:
        """Drop the live entries created before ``cutoff`` (``times`` is sorted: a binary search)."""
        if self.offset < len(self.times) and self.times[self.offset] < cutoff:
            self.drop_to(bisect_left(self.times, cutoff, self.offset))

    def drop_to(self, index: int) -> None:
        """Drop live entries below list index ``index``."""
        start = self.offset
        if index <= start:
            return
        bodies = self.bodies
        if index * 2 > len(bodies):  # the dead prefix would exceed half: compact
            del bodies[:index]
            del self.times[:index]
            self.base += index
            self.offset = 0
        else:
            bodies[start:index] = [_DROPPED] * (index - start)
            self.offset = index

    def bury(self) -> None:
        """Drop every event and keep only what a tombstone needs: ``next_seq``, sealed, deleted."""
        self.base = self.next_seq
        self.offset = 0
        self.bodies = []
        self.times = array("d")
        self.sealed = self.deleted = True

    def wake(self) -> None:
        if self.changed is not None:
            self.changed.set()
            self.changed = None


class _Gate:
    """Waiters for a log that does not exist yet; dropped when the log is created or the last waiter leaves."""

    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiters = 0


class MemoryEventLog(EventLog):
    """The embedded store: every task's log in this process's memory.

    About 160 bytes per retained event with a 100-byte body: the body's bytes object, one list slot and
    one ``double`` in an ``array``; ``StoredEvent`` objects are built only on read. Times are clamped to be
    non-decreasing per task (a wall clock may step back), so age trimming is a binary search per task.
    A tombstone is one small object per deleted log (about 300 bytes with a 32-character id); expired
    ones are removed on a later ``delete``, oldest first.
    """

    def __init__(
        self,
        max_events_per_task: int,
        clock: Callable[[], float] = time.time,
        *,
        max_event_age_s: float = math.inf,
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
    ) -> None:
        self.retain(max_events_per_task, max_event_age_s)
        self._tombstone_ttl = tombstone_ttl_s
        self._clock = clock
        self._logs: dict[str, _TaskLog] = {}
        self._tombstones: dict[str, float] = {}
        """Deleted logs' ids and when their tombstones expire, in the order they were deleted."""
        self._gates: dict[str, _Gate] = {}
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    def _ensure(self, task_id: str) -> _TaskLog:
        if self._closed:
            raise RuntimeError("the event log is closed")
        log = self._logs.get(task_id)
        if log is None:
            log = self._logs[task_id] = _TaskLog()
            gate = self._gates.pop(task_id, None)
            if gate is not None:
                gate.event.set()
        return log

    def _retained(self, task_id: str) -> _TaskLog | None:
        """The task's log (or tombstone), its events older than ``max_event_age_s`` dropped first."""
        log = self._logs.get(task_id)
        if log is not None and self._max_age != math.inf:
            log.drop_older_than(self._clock() - self._max_age)
        return log

    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        key: str | None = None,
    ) -> int:
        log = self._ensure(task_id)
        if log.deleted or (log.sealed and not epilogue):
            state = "deleted" if log.deleted else "sealed"
            raise LogSealed(f"the log of task {task_id!r} is {state}: it takes no more events")
        first = log.next_seq
        n = len(bodies)
        if n:
            times = log.times
            now = clock = self._clock()
            if log.offset < len(times) and now < times[-1]:
                now = times[-1]  # never older than the last retained event: keeps ``times`` sorted
            log.bodies.extend(bodies)
            if n == 1:
                times.append(now)
            else:
                times.extend(array("d", (now,)) * n)
            excess = len(log.bodies) - log.offset - self._max_events
            if excess > 0:
                log.drop_to(log.offset + excess)
            if self._max_age != math.inf:
                log.drop_older_than(clock - self._max_age)
        if n or seal:
            log.sealed = log.sealed or seal
            log.wake()
        return first

    async def create(self, task_id: str) -> None:
        self._ensure(task_id)

    async def seal(self, task_id: str) -> None:
        log = self._ensure(task_id)
        if not log.sealed:
            log.sealed = True
            log.wake()

    async def bounds(self, task_id: str) -> LogBounds | None:
        log = self._retained(task_id)
        return None if log is None else log.bounds()

    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        log = self._retained(task_id)
        if log is None or limit <= 0:
            return []
        base = log.base
        start = max(after + 1 - base, log.offset)
        stop = min(start + limit, len(log.bodies))
        if start >= stop:
            return []
        return _stored_events(base, log.times, log.bodies, start, stop)

    async def wait(self, task_id: str, after: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        log = self._logs.get(task_id)
        if log is None:
            log = await self._wait_created(task_id, deadline)
            if log is None:
                return False
        while True:
            if log.deleted:
                return False
            if log.has_after(after):
                return True
            remaining = deadline - loop.time()
            if log.sealed or remaining <= 0:
                return False
            changed = log.changed
            if changed is None:
                changed = log.changed = asyncio.Event()
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return not log.deleted and log.has_after(after)

    async def _wait_created(self, task_id: str, deadline: float) -> _TaskLog | None:
        """Wait until ``task_id`` has a log (or the deadline passes / the store closes)."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            log = self._logs.get(task_id)
            if log is not None:
                return log
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            gate = self._gates.get(task_id)
            if gate is None:
                gate = self._gates[task_id] = _Gate()
            gate.waiters += 1
            try:
                async with asyncio.timeout(remaining):
                    await gate.event.wait()
            except TimeoutError:
                pass
            finally:
                gate.waiters -= 1
                if gate.waiters == 0 and self._gates.get(task_id) is gate:
                    del self._gates[task_id]
        return None

    async def delete(self, task_id: str) -> None:
        now = self._clock()
        self._expire_tombstones(now)
        log = self._logs.get(task_id)
        if log is not None and not log.deleted:
            log.bury()
            log.wake()
            self._tombstones[task_id] = now + self._tombstone_ttl

    def _expire_tombstones(self, now: float) -> None:
        # Insertion order is expiry order (one TTL for all), up to a wall clock stepping back: then a
        # tombstone lives a little longer, never shorter.
        while self._tombstones:
            task_id, expires = next(iter(self._tombstones.items()))
            if expires > now:
                return
            del self._tombstones[task_id]
            del self._logs[task_id]

    async def close(self) -> None:
        self._closed = True
        logs, self._logs = self._logs, {}
        self._tombstones = {}
        for log in logs.values():
            log.deleted = True
            log.wake()
        gates, self._gates = self._gates, {}
        for gate in gates.values():
            gate.event.set()
