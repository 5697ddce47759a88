"""What every audit database backend offers the table modules and ``AuditLog``.

Two backends store the same records with the same queries (issue 21):

* SQLite (``bot.audit.db``), the default: one file next to the bot
  (``CHATOPS_DB=./chatops.db``), WAL, ``synchronous=FULL``;
* PostgreSQL (``bot.audit.pg_db``), for several replicas of the bot
  (``CHATOPS_DB=postgresql://...``), through psycopg 3 and a connection pool.

Both give a transaction (``transaction``, or ``inline`` for work made of statements
only) inside ``shielded`` (a caller cancelled mid-write leaves the write to finish by
itself), serialise writers the way SQLite's ``BEGIN IMMEDIATE`` does (PostgreSQL: one
advisory lock per schema, taken first in every write transaction), and turn the
driver's errors into ``AuditError``; a database that cannot be written *for now*
(locked, down, restarting, failing over) is ``AuditUnavailable``, which the resilient
writer rides out with its fallback journal.

The table modules run their statements on a ``Conn`` (either backend's) with ``?``
placeholders and read ``Row`` objects by column name or position; the few statements
that differ between the two dialects ask ``dialect_of(conn)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from enum import StrEnum
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Dialect(StrEnum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"


class IntegrityViolation(Exception):
    """PostgreSQL refused a row (a foreign key, a unique key, a check): what SQLite says
    with ``sqlite3.IntegrityError`` (``bot.audit.db.INTEGRITY`` is both)."""


class Row(Protocol):
    """A result row, read by column name or by position (``sqlite3.Row`` and
    ``bot.audit.pg_conn.PgRow`` both are one)."""

    def __getitem__(self, key: Any, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...

    def keys(self) -> list[str]: ...


class Backend(Protocol):
    """One open audit database (``bot.audit.db.Database`` or
    ``bot.audit.pg_db.PostgresDatabase``)."""

    dialect: Dialect
    # Migration names found in the database that this code does not know (a newer bot).
    unknown_migrations: tuple[str, ...]

    @property
    def where(self) -> str:
        """Where it is, for people: the file, or the URL without its password."""
        ...

    def transaction(self, *, write: bool) -> AbstractAsyncContextManager[Any]: ...

    async def inline(self, work: Callable[[Any], Coroutine[Any, Any, T]], *, write: bool) -> T: ...

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T: ...

    async def close(self) -> None: ...


class Shield:
    """The tasks a backend's transactions run in (``shielded``): awaited through
    ``asyncio.shield``, so a cancelled caller leaves its write to commit or roll back by
    itself, and waited for by ``close``."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` (which holds the transactions) in its own task; if our caller is
        cancelled, the task still commits or rolls back on its own."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here so a cancelled caller's error is not logged twice

    def inside(self) -> bool:
        """Whether the running task is one of ``shielded``'s."""
        return asyncio.current_task() in self._tasks

    async def settle(self) -> None:
        """Let writes already started (maybe by a caller that was cancelled) finish."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
