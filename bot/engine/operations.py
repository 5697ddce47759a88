"""The operations service: every change a person asks of a run, for both front ends.

The Slack front end and the CLI parse what was typed or clicked, call one method here
and render what it returns; neither writes a decision or a refusal itself. Each method
returns a typed result (a closed union of frozen dataclasses: ``Requested``, ``Busy``,
``Refused`` with a ``Refusal`` reason and its sentence, ``Counted`` when more approvals
are needed, ...), and every refusal is recorded here, in the refusals table, as it is
returned.

* ``request``: a person asks for a run (``ChatUser``: judged by the requesters policy;
  ``Operator``: on the terminal, whose own confirmation is the approval);
* ``decide``: an Approve or Deny click (``RunLifecycle.approve``/``deny``);
* ``cancel``: by the requester or an approver;
* ``terminate_leftovers``: one press on a host's Terminate leftover processes question:
  who may (an approver; the requester only with ``allow_self_approval``), how many (the
  run's ``min_approvals`` distinct approvers), recorded in ``leftover_approvals``;
  ``confirm_leftovers`` is the terminal operator's own yes (these, and the questions a
  driving replica asks so a press on any replica answers them, live in the base class
  ``LeftoverOperations``, ``bot.engine.leftover_operations``);
* ``recover``: the sweep (dead drivers' runs, overdue requests) and, by hand, one run.

Status changes themselves stay the run life cycle's (``bot.engine.lifecycle``), so a
deny, a cancel or an expiry means the same whichever front end it came from.

Every judgement uses the policy of the run's service (``policy_for``: ``[policy]`` with
what ``[services.NAME.policy]`` overrides, issue 22), never ``[policy]`` alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import assert_never

from bot.audit.store import AuditLog, RunRecord
from bot.core.plan import Plan
from bot.core.policy import Membership, is_requester
from bot.core.status import Decision, RunStatus, Source
from bot.engine.leftover_operations import LeftoverOperations
from bot.engine.leftover_operations import LeftoverResult as LeftoverResult
from bot.engine.leftover_operations import LeftoversAlreadyCounted as LeftoversAlreadyCounted
from bot.engine.leftover_operations import LeftoversApproved as LeftoversApproved
from bot.engine.leftover_operations import LeftoversCounted as LeftoversCounted
from bot.engine.leftover_operations import LeftoversTooLate as LeftoversTooLate
from bot.engine.leftover_operations import LeftoverVote as LeftoverVote
from bot.engine.lifecycle import RunLifecycle
from bot.engine.liveness import DRIVEN, Verdict
from bot.engine.recovery import (
    Expired,
    Interrupted,
    NotDriven,
    OwnerAlive,
    Recovered,
    recover_by_hand,
    window_note,
)
from bot.engine.run_results import (
    ApproveResult,
    Cancelled,
    CancelResult,
    DenyResult,
    Refusal,
    Refused,
)
from bot.engine.schedule import (
    AT_ONCE,
    MembersNow,
    NotNow,
    RunAt,
    Scheduler,
    StartOutcome,
    Timing,
    judge_request,
    no_groups,
)
from bot.errors import LockHeldError, RunNotFoundError
from bot.settings import PolicySettings

# ---- who asks ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatUser:
    """Someone in chat, judged by the policy: ``membership`` reads the user groups when a
    judgement needs them (a status query needs none)."""

    user: str
    channel: str
    command: str  # as typed, for a refusal's row
    membership: Callable[[], Awaitable[Membership]]


@dataclass(frozen=True, slots=True)
class Operator:
    """The operator on the bot's machine: their own confirmation is the approval
    (``approver``: someone else's, named; the demo's second person)."""

    user: str
    source: Source = Source.CLI
    approver: str | None = None


Asker = ChatUser | Operator

# ---- what a request came to ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requested:
    """Recorded, holding its locks; ``record.status`` is 'approved' when it needs nobody
    (a dry run, a status query, the terminal operator's confirmed change)."""

    record: RunRecord

    @property
    def text(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Busy:
    """Refused: another run holds the service's or a host's lock (the request is recorded
    'refused', with its refusals row). ``holder``: that run's id."""

    reason: str
    holder: int

    @property
    def text(self) -> str:
        return f"Refused: {self.reason}."


RequestResult = Requested | Busy | Refused

# ---- recovery by hand ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunLook:
    """One run as ``recover`` sees it: its record, the verdict on its driver (None when
    nothing drives it) and the locks it holds."""

    run: RunRecord
    verdict: Verdict | None
    locks: list[str]


RecoverResult = Recovered | Expired | Refused
# Asked before a run is recovered by hand, told whether its owner looks alive; raises
# (``InputError``) to stop.
Confirm = Callable[[bool], None]


class Operations(LeftoverOperations):
    """The one service both front ends call; built once per process on its one life
    cycle (``bot.engine.runtime``)."""

    def __init__(self, lifecycle: RunLifecycle) -> None:
        self.lifecycle = lifecycle
        self.audit: AuditLog = lifecycle.audit
        self.scheduler = Scheduler(lifecycle)

    def policy_for(self, service: str) -> PolicySettings:
        """The policy ``service``'s runs are judged by: ``[policy]`` with what the
        service's own ``[services.NAME.policy]`` overrides (issue 22)."""
        return self.lifecycle.settings.policy_for(service)

    async def refuse(
        self, *, user: str, channel: str | None, command: str, reason: str, code: Refusal
    ) -> Refused:
        """Record a refusal the front end judged (a wrong channel, bad input, a click off
        its card, Slack unable to say who is in a group); returns it to render."""
        return await self.lifecycle.record_refusal(user, channel, command, reason, code)

    # ---- request ------------------------------------------------------------------------

    async def request(self, plan: Plan, *, by: Asker, timing: Timing = AT_ONCE) -> RequestResult:
        """Record a request, holding its locks (``RunLifecycle.request``). A dry run is
        approved by its system approver, a terminal operator's change by
        the operator; a chat user's change waits for approvers. ``timing``: ``--at`` or
        ``--now``, judged against the service's maintenance windows (issue 22): outside
        one, a change is refused with when the next opens."""
        # A read (status, rotation) is no run: bot.engine.status_query answers it.
        assert not plan.action.read_only, f"{plan.action} is a read, not a run"
        channel: str | None
        match by:
            case ChatUser():
                if not is_requester(by.user, self.policy_for(plan.service), await by.membership()):
                    return await self.refuse(
                        user=by.user,
                        channel=by.channel,
                        command=by.command,
                        code=Refusal.NOT_REQUESTER,
                        reason=f"You are not on the requesters list for {plan.service}, "
                        f"so you cannot ask for a {plan.action}. Ask someone who is, or an "
                        "admin to add you.",
                    )
                source, channel, approver = Source.SLACK, by.channel, plan.system_approver
            case Operator():
                source, channel = by.source, None
                approver = plan.system_approver or by.approver or by.user
            case _:
                assert_never(by)
        judged = judge_request(
            plan, timing, self.policy_for(plan.service), now=self.lifecycle.clock()
        )
        match judged:
            case RunAt():
                pass
            case NotNow():
                command = (
                    by.command if isinstance(by, ChatUser) else f"{plan.action} {plan.service}"
                )
                return await self.refuse(
                    user=by.user,
                    channel=channel,
                    command=command,
                    reason=judged.reason,
                    code=judged.code,
                )
            case _:
                assert_never(judged)
        try:
            record = await self.lifecycle.request(
                plan,
                requested_by=by.user,
                source=source,
                channel=channel,
                at=judged.at,
                override=judged.override,
            )
        except LockHeldError as exc:
            # The life cycle has recorded the request as refused, with its refusals row.
            return Busy(str(exc), exc.run_id)
        if approver is not None:
            await self.lifecycle.confirm(record.id, approver)
            record = await self.audit.get_run(record.id)
        return Requested(record)

    async def withdraw(self, run_id: int, reason: str) -> bool:
        """Nobody can see the request (its card could not be posted): close it."""
        return await self.lifecycle.withdraw(run_id, reason)

    async def expire(self, run_id: int) -> bool:
        """Its window is over: close a request nobody approved; False if decided first."""
        return await self.lifecycle.expire(run_id)

    async def expire_overdue(self) -> list[RunRecord]:
        """Every request still pending past its window becomes 'expired' (a restart)."""
        return await self.lifecycle.expire_overdue()

    async def abandon(self, run_id: int, status: RunStatus, summary: str) -> bool:
        """The driver could not carry the run out: it ends ``status`` with why."""
        return await self.lifecycle.abandon(run_id, status, summary)

    async def start_due(
        self, *, source: Source | None = None, members: MembersNow = no_groups
    ) -> list[StartOutcome]:
        """The scheduled runs whose time has come: each claimed (drive it now) or refused
        at its start with why (``bot.engine.schedule``), its approvals judged again on
        the user groups ``members`` reads now."""
        return await self.scheduler.start_due(source=source, members=members)

    async def cancel_scheduled(self, run_id: int, *, by: Operator) -> Cancelled | Refused:
        """The terminal operator cancels a run approved for later, before it starts."""
        command = f"{Decision.CANCEL} run #{run_id}"
        try:
            record = await self.audit.get_run(run_id)
        except RunNotFoundError as exc:
            return await self.refuse(
                user=by.user, channel=None, command=command, reason=str(exc), code=Refusal.NOT_FOUND
            )
        if record.status == RunStatus.SCHEDULED and await self.lifecycle.cancel_scheduled(
            run_id, by.user
        ):
            return Cancelled(run_id, RunStatus.SCHEDULED)
        current = (await self.audit.get_run(run_id)).status
        return await self.refuse(
            user=by.user,
            channel=None,
            command=command,
            code=Refusal.CLOSED,
            reason=f"Run #{run_id} is {current}, not scheduled: only a run waiting for its "
            "--at time is cancelled here (a running one: Ctrl-C in its terminal, or Cancel "
            "on its card).",
        )

    async def scheduled(self, *, source: Source | None = None) -> list[RunRecord]:
        """The runs approved for later, soonest first."""
        return await self.scheduler.waiting(source=source)

    # ---- decide, cancel -----------------------------------------------------------------

    async def decide(
        self,
        run_id: int,
        decision: Decision,
        *,
        user: str,
        membership: Membership,
        channel: str | None,
    ) -> ApproveResult | DenyResult:
        """One Approve or Deny click, judged by the policy on ``membership`` now."""
        if decision == Decision.DENY:
            return await self.lifecycle.deny(
                run_id, user=user, membership=membership, channel=channel
            )
        if decision != Decision.APPROVE:
            raise ValueError(f"a click approves or denies, not {decision}")
        return await self.lifecycle.approve(
            run_id, user=user, membership=membership, channel=channel
        )

    def request_cancel(self, run_id: int, user: str) -> bool:
        """The operator's own run, driven here, stops at its next safe point (synchronous:
        a signal handler calls it; who asked is recorded by the run's driver)."""
        return self.lifecycle.request_cancel(run_id, user)

    async def cancel(
        self, run_id: int, *, user: str, membership: Membership, channel: str | None
    ) -> CancelResult:
        """Cancel by the requester or an approver (``RunLifecycle.cancel``)."""
        return await self.lifecycle.cancel(
            run_id, user=user, membership=membership, channel=channel
        )

    # ---- recover ------------------------------------------------------------------------

    async def recover(self) -> list[Interrupted]:
        """The sweep: dead drivers' runs 'interrupted', overdue requests 'expired'."""
        return await self.lifecycle.recover()

    async def look(self, run_id: int) -> RunLook:
        """How ``recover`` sees one run now (this look counts towards judging its
        heartbeat). Raises ``RunNotFoundError``."""
        judge = self.lifecycle.judge
        await judge.look(self.audit, [run_id])
        run = await self.audit.get_run(run_id)
        locks = (await self.audit.locks_held()).get(run_id, [])
        return RunLook(run, judge.verdict(run) if run.status in DRIVEN else None, locks)

    async def recover_run(
        self, look: RunLook, *, user: str, force: bool, confirm: Confirm
    ) -> RecoverResult:
        """An operator's recovery of one run by hand: refused while its owner looks alive
        (unless ``force``) or when nothing drives it; a request past its window is
        expired at once. ``confirm`` is asked before anything else changes."""
        run, judge = look.run, self.lifecycle.judge
        command = f"recover run #{run.id}" + (" --force" if force else "")

        async def refused(reason: str, code: Refusal) -> Refused:
            return await self.refuse(
                user=user, channel=None, command=command, reason=reason, code=code
            )

        if look.verdict is None:
            if not judge.window_closed(run):
                return await refused(
                    NotDriven(run, window_note(run, judge)).reason, Refusal.NOT_DRIVEN
                )
            # Expired without asking: its window closed it already, nobody can approve it.
        elif look.verdict.alive and not force:
            return await refused(OwnerAlive(run, look.verdict).reason, Refusal.OWNER_ALIVE)
        else:
            confirm(look.verdict.alive)
        result = await recover_by_hand(
            self.audit, run.id, by=user, judge=judge, force=force and look.verdict is not None
        )
        match result:
            case Recovered() | Expired():
                return result
            case OwnerAlive() | NotDriven():
                # It changed between the look and the recovery (it finished, or its owner
                # came back).
                return await refused(result.reason, Refusal.CHANGED)
            case _:
                assert_never(result)
