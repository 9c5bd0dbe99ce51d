"""The connection side of the Redis store: the key layout, the scripts, the append pipeline, and the
`RedisBackend` that holds them (and the wake-ups) for the two stores built on it.

Per task, a hash, a stream, an acks string and a list of input answers share the `{t:<id>}` hash tag
(one cluster slot); an owner's index and counter share `{o:<owner>}`; the lease set orders unfinished
tasks by lease expiry for takeover scans. Each backend is one replica: a random id minted at start, and
the epoch it holds of each task it created or claimed (`held`), which its writes carry so that a replica
another one took a task from is fenced. Script errors come back as the exceptions here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from gateway.events.log import LogSealed, StoreUnavailable
from gateway.stores import SECRET_BYTES
from gateway.stores import redis_scripts as lua
from gateway.stores.redis_wakeups import UNAVAILABLE, WakeUps

__all__ = [
    "FENCED_EPOCH",
    "RedisBackend",
    "RedisKeys",
    "StoreUnreachable",
    "TaskGone",
    "WriterFenced",
    "mapped",
    "raise_if_cancelled",
    "unavailable_as_store_error",
]

log = logging.getLogger("gateway.stores.redis")

MAX_CONNECTIONS = 32
DEFAULT_LEASE_TTL_S = 15.0
FENCED_EPOCH = -1
"""The epoch a replica writes a task with once it learnt another replica took the task over: no task
is ever at it, so every later write is refused."""
RETRIES = 5
DEFAULT_TIMEOUT_S = 5.0
DATASET_CHECK_S = 1.0
"""How often a replica reads its key prefix's data-set marker: the longest a reset goes unnoticed."""
_REFUSALS = ("MISCONF", "OOM", "READONLY", "MASTERDOWN", "LOADING")
"""Error replies of a server that runs but takes no writes now (cannot persist, out of memory, a
replica, loading its data): the store is unavailable, not the request wrong."""

P = ParamSpec("P")
R = TypeVar("R")


class StoreUnreachable(OSError):
    """The Redis server cannot be reached (at start-up, or by `check-config --connect`)."""


class WriterFenced(LogSealed):
    """An append with an epoch the task has moved past: another replica owns the task now."""


class TaskGone(LogSealed):
    """A fenced append to a task whose record does not exist (never did, or expired)."""


_ERRORS: dict[str, type[LogSealed]] = {
    "FENCED": WriterFenced,
    "TASK_GONE": TaskGone,
    "LOG_SEALED": LogSealed,
    "LOG_DELETED": LogSealed,
}


def mapped(error: BaseException) -> BaseException:
    """A script's error reply as the exception the interfaces promise."""
    if isinstance(error, ResponseError):
        code, _, message = str(error).partition(" ")
        kind = _ERRORS.get(code)
        if kind is not None:
            return kind(message)
    return error


