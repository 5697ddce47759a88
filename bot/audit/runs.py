"""The ``runs`` table: one row per request, its status and its life's timestamps.

A status change and what must go with it happen in the caller's one transaction:
entering a final status releases the run's locks, and interrupting a run also
interrupts its running steps.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.audit import decisions, locks, steps
from bot.audit.backend import Dialect, Row
from bot.audit.db import NOW_S, Conn, dialect_of, execute, fetch, insert, qmarks, run_not_found
from bot.audit.records import EXPIRED_SUMMARY, RunRecord, stored
from bot.core.service_state import ServiceState
from bot.core.status import Action, Decision, RunStatus, Source

_COLUMNS = (
    "id, service, action, hosts, requested_by, source, status, current_step, summary, "
    "version_before, version_after, created_at, started_at, finished_at, expires_at, "
    "channel, message_ts, plan, package_spec, index_name, dry_run, owner, lease_until, "
    "lease_renewals, expires_clock, service_state, scheduled_at, override, epoch, "
    "cancel_requested_by, lease_expires - {now} AS lease_left_s, "
    "expires_db - {now} AS expires_left_s"
)


def _columns(dialect: Dialect) -> str:
    """The columns a ``RunRecord`` is read from; ``lease_left_s`` by the database's
    clock at the moment of the read (issue 21: the one clock every replica shares)."""
    return _COLUMNS.format(now=NOW_S[dialect])


def runs_query(
    *,
    service: str | None,
    statuses: Collection[RunStatus] | None,
    limit: int,
    dialect: Dialect = Dialect.SQLITE,
) -> tuple[str, list[Any]]:
    """The SQL behind ``AuditLog.list_runs``; public so a test can check its plan uses
    an index."""
    where: list[str] = []
    params: list[Any] = []
    if service is not None:
        where.append("service = ?")
        params.append(service)
    if statuses is not None:
        where.append(f"status IN ({qmarks(statuses)})")
        params.extend(statuses)
    sql = f"SELECT {_columns(dialect)} FROM runs"  # noqa: S608 - our column names; values bound
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC LIMIT ?"
    params.append(limit)
    return sql, params


@dataclass(frozen=True, slots=True)
class NewRun:
    """A request as it is inserted: already validated and redacted."""

    service: str
    action: Action
    hosts_json: str
    requested_by: str
    source: Source
    channel: str | None
    plan_json: str
    package_spec: str | None
    index_name: str | None
    dry_run: bool
    status: RunStatus
    expires_at: str | None
    # Whose wall clock wrote ``expires_at`` (``bot.engine.clocks.wall_clock_id``).
    expires_clock: str | None = None
    # Issue 22: when an ``--at`` run is to start (UTC, ISO), and whether it was asked for
    # outside its window as an emergency override.
    scheduled_at: str | None = None
    override: bool = False
    # Issue 21: the approval window's length, for its end by the database's clock.
    ttl_s: float | None = None


async def create(conn: Conn, new: NewRun, now: str) -> int:
    # The window's end by the database's clock: NULL without a window.
    ends = "NULL" if new.ttl_s is None else f"{NOW_S[dialect_of(conn)]} + {float(new.ttl_s)!r}"
    return await insert(
        conn,
        "INSERT INTO runs (service, action, hosts, requested_by, source, channel, plan, "  # noqa: S608
        "package_spec, index_name, dry_run, status, created_at, started_at, "
        "finished_at, expires_at, expires_clock, scheduled_at, override, expires_db) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {ends})",
        (
            new.service,
            new.action,
            new.hosts_json,
            new.requested_by,
            new.source,
            new.channel,
            new.plan_json,
            new.package_spec,
            new.index_name,
            int(new.dry_run),
            new.status,
            now,
            now if new.status is RunStatus.RUNNING else None,
            now if new.status.is_final else None,
            new.expires_at,
            new.expires_clock,
            new.scheduled_at,
            int(new.override),
        ),
    )


async def update(conn: Conn, run_id: int, sets: Mapping[str, Any]) -> None:
    """Set columns (names from our code, never from input) of one run."""
    assignments = ", ".join(f"{column} = ?" for column in sets)
    changed = await execute(
        conn,
        f"UPDATE runs SET {assignments} WHERE id = ?",  # noqa: S608 - our column names
        [*sets.values(), run_id],
    )
    if not changed:
        raise run_not_found(run_id)


async def transition(
    conn: Conn,
    run_id: int,
    to: RunStatus,
    *,
    expect: Collection[RunStatus] | None,
    summary: str | None,
    owner: str | None,
    now: str,
    lease_until: str | None = None,
    lease_s: float | None = None,
) -> bool:
    """Compare-and-set the status; see ``AuditLog.transition``. A new ``owner`` takes
    the run: its epoch moves on (the fencing token, issue 21) and, with ``lease_s``,
    its lease runs that long from now by the database's clock."""
    sets = ["status = ?"]
    params: list[Any] = [to]
    if to is RunStatus.RUNNING:
        sets.append("started_at = COALESCE(started_at, ?)")
        params.append(now)
    if to.is_final:
        sets.append("finished_at = ?")
        params.append(now)
    if summary is not None:
        sets.append("summary = ?")
        params.append(summary)
    if owner is not None:
        sets.extend(("owner = ?", "epoch = epoch + 1", "cancel_requested_by = NULL"))
        params.append(owner)
    if lease_until is not None:
        sets.append("lease_until = ?")
        params.append(lease_until)
    if lease_s is not None:
        sets.append(f"lease_expires = {NOW_S[dialect_of(conn)]} + ?")
        params.append(lease_s)
    sql = f"UPDATE runs SET {', '.join(sets)} WHERE id = ?"  # noqa: S608 - values bound
    params.append(run_id)
    if expect is not None:
        sql += f" AND status IN ({qmarks(expect)})"
        params.extend(expect)
    if not await execute(conn, sql, params):
        if not await fetch(conn, "SELECT 1 FROM runs WHERE id = ?", (run_id,)):
            raise run_not_found(run_id)
        return False
    if to.is_final:
        await locks.release(conn, run_id)
    return True


