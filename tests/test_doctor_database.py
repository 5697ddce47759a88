"""``doctor``'s checks of the audit database (issue 21): reachable, migrated, and the
clock of this machine against PostgreSQL's, read without changing anything; judged on
both backends and on states a real server cannot be made to show (a skewed clock)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.audit.inspect import inspect
from bot.audit.migrations import MIGRATIONS
from bot.audit.store import AuditLog
from bot.core.doctor_database import DatabaseState, judge_database
from bot.core.doctor_types import Outcome
from bot.engine.doctor import database_checks
from bot.settings import PostgresUrl, Settings
from tests.support.audit_db import raw_rows
from tests.support.postgres import migrate_pg, shared_server

KNOWN = [m.name for m in MIGRATIONS]


def outcomes(state: DatabaseState) -> dict[str, Outcome]:
    return {c.name: c.outcome for c in judge_database(state, KNOWN, margin_s=5.0)}


def test_each_state_is_judged_with_a_fix_where_something_must_be_done() -> None:
    pg = DatabaseState("postgresql://u:***@db/chatops", postgres=True, exists=True)
    assert outcomes(DatabaseState("x", postgres=True, exists=False, error="refused")) == {
        "reachable": Outcome.FAIL
    }
    assert outcomes(DatabaseState("/srv/audit.db", postgres=False, exists=False)) == {
        "reachable": Outcome.OK  # made at the first start
    }
    behind = judge_database(
        DatabaseState(pg.where, True, True, applied=tuple(KNOWN[:-1]), skew_s=0.1),
        KNOWN,
        margin_s=5.0,
    )
    schema = next(c for c in behind if c.name == "schema")
    assert schema.outcome == Outcome.FAIL and "python -m bot migrate" in schema.fix
    assert KNOWN[-1] in schema.detail
    # SQLite migrates itself at the next start; a newer bot's file only warns (it opens).
    lite = DatabaseState("/srv/audit.db", False, True, applied=tuple(KNOWN[:-1]))
    assert outcomes(lite)["schema"] == Outcome.OK
    newer = (*KNOWN, "9999_future")
    assert outcomes(DatabaseState("/srv/audit.db", False, True, applied=newer))["schema"] == (
        Outcome.WARN
    )
    assert outcomes(DatabaseState(pg.where, True, True, applied=newer))["schema"] == Outcome.FAIL
    for skew, want in ((0.3, Outcome.OK), (-2.5, Outcome.WARN), (7.0, Outcome.FAIL)):
        state = DatabaseState(pg.where, True, True, applied=tuple(KNOWN), skew_s=skew)
        assert outcomes(state)["clock skew"] == want, skew


async def test_a_real_server_before_and_after_migrate(pg_url: PostgresUrl) -> None:
    before = await inspect(pg_url, timeout_s=5)
    assert before.error is None and before.applied == ()
    assert before.server is not None and before.server.startswith(("15", "16", "17"))
    # Read-only: nothing was created, not even the bookkeeping table.
    assert raw_rows(pg_url, "SELECT to_regclass('_migrations') IS NULL") == [(True,)]
    checks = await database_checks(Settings(db_path=pg_url.url.get_secret_value()))
    by = {c.name: c for c in checks}
    assert by["schema"].outcome == Outcome.FAIL
    assert by["clock skew"].outcome == Outcome.OK  # the same machine's clock
    assert shared_server().password not in " ".join(c.detail + c.fix for c in checks)
    await migrate_pg(pg_url)
    after = await database_checks(Settings(db_path=pg_url.url.get_secret_value()))
    assert {c.name: c.outcome for c in after} == {
        "reachable": Outcome.OK,
        "schema": Outcome.OK,
        "clock skew": Outcome.OK,
    }


async def test_a_machine_clock_behind_the_servers_is_measured_as_such(
    pg_url: PostgresUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skew is measured against the real server's clock: this machine's clock set
    10 s behind it (the one thing a test can move) reads as 10 s behind, and fails."""
    real = time.time
    monkeypatch.setattr("bot.audit.inspect.time.time", lambda: real() - 10.0)
    state = await inspect(pg_url, timeout_s=5)
    assert state.skew_s is not None and 9.0 < state.skew_s < 11.0
    (skew,) = [c for c in judge_database(state, KNOWN, margin_s=5.0) if c.name == "clock skew"]
    assert skew.outcome == Outcome.FAIL and "s behind the database's" in skew.detail


async def test_a_server_that_does_not_answer_fails_naming_it_without_the_password() -> None:
    server = shared_server()
    url = server.url().replace(f":{server.port}/", ":1/")  # nothing listens on port 1
    [check] = await database_checks(Settings(db_path=url))
    assert (check.name, check.outcome) == ("reachable", Outcome.FAIL)
    assert ":1/" in check.detail and server.password not in check.detail


async def test_sqlite_is_read_without_being_created_or_changed(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    assert await database_checks(Settings(db_path=db)) and not db.exists()
    async with AuditLog.open(db):
        pass
    state = await inspect(db, timeout_s=5)
    assert state.applied == tuple(KNOWN)
    assert {c.name: c.outcome for c in await database_checks(Settings(db_path=db))} == {
        "reachable": Outcome.OK,
        "schema": Outcome.OK,
    }


def test_a_postgres_url_in_the_settings_is_never_printed() -> None:
    url = "postgresql://chatops:hunter2-secret@db:5432/chatops"
    settings = Settings(db_path=url)
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.db_path)
    assert isinstance(settings.db_path, PostgresUrl)
    assert settings.db_path.url == SecretStr(url)
