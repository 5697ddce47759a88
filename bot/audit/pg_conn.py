"""The table modules' statements on a PostgreSQL connection (psycopg 3).

The table modules write SQLite's SQL with ``?`` placeholders and read rows by column
name or position (``sqlite3.Row``). ``PgConn`` runs the same text on a psycopg
``AsyncConnection``: each ``?`` outside a quoted string or identifier becomes ``%s``
(and a literal ``%`` becomes ``%%``, which psycopg would otherwise read as a
placeholder), once per distinct statement (cached); rows come back as ``PgRow``, a
tuple also indexed by column name. An ``INSERT`` whose new id is wanted gets
``RETURNING id`` (``insert``), the one thing ``lastrowid`` cannot do here.

Errors are psycopg's until the transaction that ran them turns them into
``AuditError`` (``bot.audit.pg_db``), except a refused row (a foreign key, a unique
key): ``IntegrityViolation``, which the table modules catch as they catch SQLite's
``IntegrityError``.

Only this module and ``bot.audit.pg_db`` import psycopg, so a bot on SQLite never
loads it.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from bot.audit.backend import Dialect, IntegrityViolation

if TYPE_CHECKING:
    from psycopg.rows import RowMaker


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s``; a ``%`` outside them doubled.
    Quoted strings ('...') and identifiers ("...") are copied as they are, but for
    their ``%``."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if ch == "%":
            out.append("%%")
        elif quote is not None:
            out.append(ch)
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        else:
            out.append(ch)
    return "".join(out)


class PgRow(tuple[Any, ...]):
    """A result row: a tuple, also indexed by column name (as ``sqlite3.Row``)."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def pg_rows(cursor: psycopg.AsyncCursor[Any]) -> RowMaker[PgRow]:
    """psycopg's row factory for ``PgRow``."""
    names = {d.name: i for i, d in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> PgRow:
        row = PgRow(values)
        row._names = names
        return row

    return make


class PgCursor:
    """What the statement helpers read of a cursor."""

    def __init__(self, cursor: psycopg.AsyncCursor[PgRow], lastrowid: int | None = None) -> None:
        self._cursor = cursor
        self._lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._lastrowid

    async def fetchall(self) -> list[PgRow]:
        if self._cursor.description is None:
            return []
        return list(await self._cursor.fetchall())

    async def fetchone(self) -> PgRow | None:
        if self._cursor.description is None:
            return None
        return await self._cursor.fetchone()


class PgResult:
    """``PgConn.execute``'s answer: awaited, or used with ``async with``, as aiosqlite's."""

    def __init__(self, conn: PgConn, sql: str, params: Sequence[Any]) -> None:
        self._conn, self._sql, self._params = conn, sql, params

    def __await__(self) -> Generator[Any, None, PgCursor]:
        return self._conn.run(self._sql, self._params).__await__()

    async def __aenter__(self) -> PgCursor:
        return await self._conn.run(self._sql, self._params)

    async def __aexit__(self, *exc: object) -> None:
        return None


class PgConn:
    """One transaction's connection, as the table modules see it."""

    dialect = Dialect.POSTGRES

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> PgResult:
        return PgResult(self, sql, params)

    async def run(self, sql: str, params: Sequence[Any]) -> PgCursor:
        cursor = self._conn.cursor(row_factory=pg_rows)
        try:
            await cursor.execute(to_pyformat(sql), tuple(params))
        except psycopg.IntegrityError as exc:
            raise IntegrityViolation(str(exc)) from exc
        return PgCursor(cursor)

    async def insert(self, sql: str, params: Sequence[Any]) -> int:
        """Run one INSERT and return the new row's ``id``."""
        async with self.execute(f"{sql} RETURNING id", params) as cur:
            row = await cur.fetchone()
        if row is None:
            raise IntegrityViolation(f"insert returned no row: {sql}")
        return int(row[0])

    @property
    def in_transaction(self) -> bool:
        return self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