@dataclass(frozen=True, slots=True)
class Renewed:
    """A lease renewed: the run is still this owner's. ``cancel_by``: who asked, on a
    replica that does not drive it, to cancel it (issue 21), for the driver to act on."""

    cancel_by: str | None


async def renew_lease(
    conn: Conn, run_id: int, owner: str, until: str, *, epoch: int | None, lease_s: float
) -> Renewed | None:
    """Extend the lease of a run still 'running' under ``owner`` (and ``epoch``, when
    the owner knows it) by its wall clock (``until``, for people) and by the database's
    (``lease_s``), and count the renewal (what a judge with another wall clock
    watches); None when it is not (it ended, or was recovered meanwhile): then there is
    nothing left to vouch for."""
    fence, params = ("", ()) if epoch is None else (" AND epoch = ?", (epoch,))
    changed = await execute(
        conn,
        f"UPDATE runs SET lease_until = ?, lease_renewals = lease_renewals + 1, "  # noqa: S608
        f"lease_expires = {NOW_S[dialect_of(conn)]} + ? "
        f"WHERE id = ? AND status = ? AND owner = ?{fence}",
        (until, lease_s, run_id, RunStatus.RUNNING, owner, *params),
    )
    if not changed:
        return None
    rows = await fetch(conn, "SELECT cancel_requested_by FROM runs WHERE id = ?", (run_id,))
    return Renewed(rows[0]["cancel_requested_by"])


async def ask_cancel(conn: Conn, run_id: int, user: str) -> bool:
    """Ask the driver of a running run, on another replica, to cancel it: True while it
    is 'running' (the first who asks is the one its driver records)."""
    return bool(
        await execute(
            conn,
            "UPDATE runs SET cancel_requested_by = COALESCE(cancel_requested_by, ?) "
            "WHERE id = ? AND status = ?",
            (user, run_id, RunStatus.RUNNING),
        )
    )


async def interrupt(conn: Conn, run_id: int, summary: str, now: str) -> None:
    """The run, and its running steps, become 'interrupted'; its locks are released. Its
    epoch moves on: a driver still out there (paused past its lease) is fenced off."""
    await execute(
        conn,
        "UPDATE runs SET status = ?, finished_at = ?, summary = ?, epoch = epoch + 1 WHERE id = ?",
        (RunStatus.INTERRUPTED, now, summary, run_id),
    )
    await steps.interrupt_running(conn, run_id, now)
    await locks.release(conn, run_id)


async def untold_recoveries(conn: Conn) -> list[int]:
    """Runs recovered from a dead driver (a 'recover' decision) whose Slack thread has
    not been told yet, oldest first."""
    rows = await fetch(
        conn,
        "SELECT id FROM runs WHERE status = ? AND recovery_told_at IS NULL "
        "AND channel IS NOT NULL AND message_ts IS NOT NULL "
        "AND id IN (SELECT run_id FROM decisions WHERE decision = ?) ORDER BY id",
        (RunStatus.INTERRUPTED, Decision.RECOVER),
    )
    return [int(row["id"]) for row in rows]


async def mark_told(conn: Conn, run_id: int, now: str) -> bool:
    """Claim the telling of a recovered run's thread: True for the one caller that may."""
    return bool(
        await execute(
            conn,
            "UPDATE runs SET recovery_told_at = ? WHERE id = ? AND recovery_told_at IS NULL",
            (now, run_id),
        )
    )


