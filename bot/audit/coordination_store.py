"""``CoordinationStore``: the part of ``AuditLog`` that keeps processes from stepping on
each other: the service and host locks, recovering runs whose driver died (and telling
their threads once), interrupting a run whose driver stopped, and expiring requests
nobody approved in time."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime

from bot.audit import decisions as decisions_sql
from bot.audit import leases as leases_sql
from bot.audit import leftover_questions as questions_sql
from bot.audit import locks as locks_sql
from bot.audit import rotations as rotations_sql
from bot.audit import runs as runs_sql
from bot.audit import sightings as sightings_sql
from bot.audit.db import Conn
from bot.audit.records import EXPIRED_SUMMARY, RunRecord, format_ts, now_ts
from bot.audit.rotations import RotationRow
from bot.audit.sightings import Sighting
from bot.audit.store_base import StoreBase, shielded
from bot.core.status import Decision, RunStatus
from bot.errors import LockHeldError


class CoordinationStore(StoreBase):
    """Locks, recovery and expiry (see ``bot.audit.store.AuditLog``)."""

    # -- locks -------------------------------------------------------------------

    @shielded
    async def acquire_locks(self, run_id: int, scopes: Sequence[str]) -> None:
        """Take every scope for ``run_id`` or none of them.

        Scopes this run already holds are fine (idempotent). Raises ``LockHeldError``
        naming the holder when another run holds any of them. Scopes are stored as
        given, not redacted: they are keys.
        """
        if isinstance(scopes, str):
            raise TypeError("scopes must be a sequence of scopes, not one string")
        wanted, now = list(dict.fromkeys(scopes)), now_ts()

        async def take(conn: Conn) -> None:
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

        # Statements only: one call on the database's thread (``Database.inline``).
        await self._db.inline(take, write=True)

    @shielded
    async def release_locks(self, run_id: int) -> None:
        await self._db.inline(lambda conn: locks_sql.release(conn, run_id), write=True)

    @shielded
    async def locks_held(self) -> dict[int, list[str]]:
        """Every held lock scope, by the id of the run holding it."""
        async with self._db.transaction(write=False) as conn:
            return await locks_sql.held(conn)

    @shielded
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
            summary=lambda run, _: runs_sql.interrupted_summary(run.status, run.current_step),
        )

    @shielded
    async def recover_dead(
        self,
        dead: Callable[[RunRecord], bool],
        *,
        summary: Callable[[RunRecord, Sequence[RotationRow]], str],
        run_ids: Collection[int] | None = None,
        by: str | None = None,
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
                # A replica the run took out of its router's rotation stays out: the
                # message says so, and how to put it back (issue 19).
                out = rotations_sql.left_out(await rotations_sql.of_runs(conn, [run.id]))
                await runs_sql.interrupt(conn, run.id, self._r(summary(run, out)), now)
                if by is not None:
                    await decisions_sql.record(conn, run.id, by, Decision.RECOVER, now)
                recovered.append(await runs_sql.get(conn, run.id))
        return recovered

    @shielded
    async def untold_recoveries(self) -> list[RunRecord]:
        """Runs recovered from a dead driver whose Slack thread has not been told (a CLI
        recovered them, or the bot died before it could post), oldest first."""
        async with self._db.transaction(write=False) as conn:
            return [
                await runs_sql.get(conn, run_id)
                for run_id in await runs_sql.untold_recoveries(conn)
            ]

    @shielded
    async def claim_telling(self, run_id: int) -> bool:
        """Whether this caller tells the recovered run's thread: True once per run, so
        two bots sweeping the same database do not both post."""
        now = now_ts()
        async with self._db.transaction(write=True) as conn:
            return await runs_sql.mark_told(conn, run_id, now)

    @shielded
    async def unclaim_telling(self, run_id: int) -> None:
        """The claimed telling did not reach the thread (Slack refused the post): the
        next sweep's ``untold_recoveries`` finds the run again."""
        async with self._db.transaction(write=True) as conn:
            await runs_sql.unmark_told(conn, run_id)

    @shielded
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

    @shielded
    async def expire_pending(
        self, now: datetime, run_ids: Sequence[int] | None = None
    ) -> list[RunRecord]:
        """Runs still awaiting approval at their ``expires_at`` (only ``run_ids`` when
        given) become 'expired', in one write transaction."""
        stamp = format_ts(now)
        async with self._db.transaction(write=True) as conn:
            expired = await runs_sql.expire_due(conn, stamp, run_ids)
            return [await runs_sql.get(conn, run_id) for run_id in expired]

    @shielded
    async def expire_closed(
        self, closed: Callable[[RunRecord], bool], run_ids: Collection[int] | None = None
    ) -> list[RunRecord]:
        """Runs still awaiting approval whose window ``closed(run)`` says has closed
        (only ``run_ids`` when given) become 'expired' and release their locks, in one
        write transaction: the verdict is passed on each run as it is then, so a click
        that decided it first wins. Oldest first."""
        if isinstance(run_ids, int):
            raise TypeError("run_ids must be a collection of ids")
        now = now_ts()
        expired: list[RunRecord] = []
        async with self._db.transaction(write=True) as conn:
            for row in await runs_sql.with_status(conn, (RunStatus.PENDING_APPROVAL,)):
                if run_ids is not None and row["id"] not in run_ids:
                    continue
                run = await runs_sql.get(conn, row["id"])
                if not closed(run):
                    continue
                await runs_sql.transition(
                    conn,
                    run.id,
                    RunStatus.EXPIRED,
                    expect=[RunStatus.PENDING_APPROVAL],
                    summary=EXPIRED_SUMMARY,
                    owner=None,
                    now=now,
                )
                expired.append(await runs_sql.get(conn, run.id))
        return expired

    # -- named leases (issue 21) --------------------------------------------------------

    @shielded
    async def hold_lease(self, name: str, holder: str, ttl_s: float) -> int | None:
        """Take or renew lease ``name`` for ``holder`` for ``ttl_s`` by the database's
        clock: its epoch while ``holder`` holds it, None while another does
        (``bot.audit.leases``)."""
        return await self._db.inline(
            lambda conn: leases_sql.hold(conn, name, holder, ttl_s), write=True
        )

    @shielded
    async def release_lease(self, name: str, holder: str) -> bool:
        return await self._db.inline(
            lambda conn: leases_sql.release(conn, name, holder), write=True
        )

    @shielded
    async def lease(self, name: str) -> leases_sql.LeaseState | None:
        return await self._db.inline(lambda conn: leases_sql.of(conn, name), write=False)

    @shielded
    async def server_up_s(self) -> float | None:
        """How long the database server has run (None: SQLite, no server)."""
        return await self._db.inline(leases_sql.server_up_s, write=False)

    # -- leftover questions asked across replicas (issue 21) ----------------------------

    @shielded
    async def open_question(
        self, run_id: int, host: str, question: str, ask: str, pids: Sequence[int]
    ) -> None:
        """The driving replica asks ``question`` of run ``run_id``'s ``host``."""
        ask, now = self._r(ask), now_ts()
        await self._db.inline(
            lambda conn: questions_sql.open_(conn, run_id, host, question, ask, pids, now),
            write=True,
        )

    @shielded
    async def question(self, question: str) -> tuple[questions_sql.Question, list[str]] | None:
        """A question and who pressed for it so far (None: no such question)."""

        async def read(conn: Conn) -> tuple[questions_sql.Question, list[str]] | None:
            found = await questions_sql.get(conn, question)
            return None if found is None else (found, await questions_sql.pressed(conn, question))

        return await self._db.inline(read, write=False)

    @shielded
    async def close_question(self, question: str, approved_by: str | None = None) -> bool:
        """Close an open question, answered by ``approved_by`` (enough approvals) or not
        (the wait ended): True for the one call that closed it."""
        approved_by, now = self._r.opt(approved_by), now_ts()
        return await self._db.inline(
            lambda conn: questions_sql.close(conn, question, now, approved_by), write=True
        )

    # -- what a judge saw -----------------------------------------------------------

    @shielded
    async def sight(self, clock: str, now: float, tokens: Mapping[int, str]) -> dict[int, Sighting]:
        """Record that the monotonic clock ``clock`` reads ``now`` while each run shows
        its token; returns each run's sighting on that clock (the first reading of a
        token that has not changed since). See ``bot.engine.liveness``."""
        async with self._db.transaction(write=True) as conn:
            return await sightings_sql.sight(conn, clock, now, tokens)
