"""Named, ordered schema migrations for the audit database (sqlite-utils style).

A database records the names of the migrations it has applied in
``_migrations(name TEXT PRIMARY KEY, applied_at TEXT)``.  On open, every
migration in ``MIGRATIONS`` whose name is missing is applied, in list order,
each in its own ``BEGIN IMMEDIATE`` transaction together with its
``_migrations`` row, so a crash or a failing statement leaves either all of a
migration or none of it, and two processes opening the same file at once
cannot both apply one.

Rules for whoever adds a migration:

* append to ``MIGRATIONS``; never rename, reorder or edit one that has shipped;
* keep them additive (new tables, new indexes, nullable columns or columns
  with a default), because an older bot may open a newer database: names it
  does not know are reported as ``unknown`` and the caller only warns, so the
  older bot must still be able to read and write every table it knows;
* a migration is SQL text (one or more statements; split with
  ``sqlite3.complete_statement`` so triggers work) or an async function
  receiving the connection, run inside the transaction; it must not COMMIT.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiosqlite

MigrationFunc = Callable[[aiosqlite.Connection], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    apply: str | MigrationFunc


@dataclass(frozen=True, slots=True)
class MigrationResult:
    applied: list[str] = field(default_factory=list)
    # Names found in the database that this code does not know: a newer bot wrote it.
    unknown: list[str] = field(default_factory=list)


class MigrationError(Exception):
    """A migration failed; it was rolled back and not recorded."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"migration {name!r} failed: {cause}")
        self.name = name


_INITIAL = """
CREATE TABLE runs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    service        TEXT NOT NULL,
    action         TEXT NOT NULL,
    hosts          TEXT NOT NULL,
    requested_by   TEXT NOT NULL,
    source         TEXT NOT NULL,
    channel        TEXT,
    message_ts     TEXT,
    plan           TEXT NOT NULL,
    package_spec   TEXT,
    index_name     TEXT,
    dry_run        INTEGER NOT NULL DEFAULT 0,
    status         TEXT NOT NULL,
    current_step   TEXT,
    summary        TEXT,
    version_before TEXT,
    version_after  TEXT,
    created_at     TEXT NOT NULL,
    started_at     TEXT,
    finished_at    TEXT,
    expires_at     TEXT
);
CREATE INDEX runs_service_id ON runs(service, id DESC);
CREATE INDEX runs_status_id ON runs(status, id DESC);

CREATE TABLE decisions (
    id       INTEGER PRIMARY KEY,
    run_id   INTEGER NOT NULL REFERENCES runs(id),
    user     TEXT NOT NULL,
    decision TEXT NOT NULL,
    at       TEXT NOT NULL,
    UNIQUE (run_id, user, decision)
);

CREATE TABLE steps (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    host        TEXT NOT NULL,
    step        TEXT NOT NULL,
    command     TEXT NOT NULL,
    status      TEXT NOT NULL,
    exit_status INTEGER,
    started_at  TEXT NOT NULL,
    finished_at TEXT,
    duration_s  REAL,
    output_tail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX steps_run ON steps(run_id);

CREATE TABLE gpu_snapshots (
    id       INTEGER PRIMARY KEY,
    run_id   INTEGER REFERENCES runs(id),
    host     TEXT NOT NULL,
    label    TEXT NOT NULL,
    taken_at TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX gpu_snapshots_run ON gpu_snapshots(run_id);

CREATE TABLE refusals (
    id      INTEGER PRIMARY KEY,
    at      TEXT NOT NULL,
    user    TEXT NOT NULL,
    channel TEXT,
    command TEXT NOT NULL,
    reason  TEXT NOT NULL
);

CREATE TABLE locks (
    scope       TEXT PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    acquired_at TEXT NOT NULL
);
CREATE INDEX locks_run ON locks(run_id);
"""

# Which process drives a run ("host:pid:start-time"), so start-up recovery only
# interrupts runs whose process is really gone (the CLI and the bot share the DB).
_RUN_OWNER = "ALTER TABLE runs ADD COLUMN owner TEXT;"

# Until when the driving process vouches for its run (it renews this every few seconds;
# see bot.engine.heartbeat): the only evidence of life for an owner on another machine.
_RUN_LEASE = "ALTER TABLE runs ADD COLUMN lease_until TEXT;"

# Which fallback-journal records a merge has written (bot.audit.replay), so a journal
# replayed twice is applied once; a record the database refused is kept here whole.
_JOURNAL_APPLIED = """
CREATE TABLE journal_applied (
    id         TEXT PRIMARY KEY,
    row_id     INTEGER,
    applied_at TEXT NOT NULL,
    rejected   TEXT
);
"""

# When a recovered run's Slack thread was told: a run recovered by a CLI (which cannot
# post) is told by the next bot that sweeps, and only once however many bots there are.
_RECOVERY_TOLD = "ALTER TABLE runs ADD COLUMN recovery_told_at TEXT;"