async def unmark_told(conn: Conn, run_id: int) -> None:
    """Give back the claim of ``mark_told`` (the thread was not told after all)."""
    await execute(conn, "UPDATE runs SET recovery_told_at = NULL WHERE id = ?", (run_id,))


def interrupted_summary(status: str, current_step: str | None) -> str:
    """What an interrupted run's summary says, from where its driver stopped."""
    if status == RunStatus.APPROVED:
        return "interrupted: the bot restarted after approval, before the run began"
    if current_step:
        return (
            f"interrupted: the bot stopped during step {current_step!r}; "
            "check the hosts before retrying"
        )
    return "interrupted: the bot stopped before the first step"


async def expire_due(conn: Conn, now: str, run_ids: Sequence[int] | None = None) -> list[int]:
    """Runs awaiting approval whose window closed by ``now`` (only ``run_ids`` when given)
    become 'expired' and release their locks; returns their ids, oldest first."""
    only = f" AND id IN ({qmarks(run_ids)})" if run_ids is not None else ""
    rows = await fetch(
        conn,
        "SELECT id FROM runs WHERE status = ? "  # noqa: S608 - only placeholders; values bound
        f"AND expires_at IS NOT NULL AND expires_at <= ?{only} ORDER BY id",
        (RunStatus.PENDING_APPROVAL, now, *(run_ids or ())),
    )
    for row in rows:
        await execute(
            conn,
            "UPDATE runs SET status = ?, finished_at = ?, summary = ? WHERE id = ?",
            (RunStatus.EXPIRED, now, EXPIRED_SUMMARY, row["id"]),
        )
        await locks.release(conn, row["id"])
    return [int(row["id"]) for row in rows]


async def with_status(conn: Conn, statuses: Collection[RunStatus]) -> list[Row]:
    """``id, status, current_step, owner, lease_until`` of the runs in ``statuses``,
    oldest first."""
    where = f"status IN ({qmarks(statuses)})"
    sql = (
        f"SELECT id, status, current_step, owner, lease_until FROM runs "  # noqa: S608
        f"WHERE {where} ORDER BY id"
    )
    return await fetch(conn, sql, list(statuses))


async def has_status(conn: Conn, run_id: int, status: RunStatus) -> bool:
    return bool(
        await fetch(conn, "SELECT 1 FROM runs WHERE id = ? AND status = ?", (run_id, status))
    )


async def get(conn: Conn, run_id: int) -> RunRecord:
    sql = f"SELECT {_columns(dialect_of(conn))} FROM runs WHERE id = ?"  # noqa: S608
    rows = await fetch(conn, sql, (run_id,))
    if not rows:
        raise run_not_found(run_id)
    return (await _records(conn, rows))[0]


async def listed(
    conn: Conn,
    *,
    service: str | None,
    statuses: Collection[RunStatus] | None,
    limit: int,
) -> list[RunRecord]:
    """Newest first."""
    sql, params = runs_query(
        service=service, statuses=statuses, limit=limit, dialect=dialect_of(conn)
    )
    return await _records(conn, await fetch(conn, sql, params))


async def _records(conn: Conn, rows: Sequence[Row]) -> list[RunRecord]:
    who = await decisions.deciders(conn, [row["id"] for row in rows])
    approved, denied = who[Decision.APPROVE], who[Decision.DENY]
    return [
        RunRecord(
            id=row["id"],
            service=row["service"],
            action=stored(Action, row["action"], "action"),
            hosts=json.loads(row["hosts"]),
            requested_by=row["requested_by"],
            source=stored(Source, row["source"], "source"),
            status=stored(RunStatus, row["status"], "status"),
            current_step=row["current_step"],
            summary=row["summary"],
            version_before=row["version_before"],
            version_after=row["version_after"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            expires_at=row["expires_at"],
            channel=row["channel"],
            message_ts=row["message_ts"],
            plan=json.loads(row["plan"]),
            package_spec=row["package_spec"],
            index_name=row["index_name"],
            dry_run=bool(row["dry_run"]),
            approved_by=approved.get(row["id"], []),
            denied_by=denied.get(row["id"], []),
            owner=row["owner"],
            lease_until=row["lease_until"],
            lease_renewals=int(row["lease_renewals"]),
            expires_clock=row["expires_clock"],
            recovered_by=who[Decision.RECOVER].get(row["id"], []),
            service_state=(
                None if row["service_state"] is None else ServiceState(row["service_state"])
            ),
            scheduled_at=row["scheduled_at"],
            override=bool(row["override"]),
            epoch=int(row["epoch"]),
            lease_left_s=None if row["lease_left_s"] is None else float(row["lease_left_s"]),
            cancel_requested_by=row["cancel_requested_by"],
            expires_left_s=(
                None if row["expires_left_s"] is None else float(row["expires_left_s"])
            ),
        )
        for row in rows
    ]
