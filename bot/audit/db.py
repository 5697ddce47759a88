"""The audit database's connection: opening it, and the one way to run a transaction.

Opening checks the path, switches the file to WAL (retrying while another process
opens the same fresh file), sets ``synchronous=FULL`` and foreign keys, applies the
migrations and probes a write, turning every failure into an ``AuditError`` that names
the file and the likely cause.

Transactions: ``async with db.transaction(write=...) as conn`` takes this connection's
``asyncio.Lock`` (one transaction at a time per connection), then ``BEGIN IMMEDIATE``
for a write (``BEGIN`` for a read), commits when the block ends and rolls back when it
raises. A transaction may only run inside ``Database.shielded``, which runs the
caller's work in a task of its own that the caller awaits through ``asyncio.shield``:
a caller cancelled mid-write leaves that task to commit or roll back by itself, so the
connection is never left inside a half-done transaction. ``close`` waits for such
tasks first.

``db.inline(work, write=...)`` is the same transaction for work made of statements
only (the audit records a run writes, ``bot.audit.writes``): aiosqlite runs each
statement, and each cursor's close, as one call on its thread, so a record of two
statements took six thread hops, each a wake-up of the event loop (about 1.1 ms a
record on the 2-core dev machine, against 0.3 ms for the same transaction in one
call). ``inline`` runs BEGIN, ``work`` and COMMIT as one call on that thread: ``work``
gets an ``InlineConnection`` whose statements run at once on the sqlite3 connection, and
its coroutine is driven to its end with one ``send`` there. The statements are the
table modules' own (``Conn`` is either connection), so there is still one SQL path.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Generator,
    Sequence,
)
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

import aiosqlite

from bot.audit.backend import Dialect, IntegrityViolation, Row, Shield
from bot.audit.migrations import Migration, MigrationError, apply_migrations
from bot.errors import AuditError, AuditUnavailable, RunNotFoundError

if TYPE_CHECKING:
    from bot.audit.pg_conn import PgConn

log = logging.getLogger(__name__)

T = TypeVar("T")


def problem(path: Path, exc: BaseException) -> str:
    """What went wrong with the file, in words an operator can act on."""
    text = str(exc)
    low = text.lower()
    if "not a database" in low or "malformed" in low:
        reason = "not a database, or the file is corrupt"
    elif "readonly" in low or "read-only" in low:
        reason = "read-only: the bot cannot write to it (check file and directory permissions)"
    elif "unable to open" in low:
        reason = "cannot open or create the file (does the directory exist and is it writable?)"
    elif "locked" in low or "busy" in low:
        reason = "locked by another process for longer than the busy timeout"
    else:
        reason = text
    return f"audit database {path}: {reason}"


def audit_error(path: Path, exc: sqlite3.Error | MigrationError) -> AuditError:
    """The error to raise for ``exc``: ``AuditUnavailable`` when the file cannot be
    written *for now* (locked, busy, full, an I/O error, read-only: SQLite's
    ``OperationalError``, or a bare ``DatabaseError``), which the resilient writer
    rides out; a plain ``AuditError`` otherwise (a bug, a corrupt file)."""
    transient = isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError
    return (AuditUnavailable if transient else AuditError)(problem(path, exc))


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise AuditError(f"audit database {path}: is a directory")
    parent = path.parent
    if not parent.exists():
        raise AuditError(f"audit database {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise AuditError(f"audit database {path}: {parent} is not a directory")


# -- the connection the statements run on ------------------------------------------


class InlineCursor:
    """What the statement helpers read of a cursor, on a sqlite3 cursor."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    async def fetchall(self) -> list[sqlite3.Row]:
        return list(self._cursor.fetchall())

    async def fetchone(self) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._cursor.fetchone()
        return row

    def close(self) -> None:
        self._cursor.close()


