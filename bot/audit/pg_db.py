"""The audit database on PostgreSQL (issue 21): a psycopg 3 connection pool and the
transactions run on it, with the same contract as SQLite's ``bot.audit.db.Database``.

* **Writers one at a time**, as SQLite's ``BEGIN IMMEDIATE`` makes them: every write
  transaction takes one transaction-scoped advisory lock (per schema) before its first
  statement, so a read-then-write (a compare-and-set of a run's status, taking locks,
  a claim) is never overtaken by another replica between the two. Readers are not
  held up: a read transaction is ``REPEATABLE READ READ ONLY`` (one snapshot, as a
  SQLite read transaction sees), and may not write.
* **Timeouts instead of hanging**: a write waits for the lock at most the busy timeout
  (``lock_timeout``, set for each transaction alone: nothing is left on a pooled
  session), then fails as SQLite's "database is locked" does
  (``AuditUnavailable``: the resilient writer journals it); a session left inside a
  transaction (a replica frozen by ``SIGSTOP`` or a VM pause while it held the lock) is
  ended by the server after ``IDLE_IN_TRANSACTION_S``, so the others are not blocked
  for longer than that.
* **Errors**: the connection lost, the server restarting or shutting down, a pool with
  no connection to give within the busy timeout, a lock wait over, a standby's
  read-only refusal after a fail-over, a session the server ended while it idled in a
  transaction: ``AuditUnavailable``; everything else
  ``AuditError``. Each names the database as ``where`` shows it, without its password.
  A pooled connection is checked before each use, so the first transaction after a
  server restart gets a fresh one instead of failing.
* **Migrations** (``bot.audit.migrations_pg``): never applied on open; ``migrate``
  applies them (``python -m bot migrate``), and ``open`` refuses a database with
  migrations pending or unknown, naming them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from bot.audit.backend import Dialect, IntegrityViolation, Shield
from bot.audit.migrations import Migration, MigrationError, MigrationResult
from bot.audit.pg_conn import PgConn
from bot.errors import AuditError, AuditUnavailable
from bot.settings import shown_url

log = logging.getLogger(__name__)

T = TypeVar("T")

# The first key of the writers' advisory lock (the second is the schema's hash): any
# constant no other program on the database uses.
WRITE_LOCK_CLASS = 0x43_48_41  # "CHA"
# How long the server lets a session sit inside a transaction before ending it: far
# longer than any gap between the statements of one of ours (milliseconds), short
# enough that a frozen replica holding the write lock blocks the others only briefly.
IDLE_IN_TRANSACTION_S = 5.0
POOL_MAX = 8
# The least time given to connect at start, and to get a pooled connection later.
OPEN_MIN_S = 2.0
GET_CONNECTION_MIN_S = 1.0

_BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_WRITE_LOCK = f"SELECT pg_advisory_xact_lock({WRITE_LOCK_CLASS}, hashtext(current_schema()))"


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be written *for now*."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True  # lost connection, shutdown, restart, lock wait over, pool timeout
    # A standby promoted late, or the old primary after a fail-over: it refuses writes;
    # or this session ended by the server while it idled inside a transaction (this
    # replica paused mid-write past IDLE_IN_TRANSACTION_S): the next one gets a new one.
    return isinstance(
        exc, psycopg.errors.ReadOnlySqlTransaction | psycopg.errors.IdleInTransactionSessionTimeout
    )


def audit_error(where: str, exc: BaseException) -> AuditError:
    kind = AuditUnavailable if transient(exc) else AuditError
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        # The words SQLite's "database is locked" gets (bot.audit.db.problem).
        text = "locked by another process for longer than the busy timeout (the write lock)"
    else:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return kind(f"audit database {where}: {text}")


def _begin(write: bool, busy_timeout_s: float) -> bytes:
    """A transaction's start, in one round trip: its isolation, its bounds (``SET
    LOCAL``: they end with it, so nothing is left on a session a pooler such as
    PgBouncer in transaction mode hands to someone else), and for a write the writers'
    lock."""
    idle = (
        f"SET LOCAL idle_in_transaction_session_timeout = '{int(IDLE_IN_TRANSACTION_S * 1000)}ms'"
    )
    if not write:
        return f"{_BEGIN_READ}; {idle}".encode()
    wait = f"SET LOCAL lock_timeout = '{int(busy_timeout_s * 1000)}ms'"
    return f"{_BEGIN_WRITE}; {idle}; {wait}; {_WRITE_LOCK}".encode()


class PostgresDatabase(Shield):
    """A pool of connections to one PostgreSQL database and the transactions run on
    them. Create with ``open``."""

    dialect = Dialect.POSTGRES

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        where: str,
        unknown: tuple[str, ...],
        busy_timeout_s: float,
    ) -> None:
        super().__init__()
        self._pool = pool
        self._begin = {w: _begin(w, busy_timeout_s) for w in (False, True)}
        self._where = where
        self._closed = False
        self.unknown_migrations = unknown

    @property
    def where(self) -> str:
        return self._where

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        migrations: Sequence[Migration],
        busy_timeout_s: float,
        migrate: bool = False,
        applied: list[str] | None = None,
    ) -> PostgresDatabase:
        """Connect, then check the schema (``migrate``: bring it up to date first, the
        names applied appended to ``applied``). Raises ``AuditError`` naming the
        database (without its password) and the problem."""
        where = shown_url(url)
        opening = max(busy_timeout_s, OPEN_MIN_S)

        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            open=False,
            # A connection from the pool, or a new one, within the busy timeout (but a
            # second at least: a loaded machine takes tens of milliseconds to connect).
            timeout=max(busy_timeout_s, GET_CONNECTION_MIN_S),
            # No prepared statements (psycopg prepares a query it has run five times):
            # a pooler in transaction mode would hand them to another client's session.
            kwargs={
                "autocommit": True,
                "prepare_threshold": None,
                "application_name": "vllm-chatops",
            },
            check=psycopg_pool.AsyncConnectionPool.check_connection,
            name="chatops-audit",
        )
        try:
            await pool.open(wait=True, timeout=opening)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await pool.close()
            raise AuditUnavailable(
                f"audit database {where}: cannot connect within {opening:g} s ({_why_not(exc)})"
            ) from exc
        db = cls(pool, where, (), busy_timeout_s)
        try:
            result = await db._migrations(migrations, migrate=migrate)
        except BaseException:
            await pool.close()
            raise
        if applied is not None:
            applied.extend(result.applied)
        db.unknown_migrations = tuple(result.unknown)
        return db

    async def close(self) -> None:
        if self._closed:
            return
        await self.settle()
        self._closed = True
        await self._pool.close()

    # ---- transactions ---------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[PgConn]:
        """One transaction on a pooled connection; see the module docstring."""
        if not self.inside():
            raise RuntimeError("Database.transaction() must run inside Database.shielded()")
        if self._closed:
            raise AuditError(f"audit database {self._where}: already closed")
        try:
            async with self._pool.connection() as raw:
                conn = PgConn(raw)
                try:
                    await raw.execute(self._begin[write])
                    yield conn
                    await raw.execute("COMMIT")
                except BaseException:
                    await _rollback(raw)
                    raise
        except (psycopg.Error, psycopg_pool.PoolTimeout, IntegrityViolation) as exc:
            raise audit_error(self._where, exc) from exc

    async def inline(self, work: Callable[[Any], Coroutine[Any, Any, T]], *, write: bool) -> T:
        """``work`` in one transaction (SQLite runs such statements-only work in one call
        on its thread; here it is a transaction like any other)."""
        if not self.inside():
            raise RuntimeError("Database.inline() must run inside Database.shielded()")
        async with self.transaction(write=write) as conn:
            return await work(conn)

    async def now(self) -> float:
        """The database server's clock, in seconds since the epoch: the one clock every
        replica reads the same (leases are judged by it, issue 21)."""

        async def read(conn: PgConn) -> float:
            async with conn.execute("SELECT extract(epoch FROM clock_timestamp())") as cur:
                row = await cur.fetchone()
            assert row is not None
            return float(row[0])

        return await self.shielded(self.inline(read, write=False))

    # ---- migrations -----------------------------------------------------------------

    async def _migrations(
        self, migrations: Sequence[Migration], *, migrate: bool
    ) -> MigrationResult:
        known = [m.name for m in migrations]
        if len(set(known)) != len(known):
            raise ValueError(f"duplicate migration names in {known}")
        result = MigrationResult()
        try:
            async with self._pool.connection() as raw:
                await _bookkeeping(raw)
                done = await _applied(raw)
                pending = [m for m in migrations if m.name not in done]
                if migrate:
                    for migration in pending:
                        if await _apply(raw, migration):
                            result.applied.append(migration.name)
                    done = await _applied(raw)
                result.unknown.extend(name for name in done if name not in set(known))
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise audit_error(self._where, exc) from exc
        except MigrationError as exc:
            raise AuditError(f"audit database {self._where}: {exc}") from exc
        missing = [name for name in known if name not in done]
        if missing:
            raise AuditError(
                f"audit database {self._where}: its schema is behind this bot "
                f"(migrations not applied: {', '.join(missing)}); run "
                "`python -m bot migrate` once, then start the bot"
            )
        if result.unknown:
            raise AuditError(
                f"audit database {self._where} was migrated by a newer bot (migrations "
                f"this bot does not know: {', '.join(result.unknown)}); run the newer "
                "version of the bot"
            )
        return result


async def _rollback(raw: psycopg.AsyncConnection[Any]) -> None:
    if raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        await raw.execute("ROLLBACK")
    except psycopg.Error:
        # The connection is gone: the pool discards it, the server rolled back.
        log.debug("rollback failed", exc_info=True)


async def _bookkeeping(raw: psycopg.AsyncConnection[Any]) -> None:
    """``_migrations``, made under the writers' lock: two bots creating it at once would
    collide in the catalog (``IF NOT EXISTS`` does not serialise them)."""
    await raw.execute(_BEGIN_WRITE)
    try:
        await raw.execute(_WRITE_LOCK)
        await raw.execute(
            "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, "
            "applied_at TEXT, seq BIGINT GENERATED ALWAYS AS IDENTITY)"
        )
        await raw.execute("COMMIT")
    except BaseException:
        await _rollback(raw)
        raise


async def _applied(raw: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await raw.execute("SELECT name FROM _migrations ORDER BY seq")
    return [str(row[0]) for row in await cur.fetchall()]


async def _apply(raw: psycopg.AsyncConnection[Any], migration: Migration) -> bool:
    """One migration and its ``_migrations`` row in one transaction, under the writers'
    lock (two operators migrating at once apply it once); False if another did first."""
    if not isinstance(migration.apply, str):
        raise MigrationError(migration.name, TypeError("PostgreSQL migrations are SQL text"))
    await raw.execute(_BEGIN_WRITE)
    try:
        await raw.execute(_WRITE_LOCK)
        cur = await raw.execute("SELECT 1 FROM _migrations WHERE name = %s", (migration.name,))
        if await cur.fetchone() is not None:
            await raw.execute("COMMIT")
            return False
        try:
            # No parameters: the simple query protocol runs the whole script.
            await raw.execute(migration.apply.encode())
        except psycopg.Error as exc:
            raise MigrationError(migration.name, exc) from exc
        await raw.execute(
            "INSERT INTO _migrations (name, applied_at) VALUES (%s, %s)",
            (migration.name, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")),
        )
        await raw.execute("COMMIT")
    except BaseException:
        await _rollback(raw)
        raise
    return True


def _why_not(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
