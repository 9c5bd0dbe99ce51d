"""The SQLite database both durable embedded stores share: one file, its schema, one writer, many readers.

`SqliteTaskStore` (`gateway.stores.sqlite_tasks`) and `SqliteEventLog` (`gateway.stores.sqlite_log`) keep
their tables in one file opened here. The file is in WAL mode (readers never block the writer, nor it
them), with `synchronous = NORMAL` (a commit survives a crash of the process, the last ones may be lost
on power loss) or `FULL` (every commit is on disk). WAL needs shared memory between the connections:
one host only, never a network filesystem; and one process per file, held by an OS lock (`flock`) on
the database file itself, which nothing can delete from under the process that holds it. Opening runs
`PRAGMA quick_check`: a corrupt file is refused at start (and by `check-config --connect`).

Nothing here blocks the event loop. Every write is a function run on the one writer connection, on a
thread of its own: the writes a loop tick submits (and any that queue up while a commit runs) run in
one transaction, committed once, and each caller's future resolves after the commit (after the
write's `on_commit`, which runs even if the caller stopped waiting). A write function refuses (raises)
before it changes anything; an SQLite error fails every write of its batch (and runs the `on_rollback`
hooks, for what a store keeps beside the file on the writer thread). Reads run on a small pool of
threads, each with its own read-only connection, and see every committed write. Any SQLite error of a
write or a read (a full disk, an I/O error, a page found corrupt) comes out as `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import queue
import secrets
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Generic, Literal, TypeVar

from gateway.events.log import StoreUnavailable
from gateway.stores import SECRET_BYTES

__all__ = ["SCHEMA_VERSION", "SqliteDatabase", "StoreUnavailable", "Synchronous"]

T = TypeVar("T")
Synchronous = Literal["normal", "full"]

SCHEMA_VERSION = 3
"""`PRAGMA user_version` of the files this code writes; a file with a newer one is refused, an older one
is brought up to date (`MIGRATIONS`) when opened."""

READER_THREADS = 2
"""Read connections (one per thread): the machines this targets have a few cores."""

BUSY_TIMEOUT_MS = 5000
"""How long a connection waits for a lock (a checkpoint, start-up) before an error."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    number INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order: list_owned's order and cursor, never reused
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    expires_at REAL NOT NULL,
    next_seq INTEGER NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,  -- the owner's fencing epoch, for a takeover after a restart
    record BLOB NOT NULL,  -- TaskRecord.to_dict() as JSON; status and next_seq above are authoritative
    outcome BLOB,
    outcome_replaced INTEGER NOT NULL DEFAULT 0  -- the outcome is an eviction's error, not the task's own
);
CREATE INDEX IF NOT EXISTS tasks_by_owner ON tasks (owner, number);
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at);
CREATE INDEX IF NOT EXISTS tasks_unfinished ON tasks (status) WHERE status IN ('working', 'input_required');

