"""``AuditLog``: the audit log's front door, what the engine, Slack and the CLI call.

Each public call validates its arguments against the enums of ``bot.core.status``,
redacts every free-text value, and runs as one transaction (``bot.audit.db``) made of
the table modules' statements (``bot.audit.runs``, ``steps``, ``decisions``...). What
is stored, and the guarantees, are described in the ``bot.audit`` package docstring.

The calls are grouped by job into parts, each its own module, so no one class holds
them all: ``run_store`` (runs, decisions, status transitions), ``evidence_store``
(steps, GPU snapshots, environments, refusals) and ``coordination_store`` (locks,
recovering runs whose driver died, expiry, telling threads). ``AuditLog`` joins them
and keeps opening, closing, redaction and the fallback journal's records; callers see
one object.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from bot.audit import export as export_sql
from bot.audit import fence as fence_sql
from bot.audit import host_outcomes as host_outcomes_sql
from bot.audit import release_switches as switches_sql
from bot.audit import replay as replay_sql
from bot.audit import rotations as rotations_sql
from bot.audit.backend import Backend, Dialect
from bot.audit.coordination_store import CoordinationStore
from bot.audit.db import INTEGRITY, Conn, Database, Opening, fetch
from bot.audit.evidence_store import EvidenceStore
from bot.audit.fence import Fence
from bot.audit.journal import JournalRecord
from bot.audit.migrations import MIGRATIONS, Migration
from bot.audit.records import RunRecord, StepRecord, format_ts, now_ts, parse_ts
from bot.audit.redaction import Redaction, Redactor, identity
from bot.audit.run_store import RunStore
from bot.audit.store_base import shielded
from bot.core.status import FINAL_STATUSES
from bot.errors import AuditError
from bot.settings import PostgresUrl

# AuditLog, and the names other modules imported from here before the split.
__all__ = [
    "FINAL_STATUSES",
    "AuditLog",
    "Redactor",
    "RunRecord",
    "StepRecord",
    "format_ts",
    "parse_ts",
]

log = logging.getLogger(__name__)


class AuditLog(RunStore, EvidenceStore, CoordinationStore):
    """The audit store. Create with ``await AuditLog.open(path)``."""

    def __init__(self, db: Backend, redact: Redactor) -> None:
        self._db = db
        self._r = Redaction(redact)
        self.unknown_migrations = db.unknown_migrations

    @classmethod
    def open(
        cls,
        target: Path | PostgresUrl,
        *,
        redact: Redactor = identity,
        migrations: Sequence[Migration] | None = None,
        busy_timeout_s: float = 10.0,
        migrate: bool = False,
        applied: list[str] | None = None,
    ) -> Opening[AuditLog]:
        """Open the audit database ``target`` (a SQLite file, created and migrated if
        needed; or PostgreSQL, whose schema must be migrated already unless
        ``migrate``); await the result or use it with ``async with``.

        ``migrations`` exists so tests can play an older or newer bot; ``applied`` gets
        the names of the migrations this open applied. Raises ``AuditError`` naming the
        database and the problem (``AuditUnavailable`` when it cannot be reached now).
        """
        return Opening(
            lambda: cls._open(target, redact, migrations, busy_timeout_s, migrate, applied)
        )

    @classmethod
    async def _open(
        cls,
        target: Path | PostgresUrl,
        redact: Redactor,
        migrations: Sequence[Migration] | None,
        busy_timeout_s: float,
        migrate: bool,
        applied: list[str] | None,
    ) -> AuditLog:
        db: Backend
        if isinstance(target, PostgresUrl):
            # Imported here: a bot on SQLite never loads psycopg.
            from bot.audit.migrations_pg import MIGRATIONS_PG
            from bot.audit.pg_db import PostgresDatabase

            db = await PostgresDatabase.open(
                target.url.get_secret_value(),
                migrations=MIGRATIONS_PG if migrations is None else migrations,
                busy_timeout_s=busy_timeout_s,
                migrate=migrate,
                applied=applied,
            )
            return cls(db, redact)
        path = Path(target)
        sqlite = await Database.open(
            path,
            migrations=MIGRATIONS if migrations is None else migrations,
            busy_timeout_s=busy_timeout_s,
            applied=applied,
        )
        if sqlite.unknown_migrations:
            # Safe because migrations stay additive: every table we know is still there.
            log.warning(
                "audit database %s was written by a newer bot (unknown migrations: "
                "%s); opening it anyway",
                path,
                ", ".join(sqlite.unknown_migrations),
            )
        return cls(sqlite, redact)

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL database has none: ``where`` names either)."""
        if not isinstance(self._db, Database):
            raise TypeError(f"the audit database {self._db.where} is not a file")
        return self._db.path

    @property
    def where(self) -> str:
        """The database, for people: the file, or the URL without its password."""
        return self._db.where

    @property
    def dialect(self) -> Dialect:
        return self._db.dialect

    @shielded
    async def pragmas(self) -> dict[str, Any]:
        """The durability settings of this connection, for tests and a health check."""
        async with self._db.transaction(write=False) as conn:
            return {
                name: (await fetch(conn, f"PRAGMA {name}"))[0][0]
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> AuditLog:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def redaction(self) -> Redaction:
        """What every free-text value passes through before it is stored (the fallback
        journal stores its records the same way)."""
        return self._r

    def as_stored(self, value: Any) -> Any:
        """``value`` as it reads back after being stored (redacted, JSON types), so a
        fresh object can be compared with a stored one."""
        return self._r.as_stored(value)

    # -- records of the fallback journal -----------------------------------------

    @shielded
    async def write_records(
        self,
        records: Sequence[JournalRecord],
        *,
        merge: bool,
        fence: Fence | None = None,
        again: bool = False,
    ) -> replay_sql.Applied:
        """Write records made by ``bot.audit.resilient`` (already redacted) in one
        transaction: one on its direct path (``merge=False``), or the fallback journal
        being merged (``merge=True``: each record at most once; see ``bot.audit.replay``).
        ``fence``: first check that the run is still at the epoch its driver took
        (``bot.audit.fence``), in the same transaction. ``again``: a retry of a direct
        write whose try failed as the database being away; on PostgreSQL that try may
        have committed with its answer lost, so its marks are looked for first."""
        now = now_ts()
        # Only a server can commit and then lose the answer: SQLite's commit returns or
        # raises in this process, and it keeps the hot path's cost (issue 18) as it was.
        mark = not merge and self.dialect is Dialect.POSTGRES

        async def write(conn: Conn) -> replay_sql.Applied:
            if mark and again and (done := await replay_sql.already_applied(conn, [*records])):
                return done
            if fence is not None:
                await fence_sql.check(conn, fence)
            return await replay_sql.apply(conn, list(records), merge=merge, now=now, mark=mark)

        # Statements only, so the whole transaction is one call on the database's thread
        # (``Database.inline``): a run's ~35 records each paid six thread hops before.
        try:
            return await self._db.inline(write, write=True)
        except AuditError as exc:
            # The retry's look can run before the try whose answer was lost has committed
            # on the server: its marks then meet that try's (the key waits for it, then
            # refuses). That try wrote the batch; a refusal here would stop the run.
            if not (mark and again and isinstance(exc.__cause__, INTEGRITY)):
                raise
            done = await self._db.inline(
                lambda conn: replay_sql.already_applied(conn, [*records]), write=False
            )
            if done is None:
                raise
            return done

    @shielded
    async def host_outcomes(
        self, run_ids: Sequence[int]
    ) -> dict[int, list[host_outcomes_sql.HostOutcome]]:
        """How each host of these runs ended, with the service state it left (issue 18),
        in one query, as ``packages_changed`` and ``restorations`` read theirs; a run with
        no host outcome is missing."""
        async with self._db.transaction(write=False) as conn:
            rows = await host_outcomes_sql.of_runs(conn, run_ids)
        outcomes: dict[int, list[host_outcomes_sql.HostOutcome]] = {}
        for row in rows:
            outcomes.setdefault(row.run_id, []).append(row)
        return outcomes

    @shielded
    async def rotations(self, run_ids: Sequence[int]) -> dict[int, list[rotations_sql.RotationRow]]:
        """Each of these runs' rotation changes (issue 19), in the order made, in one query;
        a run that changed none is missing."""
        async with self._db.transaction(write=False) as conn:
            rows = await rotations_sql.of_runs(conn, run_ids)
        out: dict[int, list[rotations_sql.RotationRow]] = {}
        for row in rows:
            out.setdefault(row.run_id, []).append(row)
        return out

    @shielded
    async def release_switches(
        self, run_ids: Sequence[int]
    ) -> dict[int, list[switches_sql.SwitchRow]]:
        """Each of these runs' release switches, in the order made, in one query; a run
        that switched none is missing."""
        async with self._db.transaction(write=False) as conn:
            rows = await switches_sql.of_runs(conn, run_ids)
        out: dict[int, list[switches_sql.SwitchRow]] = {}
        for row in rows:
            out.setdefault(row.run_id, []).append(row)
        return out

    @shielded
    async def switch_history(self, service: str, host: str) -> list[switches_sql.SwitchRow]:
        """The newest switches of ``service``'s link on ``host`` by any run, oldest first
        (at most ``release_switches.HISTORY``): where a rollback by hand goes."""
        async with self._db.transaction(write=False) as conn:
            return await switches_sql.history(conn, service, host)

    @shielded
    async def export_page(
        self, after_id: int, flt: export_sql.ExportFilter, limit: int = export_sql.PAGE_RUNS
    ) -> export_sql.Page:
        """The next page of runs after ``after_id`` as ``audit --format jsonl`` writes
        them (``bot.audit.export``): one read transaction, bounded by ``limit`` runs."""
        async with self._db.transaction(write=False) as conn:
            return await export_sql.page(conn, after_id, flt, limit)

    @shielded
    async def export_finished(self, run_ids: Sequence[int]) -> list[dict[str, Any]]:
        """Those of ``run_ids`` (unfinished when a page passed them) finished by now."""
        async with self._db.transaction(write=False) as conn:
            return await export_sql.finished(conn, run_ids)

    @shielded
    async def latest_rotations(
        self, router: str, servers: Sequence[str]
    ) -> dict[str, rotations_sql.RotationRow]:
        """Each server's last recorded rotation change at ``router``, by any run."""
        async with self._db.transaction(write=False) as conn:
            return await rotations_sql.latest(conn, router, servers)

    @shielded
    async def journal_rejects(self) -> list[tuple[str, str]]:
        """The journal records a merge could not apply: (record id, record and reason)."""
        async with self._db.transaction(write=False) as conn:
            return await replay_sql.rejected(conn)
