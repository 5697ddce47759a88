"""Reading and writing an audit database behind the bot's back, on either backend (a
SQLite file, or a PostgreSQL schema's URL): what a test checks was really stored, or
plants as another process would."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg

from bot.audit.pg_conn import to_pyformat
from bot.audit.pg_db import _WRITE_LOCK
from bot.settings import PostgresUrl

Target = Path | PostgresUrl


def raw_rows(target: Target, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) in its own transaction; its rows."""
    if isinstance(target, PostgresUrl):
        with psycopg.connect(target.url.get_secret_value(), autocommit=True) as conn:
            cur = conn.execute(to_pyformat(sql).encode(), params)
            return list(cur.fetchall()) if cur.description is not None else []
    with closing(sqlite3.connect(target, timeout=10)) as lite, lite:
        return list(lite.execute(sql, params).fetchall())


def raw_dump(target: Target) -> str:
    """Every row of every table, as text: what a secret must never be found in."""
    if isinstance(target, PostgresUrl):
        with psycopg.connect(target.url.get_secret_value(), autocommit=True) as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() ORDER BY table_name"
                ).fetchall()
            ]
            lines = [
                repr(row)
                for table in tables
                for row in conn.execute(f'SELECT * FROM "{table}"'.encode()).fetchall()
            ]
        return "\n".join(lines)
    with closing(sqlite3.connect(target)) as conn:
        return "\n".join(conn.iterdump())


def db_arg(target: Target) -> str:
    """``target`` as ``--db`` or ``CHATOPS_DB`` take it (a URL with its password: the
    test's own server)."""
    return target.url.get_secret_value() if isinstance(target, PostgresUrl) else str(target)


def db_option(target: Target) -> tuple[list[str], dict[str, str]]:
    """``--db`` for ``target`` as an operator gives it, and the environment to run with: a
    PostgreSQL URL without its password, which libpq reads from ``PGPASSWORD`` (the
    command line refuses a password: every user of the machine can read it there)."""
    if not isinstance(target, PostgresUrl):
        return ["--db", str(target)], {}
    parts = urlsplit(target.url.get_secret_value())
    host = parts.netloc.rpartition("@")[2]
    bare = parts._replace(netloc=f"{parts.username}@{host}").geturl()
    return ["--db", bare], {"PGPASSWORD": unquote(parts.password or "")}


def raw_many(target: Target, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """Run one statement once per row, in one transaction (``executemany``)."""
    if isinstance(target, PostgresUrl):
        with psycopg.connect(target.url.get_secret_value()) as conn, conn.cursor() as cur:
            cur.executemany(to_pyformat(sql).encode(), rows)
        return
    with closing(sqlite3.connect(target, timeout=10)) as lite, lite:
        lite.executemany(sql, rows)


class Locker:
    """Another process holding the database's write lock: on SQLite a second connection
    to the same file inside ``BEGIN EXCLUSIVE``; on PostgreSQL a second session holding
    the writers' advisory lock (``bot.audit.pg_db``) inside its transaction."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if isinstance(target, PostgresUrl):
            self._pg = psycopg.connect(target.url.get_secret_value(), autocommit=True)
        else:
            self._sqlite = sqlite3.connect(target, isolation_level=None, timeout=5)

    def lock(self) -> None:
        if self._pg is not None:
            self._pg.execute("BEGIN")
            self._pg.execute(_WRITE_LOCK.encode())
        else:
            assert self._sqlite is not None
            self._sqlite.execute("BEGIN EXCLUSIVE")

    def unlock(self) -> None:
        if self._pg is not None:
            self._pg.execute("ROLLBACK")
        else:
            assert self._sqlite is not None
            self._sqlite.execute("ROLLBACK")

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        elif self._sqlite is not None:
            if self._sqlite.in_transaction:
                self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
