"""``Database.inline``: a transaction of statements only, run whole in one call on
aiosqlite's thread (the audit records a run writes; issue 18's overhead)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.audit.db import Conn, Database, execute, fetch, insert
from bot.audit.migrations import MIGRATIONS
from bot.audit.resilient import unavailable
from bot.errors import AuditError


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    opened = await Database.open(tmp_path / "audit.db", migrations=MIGRATIONS, busy_timeout_s=1)
    yield opened
    await opened.close()


async def names(db: Database) -> list[str]:
    async def read(conn: Conn) -> list[str]:
        rows = await fetch(conn, "SELECT name FROM _migrations WHERE name LIKE 'test-%'")
        return [str(r["name"]) for r in rows]

    return await db.shielded(db.inline(read, write=False))


def add(name: str) -> str:
    return f"INSERT INTO _migrations (name, applied_at) VALUES ('{name}', '')"


async def test_statements_run_in_one_call_on_the_thread_and_commit(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    conn = db._conn
    original: Callable[..., Awaitable[Any]] = conn._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return await original(fn, *args, **kwargs)

    monkeypatch.setattr(conn, "_execute", counted)

    async def work(c: Conn) -> tuple[int, int]:
        row = await insert(c, add("test-a"), ())
        changed = await execute(
            c, "UPDATE _migrations SET applied_at = 'x' WHERE rowid = ?", (row,)
        )
        await c.execute(add("test-b"))
        return row, changed

    row, changed = await db.shielded(db.inline(work, write=True))
    assert row > 0 and changed == 1
    assert len(calls) == 1  # BEGIN, three statements, the cursors' closes and COMMIT
    monkeypatch.undo()
    assert await names(db) == ["test-a", "test-b"]
    # Committed: another connection sees it.
    other = sqlite3.connect(db.path)
    try:
        (count,) = other.execute(
            "SELECT count(*) FROM _migrations WHERE name LIKE 'test-%'"
        ).fetchone()
    finally:
        other.close()
    assert count == 2


async def test_a_failing_statement_rolls_the_whole_transaction_back(db: Database) -> None:
    async def work(c: Conn) -> None:
        await c.execute(add("test-a"))
        await c.execute(add("test-a"))  # the primary key refuses it

    with pytest.raises(AuditError):
        await db.shielded(db.inline(work, write=True))
    assert await names(db) == []


async def test_work_that_awaits_anything_but_its_statements_is_refused_and_rolled_back(
    db: Database,
) -> None:
    async def work(c: Conn) -> None:
        await c.execute(add("test-a"))
        await asyncio.sleep(0)  # would run on the event loop's thread: never allowed here

    with pytest.raises(RuntimeError, match="other than its statements"):
        await db.shielded(db.inline(work, write=True))
    assert await names(db) == []


async def test_a_locked_database_is_an_audit_error_the_writer_retries(db: Database) -> None:
    holder = sqlite3.connect(db.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:

        async def work(c: Conn) -> None:
            await c.execute(add("test-a"))

        with pytest.raises(AuditError) as caught:
            await db.shielded(db.inline(work, write=True))
        assert unavailable(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert await names(db) == []


async def test_inline_runs_only_inside_shielded(db: Database) -> None:
    async def work(c: Conn) -> None:
        await c.execute(add("test-a"))

    with pytest.raises(RuntimeError, match="shielded"):
        await db.inline(work, write=True)
