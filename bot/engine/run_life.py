"""A run once it is asked for: the status changes that are no one's decision (expiry,
start, end, interrupt, recovery, a scheduled run's claim, a withdrawal), its locks and
the runs this process drives. ``RunLifecycle`` (``bot.engine.lifecycle``) adds the
decisions on top; see its docstring for the whole life of a run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from bot.audit.backend import Dialect
from bot.audit.rotations import left_out
from bot.audit.store import AuditLog, RunRecord
from bot.core.plan import Plan
from bot.core.policy import run_policy
from bot.core.status import Decision, RunStatus
from bot.engine.clocks import Monotonic, system_monotonic, wall_clock_id
from bot.engine.executor import CancelToken
from bot.engine.liveness import Judge
from bot.engine.owner import process_owner
from bot.engine.recovery import Closed, Interrupted, Tell, interrupted_message
from bot.engine.run_driver import RunDriver
from bot.engine.run_locks import RunLocks
from bot.engine.run_results import Refusal
from bot.settings import PolicySettings, Settings

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def lock_scopes(plan: Plan) -> list[str]:
    # A host's maintenance holds every service on it too: none of them may be redeployed
    # elsewhere meanwhile (its rollout would count on this host's replica).
    services = [p.service for p in plan.parts] if plan.action.host_wide else [plan.service]
    return [*(f"service:{s}" for s in services), *(f"host:{h}" for h in plan.hosts)]


def needs_locks(plan: Plan) -> bool:
    """Status queries and dry runs change nothing, so they never wait behind a job."""
    return not plan.action.read_only and not plan.dry_run


class RunLife:
    """A run once it is asked for: its expiry, start, end and recovery, and its locks (the
    status changes that are no one's decision); ``RunLifecycle`` adds the decisions."""

    def __init__(
        self,
        settings: Settings,
        audit: AuditLog,
        *,
        clock: Clock = utc_now,
        owner: Callable[[], str] = process_owner,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Monotonic | None = None,
        wall_id: str | None = None,
        database_clock: bool | None = None,
    ) -> None:
        self.settings = settings
        self.audit = audit
        self.clock = clock
        # Told each refusal's reason code (the process's metrics; bot.engine.runtime).
        self.on_refusal: Callable[[Refusal], None] = _ignore
        replicas = settings.replicas
        self.lease_s = replicas.lease_s
        judged_by_database = by_database(audit, database_clock)
        self.judge = Judge(
            wall=clock,
            monotonic=monotonic if monotonic is not None else system_monotonic(),
            wall_id=wall_id if wall_id is not None else wall_clock_id(),
            ttl_s=settings.policy.approval_ttl_s,
            lease_s=replicas.lease_s,
            # Replicas on PostgreSQL share its clock: a driver's lease and a card's window
            # are judged by it (None: so on PostgreSQL; a test that moves this process's
            # clocks by hand says False).
            by_database=judged_by_database,
        )
        self._owner = owner
        # Between heartbeats, ``sleep`` (tests pass the clock's).
        self.driver = RunDriver(
            audit,
            owner=owner,
            clock=clock,
            sleep=sleep,
            margin_s=settings.lease_margin_s(),
            lease_s=replicas.lease_s,
            every_s=replicas.renew_every_s,
            wait_for_database=judged_by_database,
        )
        self.locks = RunLocks(audit, self.judge)

    @property
    def recovered(self) -> list[Tell]:
        """Told of each run this process recovers on meeting its lock: the Slack front
        end posts in its thread, the CLI prints it."""
        return self.locks.recovered

    @property
    def expired(self) -> list[Closed]:
        """Told of each overdue request this process expires on meeting its lock (a CLI,
        or a bot that was down at its deadline): the Slack front end closes its card."""
        return self.locks.expired

    # ---- expire -------------------------------------------------------------------------

    async def expire(self, run_id: int) -> bool:
        """Close a request nobody approved in time; False if it was decided first, or
        its window has not closed by this process's evidence (another clock's card this
        process has not yet watched for the window's length: its sweep expires it
        then)."""
        await self.judge.look(self.audit, [run_id])
        return bool(await self.audit.expire_closed(self.judge.window_closed, run_ids=[run_id]))

    async def expire_overdue(self) -> list[RunRecord]:
        """Every request still pending past its window (after a restart, and at each
        sweep) becomes 'expired'."""
        await self.judge.look(self.audit)
        return await self.audit.expire_closed(self.judge.window_closed)

    async def pending(self) -> list[RunRecord]:
        """The requests awaiting approval, newest first."""
        return await self.audit.list_runs(statuses=[RunStatus.PENDING_APPROVAL], limit=10_000)

    # ---- start, finish, interrupt -------------------------------------------------------

    async def start(self, run_id: int) -> CancelToken | None:
        """approved -> running, recording this process as the owner. Returns the run's
        cancel token, or None when the run was not 'approved' (nothing started)."""
        owner = self._owner()
        if not await self.audit.transition(
            run_id,
            RunStatus.RUNNING,
            expect=(RunStatus.APPROVED,),
            owner=owner,
            lease_until=self._lease_end(),
            lease_s=self.lease_s,
        ):
            return None
        # The epoch this start took is the run's fencing token for this process; read
        # after the start, so a pause past the lease between the two (another replica
        # recovered the run meanwhile) reads a run no longer this process's, whose epoch
        # must not become its token (issue 21: exactly one driver).
        run = await self.audit.get_run(run_id)
        if run.status != RunStatus.RUNNING or run.owner != owner:
            return None
        return self.driver.drive(run_id, run.epoch)

    async def released(self, run_id: int) -> None:
        """The driver is done with the run (whatever its end): no more cancels, and who
        cancelled it is on disk before this returns."""
        await self.driver.released(run_id)

    async def finish(self, run_id: int, status: RunStatus, summary: str) -> bool:
        """running -> its final status (the worst of its hosts')."""
        return await self.audit.transition(
            run_id, status, expect=(RunStatus.RUNNING,), summary=summary
        )

    async def abandon(self, run_id: int, status: RunStatus, summary: str) -> bool:
        """The driver could not carry the run out (its locks were taken meanwhile, the
        config no longer has the service, a bug): it ends ``status`` with why."""
        return await self.audit.transition(
            run_id, status, expect=(RunStatus.APPROVED, RunStatus.RUNNING), summary=summary
        )

    async def interrupt(self, run_id: int) -> bool:
        """Its driver stopped mid-run (cancelled at shutdown, broken): the run becomes
        'interrupted' with what that means for the service, at once."""
        record = await self.audit.get_run(run_id)
        out = left_out((await self.audit.rotations([run_id])).get(run_id, []))
        return await self.audit.interrupt(run_id, interrupted_message(record, out))

    async def recover(self) -> list[Interrupted]:
        """The runs of dead processes become 'interrupted' (at start, and the bot's sweep),
        and overdue requests 'expired' (``expired`` is told of them)."""
        return await self.locks.recover()

    # ---- scheduled runs (issue 22) ----------------------------------------------------

    def policy_of(self, record: RunRecord) -> PolicySettings:
        """The rule ``record`` is judged by: its service's policy, with an emergency
        override's extra approvals (``bot.core.policy.run_policy``)."""
        return run_policy(self.settings.policy_for(record.service), override=record.override)

    async def claim(self, run_id: int) -> bool:
        """scheduled -> approved at its time, this process its owner (it drives it now):
        a compare-and-set, so of two bots (or a bot and a CLI) exactly one starts it."""
        return await self.audit.transition(
            run_id,
            RunStatus.APPROVED,
            expect=(RunStatus.SCHEDULED,),
            owner=self._owner(),
            lease_until=self._lease_end(),
            lease_s=self.lease_s,
        )

    async def cancel_scheduled(self, run_id: int, user: str) -> bool:
        """The terminal operator's cancel of a run approved for later (their shell on the
        bot's machine is their right, as their confirmation is an approval there)."""
        if await self._close_unstarted(
            run_id, RunStatus.SCHEDULED, f"cancelled by {user} before its scheduled start"
        ):
            await self.audit.record_decision(run_id, user, Decision.CANCEL)
            return True
        return False

    async def _close_unstarted(self, run_id: int, was: RunStatus, summary: str) -> bool:
        return await self.audit.transition(
            run_id, RunStatus.CANCELLED, expect=(was,), summary=summary
        )

    # ---- locks --------------------------------------------------------------------------

    def _lease_end(self) -> datetime:
        return self.clock() + timedelta(seconds=self.lease_s)

    async def take_locks(self, run_id: int, scopes: Sequence[str]) -> None:
        """Take the locks (``RunLocks.take_locks``): a dead holder is recovered, an
        overdue request expired, a live one raises ``LockHeldError``."""
        await self.locks.take_locks(run_id, scopes)

    def request_cancel(self, run_id: int, user: str) -> bool:
        """Ask a run this process drives to stop at its next safe point (synchronous, so
        a signal handler can call it). False when no run here has that id."""
        return self.driver.request_cancel(run_id, user)

    async def withdraw(self, run_id: int, reason: str) -> bool:
        """Nobody can see the request (its card could not be posted): close it rather
        than leave it pending."""
        return await self.audit.transition(
            run_id,
            RunStatus.CANCELLED,
            expect=(RunStatus.PENDING_APPROVAL, RunStatus.APPROVED, RunStatus.SCHEDULED),
            summary=reason,
        )


def by_database(audit: AuditLog, said: bool | None) -> bool:
    return audit.dialect is Dialect.POSTGRES if said is None else said


def _ignore(code: Refusal) -> None:
    """No one listening for refusals (no metrics)."""
