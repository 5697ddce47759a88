"""``EvidenceStore``: the part of ``AuditLog`` that keeps what a run did and saw: its
steps (and the start durations they give), GPU snapshots, the package sets of each
host's environment (issue 10), and the refusals of commands and clicks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.audit import environments as environments_sql
from bot.audit import refusals as refusals_sql
from bot.audit import snapshots as snapshots_sql
from bot.audit import steps as steps_sql
from bot.audit import writes as w
from bot.audit.records import (
    OUTPUT_TAIL_CHARS,
    EnvironmentRecord,
    Refusal,
    SnapshotRecord,
    StepRecord,
    checked,
    now_ts,
)
from bot.audit.store_base import StoreBase, shielded
from bot.core.packages import Restoration
from bot.core.startup import StartHistory
from bot.core.status import STORED_STEP_STATUSES, StepStatus

# What a step may end as: it is stored 'running' when it starts, never 'pending'.
_STEP_ENDS = STORED_STEP_STATUSES - {StepStatus.RUNNING}


class EvidenceStore(StoreBase):
    """Steps, snapshots, environments and refusals (see ``bot.audit.store.AuditLog``)."""

    # -- steps and snapshots -----------------------------------------------------

    async def _apply(self, record: w.AuditRecord) -> int | None:
        """One typed write in its own transaction, through the one ``bot.audit.writes.apply``
        the resilient writer and the journal's replay use: no second SQL path."""
        async with self._db.transaction(write=True) as conn:
            return await w.apply(conn, record, at=now_ts(), row_ids={})

    async def _row(self, record: w.StepStarted | w.Snapshot | w.Environment) -> int:
        row_id = await self._apply(record)
        assert row_id is not None  # these records always make a row
        return row_id

    @shielded
    async def step_started(self, run_id: int, host: str, step: str, command: str) -> int:
        """Record a step as running and make it the run's current step, in one
        transaction: one fsync before each remote action instead of two."""
        r = self._r
        record = w.StepStarted(run_id=run_id, host=r(host), step=r(step), command=r(command))
        return await self._row(record)

    @shielded
    async def step_finished(
        self,
        step_id: int,
        *,
        status: StepStatus,
        exit_status: int | None = None,
        duration_s: float | None = None,
        output_tail: str = "",
    ) -> None:
        status = checked(StepStatus, status, "step status")
        if status not in _STEP_ENDS:
            raise ValueError(
                f"a step cannot end with step status {status.value!r}; "
                f"expected one of {sorted(s.value for s in _STEP_ENDS)}"
            )
        # Redact before cutting: cutting first could leave half a secret unrecognised.
        tail = self._r(output_tail)[-OUTPUT_TAIL_CHARS:]
        await self._apply(
            w.StepFinished(
                status=status,
                exit_status=exit_status,
                duration_s=duration_s,
                output_tail=tail,
                step_id=step_id,
            )
        )

    @shielded
    async def steps(self, run_id: int) -> list[StepRecord]:
        async with self._db.transaction(write=False) as conn:
            return await steps_sql.of_run(conn, run_id)

    @shielded
    async def start_history(self, service: str, limit: int = 20) -> StartHistory:
        """This service's last successful starts (``bot.core.startup.StartHistory``): what
        a start's progress compares with, and what ``status`` shows."""
        name = self._r(service)
        durations = await self._db.inline(
            lambda conn: steps_sql.start_durations(conn, name, limit), write=False
        )
        return StartHistory(tuple(durations))

    @shielded
    async def add_snapshot(
        self, run_id: int | None, host: str, label: str, data: Mapping[str, Any]
    ) -> int:
        r = self._r
        return await self._row(
            w.Snapshot(run_id=run_id, host=r(host), label=r(label), data=r.json(data))
        )

    @shielded
    async def snapshots(self, run_id: int) -> list[SnapshotRecord]:
        async with self._db.transaction(write=False) as conn:
            return await snapshots_sql.of_run(conn, run_id)

    @shielded
    async def last_snapshot(self, host: str, label: str) -> SnapshotRecord | None:
        """The host's newest snapshot with ``label`` (the deep GPU check's GPU count)."""
        host, label = self._r(host), self._r(label)
        async with self._db.transaction(write=False) as conn:
            return await snapshots_sql.last_of_host(conn, host, label)

    # -- environments (issue 10) -------------------------------------------------

    @shielded
    async def add_environment(
        self, run_id: int, host: str, kind: str, data: Mapping[str, Any]
    ) -> int:
        """A package set of one host's run (``bot.core.packages.EnvKind``), as JSON."""
        r = self._r
        return await self._row(
            w.Environment(run_id=run_id, host=r(host), kind=r(kind), data=r.json(data))
        )

    @shielded
    async def environments(self, run_id: int) -> list[EnvironmentRecord]:
        async with self._db.transaction(write=False) as conn:
            return await environments_sql.of_run(conn, run_id)

    @shielded
    async def packages_changed(self, run_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """What the install of each run really changed, from its first host's 'installed'
        record: ``[{name, before, after}]``; runs that installed nothing are missing."""
        async with self._db.transaction(write=False) as conn:
            records = await environments_sql.of_kind(conn, list(run_ids), "installed")
        out: dict[int, list[dict[str, Any]]] = {}
        for rec in records:
            out.setdefault(rec.run_id, list(rec.data.get("changes") or []))
        return out

    @shielded
    async def restorations(self, run_ids: Sequence[int]) -> dict[int, Restoration]:
        """Whether a rollback undid what ``packages_changed`` reports: after the last
        rollback on the host of that 'installed' record, how its environment compares
        with the snapshot; runs with no rollback on that host are missing."""
        async with self._db.transaction(write=False) as conn:
            installed = await environments_sql.of_kind(conn, list(run_ids), "installed")
            restored = await environments_sql.of_kind(conn, list(run_ids), "restored")
        host: dict[int, str] = {}
        for rec in installed:
            host.setdefault(rec.run_id, rec.host)
        return {
            rec.run_id: Restoration.of(rec.data)
            for rec in restored
            if host.get(rec.run_id) == rec.host
        }  # oldest first: the last one stays

    # -- refusals ----------------------------------------------------------------

    @shielded
    async def record_refusal(
        self, *, user: str, channel: str | None, command: str, reason: str
    ) -> int:
        at, user, command, reason = now_ts(), self._r(user), self._r(command), self._r(reason)
        where = self._r.opt(channel)
        async with self._db.transaction(write=True) as conn:
            return await refusals_sql.add(
                conn, at=at, user=user, channel=where, command=command, reason=reason
            )

    @shielded
    async def refusals(self, limit: int = 50) -> list[Refusal]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        async with self._db.transaction(write=False) as conn:
            return await refusals_sql.newest(conn, limit)