class InlineResult:
    """``InlineConnection.execute``'s answer: awaited or used with ``async with``, as
    aiosqlite's is; the statement runs then, at once (nothing here ever suspends)."""

    def __init__(self, conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> None:
        self._conn, self._sql, self._params = conn, sql, params
        self._cursor: InlineCursor | None = None

    async def _run(self) -> InlineCursor:
        return InlineCursor(self._conn.execute(self._sql, self._params))

    def __await__(self) -> Generator[Any, None, InlineCursor]:
        return self._run().__await__()

    async def __aenter__(self) -> InlineCursor:
        self._cursor = await self._run()
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        if self._cursor is not None:
            self._cursor.close()


class InlineConnection:
    """aiosqlite's statement calls (``execute``, ``in_transaction``) on the sqlite3
    connection itself, for work that ``Database.inline`` runs whole on aiosqlite's
    thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> InlineResult:
        return InlineResult(self._conn, sql, params)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


# What a table module's statements run on: a transaction's aiosqlite connection, an
# inline transaction's (``Database.inline``), or PostgreSQL's (``bot.audit.pg_conn``).
Conn: TypeAlias = "aiosqlite.Connection | InlineConnection | PgConn"
_SQLITE = (aiosqlite.Connection, InlineConnection)

# A row the database refused (a foreign key, a unique key), from either backend.
INTEGRITY: tuple[type[Exception], ...] = (sqlite3.IntegrityError, IntegrityViolation)


# The database's own clock, in seconds since the epoch, as SQL: what leases are judged
# by when replicas share a PostgreSQL server (SQLite's is this machine's).
NOW_S: dict[Dialect, str] = {
    Dialect.SQLITE: "((julianday('now') - 2440587.5) * 86400.0)",
    Dialect.POSTGRES: "extract(epoch FROM clock_timestamp())::double precision",
}


def dialect_of(conn: Conn) -> Dialect:
    """Which SQL ``conn`` speaks, for the few statements that differ."""
    return Dialect.SQLITE if isinstance(conn, _SQLITE) else Dialect.POSTGRES


def _complete(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end now. Its statements never suspend; anything else it awaits
    would (it belongs to the event loop, on another thread): refused, so rolled back."""
    try:
        work.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    work.close()
    raise RuntimeError("an inline transaction awaited something other than its statements")


def _transact(
    conn: sqlite3.Connection, work: Callable[[Conn], Coroutine[Any, Any, T]], begin: str
) -> T:
    """One transaction, on aiosqlite's thread: ``begin``, ``work``, COMMIT; ROLLBACK when
    ``work`` or the COMMIT raises."""
    conn.execute(begin)
    try:
        result = _complete(work(InlineConnection(conn)))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.warning("rollback failed", exc_info=True)
        raise
    return result


def _on_thread(conn: aiosqlite.Connection) -> Callable[[Callable[[], T]], Awaitable[T]]:
    """Runs a function on ``conn``'s own thread, in turn with its statements. aiosqlite
    (0.22, pinned in uv.lock) has no public call for this; ``_execute`` is what each of
    its own statements goes through."""
    run: Callable[[Callable[[], T]], Awaitable[T]] = conn._execute
    return run


# -- statement helpers the table modules share -------------------------------------


def qmarks(values: Collection[Any]) -> str:
    """The placeholders of ``IN (...)`` for ``values``; for none, ``NULL``: ``x IN (NULL)``
    matches nothing on both backends, where PostgreSQL refuses an empty ``IN ()``."""
    return ", ".join("?" * len(values)) or "NULL"


async def execute(conn: Conn, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; returns the number of rows it changed."""
    async with conn.execute(sql, params) as cur:
        return cur.rowcount


async def insert(conn: Conn, sql: str, params: Sequence[Any]) -> int:
    """Run one INSERT; returns the new row's id."""
    if not isinstance(conn, _SQLITE):
        return await conn.insert(sql, params)
    async with conn.execute(sql, params) as cur:
        rowid = cur.lastrowid
    if rowid is None:
        raise AuditError(f"insert returned no row id: {sql}")
    return rowid


async def fetch(conn: Conn, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    async with conn.execute(sql, params) as cur:
        return list(await cur.fetchall())


def run_not_found(run_id: int) -> RunNotFoundError:
    return RunNotFoundError(f"there is no run #{run_id} in the audit log")


# -- opening -----------------------------------------------------------------------


async def _enable_wal(conn: aiosqlite.Connection, timeout_s: float) -> str:
    """Switch a database to WAL (persistent: done once per file) and return the mode.

    Changing the journal mode needs an exclusive lock, and SQLite answers "database
    is locked" at once, without its busy handler, when another process is opening the
    same fresh file: retry until the busy timeout, as every other statement waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        (mode,) = (await fetch(conn, "PRAGMA journal_mode"))[0]
        if str(mode).lower() == "wal":
            return str(mode)
        try:
            (mode,) = (await fetch(conn, "PRAGMA journal_mode = WAL"))[0]
            return str(mode)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.01)


async def _probe_write(conn: aiosqlite.Connection) -> None:
    # SQLite opens a read-only file without complaint; find out now, not at the first write.
    await conn.execute("BEGIN IMMEDIATE")
    try:
        await conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('probe', '')")
    finally:
        await conn.execute("ROLLBACK")


class Database(Shield):
    """One SQLite connection and the transactions run on it. Create with ``open``."""

    dialect = Dialect.SQLITE

    def __init__(
        self, conn: aiosqlite.Connection, path: Path, unknown_migrations: tuple[str, ...]
    ) -> None:
        super().__init__()
        self._conn = conn
        self._lock = asyncio.Lock()
        self._closed = False
        self.path = path
        # Migration names found in the file that this code does not know (a newer bot).
        self.unknown_migrations = unknown_migrations

    @property
    def where(self) -> str:
        return str(self.path)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        migrations: Sequence[Migration],
        busy_timeout_s: float,
        applied: list[str] | None = None,
    ) -> Database:
        """Open (creating if needed) and migrate; ``AuditError`` names the path and problem."""
        _check_path(path)
        try:
            conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_s)
        except sqlite3.Error as exc:
            raise audit_error(path, exc) from exc
        try:
            conn.row_factory = sqlite3.Row
            mode = await _enable_wal(conn, busy_timeout_s)
            if str(mode).lower() != "wal":
                raise AuditError(
                    f"audit database {path}: cannot use WAL journal mode (got {mode!r}); "
                    "is it on a network file system?"
                )
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA foreign_keys = ON")
            result = await apply_migrations(conn, migrations)
            await _probe_write(conn)
        except BaseException as exc:
            try:
                await conn.close()
            except sqlite3.Error:
                log.debug("closing %s after a failed open also failed", path, exc_info=True)
            if isinstance(exc, sqlite3.Error | MigrationError):
                raise audit_error(path, exc) from exc
            raise
        if applied is not None:
            applied.extend(result.applied)
        return cls(conn, path, tuple(result.unknown))

    async def close(self) -> None:
        if self._closed:
            return
        await self.settle()
        async with self._lock:
            self._closed = True
            try:
                await self._conn.close()
            except sqlite3.Error as exc:
                raise audit_error(self.path, exc) from exc

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[aiosqlite.Connection]:
        """One transaction on this connection; see the module docstring."""
        if not self.inside():
            # Outside a shielded task, cancelling the caller would cut the transaction
            # in half: refuse, rather than rely on every caller remembering.
            raise RuntimeError("Database.transaction() must run inside Database.shielded()")
        async with self._lock:
            if self._closed:
                raise AuditError(f"audit database {self.path}: already closed")
            conn = self._conn
            try:
                # IMMEDIATE takes the write lock up front: a read-then-write (CAS, locks)
                # can then never be overtaken by another process between the two.
                await conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield conn
                await conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        await conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.warning("rollback failed on %s", self.path, exc_info=True)
                if isinstance(exc, sqlite3.Error):
                    raise audit_error(self.path, exc) from exc
                raise

    async def inline(self, work: Callable[[Conn], Coroutine[Any, Any, T]], *, write: bool) -> T:
        """One transaction of ``work``, which only runs statements on the connection it
        is given, in one call on aiosqlite's thread (see the module docstring); the same
        lock, rule and errors as ``transaction``. Once queued, the call commits or rolls
        back whatever happens to its caller."""
        if not self.inside():
            raise RuntimeError("Database.inline() must run inside Database.shielded()")
        async with self._lock:
            if self._closed:
                raise AuditError(f"audit database {self.path}: already closed")
            conn = self._conn
            begin = "BEGIN IMMEDIATE" if write else "BEGIN"
            try:
                return await _on_thread(conn)(functools.partial(_transact, conn._conn, work, begin))
            except sqlite3.Error as exc:
                raise audit_error(self.path, exc) from exc


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class Opening(Generic[C]):
    """What an ``open`` returns: await it, or use it with ``async with`` (closed on exit)."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, C]]) -> None:
        self._start = start
        self._opened: C | None = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._start().__await__()

    async def __aenter__(self) -> C:
        self._opened = await self._start()
        return self._opened

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._opened is not None:
            await self._opened.close()
