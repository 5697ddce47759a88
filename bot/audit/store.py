"""``AuditLog``: the audit log's front door, what the engine, Slack and the CLI call.

Each public call validates its arguments against the enums of ``bot.core.status``,
redacts every free-text value, and runs as one transaction (``bot.audit.db``) made of
the table modules' statements (``bot.audit.runs``, ``steps``, ``decisions``...). What
is stored, and the guarantees, are described in the ``bot.audit`` package docstring.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from bot.audit import decisions as decisions_sql
from bot.audit import environments as environments_sql
from bot.audit import locks as locks_sql
from bot.audit import refusals as refusals_sql
from bot.audit import replay as replay_sql
from bot.audit import runs as runs_sql
from bot.audit import snapshots as snapshots_sql
from bot.audit import steps as steps_sql
from bot.audit.db import Database, Opening, fetch
from bot.audit.journal import JournalRecord
from bot.audit.migrations import MIGRATIONS, Migration
from bot.audit.records import (
    OUTPUT_TAIL_CHARS,
    DecisionRecord,
    EnvironmentRecord,
    Refusal,
    RunRecord,
    SnapshotRecord,
    StepRecord,
    checked,
    format_ts,
    now_ts,
    parse_ts,
)
from bot.audit.redaction import Redaction, Redactor, identity
from bot.core.startup import StartHistory
from bot.core.status import (
    FINAL_STATUSES,
    STORED_STEP_STATUSES,
    Action,
    Decision,
    RunStatus,
    Source,
    StepStatus,
)
from bot.errors import LockHeldError

# AuditLog, and the names other modules imported from here before the split.
__all__ = ["FINAL_STATUSES", "AuditLog", "Redactor", "RunRecord", "StepRecord", "format_ts",
           "parse_ts"]

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

# What a step may end as: it is stored 'running' when it starts, never 'pending'.
_STEP_ENDS = STORED_STEP_STATUSES - {StepStatus.RUNNING}


def _shielded(
    method: Callable[Concatenate[AuditLog, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[AuditLog, P], Coroutine[Any, Any, T]]:
    """Every public call that opens a transaction runs in ``Database.shielded``: a caller
    cancelled mid-write leaves the write to finish by itself."""

    @functools.wraps(method)
    async def call(self: AuditLog, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._db.shielded(method(self, *args, **kwargs))

    return call


class AuditLog:
    """The audit store. Create with ``await AuditLog.open(path)``."""

    def __init__(self, db: Database, redact: Redactor) -> None:
        self._db = db
        self._r = Redaction(redact)
        self.unknown_migrations = db.unknown_migrations

    @classmethod
    def open(
        cls, path: Path, *, redact: Redactor = identity,
        migrations: Sequence[Migration] = MIGRATIONS, busy_timeout_s: float = 10.0,
    ) -> Opening[AuditLog]:
        """Open (creating if needed) and migrate the database at ``path``; await the
        result or use it with ``async with``.

        ``migrations`` exists so tests can play an older or newer bot.
        Raises ``AuditError`` naming the path and the problem.
        """
        return Opening(lambda: cls._open(Path(path), redact, migrations, busy_timeout_s))

    @classmethod
    async def _open(cls, path: Path, redact: Redactor, migrations: Sequence[Migration],
                    busy_timeout_s: float) -> AuditLog:
        db = await Database.open(path, migrations=migrations, busy_timeout_s=busy_timeout_s)
        if db.unknown_migrations:
            # Safe because migrations stay additive: every table we know is still there.
            log.warning("audit database %s was written by a newer bot (unknown migrations: "
                        "%s); opening it anyway", path, ", ".join(db.unknown_migrations))
        return cls(db, redact)

    @property
    def path(self) -> Path:
        return self._db.path

    @_shielded
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

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
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

    # -- runs --------------------------------------------------------------------

    @_shielded
    async def create_run(
        self, *, service: str, action: Action, hosts: Sequence[str], requested_by: str,
        source: Source, plan: Mapping[str, Any], package_spec: str | None,
        index_name: str | None = None, dry_run: bool = False,
        status: RunStatus = RunStatus.PENDING_APPROVAL, channel: str | None = None,
        expires_at: datetime | None = None,
    ) -> int:
        new = runs_sql.NewRun(
            service=self._r(service),
            action=checked(Action, action, "action"),
            hosts_json=self._r.json(list(hosts)),
            requested_by=self._r(requested_by),
            source=checked(Source, source, "source"),
            channel=self._r.opt(channel),
            plan_json=self._r.json(plan),
            package_spec=self._r.opt(package_spec),
            index_name=self._r.opt(index_name),
            dry_run=dry_run,
            status=checked(RunStatus, status, "status"),
            expires_at=None if expires_at is None else format_ts(expires_at),
        )
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            return await runs_sql.create(conn, new, now)

    @_shielded
    async def _update_run(self, run_id: int, sets: Mapping[str, Any]) -> None:
        async with self._db.transaction(write=True) as conn:
            await runs_sql.update(conn, run_id, sets)

    async def set_message(self, run_id: int, channel: str, ts: str) -> None:
        await self._update_run(run_id, {"channel": self._r(channel), "message_ts": self._r(ts)})

    async def set_step(self, run_id: int, step: str | None) -> None:
        await self._update_run(run_id, {"current_step": self._r.opt(step)})

    async def set_versions(
        self, run_id: int, *, before: str | None = None, after: str | None = None
    ) -> None:
        """Record installed versions; only the ones given are overwritten."""
        sets: dict[str, Any] = {}
        if before is not None:
            sets["version_before"] = self._r(before)
        if after is not None:
            sets["version_after"] = self._r(after)
        if sets:
            await self._update_run(run_id, sets)

    @_shielded
    async def transition(
        self, run_id: int, to: RunStatus, *, expect: Collection[RunStatus] | None = None,
        summary: str | None = None, owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """Compare-and-set the status: False (nothing changed) if it is not in ``expect``.

        ``owner`` records the process that drives the run from here on, and
        ``lease_until`` until when it vouches for it (see ``renew_lease``).

        Entering ``running`` stamps started_at (first time only); entering a final
        status stamps finished_at and releases the run's locks, in the same transaction.
        """
        to = checked(RunStatus, to, "status")
        if isinstance(expect, str):
            raise TypeError("expect must be a collection of statuses, not one string")
        expected = None if expect is None else [checked(RunStatus, s, "status") for s in expect]
        summary = self._r.opt(summary)
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            return await runs_sql.transition(
                conn, run_id, to, expect=expected, summary=summary, owner=owner, now=now,
                lease_until=None if lease_until is None else format_ts(lease_until))

    @_shielded
    async def renew_lease(self, run_id: int, owner: str, until: datetime) -> bool:
        """The heartbeat of the process driving a run: its lease now ends at ``until``.
        False when the run is no longer 'running' under ``owner`` (it ended, or was
        recovered): there is nothing left to vouch for."""
        stamp = format_ts(until)
        async with self._db.transaction(write=True) as conn:
            return await runs_sql.renew_lease(conn, run_id, owner, stamp)

    @_shielded
    async def get_run(self, run_id: int) -> RunRecord:
        async with self._db.transaction(write=False) as conn:
            return await runs_sql.get(conn, run_id)

    @_shielded
    async def list_runs(
        self, *, service: str | None = None, limit: int = 20,
        statuses: Collection[RunStatus] | None = None,
    ) -> list[RunRecord]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if isinstance(statuses, str):
            raise TypeError("statuses must be a collection of statuses, not one string")
        async with self._db.transaction(write=False) as conn:
            return await runs_sql.listed(
                conn, service=self._r.opt(service),
                statuses=None if statuses is None else list(statuses), limit=limit)

    # -- decisions ---------------------------------------------------------------

    @_shielded
    async def record_decision(self, run_id: int, user: str, decision: Decision) -> bool:
        """False when this user already made this decision on this run (a double click)."""
        decision = checked(Decision, decision, "decision")
        user, now = self._r(user), now_ts()
        async with self._db.transaction(write=True) as conn:
            return await decisions_sql.record(conn, run_id, user, decision, now)

    @_shielded
    async def decisions(self, run_id: int) -> list[DecisionRecord]:
        async with self._db.transaction(write=False) as conn:
            return await decisions_sql.of_run(conn, run_id)

    # -- steps and snapshots -----------------------------------------------------

    @_shielded
    async def step_started(self, run_id: int, host: str, step: str, command: str) -> int:
        """Record a step as running and make it the run's current step, in one
        transaction: one fsync before each remote action instead of two."""
        host, step, command, now = self._r(host), self._r(step), self._r(command), now_ts()
        async with self._db.transaction(write=True) as conn:
            step_id = await steps_sql.start(conn, run_id, host, step, command, now)
            await runs_sql.update(conn, run_id, {"current_step": step})
            return step_id

    @_shielded
    async def step_finished(
        self, step_id: int, *, status: StepStatus, exit_status: int | None = None,
        duration_s: float | None = None, output_tail: str = "",
    ) -> None:
        status = checked(StepStatus, status, "step status")
        if status not in _STEP_ENDS:
            raise ValueError(f"a step cannot end with step status {status.value!r}; "
                             f"expected one of {sorted(s.value for s in _STEP_ENDS)}")
        # Redact before cutting: cutting first could leave half a secret unrecognised.
        tail = self._r(output_tail)[-OUTPUT_TAIL_CHARS:]
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            await steps_sql.finish(conn, step_id, status=status, exit_status=exit_status,
                                   duration_s=duration_s, output_tail=tail, now=now)

    @_shielded
    async def steps(self, run_id: int) -> list[StepRecord]:
        async with self._db.transaction(write=False) as conn:
            return await steps_sql.of_run(conn, run_id)

    @_shielded
    async def start_history(self, service: str, limit: int = 20) -> StartHistory:
        """This service's last successful starts (``bot.core.startup.StartHistory``): what
        a start's progress compares with, and what ``status`` shows."""
        async with self._db.transaction(write=False) as conn:
            durations = await steps_sql.start_durations(conn, self._r(service), limit)
        return StartHistory(tuple(durations))

    @_shielded
    async def add_snapshot(
        self, run_id: int | None, host: str, label: str, data: Mapping[str, Any]
    ) -> int:
        host, label, data_json, now = self._r(host), self._r(label), self._r.json(data), now_ts()
        async with self._db.transaction(write=True) as conn:
            return await snapshots_sql.add(conn, run_id, host, label, data_json, now)

    @_shielded
    async def snapshots(self, run_id: int) -> list[SnapshotRecord]:
        async with self._db.transaction(write=False) as conn:
            return await snapshots_sql.of_run(conn, run_id)

    # -- environments (issue 10) -------------------------------------------------

    @_shielded
    async def add_environment(self, run_id: int, host: str, kind: str,
                              data: Mapping[str, Any]) -> int:
        """A package set of one host's run (``bot.core.packages.EnvKind``), as JSON."""
        host, kind, data_json, now = self._r(host), self._r(kind), self._r.json(data), now_ts()
        async with self._db.transaction(write=True) as conn:
            return await environments_sql.add(conn, run_id, host, kind, data_json, now)

    @_shielded
    async def environments(self, run_id: int) -> list[EnvironmentRecord]:
        async with self._db.transaction(write=False) as conn:
            return await environments_sql.of_run(conn, run_id)

    @_shielded
    async def packages_changed(self, run_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """What the install of each run really changed, from its first host's 'installed'
        record: ``[{name, before, after}]``; runs that installed nothing are missing."""
        async with self._db.transaction(write=False) as conn:
            records = await environments_sql.of_kind(conn, list(run_ids), "installed")
        out: dict[int, list[dict[str, Any]]] = {}
        for rec in records:
            out.setdefault(rec.run_id, list(rec.data.get("changes") or []))
        return out

    # -- records of the fallback journal -----------------------------------------

    @_shielded
    async def write_records(self, records: Sequence[JournalRecord], *,
                            merge: bool) -> replay_sql.Applied:
        """Write records made by ``bot.audit.resilient`` (already redacted) in one
        transaction: one on its direct path (``merge=False``), or the fallback journal
        being merged (``merge=True``: each record at most once; see ``bot.audit.replay``)."""
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            return await replay_sql.apply(conn, list(records), merge=merge, now=now)

    @_shielded
    async def journal_rejects(self) -> list[tuple[str, str]]:
        """The journal records a merge could not apply: (record id, record and reason)."""
        async with self._db.transaction(write=False) as conn:
            return await replay_sql.rejected(conn)

    # -- refusals ----------------------------------------------------------------

    @_shielded
    async def record_refusal(
        self, *, user: str, channel: str | None, command: str, reason: str
    ) -> int:
        at, user, command, reason = now_ts(), self._r(user), self._r(command), self._r(reason)
        where = self._r.opt(channel)
        async with self._db.transaction(write=True) as conn:
            return await refusals_sql.add(conn, at=at, user=user, channel=where, command=command,
                                          reason=reason)

    @_shielded
    async def refusals(self, limit: int = 50) -> list[Refusal]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        async with self._db.transaction(write=False) as conn:
            return await refusals_sql.newest(conn, limit)

    # -- locks -------------------------------------------------------------------

    @_shielded
    async def acquire_locks(self, run_id: int, scopes: Sequence[str]) -> None:
        """Take every scope for ``run_id`` or none of them.

        Scopes this run already holds are fine (idempotent). Raises ``LockHeldError``
        naming the holder when another run holds any of them. Scopes are stored as
        given, not redacted: they are keys.
        """
        if isinstance(scopes, str):
            raise TypeError("scopes must be a sequence of scopes, not one string")
        wanted, now = list(dict.fromkeys(scopes)), now_ts()
        async with self._db.transaction(write=True) as conn:
            conflict = await locks_sql.acquire(conn, run_id, wanted, now)
            if conflict is not None:
                scope, holder_id = conflict
                holder = await runs_sql.get(conn, holder_id)
                raise LockHeldError(
                    f"{scope} is locked by run #{holder.id} ({holder.action} "
                    f"{holder.service}, requested by {holder.requested_by}, {holder.status})",
                    run_id=holder.id,
                    requested_by=holder.requested_by,
                )

    @_shielded
    async def release_locks(self, run_id: int) -> None:
        async with self._db.transaction(write=True) as conn:
            await locks_sql.release(conn, run_id)

    @_shielded
    async def locks_held(self) -> dict[int, list[str]]:
        """Every held lock scope, by the id of the run holding it."""
        async with self._db.transaction(write=False) as conn:
            return await locks_sql.held(conn)

    @_shielded
    async def lock_holder(self, scope: str) -> RunRecord | None:
        async with self._db.transaction(write=False) as conn:
            holder_id = await locks_sql.holder(conn, scope)
            return None if holder_id is None else await runs_sql.get(conn, holder_id)

    # -- start-up housekeeping -----------------------------------------------------

    async def recover_interrupted(
        self, alive: Callable[[str | None], bool] | None = None
    ) -> list[RunRecord]:
        """After a restart: runs the old process was driving become 'interrupted'.

        ``alive(owner)`` says whether the owning process still runs (another bot or
        CLI on the same DB); such runs are left alone. (``bot.engine.recovery`` judges
        by the lease too, through ``recover_dead``.)

        That is every 'running' run, and every 'approved' one too: nothing in a fresh
        process will ever start it, and it may hold locks. Their 'running' steps become
        'interrupted' and their locks are released. Returns the runs, for Slack.
        """
        return await self.recover_dead(
            (lambda run: True) if alive is None else (lambda run: not alive(run.owner)),
            summary=lambda run: runs_sql.interrupted_summary(run.status, run.current_step))

    @_shielded
    async def recover_dead(
        self, dead: Callable[[RunRecord], bool], *, summary: Callable[[RunRecord], str],
        run_ids: Collection[int] | None = None, by: str | None = None,
    ) -> list[RunRecord]:
        """Runs left 'running' or 'approved' by a driver ``dead(run)`` says is gone become
        'interrupted' (their running steps too) with ``summary(run)``, and release their
        locks; ``by`` (who recovered them) is recorded as a 'recover' decision.

        One write transaction: the verdict is passed on the run as it is at that moment,
        so a run that finished, or was recovered by another process, meanwhile is left
        alone. ``run_ids`` limits it to those runs. Returns the recovered runs, oldest
        first.
        """
        if isinstance(run_ids, int):
            raise TypeError("run_ids must be a collection of ids")
        now = now_ts()
        by = None if by is None else self._r(by)
        recovered: list[RunRecord] = []
        async with self._db.transaction(write=True) as conn:
            rows = await runs_sql.with_status(conn, (RunStatus.RUNNING, RunStatus.APPROVED))
            for row in rows:
                if run_ids is not None and row["id"] not in run_ids:
                    continue
                run = await runs_sql.get(conn, row["id"])
                if not dead(run):
                    continue
                await runs_sql.interrupt(conn, run.id, self._r(summary(run)), now)
                if by is not None:
                    await decisions_sql.record(conn, run.id, by, Decision.RECOVER, now)
                recovered.append(await runs_sql.get(conn, run.id))
        return recovered

    @_shielded
    async def untold_recoveries(self) -> list[RunRecord]:
        """Runs recovered from a dead driver whose Slack thread has not been told (a CLI
        recovered them, or the bot died before it could post), oldest first."""
        async with self._db.transaction(write=False) as conn:
            return [await runs_sql.get(conn, run_id)
                    for run_id in await runs_sql.untold_recoveries(conn)]

    @_shielded
    async def claim_telling(self, run_id: int) -> bool:
        """Whether this caller tells the recovered run's thread: True once per run, so
        two bots sweeping the same database do not both post."""
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            return await runs_sql.mark_told(conn, run_id, now)

    @_shielded
    async def interrupt(self, run_id: int, summary: str) -> bool:
        """A run whose driver stopped (cancelled at shutdown, or broken) becomes
        'interrupted', with its running steps, and releases its locks: it must never
        look as if something still drives it. False if it was not 'running'."""
        summary, now = self._r(summary), now_ts()
        async with self._db.transaction(write=True) as conn:
            if not await runs_sql.has_status(conn, run_id, RunStatus.RUNNING):
                return False
            await runs_sql.interrupt(conn, run_id, summary, now)
            return True

    @_shielded
    async def expire_pending(self, now: datetime) -> list[RunRecord]:
        """Runs still awaiting approval at their ``expires_at`` become 'expired'."""
        stamp = format_ts(now)
        async with self._db.transaction(write=True) as conn:
            expired = await runs_sql.expire_due(conn, stamp)
            return [await runs_sql.get(conn, run_id) for run_id in expired]