def store_error(error: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable an error of the client or a server refusal means, if it means one."""
    if isinstance(error, UNAVAILABLE):
        return StoreUnavailable(f"the Redis store cannot be reached: {error}")
    if isinstance(error, ResponseError) and str(error).startswith(_REFUSALS):
        return StoreUnavailable(f"the Redis store takes no writes: {str(error).splitlines()[0]}")
    return None


def unavailable_as_store_error(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A store operation whose connection errors (and refusals of a server that takes no writes now)
    come out as the interfaces' `StoreUnavailable`."""

    @functools.wraps(method)
    async def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except (*UNAVAILABLE, ResponseError) as error:
            unavailable = store_error(error)
            if unavailable is None:
                raise
            raise unavailable from error

    return translated


def raise_if_cancelled() -> None:
    """Re-raise a cancellation redis-py swallowed: a command cancelled on a pooled connection can complete
    and return normally (redis-py 8.1), and a reader must not outlive its cancelled caller (checked on the
    paths a `tasks/stream` reader loops on: read, bounds, wait)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else value or ""


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """The key layout under one prefix."""

    prefix: str

    def task(self, task_id: str) -> tuple[str, str]:
        """The task's hash and stream (one hash tag)."""
        base = f"{self.prefix}{{t:{task_id}}}"
        return base + ":h", base + ":s"

    def acks(self, task_id: str) -> str:
        """The answers of the task's appends in the last pipeline (what makes a retried pipeline safe): a
        string. (`:a`, the hash an earlier version kept them in, is left to expire.)"""
        return f"{self.prefix}{{t:{task_id}}}:k"

    def channel(self, task_id: str) -> str:
        return f"{self.prefix}{{t:{task_id}}}:w"

    def inputs(self, task_id: str) -> str:
        """Input answers recorded for the replica that runs the task (2026-07-28 `tasks/update`)."""
        return f"{self.prefix}{{t:{task_id}}}:u"

    @property
    def leases(self) -> str:
        """Task ids scored by lease expiry (ms, Redis server time): what a takeover scan reads."""
        return self.prefix + "leases"

    @property
    def control(self) -> str:
        """The prefix of each replica's control channel (+ replica id): cancel and input requests."""
        return self.prefix + "replica:"

    def owned(self, owner: str) -> tuple[str, str]:
        """The owner's index (task ids scored by creation number) and its counter."""
        base = f"{self.prefix}{{o:{owner}}}"
        return base + ":i", base + ":n"

    @property
    def expiry(self) -> str:
        return self.prefix + "expiry"

    @property
    def dataset(self) -> str:
        """A random marker of the data set under this prefix, written at first use: gone or changed
        means the data set was replaced under the replicas (`RedisBackend.reset_found`)."""
        return self.prefix + "dataset"

    def secret(self, name: str) -> str:
        """A random secret every replica shares (`RedisBackend.secret`)."""
        return f"{self.prefix}secret:{name}"


class _Scripts:
    """The scripts, registered on one client (redis-py reloads one the server has forgotten)."""

    def __init__(self, client: aioredis.Redis) -> None:
        def register(source: str) -> AsyncScript:
            return client.register_script(source)

        self.create_record = register(lua.CREATE_RECORD)
        self.index_owned = register(lua.INDEX_OWNED)
        self.update_status = register(lua.UPDATE_STATUS)
        self.replace_outcome = register(lua.REPLACE_OUTCOME)
        self.advance_next_seq = register(lua.ADVANCE_NEXT_SEQ)
        self.drop_record = register(lua.DROP_RECORD)
        self.bump_epoch = register(lua.BUMP_EPOCH)
        self.renew_lease = register(lua.RENEW_LEASE)
        self.claim_lease = register(lua.CLAIM_LEASE)
        self.request = register(lua.REQUEST)
        self.take_input = register(lua.TAKE_INPUT)
        self.append = register(lua.APPEND)
        self.create_log = register(lua.CREATE_LOG)
        self.seal = register(lua.SEAL)
        self.bounds = register(lua.BOUNDS)
        self.read = register(lua.READ)
        self.delete_log = register(lua.DELETE_LOG)


@dataclass(slots=True)
class _Pending:
    keys: list[str]
    args: list[Any]
    done: asyncio.Future[Any]
    key: str | None = None
    """The caller's name for this append, kept across its retries (`EventLog.append`'s `key`)."""


class _AppendPipeline:
    """Sends the appends queued during one loop tick as one pipeline; while one is in flight, the next
    batch gathers (one pipeline at a time, so a task's appends reach Redis in the order they were made)."""

    def __init__(self, client: aioredis.Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._queue: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, keys: list[str], args: list[Any], key: str | None = None) -> Any:
        pending = _Pending(keys, args, asyncio.get_running_loop().create_future(), key)
        self._queue.append(pending)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await pending.done

    async def _send(self) -> None:
        try:
            while self._queue:
                await asyncio.sleep(0)  # let the rest of this tick queue up
                batch, self._queue = self._queue, []
                await self._send_batch(batch)
        finally:
            self._sender = None

    async def _send_batch(self, batch: list[_Pending]) -> None:
        try:
            results = await self._execute(batch)
            if any(isinstance(result, NoScriptError) for result in results):  # the server restarted
                await self._client.script_load(self._script.script)
                results = await self._execute(batch)
        except Exception as error:  # the whole pipeline failed (connection lost): every caller learns it
            results = [error] * len(batch)
        for pending, result in zip(batch, results, strict=True):
            if pending.done.done():
                continue
            if isinstance(result, BaseException):
                pending.done.set_exception(mapped(result))
            else:
                pending.done.set_result(result)

    async def _execute(self, batch: list[_Pending]) -> list[Any]:
        """One round trip: the batch's scripts packed here, sent at once, every reply read (an error reply
        as its exception); retried on a new connection after a lost one, as a redis-py pipeline is."""
        sha = self._script.sha.encode()
        batch_id = secrets.token_hex(8)  # with the index, what a retried pipeline's appends are known by
        commands = []
        for index, pending in enumerate(batch):
            header, *bodies = pending.args
            keys = [key.encode() for key in pending.keys]
            # A keyed append is its own batch: retried by its caller in another pipeline, it is known again.
            known_as = f"{pending.key} 0" if pending.key is not None else f"{batch_id} {index}"
            commands.append([b"EVALSHA", sha, b"%d" % len(keys), *keys, f"{header} {known_as}".encode(), *bodies])
        packed = _packed(commands)
        pool = self._client.connection_pool
        connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            results: list[Any] = await connection.retry.call_with_retry(
                lambda: _round_trip(connection, packed, len(commands)), lambda _: connection.disconnect()
            )
            return results
        finally:
            await pool.release(connection)


def _packed(commands: list[list[bytes]]) -> bytes:
    """Commands in the Redis protocol: packed here, this costs a third of what redis-py's general packing
    does (which was about half of a pipelined append's time in Python)."""
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        parts += [b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in command]
    return b"".join(parts)


async def _round_trip(connection: AbstractConnection, packed: bytes, replies: int) -> list[Any]:
    await connection.send_packed_command(packed, check_health=False)
    results: list[Any] = []
    for _ in range(replies):
        try:
            results.append(await connection.read_response())
        except ResponseError as error:  # one script's error reply: the others still answer
            results.append(error)
    return results


def _pool(url: str, max_connections: int, timeout_s: float) -> aioredis.BlockingConnectionPool:
    """A bounded pool (many waiting readers share a few connections instead of opening one each) whose
    commands are retried a few times on a lost connection, which covers a server restart of about a
    second (append pipelines too: the acks make a replayed one safe). A command unanswered within
    `timeout_s` (a paused server) is not retried: the store is unavailable for now."""
    return aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES, supported_errors=(RedisConnectionError,)),
    )


