"""A run's life, in one place: every change of a run's status goes through here.

    request ─> pending_approval ─approve (N of M)─> approved ─start─> running ─finish─> …
                  │ └─deny──> denied               │                  └─interrupt─> interrupted
                  │ └─expire─> expired             └─cancel─> cancelled
                  └─cancel─> cancelled   (busy, or the plan drifted: refused)

    with --at:  pending_approval ─approve─> scheduled ─claim (at its time)─> approved ─> …
                                              ├─cancel─> cancelled
                                              └─window closed, too late, approvals
                                                short under the policy now─> refused

The Slack front end and the CLI reach the same methods through the operations service
(``bot.engine.operations``), so a deny, an expiry or a cancel means the same thing
whichever front end it came from. Driving runs (cancel tokens, heartbeats) is the
``RunDriver``'s job (``bot.engine.run_driver``), locks and recovery the ``RunLocks``'
(``bot.engine.run_locks``); the status changes that are no one's decision (expiry,
start, end, a scheduled run's claim) the base class ``RunLife``'s (``bot.engine.run_life``);
the typed results live in ``bot.engine.run_results``.

Each status change is a compare-and-set in the audit log (``AuditLog.transition``): of a
double click,
concurrent approvers, an approval racing a deny or the expiry timer, exactly one
wins, and a click counts once (the decisions table is unique per run, user and
decision).

Who may approve, deny or cancel is the pure policy (``bot.core.policy``) judged at
the moment of the click; the caller resolves user groups into a ``Membership`` (in
Slack, through ``usergroups.users.list``). The outcome of a click is a typed result
(``Approved``, ``Counted``, ``Refused``, …), not a sentence to parse; each carries
``text``, the sentence for the person, and the front end decides what else to do
(start the run, re-render the card).

Choices:

* Every approval that moves a run to 'approved', and every start, records the owner
  (``bot.engine.owner.process_owner``): the process that will drive it. A bot
  starting meanwhile leaves a run with a live owner alone. Who is alive, and whether a
  card's window has closed, is this process's ``Judge``'s call (``bot.engine.liveness``),
  with this process's own clocks: a request records whose wall clock wrote its
  deadline, and a process reading another clock never ends that window early.
* Dry runs are approved by a system approver (``system:dry-run``; a status or rotation
  read is no run at all, ``bot.engine.status_query``), and on a terminal the operator's own
  confirmation is the approval (``confirm``): the audit log never credits a person
  with an approval they did not give.
* Refused clicks and cancels are written to the refusals table here; the other
  refusals (wrong channel, bad input) are recorded by the operations service
  (``bot.engine.operations``) the front ends call, never by a front end itself.
* Time comes from the injected ``clock`` (wall) and ``monotonic``, with their ids, so
  expiry and skewed clocks are tested without waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from bot.audit.store import RunRecord, parse_ts
from bot.core.plan import Plan
from bot.core.policy import (
    Membership,
    counted_approvals,
    evaluate_approval,
    may_cancel,
)
from bot.core.status import Decision, RunStatus, Source
from bot.engine.recovery import HolderMayBeAlive
from bot.engine.run_life import Clock, RunLife, by_database, lock_scopes, needs_locks, utc_now
from bot.engine.run_results import (
    AlreadyCounted,
    Approved,
    ApproveResult,
    Cancelled,
    CancelRequested,
    CancelResult,
    Counted,
    Denied,
    DenyResult,
    NotCancellable,
    Refusal,
    Refused,
    Scheduled,
    TooLate,
)
from bot.errors import LockHeldError, RunNotFoundError

# The typed results live in bot.engine.run_results, the status changes that are no one's
# decision in bot.engine.run_life; importing them from here still works.
__all__ = [
    "AlreadyCounted",
    "ApproveResult",
    "Approved",
    "CancelRequested",
    "CancelResult",
    "Cancelled",
    "Clock",
    "Counted",
    "Denied",
    "DenyResult",
    "NotCancellable",
    "Refusal",
    "Refused",
    "RunLife",
    "RunLifecycle",
    "TooLate",
    "by_database",
    "lock_scopes",
    "needs_locks",
    "utc_now",
]


class RunLifecycle(RunLife):
    """Every transition of a run: the decisions and status changes are here; driving
    runs (cancel tokens, heartbeats) is its ``driver``'s job (``bot.engine.run_driver``),
    locks and recovery its ``locks``' (``bot.engine.run_locks``). One instance per
    process, shared by the engine and the front ends (so a cancel reaches the token of
    the run this process drives).

    ``clock`` is the wall clock and ``wall_id`` whose it is (None: this machine's);
    ``monotonic`` the clock the judge measures lengths of time on (None: this
    machine's)."""

    # ---- request ------------------------------------------------------------------------

    async def request(
        self,
        plan: Plan,
        *,
        requested_by: str,
        source: Source,
        channel: str | None = None,
        at: datetime | None = None,
        override: bool = False,
    ) -> RunRecord:
        """Record a request awaiting approval, holding the service's and hosts' locks
        from now until it ends (expired, denied and refused requests release them).

        While another request or job holds any of them this one is recorded as
        'refused', with a refusals row, and LockHeldError names the holder. Taking the
        locks here (atomically, in SQLite) is what makes two requests in the same
        second end with exactly one card. Read-only runs take no locks, and nor does a
        run scheduled for later (``at``): it takes them when it starts, so a run set for
        02:00 does not block the service all day (``bot.engine.schedule``). ``override``
        records an emergency request outside its window (more approvals).
        """
        expires = self.clock() + timedelta(seconds=self.settings.policy.approval_ttl_s)
        run_id = await self.audit.create_run(
            service=plan.service,
            action=plan.action,
            hosts=list(plan.hosts),
            requested_by=requested_by,
            source=source,
            plan=plan.to_json(),
            package_spec=plan.spec,
            index_name=plan.index_name,
            dry_run=plan.dry_run,
            channel=channel,
            expires_at=expires,
            expires_clock=self.judge.wall_id,
            ttl_s=self.settings.policy.approval_ttl_s,
            scheduled_at=at,
            override=override,
        )
        record = await self.audit.get_run(run_id)
        if needs_locks(plan) and at is None:
            try:
                await self.take_locks(run_id, lock_scopes(plan))
            except LockHeldError as exc:
                holder = await self.audit.get_run(exc.run_id)
                # A holder only a later look can judge: say when to try again.
                note = f"; {exc.note}" if isinstance(exc, HolderMayBeAlive) else ""
                busy = LockHeldError(
                    f"{plan.service} is busy: run #{holder.id} ({holder.action}, "
                    f"{holder.status}) requested by {holder.requested_by}{note}",
                    run_id=holder.id,
                    requested_by=holder.requested_by,
                )
                await self.refuse(record, str(busy), expect=(RunStatus.PENDING_APPROVAL,))
                raise busy from None
        return record

    async def refuse(
        self, record: RunRecord, reason: str, *, expect: Sequence[RunStatus] = (RunStatus.APPROVED,)
    ) -> bool:
        """The run will not start (a busy service, a plan that drifted since approval):
        it ends 'refused', with the refusal recorded, instead of waiting in a queue
        nobody can see."""
        moved = await self.audit.transition(
            record.id, RunStatus.REFUSED, expect=expect, summary=f"not started: {reason}"
        )
        await self.record_refusal(
            record.requested_by,
            record.channel,
            f"{record.action} {record.service}",
            reason,
            Refusal.NOT_STARTED,
        )
        return moved

    # ---- approve, deny ------------------------------------------------------------------

    async def confirm(self, run_id: int, approver: str) -> bool:
        """Approve without a vote: the terminal operator's confirmation, or a system
        approver for dry runs and status queries. False if it was not pending."""
        await self.audit.record_decision(run_id, approver, Decision.APPROVE)
        return await self._approved(await self.audit.get_run(run_id))

    async def _approved(self, record: RunRecord) -> bool:
        if record.scheduled_at is not None:
            # Approved for later: nobody drives it until the scheduler claims it at its
            # time (``claim``), so no owner now, and no recovery sweep touches it.
            return await self.audit.transition(
                record.id, RunStatus.SCHEDULED, expect=(RunStatus.PENDING_APPROVAL,)
            )
        # The one way into 'approved': the approving process is the one that will drive
        # the run, so it becomes the owner now and a bot starting meanwhile leaves it be.
        return await self.audit.transition(
            record.id,
            RunStatus.APPROVED,
            expect=(RunStatus.PENDING_APPROVAL,),
            owner=self._owner(),
            lease_until=self._lease_end(),
            lease_s=self.lease_s,
        )

    async def approve(
        self, run_id: int, *, user: str, membership: Membership, channel: str | None = None
    ) -> ApproveResult:
        """One Approve click, judged by the policy now; the N-th distinct eligible
        approval moves the run to 'approved'."""
        judged = await self._judge(run_id, user, Decision.APPROVE, membership, channel)
        if not isinstance(judged, RunRecord):
            return judged
        record = await self.audit.get_run(run_id)
        policy = self.policy_of(record)
        counted = counted_approvals(
            record.approved_by,
            requester=record.requested_by,
            policy=policy,
            membership=membership,
        )
        needed = policy.min_approvals
        if len(counted) < needed:
            return Counted(run_id, len(counted), needed)
        # Of concurrent final approvals (or an approval racing a deny or the expiry)
        # exactly one compare-and-set wins; only the winner starts the run.
        if await self._approved(record):
            if record.scheduled_at is not None:
                return Scheduled(run_id, parse_ts(record.scheduled_at))
            return Approved(run_id, start=True)
        current = await self.audit.get_run(run_id)
        if current.status in (RunStatus.APPROVED, RunStatus.RUNNING, RunStatus.SCHEDULED):
            return Approved(run_id, start=False)
        return TooLate(run_id, current.status)

    async def deny(
        self, run_id: int, *, user: str, membership: Membership, channel: str | None = None
    ) -> DenyResult:
        """One Deny click: one eligible deny (or the requester's withdrawal) closes it."""
        judged = await self._judge(run_id, user, Decision.DENY, membership, channel)
        if not isinstance(judged, RunRecord):
            return judged
        if not await self.audit.transition(
            run_id,
            RunStatus.DENIED,
            expect=(RunStatus.PENDING_APPROVAL,),
            summary=f"denied by {user}",
        ):
            return TooLate(run_id, (await self.audit.get_run(run_id)).status)
        return Denied(run_id)

    async def _judge(
        self,
        run_id: int,
        user: str,
        decision: Decision,
        membership: Membership,
        channel: str | None,
    ) -> RunRecord | Refused | AlreadyCounted:
        """The policy's verdict on a click; the run when the click was recorded."""
        command = f"{decision} run #{run_id}"
        try:
            record = await self.audit.get_run(run_id)
        except RunNotFoundError as exc:
            return await self.record_refusal(user, channel, command, str(exc), Refusal.NOT_FOUND)
        if record.status != RunStatus.PENDING_APPROVAL:
            return await self.record_refusal(
                user,
                channel,
                command,
                f"Run #{run_id} is already {record.status}.",
                Refusal.CLOSED,
                expired=record.status == RunStatus.EXPIRED,
            )
        now = self.clock()
        expires_at = parse_ts(record.expires_at) if record.expires_at else now
        if not self.judge.same_wall_clock(record):
            # Another clock's deadline: this process may also have watched the window
            # pass by its own clock (bot.engine.liveness).
            await self.judge.look(self.audit, [run_id])
            if self.judge.window_closed(record):
                now = max(now, expires_at)
        verdict = evaluate_approval(
            policy=self.policy_of(record),
            service=record.service,
            membership=membership,
            requester=record.requested_by,
            approvals=record.approved_by,
            denials=record.denied_by,
            clicker=user,
            action=decision,
            now=now,
            expires_at=expires_at,
        )
        if not verdict.accepted:
            late = verdict.state == RunStatus.EXPIRED
            expired = late and await self.expire(run_id)
            return await self.record_refusal(
                user,
                channel,
                command,
                verdict.reason,
                Refusal.EXPIRED if late else Refusal.NOT_ALLOWED,
                expired=expired,
            )
        if not await self.audit.record_decision(run_id, user, decision):
            return AlreadyCounted(run_id, decision)
        return record

    async def record_refusal(
        self,
        user: str,
        channel: str | None,
        command: str,
        reason: str,
        code: Refusal,
        *,
        expired: bool = False,
    ) -> Refused:
        """The one way a refusal is recorded (the audit row) and told (``on_refusal``), for
        the life cycle's own refusals and the front ends' (``Operations.refuse``)."""
        await self.audit.record_refusal(user=user, channel=channel, command=command, reason=reason)
        self.on_refusal(code)
        return Refused(reason, expired=expired, code=code)

    # ---- cancel -------------------------------------------------------------------------

    async def cancel(
        self, run_id: int, *, user: str, membership: Membership, channel: str | None = None
    ) -> CancelResult:
        """Cancel by the requester or an approver: a pending or approved-not-started run
        closes at once; one this process drives stops at its next safe point."""
        command = f"{Decision.CANCEL} run #{run_id}"
        try:
            record = await self.audit.get_run(run_id)
        except RunNotFoundError as exc:
            return await self.record_refusal(user, channel, command, str(exc), Refusal.NOT_FOUND)
        policy = self.settings.policy_for(record.service)
        if not may_cancel(user, record.requested_by, policy, membership):
            return await self.record_refusal(
                user,
                channel,
                command,
                f"Only the requester or an approver of {record.service} can cancel run #{run_id}.",
                Refusal.NOT_ALLOWED,
            )
        if record.is_final:
            return NotCancellable(run_id, record.status)
        # A run driven here stops through its token, with no write first: the cancel
        # must work while the audit database cannot be written (who asked is recorded,
        # or kept in the fallback journal, by the run's driver).
        if record.status == RunStatus.RUNNING and self.request_cancel(run_id, user):
            return CancelRequested(run_id)
        # The 'cancel' decision is recorded only where a cancel really happens (for a
        # running run when its token is set, see start()).
        if await self._close_unstarted(
            run_id, RunStatus.PENDING_APPROVAL, f"cancelled by {user} before approval"
        ):
            await self.audit.record_decision(run_id, user, Decision.CANCEL)
            return Cancelled(run_id, RunStatus.PENDING_APPROVAL)
        if self.request_cancel(run_id, user):
            return CancelRequested(run_id)
        # Approved but not started yet: closing it now means it never starts.
        if await self._close_unstarted(
            run_id, RunStatus.APPROVED, f"cancelled by {user} before it started"
        ):
            await self.audit.record_decision(run_id, user, Decision.CANCEL)
            return Cancelled(run_id, RunStatus.APPROVED)
        if await self._close_unstarted(
            run_id, RunStatus.SCHEDULED, f"cancelled by {user} before its scheduled start"
        ):
            await self.audit.record_decision(run_id, user, Decision.CANCEL)
            return Cancelled(run_id, RunStatus.SCHEDULED)
        # Running, driven by another process (a replica, a CLI): it hears of the cancel
        # at its next heartbeat and stops at its next safe point (issue 21); it records
        # who cancelled, as for a cancel made where it runs.
        if await self.audit.ask_cancel(run_id, user):
            return CancelRequested(run_id, elsewhere=True)
        return NotCancellable(run_id, (await self.audit.get_run(run_id)).status)