# Issue 10: what each run did to the whole environment, per host: the dry run's change
# shown on the card ('preview') and at preflight ('planned'), the freeze before anything
# changed ('snapshot', with where the host keeps it), what the install really changed
# ('installed') and, after a rollback, how the freeze compares with the snapshot
# ('restored'). ``data`` is JSON (see bot.audit.environments).
_ENVIRONMENTS = """
CREATE TABLE environments (
    id       INTEGER PRIMARY KEY,
    run_id   INTEGER NOT NULL REFERENCES runs(id),
    host     TEXT NOT NULL,
    kind     TEXT NOT NULL,
    taken_at TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX environments_run ON environments(run_id);
"""

# Issue 17 (F4): a lease written with one wall clock and read with another is wrong by the
# skew between them. The heartbeat also counts its renewals, and a judge declares an
# owner dead only once it has itself seen nothing change for the lease on its own
# monotonic clock; what it saw, and when by that clock, is kept per clock (processes on
# one machine share CLOCK_MONOTONIC, so a CLI's sighting serves the next CLI or the bot
# there). A pending card's sighting is kept the same way (see bot.engine.liveness).
_LEASE_RENEWALS = """
ALTER TABLE runs ADD COLUMN lease_renewals INTEGER NOT NULL DEFAULT 0;
CREATE TABLE lease_sightings (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    clock  TEXT NOT NULL,
    token  TEXT NOT NULL,
    seen   REAL NOT NULL,
    PRIMARY KEY (run_id, clock)
);
"""

# Issue 17 (F4): whose wall clock wrote ``expires_at`` (the requesting machine's boot
# id): only a process reading that clock judges the deadline by it.
_EXPIRES_CLOCK = "ALTER TABLE runs ADD COLUMN expires_clock TEXT;"

# Issue 17 F5: each approver's go to terminate the processes that outlived a stop, per
# host and question, with the exact PIDs it listed (bot.audit.leftover_approvals). A table
# of its own: ``decisions`` holds one row per person, run and decision.
_LEFTOVER_APPROVALS = """
CREATE TABLE leftover_approvals (
    id       INTEGER PRIMARY KEY,
    run_id   INTEGER NOT NULL REFERENCES runs(id),
    host     TEXT NOT NULL,
    question TEXT NOT NULL,
    user     TEXT NOT NULL,
    pids     TEXT NOT NULL,
    at       TEXT NOT NULL,
    UNIQUE (run_id, host, question, user)
);
CREATE INDEX leftover_approvals_run ON leftover_approvals(run_id);
"""

# Issue 18: how a run, and each of its hosts, left the service (``ServiceState``);
# NULL for runs written before it, and for a run whose driver did not say.
_SERVICE_STATE = """
ALTER TABLE runs ADD COLUMN service_state TEXT;
CREATE TABLE host_outcomes (
    id            INTEGER PRIMARY KEY,
    run_id        INTEGER NOT NULL REFERENCES runs(id),
    host          TEXT NOT NULL,
    status        TEXT NOT NULL,
    summary       TEXT NOT NULL,
    service_state TEXT,
    at            TEXT NOT NULL
);
CREATE INDEX host_outcomes_run ON host_outcomes(run_id);
"""

# Issue 19: each change of a replica's place in its router's rotation.
_ROTATIONS = """
CREATE TABLE rotations (
    id      INTEGER PRIMARY KEY,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    host    TEXT NOT NULL,
    router  TEXT NOT NULL,
    server  TEXT NOT NULL,
    change  TEXT NOT NULL CHECK (change IN ('out', 'in')),
    ok      INTEGER NOT NULL,
    detail  TEXT NOT NULL,
    at      TEXT NOT NULL
);
CREATE INDEX rotations_run ON rotations(run_id);
CREATE INDEX rotations_server ON rotations(router, server);
"""

# Issue 22: a run approved for a later start (its UTC start time), and one requested
# outside its maintenance window as an emergency override (more approvals).
_SCHEDULE = """
ALTER TABLE runs ADD COLUMN scheduled_at TEXT;
ALTER TABLE runs ADD COLUMN override INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_scheduled ON runs(status, scheduled_at);
"""

