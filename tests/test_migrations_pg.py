"""The PostgreSQL backend (issue 21) against a real PostgreSQL 15 server
(``tests.support.postgres``): its migrations beside SQLite's, ``python -m bot migrate``,
the refusals of a schema the bot does not know, the writers' lock and the errors."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from pydantic import SecretStr

from bot.audit.migrations import MIGRATIONS
from bot.audit.migrations_pg import MIGRATIONS_PG
from bot.audit.pg_conn import to_pyformat
from bot.audit.store import AuditLog
from bot.core.status import Action, RunStatus, Source
from bot.errors import AuditError, AuditUnavailable
from bot.settings import PostgresUrl, shown_url
from tests.polling import eventually
from tests.support.audit_db import db_arg, db_option, raw_rows
from tests.support.cli import cli
from tests.support.postgres import shared_server


def sqlite_schema(db: Path) -> dict[str, set[str]]:
    with sqlite3.connect(db) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' AND name != '_migrations'"
            )
        ]
        return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in names}


def pg_schema(url: PostgresUrl) -> dict[str, set[str]]:
    rows = raw_rows(
        url,
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name != '_migrations'",
    )
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def indexes(target: Path | PostgresUrl) -> set[str]:
    if isinstance(target, PostgresUrl):
        rows = raw_rows(
            target,
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND indexname NOT LIKE '%pkey' AND indexname NOT LIKE '%key'",
        )
    else:
        rows = raw_rows(
            target,
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL",
        )
    return {r[0] for r in rows}


async def pending_run(audit: AuditLog) -> int:
    return await audit.create_run(
        service="svc",
        action=Action.RESTART,
        hosts=["h"],
        requested_by="U1",
        source=Source.CLI,
        plan={},
        package_spec=None,
    )


def test_sql_placeholders_become_psycopgs_outside_quotes() -> None:
    assert to_pyformat("SELECT a FROM t WHERE b = ? AND c IN (?, ?)") == (
        "SELECT a FROM t WHERE b = %s AND c IN (%s, %s)"
    )
    # A ? inside a string or an identifier is text; a % anywhere is escaped.
    assert to_pyformat("SELECT '?', \"a?\" FROM t WHERE x LIKE '5%' AND y = ?") == (
        "SELECT '?', \"a?\" FROM t WHERE x LIKE '5%%' AND y = %s"
    )
    assert to_pyformat("SELECT 'it''s ?' WHERE z = ?") == "SELECT 'it''s ?' WHERE z = %s"


def test_a_url_is_shown_without_its_password() -> None:
    url = "postgresql://chatops:s3cr%40t@db.example:5433/chatops?sslmode=require&password=p2"
    shown = shown_url(url)
    assert "s3cr" not in shown and "p2" not in shown
    assert shown.startswith("postgresql://chatops:***@db.example:5433/chatops?")
    assert "sslmode=require" in shown and "password=***" in shown
    assert shown_url("postgresql:///chatops?service=chatops") == (
        "postgresql:///chatops?service=chatops"
    )
    assert str(PostgresUrl(url=SecretStr(url))) == shown


async def test_both_backends_make_the_same_tables_columns_and_indexes(
    tmp_path: Path, pg_url: PostgresUrl
) -> None:
    assert [m.name for m in MIGRATIONS_PG] == [m.name for m in MIGRATIONS]
    db = tmp_path / "audit.db"
    async with AuditLog.open(db), AuditLog.open(pg_url, migrate=True):
        pass
    sqlite, pg = sqlite_schema(db), pg_schema(pg_url)
    # PostgreSQL's journal_applied keeps its order in ``seq`` (SQLite has its rowid).
    pg["journal_applied"].discard("seq")
    assert pg == sqlite
    assert indexes(pg_url) == indexes(db)


async def test_a_bot_refuses_a_schema_behind_it_until_migrate_brings_it_up(
    tmp_path: Path, pg_url: PostgresUrl
) -> None:
    with pytest.raises(AuditError, match="python -m bot migrate") as refused:
        await AuditLog.open(pg_url)
    assert "0001_initial" in str(refused.value) and shared_server().password not in str(
        refused.value
    )
    # An older bot migrated it: the new migration is named as missing.
    async with AuditLog.open(pg_url, migrations=MIGRATIONS_PG[:-1], migrate=True):
        pass
    with pytest.raises(AuditError, match=MIGRATIONS_PG[-1].name):
        await AuditLog.open(pg_url)
    # Not with the password on the command line, where every user of the machine reads it.
    code, out, err = await cli("migrate", "--db", db_arg(pg_url), cwd=tmp_path)
    assert code == 2 and "--db carries the database's password" in err, err
    assert shared_server().password not in out + err
    db, env = db_option(pg_url)
    code, out, err = await cli("migrate", *db, cwd=tmp_path, env=env)
    assert code == 0, err
    assert f"applied 1 migration(s): {MIGRATIONS_PG[-1].name}" in out
    assert shared_server().password not in out + err and "chatops@" in out
    code, out, _ = await cli("migrate", *db, cwd=tmp_path, env=env)
    assert code == 0 and "the schema is current" in out
    async with AuditLog.open(pg_url) as audit:
        assert await audit.list_runs() == []


async def test_a_bot_refuses_a_schema_a_newer_bot_migrated(pg_url: PostgresUrl) -> None:
    async with AuditLog.open(pg_url, migrate=True):
        pass
    raw_rows(pg_url, "INSERT INTO _migrations (name, applied_at) VALUES ('9999_future', 'x')")
    with pytest.raises(AuditError, match=r"newer bot.*9999_future"):
        await AuditLog.open(pg_url)


async def test_operators_migrating_at_once_apply_each_migration_once(pg_url: PostgresUrl) -> None:
    applied: list[list[str]] = [[], [], []]
    opened = await asyncio.gather(
        *(AuditLog.open(pg_url, migrate=True, applied=a).__aenter__() for a in applied)
    )
    for audit in opened:
        await audit.close()
    everything = [name for names in applied for name in names]
    assert sorted(everything) == sorted(m.name for m in MIGRATIONS_PG)
    rows = raw_rows(pg_url, "SELECT name FROM _migrations ORDER BY seq")
    assert [r[0] for r in rows] == [m.name for m in MIGRATIONS_PG]


async def test_the_migrations_table_is_made_under_the_writers_lock(pg_url: PostgresUrl) -> None:
    """Two bots opening a database that has no ``_migrations`` yet would collide in the
    catalog making it (``IF NOT EXISTS`` does not serialise them): each makes it under
    the writers' lock, so one held elsewhere holds the opening up until it is let go."""
    from tests.support.audit_db import Locker

    def waiting_for_a_lock() -> bool:
        return bool(
            raw_rows(
                pg_url,
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'vllm-chatops' "
                "AND wait_event_type = 'Lock'",
            )
        )

    locker = Locker(pg_url)
    try:
        locker.lock()
        opening = asyncio.create_task(AuditLog.open(pg_url, migrate=True).__aenter__())
        await eventually(waiting_for_a_lock, "the opening to wait for the writers' lock")
        assert raw_rows(pg_url, "SELECT to_regclass('_migrations') IS NULL") == [(True,)]
        locker.unlock()
        audit = await opening
        await audit.close()
    finally:
        locker.close()
    names = [r[0] for r in raw_rows(pg_url, "SELECT name FROM _migrations ORDER BY seq")]
    assert names == [m.name for m in MIGRATIONS_PG]