CREATE TABLE IF NOT EXISTS logs (
    task TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL DEFAULT 0,  -- never goes back: deleting events never resets a sequence
    sealed INTEGER NOT NULL DEFAULT 0,
    tombstone_until REAL  -- set by delete: the events are gone, the row keeps next_seq until then
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS logs_tombstones ON logs (tombstone_until) WHERE tombstone_until IS NOT NULL;

CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,  -- what the secret is for: "principal_key"
    value BLOB NOT NULL  -- random bytes drawn once, on first use
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS events (
    task TEXT NOT NULL,
    seq INTEGER NOT NULL,
    created REAL NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (task, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS staged (
    id INTEGER PRIMARY KEY,  -- insertion order: a commit of one event for each of many tasks fills one page
    task TEXT NOT NULL,
    seq INTEGER NOT NULL,  -- each task's staged seqs are above all of its seqs in events
    created REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS staged_by_task ON staged (task, seq);  -- small entries: few pages per commit
"""

MIGRATIONS: dict[int, str] = {
    1: "ALTER TABLE tasks ADD COLUMN outcome_replaced INTEGER NOT NULL DEFAULT 0;",
    2: "",  # the `staged` table, which SCHEMA creates; the version tells an older gateway to refuse the file
}
"""From a file's schema version to the next: what brings it up to date (`SCHEMA` creates what is missing)."""

Write = Callable[[sqlite3.Connection], Any]
_Job = tuple[Write, "asyncio.Future[Any]", Callable[[Any], None] | None]
_Batch = tuple[asyncio.AbstractEventLoop, list[_Job]]


class SqliteDatabase:
    """One database file: its writer thread and connection, its reader threads and connections.

    Opened (file, directory, pragmas, schema) synchronously by the constructor, before the gateway
    serves: StoreUnavailable if that fails. Each store holding it calls `acquire` once and `release`
    when it closes; the last release closes the file.
    """

    def __init__(self, path: str | Path, synchronous: Synchronous = "normal") -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        self._lock = self._take_lock()
        try:
            self._writer = self._open_writer()
        except StoreUnavailable:
            self._lock.close()
            raise
        self._jobs: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._pending: list[_Job] = []
        """Writes submitted during the current loop tick, handed to the writer at its end."""
        self._rollback_hooks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._write_batches, name=f"sqlite-writer:{self.path.name}", daemon=True)
        self._thread.start()
        self._readers = ThreadPoolExecutor(READER_THREADS, thread_name_prefix=f"sqlite-reader:{self.path.name}")
        self._reader_local = threading.local()
        self._reader_connections: list[sqlite3.Connection] = []
        self._reader_lock = threading.Lock()
        self._users = 0
        self._closed = False

    # -- opening

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return connection

    def _take_lock(self) -> IO[bytes]:
        """Hold an exclusive `flock` on the database file itself while open (created empty if new,
        which SQLite takes for a new database): a second process on the same file would write the same
        seqs and wake none of this one's waiters. `flock` locks are apart from SQLite's own POSIX locks
        on the file, and this descriptor stays open until the connections are closed, so closing it
        never drops theirs."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path, "ab")  # noqa: SIM115 - held until the database closes
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path}: {_reason(exc)}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise StoreUnavailable(
                f"the SQLite store {self.path} is in use by another gateway process: stop that gateway, or give "
                "this one a data folder of its own (serve --data-dir DIR, $MCP_GATEWAY_DATA_DIR, or [store] path)"
            ) from None
        return lock

    def _open_writer(self) -> sqlite3.Connection:
        where = str(self.path)
        try:
            connection = self._connect()
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {where}: {_reason(exc)}") from None
        try:
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreUnavailable(f"the SQLite store {where} cannot use WAL (journal mode {mode!r})")
            connection.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            (verdict,) = connection.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":  # one line of what SQLite found first (a verdict may hold several)
                raise StoreUnavailable(f"the SQLite store {where} is corrupt: {str(verdict).splitlines()[0]}")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"the SQLite store {where} has schema version {version}; this gateway knows {SCHEMA_VERSION}"
                )
            # A new file (version 0) gets the whole SCHEMA; an older one its migrations first.
            migrations = "".join(MIGRATIONS[old] for old in range(version, SCHEMA_VERSION)) if version else ""
            connection.executescript(f"BEGIN; {migrations} {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
        except sqlite3.Error as exc:
            connection.close()
            raise StoreUnavailable(f"cannot use the SQLite store {where}: {_reason(exc)}") from None
        except StoreUnavailable:
            connection.close()
            raise
        return connection

    # -- lifetime

    def acquire(self) -> SqliteDatabase:
        self._users += 1
        return self

    async def release(self) -> None:
        """One holder is done; the last one closes the file (after the writes already submitted)."""
        self._users -= 1
        if self._users > 0 or self._closed:
            return
        self._closed = True
        self._submit()
        self._jobs.put(None)
        await asyncio.to_thread(self._shut_down)

    def _shut_down(self) -> None:
        self._thread.join()
        self._readers.shutdown(wait=True)
        with self._reader_lock:
            for connection in self._reader_connections:
                connection.close()
        self._writer.close()
        self._lock.close()

    # -- writes

    async def write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run `job` on the writer connection in this tick's transaction; its result once committed."""
        return await self.submit(job)

    def submit(
        self, job: Callable[[sqlite3.Connection], T], on_commit: Callable[[T], None] | None = None
    ) -> asyncio.Future[T]:
        """`write` as a future, resolved once committed (or failed); cancelling it cancels no write.
        `on_commit` gets the job's result on the loop once committed, before the future resolves,
        whether or not anyone still waits for it."""
        if self._closed:
            raise RuntimeError(f"the SQLite store {self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._submit)
        self._pending.append((job, future, on_commit))
        return future

    def on_rollback(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the writer thread after a batch is rolled back (an SQLite error): what a store
        keeps of the file's state on that thread is then no longer true."""
        self._rollback_hooks.append(hook)

    def _submit(self) -> None:
        if self._pending:
            jobs, self._pending = self._pending, []
            self._jobs.put((asyncio.get_running_loop(), jobs))

    def _write_batches(self) -> None:
        """The writer thread: take every batch queued, run them in one transaction, commit, answer."""
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                return
            batches = [first]
            while not self._jobs.empty():
                more = self._jobs.get()
                if more is None:
                    stopping = True
                    break
                batches.append(more)
            results = self._transaction([job for _, jobs in batches for job, _, _ in jobs])
            index = 0
            for loop, jobs in batches:
                answered = results[index : index + len(jobs)]
                index += len(jobs)
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                    loop.call_soon_threadsafe(_answer, jobs, answered)

    def _transaction(self, jobs: list[Write]) -> list[tuple[bool, Any]]:
        """Run `jobs` in one transaction: (True, result) or (False, exception) for each, in order."""
        results: list[tuple[bool, Any]] = []
        connection = self._writer
        try:
            connection.execute("BEGIN IMMEDIATE")
            for job in jobs:
                try:
                    results.append((True, job(connection)))
                except sqlite3.Error:
                    raise
                except Exception as exc:  # a refusal: the job changed nothing
                    results.append((False, exc))
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            for hook in self._rollback_hooks:
                hook()
            failure = StoreUnavailable(f"the SQLite store {self.path} failed a write: {_reason(exc)}")
            return [(False, failure)] * len(jobs)
        return results

    # -- reads

    async def secret(self, name: str) -> bytes:
        """The random secret `name` kept in the file: drawn on first use, the same ever after."""

        def get_or_draw(connection: sqlite3.Connection) -> bytes:
            drawn = (name, secrets.token_bytes(SECRET_BYTES))
            connection.execute("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", drawn)
            value: bytes = connection.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()[0]
            return value

        return await self.write(get_or_draw)

    async def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run `query` on a read connection (off the loop); it sees every write committed before.
        StoreUnavailable if SQLite fails it (an I/O error, a corrupt page)."""
        if self._closed:
            raise RuntimeError(f"the SQLite store {self.path} is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._readers, self._on_reader, query)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the SQLite store {self.path} failed a read: {_reason(exc)}") from None

    def _on_reader(self, query: Callable[[sqlite3.Connection], T]) -> T:
        connection: sqlite3.Connection | None = getattr(self._reader_local, "connection", None)
        if connection is None:
            connection = self._reader_local.connection = self._connect()
            connection.execute("PRAGMA query_only = ON")
            with self._reader_lock:
                self._reader_connections.append(connection)
        return query(connection)


def _answer(jobs: list[_Job], results: list[tuple[bool, Any]]) -> None:
    for (_, future, on_commit), (ok, value) in zip(jobs, results, strict=True):
        if ok and on_commit is not None:
            on_commit(value)
        if future.done():  # the caller was cancelled; its write happened all the same
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _reason(exc: BaseException) -> str:
    """One line: an OSError's strerror and file name, an SQLite error's message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


KNOWN_STATES = 10_000
"""How many keys' states a `Committed` keeps (the longest held dropped first)."""

S = TypeVar("S")


class Committed(Generic[S]):
    """What the last committed write left of each key (a log's state, a task's record), kept in memory
    by a store that is its file's only writer, so a lookup needs no trip to a reader thread.

    `commits` counts the writes committed so far: a read from the file that started before one may have
    seen an older state, and is remembered (`remember`) only if none committed meanwhile."""

    def __init__(self) -> None:
        self._states: dict[str, S] = {}
        self.commits = 0

    def get(self, key: str) -> S | None:
        return self._states.get(key)

    def committed(self, key: str, state: S | None) -> None:
        """A write committed `state` for `key` (None: not known how it is now)."""
        self.commits += 1
        self.remember(key, state)

    def remember(self, key: str, state: S | None) -> None:
        self._states.pop(key, None)
        if state is None:
            return
        self._states[key] = state
        if len(self._states) > KNOWN_STATES:
            del self._states[next(iter(self._states))]

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    def clear(self) -> None:
        self._states.clear()
