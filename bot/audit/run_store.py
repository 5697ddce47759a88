"""``RunStore``: the part of ``AuditLog`` that records runs and what was decided about
them: creating a run, its card, step and versions, the compare-and-set of its status,
its owner's lease, reading runs back, and the approve/deny/cancel decisions."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.audit import decisions as decisions_sql
from bot.audit import leftover_approvals as leftover_approvals_sql
from bot.audit import metrics_reads as metrics_reads_sql
from bot.audit import runs as runs_sql
from bot.audit.leftover_approvals import LeftoverApproval
from bot.audit.metrics_reads import MetricsReads
from bot.audit.records import DecisionRecord, RunRecord, checked, format_ts, now_ts
from bot.audit.store_base import StoreBase, shielded
from bot.core.status import Action, Decision, RunStatus, Source


class RunStore(StoreBase):
    """Runs and decisions (see ``bot.audit.store.AuditLog``)."""

    # -- runs --------------------------------------------------------------------

    @shielded
    async def create_run(
        self,
        *,
        service: str,
        action: Action,
        hosts: Sequence[str],
        requested_by: str,
        source: Source,
        plan: Mapping[str, Any],
        package_spec: str | None,
        index_name: str | None = None,
        dry_run: bool = False,
        status: RunStatus = RunStatus.PENDING_APPROVAL,
        channel: str | None = None,
        expires_at: datetime | None = None,
        expires_clock: str | None = None,
        scheduled_at: datetime | None = None,
        override: bool = False,
        ttl_s: float | None = None,
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
            expires_clock=expires_clock,
            scheduled_at=None if scheduled_at is None else format_ts(scheduled_at),
            override=override,
            ttl_s=ttl_s,
        )
        now = now_ts()
        # Statements only: one call on the database's thread (``Database.inline``).
        return await self._db.inline(lambda conn: runs_sql.create(conn, new, now), write=True)

    @shielded
    async def _update_run(self, run_id: int, sets: Mapping[str, Any]) -> None:
        await self._db.inline(lambda conn: runs_sql.update(conn, run_id, sets), write=True)

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

    @shielded
    async def transition(
        self,
        run_id: int,
        to: RunStatus,
        *,
        expect: Collection[RunStatus] | None = None,
        summary: str | None = None,
        owner: str | None = None,
        lease_until: datetime | None = None,
        lease_s: float | None = None,
    ) -> bool:
        """Compare-and-set the status: False (nothing changed) if it is not in ``expect``.

        ``owner`` records the process that drives the run from here on (its epoch, the
        fencing token, moves on), ``lease_until`` until when it vouches for it by its
        wall clock and ``lease_s`` for how long by the database's (see ``renew_lease``).

        Entering ``running`` stamps started_at (first time only); entering a final
        status stamps finished_at and releases the run's locks, in the same transaction.
        """
        to = checked(RunStatus, to, "status")
        if isinstance(expect, str):
            raise TypeError("expect must be a collection of statuses, not one string")
        expected = None if expect is None else [checked(RunStatus, s, "status") for s in expect]
        summary = self._r.opt(summary)
        now = now_ts()
        lease = None if lease_until is None else format_ts(lease_until)
        return await self._db.inline(
            lambda conn: runs_sql.transition(
                conn,
                run_id,
                to,
                expect=expected,
                summary=summary,
                owner=owner,
                now=now,
                lease_until=lease,
                lease_s=lease_s,
            ),
            write=True,
        )

    @shielded
    async def renew_lease(
        self,
        run_id: int,
        owner: str,
        until: datetime,
        *,
        lease_s: float,
        epoch: int | None = None,
    ) -> runs_sql.Renewed | None:
        """The heartbeat of the process driving a run: its lease now ends at ``until``
        by its clock and ``lease_s`` from now by the database's, and its renewal count
        goes up by one. None when the run is no longer 'running' under ``owner`` (and
        ``epoch``, when given): it ended, or was recovered; there is nothing left to
        vouch for. The answer carries a cancel asked on another replica (issue 21)."""
        stamp = format_ts(until)
        return await self._db.inline(
            lambda conn: runs_sql.renew_lease(
                conn, run_id, owner, stamp, epoch=epoch, lease_s=lease_s
            ),
            write=True,
        )

    @shielded
    async def ask_cancel(self, run_id: int, user: str) -> bool:
        """Ask the replica driving a running run to cancel it (issue 21): it hears at its
        next heartbeat. False when it is not running, or someone asked already."""
        user = self._r(user)
        return await self._db.inline(
            lambda conn: runs_sql.ask_cancel(conn, run_id, user), write=True
        )

    @shielded
    async def get_run(self, run_id: int) -> RunRecord:
        return await self._db.inline(lambda conn: runs_sql.get(conn, run_id), write=False)

    @shielded
    async def list_runs(
        self,
        *,
        service: str | None = None,
        limit: int = 20,
        statuses: Collection[RunStatus] | None = None,
    ) -> list[RunRecord]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if isinstance(statuses, str):
            raise TypeError("statuses must be a collection of statuses, not one string")
        async with self._db.transaction(write=False) as conn:
            return await runs_sql.listed(
                conn,
                service=self._r.opt(service),
                statuses=None if statuses is None else list(statuses),
                limit=limit,
            )

    @shielded
    async def metrics_reads(self) -> MetricsReads:
        """What a metrics scrape reads (``bot.audit.metrics_reads``), in one read."""
        async with self._db.transaction(write=False) as conn:
            return await metrics_reads_sql.read(conn)

    # -- decisions ---------------------------------------------------------------

    @shielded
    async def record_decision(self, run_id: int, user: str, decision: Decision) -> bool:
        """False when this user already made this decision on this run (a double click)."""
        decision = checked(Decision, decision, "decision")
        user, now = self._r(user), now_ts()
        return await self._db.inline(
            lambda conn: decisions_sql.record(conn, run_id, user, decision, now), write=True
        )

    @shielded
    async def decisions(self, run_id: int) -> list[DecisionRecord]:
        async with self._db.transaction(write=False) as conn:
            return await decisions_sql.of_run(conn, run_id)

    @shielded
    async def record_terminate(
        self, run_id: int, user: str, *, host: str, question: str, pids: Sequence[int]
    ) -> bool:
        """One approver's go to terminate exactly ``pids`` on ``host`` (the question
        ``question`` listed them), with the run's ``terminate`` decision, in one
        transaction. False when this user already approved this question."""
        user, host, now = self._r(user), self._r(host), now_ts()
        async with self._db.transaction(write=True) as conn:
            await decisions_sql.record(conn, run_id, user, Decision.TERMINATE, now)
            return await leftover_approvals_sql.record(
                conn, run_id, host=host, question=self._r(question), user=user, pids=pids, at=now
            )

    @shielded
    async def leftover_approvals(self, run_id: int) -> list[LeftoverApproval]:
        """Every go to terminate leftover processes of the run, oldest first."""
        async with self._db.transaction(write=False) as conn:
            return await leftover_approvals_sql.of_run(conn, run_id)
