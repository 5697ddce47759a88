"""What ``doctor`` reads of the audit database (issue 21), changing nothing: whether it
can be reached, the migrations it has, and, on PostgreSQL, the server's version and its
clock against this machine's. SQLite's file is opened read-only (a missing one is not
created); PostgreSQL's tables are read in a read-only transaction."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from bot.core.doctor_database import DatabaseState
from bot.settings import PostgresUrl, shown_url


async def inspect(target: Path | PostgresUrl, *, timeout_s: float) -> DatabaseState:
    if isinstance(target, PostgresUrl):
        return await _postgres(target.url.get_secret_value(), timeout_s)
    return await asyncio.to_thread(_sqlite, Path(target))


def _sqlite(path: Path) -> DatabaseState:
    where = str(path)
    if not path.exists():
        return DatabaseState(where, postgres=False, exists=False)
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'"
            ).fetchone()
            rows = (
                conn.execute("SELECT name FROM _migrations ORDER BY rowid").fetchall()
                if found
                else []
            )
    except sqlite3.Error as exc:
        return DatabaseState(where, postgres=False, exists=True, error=str(exc))
    return DatabaseState(where, postgres=False, exists=True, applied=tuple(r[0] for r in rows))


async def _postgres(url: str, timeout_s: float) -> DatabaseState:
    import psycopg

    where = shown_url(url)
    try:
        async with await psycopg.AsyncConnection.connect(
            url, connect_timeout=max(1, int(timeout_s)), autocommit=True
        ) as conn:
            await conn.execute("BEGIN READ ONLY")
            before = time.time()
            cur = await conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::double precision, "
                "current_setting('server_version'), to_regclass('_migrations') IS NOT NULL"
            )
            after = time.time()
            row = await cur.fetchone()
            assert row is not None
            now, version, has_table = row
            applied: tuple[str, ...] = ()
            if has_table:
                cur = await conn.execute("SELECT name FROM _migrations ORDER BY seq")
                applied = tuple(str(r[0]) for r in await cur.fetchall())
            await conn.execute("COMMIT")
    except psycopg.Error as exc:
        text = str(exc).strip().splitlines()
        return DatabaseState(where, postgres=True, exists=False, error=text[-1] if text else "?")
    # The server read its clock between our two readings: compare with their middle.
    skew = float(now) - (before + after) / 2
    return DatabaseState(
        where, postgres=True, exists=True, applied=applied, server=str(version), skew_s=skew
    )