async def test_a_failing_migration_is_rolled_back_and_not_recorded(pg_url: PostgresUrl) -> None:
    from bot.audit.migrations import Migration

    broken = (*MIGRATIONS_PG, Migration("9000_broken", "CREATE TABLE x (a INT); SELECT nope;"))
    with pytest.raises(AuditError, match="9000_broken"):
        await AuditLog.open(pg_url, migrations=broken, migrate=True)
    assert raw_rows(pg_url, "SELECT to_regclass('x') IS NULL") == [(True,)]
    names = [r[0] for r in raw_rows(pg_url, "SELECT name FROM _migrations ORDER BY seq")]
    assert names == [m.name for m in MIGRATIONS_PG]


async def test_a_server_that_is_not_there_is_unavailable_naming_it_without_the_password() -> None:
    server = shared_server()
    with socket_reserved() as port:
        url = server.url().replace(f":{server.port}/", f":{port}/")
        with pytest.raises(AuditUnavailable, match="cannot connect") as refused:
            await AuditLog.open(PostgresUrl(url=SecretStr(url)), busy_timeout_s=0.5)
    assert server.password not in str(refused.value) and f":{port}/" in str(refused.value)


async def test_a_read_transaction_cannot_write(pg_url: PostgresUrl) -> None:
    async with AuditLog.open(pg_url, migrate=True) as audit:

        async def write(conn: object) -> None:
            from bot.audit.db import execute

            await execute(conn, "DELETE FROM locks")  # type: ignore[arg-type]

        with pytest.raises(AuditError, match="read-only"):
            await audit._db.shielded(audit._db.inline(write, write=False))