# Issue 21: several replicas of the bot on one database.
# * ``runs.epoch``: the fencing token of a run's ownership. Every change of owner (an
#   approval, the start, a scheduled run's claim) and every recovery adds one; the owner
#   remembers the value it took, and each of its writes checks it, so a replica that
#   lost the run (paused past its lease, recovered by another) can no longer write as
#   its owner (``bot.audit.fence``).
# * ``runs.lease_expires``: the end of the owner's lease by the *database's* clock
#   (seconds since the epoch), renewed by its heartbeat: replicas on other machines
#   judge it by the one clock they share, not by their own.
# * ``runs.cancel_requested_by``: a cancel asked on a replica that does not drive the
#   run, for its driver to pick up at its next heartbeat.
# * ``runs.expires_db``: the end of a request's approval window by the database's clock,
#   so any replica closes the card of one that died on time.
# * ``leases``: named leases of one holder at a time (``leader``: the replica that runs
#   the sweeps and the scheduled starts), each with its epoch and its end by the
#   database's clock.
# * ``leftover_questions``: a run's open question to terminate leftover processes, so a
#   press on any replica can answer the question the driving replica asked.
_HA = """
ALTER TABLE runs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lease_expires REAL;
ALTER TABLE runs ADD COLUMN cancel_requested_by TEXT;
ALTER TABLE runs ADD COLUMN expires_db REAL;
CREATE TABLE leases (
    name    TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    epoch   INTEGER NOT NULL,
    expires REAL NOT NULL
);
CREATE TABLE leftover_questions (
    question    TEXT PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    host        TEXT NOT NULL,
    ask         TEXT NOT NULL,
    pids        TEXT NOT NULL,
    asked_at    TEXT NOT NULL,
    closed_at   TEXT,
    approved_by TEXT
);
CREATE INDEX leftover_questions_run ON leftover_questions(run_id);
"""

# Every switch of a side-by-side service's link the bot made on a host, from which release
# to which (``kind``: a run's switch, or the switch back after a failed start): what a
# rollback by hand goes by (bot.audit.release_switches). ``from_release`` is NULL when
# the link pointed at no release.
_RELEASE_SWITCHES = """
CREATE TABLE release_switches (
    id           INTEGER PRIMARY KEY,
    run_id       INTEGER NOT NULL REFERENCES runs(id),
    service      TEXT NOT NULL,
    host         TEXT NOT NULL,
    from_release TEXT,
    to_release   TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('switch', 'switch_back')),
    at           TEXT NOT NULL
);
CREATE INDEX release_switches_run ON release_switches(run_id);
CREATE INDEX release_switches_host ON release_switches(service, host, id);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration("0001_initial", _INITIAL),
    Migration("0002_run_owner", _RUN_OWNER),
    Migration("0003_run_lease", _RUN_LEASE),
    Migration("0004_journal_applied", _JOURNAL_APPLIED),
    Migration("0005_recovery_told", _RECOVERY_TOLD),
    Migration("0006_environments", _ENVIRONMENTS),
    Migration("0007_lease_renewals", _LEASE_RENEWALS),
    Migration("0008_expires_clock", _EXPIRES_CLOCK),
    Migration("0009_leftover_approvals", _LEFTOVER_APPROVALS),
    Migration("0010_service_state", _SERVICE_STATE),
    Migration("0011_rotations", _ROTATIONS),
    Migration("0012_schedule", _SCHEDULE),
    Migration("0013_replicas", _HA),
    Migration("0014_release_switches", _RELEASE_SWITCHES),
)


def split_statements(script: str) -> list[str]:
    """Split SQL text into statements; a ';' inside a trigger, string or comment does not split."""
    statements: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip().rstrip(";").strip():
                statements.append(pending.strip())
            pending = ""
    if pending.rstrip(";").strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]!r}")
    return statements


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _applied(conn: aiosqlite.Connection) -> list[str]:
    rows = await conn.execute_fetchall("SELECT name FROM _migrations ORDER BY rowid")
    return [str(row[0]) for row in rows]


async def apply_migrations(
    conn: aiosqlite.Connection, migrations: Sequence[Migration] = MIGRATIONS
) -> MigrationResult:
    """Apply the missing migrations in order. ``conn`` must be in autocommit mode.

    Raises ``MigrationError`` for a migration that fails (it is rolled back);
    ``sqlite3.Error`` from bookkeeping (not a database, read-only...) propagates.
    """
    names = [m.name for m in migrations]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate migration names in {names}")
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)"
    )
    result = MigrationResult()
    done = set(await _applied(conn))
    for migration in migrations:
        if migration.name in done:
            continue
        await conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-check under the write lock: another process may have just applied it.
            async with conn.execute(
                "SELECT 1 FROM _migrations WHERE name = ?", (migration.name,)
            ) as cur:
                already = await cur.fetchone() is not None
            if not already:
                await _run(conn, migration)
                await conn.execute(
                    "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)",
                    (migration.name, _now()),
                )
            await conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
            raise
        if not already:
            result.applied.append(migration.name)
    known = set(names)
    result.unknown.extend(name for name in await _applied(conn) if name not in known)
    return result


async def _run(conn: aiosqlite.Connection, migration: Migration) -> None:
    try:
        if isinstance(migration.apply, str):
            for statement in split_statements(migration.apply):
                await conn.execute(statement)
        else:
            await migration.apply(conn)
    except (sqlite3.Error, ValueError) as exc:
        raise MigrationError(migration.name, exc) from exc
