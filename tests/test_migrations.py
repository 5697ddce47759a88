"""Named migrations against real SQLite files."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite
import pytest

import bot.audit
from bot.audit.migrations import MIGRATIONS, Migration, apply_migrations, split_statements
from bot.audit.store import AuditLog
from bot.core.status import Action, Source
from bot.engine.clocks import Monotonic
from bot.engine.liveness import Judge, JudgedBy
from bot.engine.owner import read_stat
from bot.errors import AuditError
from tests.support.clock import ManualClock
from tests.support.wall_clock import ManualWallClock


def applied_names(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]


def tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def columns(db: Path, table: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


async def add_run(log: AuditLog) -> int:
    return await log.create_run(
        service="kimi-k25",
        action=Action.REDEPLOY,
        hosts=["gpu1"],
        requested_by="U1",
        source=Source.CLI,
        plan={},
        package_spec="vllm==0.9.0",
    )


def test_split_statements_keeps_triggers_strings_and_comments_whole() -> None:
    script = """
        CREATE TABLE a (x TEXT DEFAULT 'semi;colon');  -- a comment; with a semicolon
        CREATE TRIGGER t AFTER INSERT ON a BEGIN
            UPDATE a SET x = 'y'; DELETE FROM a WHERE x = 'z';
        END;
        INSERT INTO a VALUES ('1')
    """
    statements = split_statements(script)
    assert len(statements) == 3
    assert statements[0].startswith("CREATE TABLE a")
    assert statements[1].startswith("-- a comment")  # the comment rides with the next one
    assert statements[1].rstrip().endswith("END;")
    assert statements[2].startswith("INSERT INTO a")


async def test_fresh_database_gets_every_migration_once(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db) as log:
        assert log.unknown_migrations == ()
    assert applied_names(db) == [m.name for m in MIGRATIONS]
    assert {"runs", "decisions", "steps", "gpu_snapshots", "refusals", "locks"} <= tables(db)


async def test_the_package_docstring_describes_the_schema_the_migrations_create(
    tmp_path: Path,
) -> None:
    # The schema description in bot/audit/__init__.py drifted once (the runs.owner column
    # was missing): every table, column and index the migrations create must be in it.
    db = tmp_path / "audit.db"
    async with AuditLog.open(db):
        pass
    doc = bot.audit.__doc__ or ""
    sections = dict(re.findall(r"^``(\w+)``\n((?:    .*\n)+)", doc, re.MULTILINE))
    with sqlite3.connect(db) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        assert sorted(sections) == sorted(names)
        for table in names:
            text = " ".join(sections[table].split())
            for column in columns(db, table):
                # As an item of the column list, not inside some other word or name.
                assert re.search(rf"(?:^|, ){column}(?:[ ,;:.]|$)", text), (table, column)
            indexes = [
                r[1]
                for r in conn.execute(f"PRAGMA index_list({table})")
                if not r[1].startswith("sqlite_autoindex")
            ]
            for index in indexes:
                keys = [
                    f"{r[2]} DESC" if r[3] else r[2]
                    for r in conn.execute(f"PRAGMA index_xinfo({index})")
                    if r[5]
                ]
                assert f"({', '.join(keys)})" in text, (table, index, keys)


async def test_reopening_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db) as log:
        run_id = await add_run(log)
    async with AuditLog.open(db) as log:
        assert (await log.get_run(run_id)).service == "kimi-k25"
    assert applied_names(db) == [m.name for m in MIGRATIONS]

    async with aiosqlite.connect(db, isolation_level=None) as conn:
        result = await apply_migrations(conn)
    assert result.applied == []
    assert result.unknown == []


async def test_migration_added_later_applies_to_an_old_database(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db, migrations=MIGRATIONS) as log:
        run_id = await add_run(log)

    async def backfill(conn: aiosqlite.Connection) -> None:
        await conn.execute("UPDATE runs SET ticket = 'OPS-' || id")

    newer = (
        *MIGRATIONS,
        Migration(
            "0002_runs_ticket",
            "ALTER TABLE runs ADD COLUMN ticket TEXT;CREATE INDEX runs_ticket ON runs(ticket);",
        ),
        Migration("0003_backfill_ticket", backfill),
    )
    async with AuditLog.open(db, migrations=newer) as log:
        assert (await log.get_run(run_id)).service == "kimi-k25"
    assert "ticket" in columns(db, "runs")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT ticket FROM runs").fetchall() == [(f"OPS-{run_id}",)]
    assert applied_names(db) == [m.name for m in newer]

    # Opening again with the newer list applies nothing.
    async with aiosqlite.connect(db, isolation_level=None) as aconn:
        assert (await apply_migrations(aconn, newer)).applied == []


async def test_a_database_from_before_issue_17_keeps_its_owners_and_counts_heartbeats(
    tmp_path: Path,
) -> None:
    # Written by a bot before 0007/0008: an owner string `host:pid:start-time`, a lease.
    db = tmp_path / "audit.db"
    stat = read_stat(os.getpid())
    assert stat is not None
    old_owner = f"{socket.gethostname()}:{os.getpid()}:{stat.start_time}"  # this process
    async with aiosqlite.connect(db, isolation_level=None) as conn:
        await apply_migrations(conn, [m for m in MIGRATIONS if m.name < "0007"])
        await conn.execute(
            "INSERT INTO runs (service, action, hosts, requested_by, source, plan, status, "
            "created_at, owner, lease_until) VALUES ('kimi-k25', 'restart', '[\"gpu1\"]', "
            "'U1', 'cli', '{}', 'running', '2026-11-30T12:00:00Z', ?, "
            "'2026-11-30T12:00:30Z')",
            (old_owner,),
        )
    async with AuditLog.open(db) as log:
        # (Later migrations, 0009_leftover_approvals on, follow these two.)
        assert applied_names(db)[6:8] == ["0007_lease_renewals", "0008_expires_clock"]
        run = await log.get_run(1)
        assert (run.owner, run.lease_renewals, run.expires_clock) == (old_owner, 0, None)
        # Nothing says which PID namespace that PID is of (an older bot in a container
        # writes the same string): judged by its heartbeat only, even though this live
        # process has exactly that PID and start time here.
        judge = Judge(
            wall=ManualWallClock(),
            monotonic=Monotonic(ManualClock(), "here"),
            wall_id=None,
            ttl_s=600,
        )
        await judge.look(log)
        verdict = judge.verdict(run)
        assert (verdict.alive, verdict.by) == (True, JudgedBy.LEASE)
        # The old bot's heartbeat goes on renewing: now the count moves too.
        assert await log.renew_lease(
            1, old_owner, datetime(2026, 11, 30, 12, 1, tzinfo=UTC), lease_s=30
        )
        assert (await log.get_run(1)).lease_renewals == 1
    assert {"lease_renewals", "expires_clock"} <= set(columns(db, "runs"))
    assert "lease_sightings" in tables(db)


async def test_failing_migration_is_rolled_back_and_not_recorded(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db):
        pass
    broken = (
        *MIGRATIONS,
        Migration("0002_broken", "CREATE TABLE half_done (x INTEGER);INSERT INTO nope VALUES (1);"),
    )
    with pytest.raises(AuditError, match=r"audit database .*0002_broken.*no such table: nope"):
        await AuditLog.open(db, migrations=broken)
    assert "half_done" not in tables(db)
    assert applied_names(db) == [m.name for m in MIGRATIONS]
    async with AuditLog.open(db):  # still usable by the current code
        pass


async def test_database_from_a_newer_bot_opens_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "audit.db"
    newer = (*MIGRATIONS, Migration("0099_from_the_future", "CREATE TABLE future (x TEXT);"))
    async with AuditLog.open(db, migrations=newer) as log:
        run_id = await add_run(log)

    with caplog.at_level(logging.WARNING, logger="bot.audit.store"):
        async with AuditLog.open(db) as log:
            assert log.unknown_migrations == ("0099_from_the_future",)
            assert (await log.get_run(run_id)).id == run_id
            await add_run(log)  # and it can still write
    assert "0099_from_the_future" in caplog.text
    assert "newer bot" in caplog.text


async def test_duplicate_migration_names_are_rejected(tmp_path: Path) -> None:
    async with aiosqlite.connect(tmp_path / "x.db", isolation_level=None) as conn:
        with pytest.raises(ValueError, match="duplicate"):
            await apply_migrations(conn, (Migration("a", "SELECT 1;"), Migration("a", "SELECT 2;")))


async def test_two_processes_opening_a_fresh_file_at_once_apply_it_once(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    logs = await asyncio.gather(*(AuditLog.open(db) for _ in range(4)))
    try:
        for log in logs:
            await add_run(log)
    finally:
        for log in logs:
            await log.close()
    assert applied_names(db) == [m.name for m in MIGRATIONS]