async def test_writers_of_two_replicas_take_turns_and_readers_do_not_wait(
    pg_url: PostgresUrl,
) -> None:
    """The writers' lock: a second connection holding it (another replica mid-write)
    makes a write wait; reads go on meanwhile; the write lands once it is let go."""
    async with AuditLog.open(pg_url, migrate=True, busy_timeout_s=10) as audit:
        run_id = await pending_run(audit)
        with psycopg.connect(pg_url.url.get_secret_value(), autocommit=True) as other:
            other.execute("BEGIN")
            other.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (0x434841,)
            )
            write = asyncio.create_task(
                audit.transition(run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL])
            )
            # The read answers while the write waits on the lock.
            assert (await audit.get_run(run_id)).status == RunStatus.PENDING_APPROVAL
            assert not write.done()
            other.execute("COMMIT")
        assert await write
        assert (await audit.get_run(run_id)).status == RunStatus.APPROVED


class socket_reserved:
    """A loopback port nothing listens on for the block's length."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_the_databases_password_is_redacted_wherever_the_bot_writes() -> None:
    from bot.core.redact import Redactor
    from bot.settings import Settings

    url = "postgresql://chatops:p%40ss-w0rd-42@db:5432/chatops?sslpassword=k3y-secret-9"
    settings = Settings(db_path=url)
    redact = Redactor.for_settings(settings)
    said = f"connect to {url} failed for p@ss-w0rd-42; key k3y-secret-9"
    masked = redact(said)
    assert "w0rd" not in masked and "k3y-secret" not in masked
    assert isinstance(settings.db_path, PostgresUrl) and "w0rd" not in repr(settings)


def test_a_password_in_the_urls_query_is_redacted_as_written_and_as_libpq_reads_it() -> None:
    """libpq decodes a query parameter's %XX and nothing else: ``password=s%2Fe+cr`` is
    the password ``s/e+cr`` (a "+" stays a "+"), which an error may repeat; the URL itself
    holds it percent-encoded."""
    from bot.core.redact import Redactor
    from bot.settings import Settings

    url = "postgresql://chatops@db/chatops?password=s%2Fe+cr%40et-7&sslpassword=k%26y-secret-9"
    redact = Redactor.for_settings(Settings(db_path=url))
    for said in ("s/e+cr@et-7", "s%2Fe+cr%40et-7", "k&y-secret-9", "k%26y-secret-9"):
        assert redact(f"the server said: {said}.") == "the server said: ***."


def test_the_password_libpq_reads_from_the_environment_is_redacted_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README puts the password in PGPASSWORD rather than the URL: it is the same
    secret, masked wherever the bot writes, as it would be in the URL."""
    from bot.core.redact import Redactor
    from bot.settings import Settings

    monkeypatch.setenv("PGPASSWORD", "env-s3cret-77")
    redact = Redactor.for_settings(Settings(db_path="postgresql://chatops@db/chatops"))
    assert redact("the server said: env-s3cret-77.") == "the server said: ***."
    # A bot on SQLite has no database password: the variable is not its secret.
    plain = Redactor.for_settings(Settings(db_path="chatops.db"))
    assert plain("env-s3cret-77") == "env-s3cret-77"


async def test_a_transaction_leaves_nothing_set_on_its_pooled_session(pg_url: PostgresUrl) -> None:
    """Each transaction sets its timeouts for itself alone (``SET LOCAL``): a pooler in
    transaction mode hands the session to another client next, and a plain ``SET``
    would give that client the bot's lock timeout and end its idle transactions."""
    async with AuditLog.open(pg_url, migrate=True) as audit:
        run_id = await pending_run(audit)
        assert await audit.transition(
            run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL]
        )
        await audit.get_run(run_id)
        from bot.audit.pg_db import PostgresDatabase

        assert isinstance(audit._db, PostgresDatabase)
        pool = audit._db._pool
        assert pool.get_stats()["pool_size"] == 1  # the session those transactions ran on
        async with pool.connection() as raw:
            cur = await raw.execute(
                "SELECT current_setting('lock_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            )
            assert await cur.fetchone() == ("0", "0")


async def test_a_replica_frozen_inside_a_write_holds_the_others_up_only_briefly(
    pg_url: PostgresUrl,
) -> None:
    """A replica stopped (SIGSTOP, a frozen VM) between the statements of a write keeps
    the writers' lock; the server ends its idle transaction after IDLE_IN_TRANSACTION_S,
    so another replica's write, waiting up to its busy timeout, then goes through. The
    frozen one is played by a session that began a write exactly as the bot does."""
    from bot.audit.pg_db import IDLE_IN_TRANSACTION_S, _begin

    async with AuditLog.open(
        pg_url, migrate=True, busy_timeout_s=IDLE_IN_TRANSACTION_S * 3
    ) as audit:
        run_id = await pending_run(audit)
        frozen = await psycopg.AsyncConnection.connect(
            pg_url.url.get_secret_value(), autocommit=True
        )
        try:
            await frozen.execute(_begin(True, busy_timeout_s=10))  # holds the lock, then idles
            assert await audit.transition(
                run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL]
            )
            # The server ended the frozen session: it finds out at its next statement.
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await frozen.execute("SELECT 1")
        finally:
            await frozen.close()