class RedisBackend:
    """One Redis server (or cluster entry point) under one key prefix: the client, the scripts, the
    append pipeline and the wake-up connection both stores share."""

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self.replica = secrets.token_hex(8)
        """This replica's id: random, minted at start (a restarted process is a new replica)."""
        self.lease_ttl_ms = max(1, int(lease_ttl_s * 1000))
        self.held: dict[str, int] = {}
        """The epoch this replica writes each task it created or claimed with (FENCED_EPOCH once another
        replica took it over): its appends and status updates are refused unless the task is still at it."""
        self.on_held: Callable[[str], None] | None = None
        """Told when this replica comes to hold a task (creates or claims it): what it leases. Told after
        the last await of the create or claim, so that the caller knows the task (its registry) before
        a lease tick can see it: a tick releases the leases of tasks the registry does not know."""
        self.on_fenced: Callable[[str], None] | None = None
        """Told (once per task) when a write of this replica was fenced: the task is another's now."""
        self.client: aioredis.Redis = aioredis.Redis(connection_pool=_pool(url, MAX_CONNECTIONS, timeout_s))
        # The append pipeline has a connection of its own: many readers never make a writer wait for one.
        self.writer: aioredis.Redis = aioredis.Redis(connection_pool=_pool(url, 1, timeout_s))
        self.keys = RedisKeys(prefix)
        self.scripts = _Scripts(self.client)
        self.appends = _AppendPipeline(self.writer, self.scripts.append)
        self.wake_ups = WakeUps(self.client)
        self.closed = False
        self._users = 0
        self.dataset: bytes | None = None
        """The marker of the data set this replica works on (`RedisKeys.dataset`), read at `check`."""
        self.resets = 0
        """How many times this replica found the data set replaced (the marker gone or changed)."""
        self.on_reset = on_reset
        """Told (on the loop) each time a reset is found: counted and logged by the caller."""
        self._watcher: asyncio.Task[None] | None = None

    def hold(self, task_id: str, epoch: int) -> None:
        """This replica runs (or watches) the task from now on, writing it at `epoch`."""
        self.held[task_id] = epoch
        if self.on_held is not None:
            self.on_held(task_id)

    def epoch_of(self, task_id: str) -> int | None:
        """The epoch this replica's writes of the task carry (None: an unfenced writer)."""
        return self.held.get(task_id)

    def fenced(self, task_id: str) -> None:
        """A write of the task was refused: another replica holds it. Every later write is refused too."""
        if self.held.get(task_id) == FENCED_EPOCH:
            return
        self.held[task_id] = FENCED_EPOCH
        log.warning(
            "task taken over by another replica (or expired): this replica stops working on it", extra={"task": task_id}
        )
        if self.on_fenced is not None:
            self.on_fenced(task_id)

    def use(self) -> RedisBackend:
        """Count one more store on this backend: it closes when the last one does."""
        self._users += 1
        return self

    async def check(self) -> list[str]:
        """Reach the server; warnings about settings the stores need (`maxmemory-policy noeviction`).
        StoreUnreachable if it cannot be reached. Learns the data-set marker (drawing it if the key
        prefix has none) and from then on watches it (`watch_dataset`)."""
        try:
            await self.client.ping()
            self.dataset = await self._marker()
        except UNAVAILABLE as error:
            where = self.client.connection_pool.connection_kwargs
            server = where.get("path") or f"{where.get('host')}:{where.get('port')}"  # never the password
            raise StoreUnreachable(f"the Redis store at {server} cannot be reached: {error}") from error
        try:
            settings = await self.client.config_get("maxmemory-policy")
        except ResponseError as error:  # managed services may refuse CONFIG
            self._start_watching()
            return [f"could not check the Redis maxmemory-policy ({error}); it must be noeviction"]
        self._start_watching()
        policy = next((_text(value) for name, value in settings.items() if _text(name) == "maxmemory-policy"), "")
        if policy != "noeviction":
            return [
                f"Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure Redis may "
                "evict task records and events, and readers would see tasks vanish and logs gone"
            ]
        return []

    async def _marker(self) -> bytes:
        """The key prefix's data-set marker, drawn now if there is none."""
        key = self.keys.dataset
        await self.client.set(key, secrets.token_hex(8), nx=True)
        value = await self.client.get(key)
        assert isinstance(value, bytes)  # set just now if it was not there
        return value

    def _start_watching(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_dataset(), name="redis-dataset-marker")

    async def _watch_dataset(self) -> None:
        """Every `DATASET_CHECK_S`, read the marker; a marker gone or changed (a server restarted empty,
        a flush, a failover to an empty replica) is a reset: `reset_found`."""
        while True:
            await asyncio.sleep(DATASET_CHECK_S)
            with contextlib.suppress(*UNAVAILABLE):  # an outage is not a reset: asked again after it
                marker = await self._marker()
                if marker != self.dataset:
                    self.dataset = marker
                    self.reset_found()

    def reset_found(self) -> None:
        """The data set was replaced: every task this replica held is gone (its runs are stopped as a
        fenced replica's are), and every waiter wakes to find what it followed gone."""
        self.resets += 1
        log.error(
            "the Redis data set under this key prefix was replaced (restarted empty, flushed, or failed over "
            "to an empty replica): its tasks and logs are lost; open streams end with store_reset",
            extra={"tasks_held": len(self.held)},
        )
        for task_id in list(self.held):
            self.fenced(task_id)
        self.held.clear()
        self.wake_ups.wake_all()
        if self.on_reset is not None:
            self.on_reset()

    async def secret(self, name: str) -> bytes:
        """The random secret `name` every replica on this prefix shares: the first to ask draws it."""
        key = self.keys.secret(name)
        await self.client.set(key, secrets.token_bytes(SECRET_BYTES), nx=True)
        value = await self.client.get(key)
        assert isinstance(value, bytes)  # set just now if it was not there; never deleted
        return value

    async def release(self) -> None:
        self._users -= 1
        if self._users > 0 or self.closed:
            return
        self.closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.wake_ups.close()
        await self.writer.aclose()
        await self.client.aclose()