async def test_a_write_the_server_ended_while_its_replica_idled_inside_is_unavailable(
    pg_url: PostgresUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of 21-6: the replica paused (a GC pause, a frozen VM) inside one of
    its own writes wakes to find the server ended its session. That is the database away
    for now (the resilient writer retries on a fresh connection, or journals the write),
    not a bug that stops a run mid-step."""
    from bot.audit import pg_db
    from bot.audit.db import execute

    monkeypatch.setattr(pg_db, "IDLE_IN_TRANSACTION_S", 0.2)

    def ended() -> bool:
        return not raw_rows(
            pg_url,
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'vllm-chatops' "
            "AND state = 'idle in transaction'",
        )

    async with AuditLog.open(pg_url, migrate=True) as audit:
        run_id = await pending_run(audit)
        db = audit._db

        async def paused_inside_a_write() -> None:
            async with db.transaction(write=True) as conn:
                await execute(conn, "UPDATE runs SET summary = 'a' WHERE id = ?", (run_id,))
                await eventually(ended, "the server to end the idle transaction", 10)
                await execute(conn, "UPDATE runs SET summary = 'b' WHERE id = ?", (run_id,))

        with pytest.raises(AuditUnavailable):
            await db.shielded(paused_inside_a_write())
        assert await audit.transition(
            run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL]
        )


async def test_no_statement_is_left_prepared_on_a_session_a_pooler_may_hand_on(
    pg_url: PostgresUrl,
) -> None:
    """psycopg prepares a statement it has run five times on a connection; behind a
    pooler in transaction mode (PgBouncer) the next transaction may be another server
    session, which knows nothing of it. The bot's sessions prepare none."""
    from bot.audit.db import fetch

    async with AuditLog.open(pg_url, migrate=True) as audit:

        async def the_same_read_ten_times(conn: object) -> list[tuple[object, ...]]:
            for _ in range(10):
                await fetch(conn, "SELECT id FROM runs WHERE id = ?", (1,))  # type: ignore[arg-type]
            rows = await fetch(conn, "SELECT name FROM pg_prepared_statements")  # type: ignore[arg-type]
            return [tuple(row) for row in rows]

        db = audit._db
        assert await db.shielded(db.inline(the_same_read_ten_times, write=False)) == []


async def test_a_pooled_connection_the_server_dropped_is_replaced_before_its_next_use(
    pg_url: PostgresUrl,
) -> None:
    """After a server restart (or a fail-over) every pooled session is gone: the pool
    checks a connection before lending it, so the first transaction after gets a fresh
    one instead of failing as the database being away (and journaling its write)."""
    from bot.audit.db import fetch

    async def backend_pid(conn: object) -> int:
        return int((await fetch(cast(Any, conn), "SELECT pg_backend_pid() AS pid"))[0]["pid"])

    async with AuditLog.open(pg_url, migrate=True) as audit:
        run_id = await pending_run(audit)
        db = audit._db
        first = await db.shielded(db.inline(backend_pid, write=False))
        raw_rows(pg_url, "SELECT pg_terminate_backend(?)", (first,))
        await eventually(
            lambda: not raw_rows(pg_url, "SELECT 1 FROM pg_stat_activity WHERE pid = ?", (first,)),
            "the server to end the pooled session",
        )
        assert await audit.transition(
            run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL]
        )
        assert await db.shielded(db.inline(backend_pid, write=False)) != first


async def test_a_write_refused_by_a_read_only_standby_is_unavailable(
    pg_url: PostgresUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fail-over a replica may still reach the old primary, now a standby that
    refuses writes: that is the database away for now (the resilient writer retries and
    journals the write), not a bug that stops a run mid-step."""
    from bot.audit import pg_db

    async with AuditLog.open(pg_url, migrate=True) as audit:
        run_id = await pending_run(audit)
    url = pg_url.url.get_secret_value()
    assert "options=-csearch_path" in url
    standby = PostgresUrl(
        url=SecretStr(
            url.replace(
                "options=-csearch_path",
                "options=-cdefault_transaction_read_only%3Don%20-csearch_path",
            )
        )
    )

    async def opened_while_primary(raw: object) -> None:
        return None

    monkeypatch.setattr(pg_db, "_bookkeeping", opened_while_primary)
    async with AuditLog.open(standby) as audit:
        assert (await audit.get_run(run_id)).status == RunStatus.PENDING_APPROVAL
        with pytest.raises(AuditUnavailable, match="read-only"):
            await audit.transition(run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL])
