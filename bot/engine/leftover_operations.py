"""The operations service's part for leftover processes (issue 12; across replicas,
issue 21): one press on a host's Terminate leftover processes question, judged, counted
and recorded; the terminal operator's own yes; and the questions a driving replica asks,
recorded so a press on any replica answers them. ``Operations``
(``bot.engine.operations``) is the one service the front ends call; this is its base."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.audit.store import AuditLog
from bot.core.policy import Membership, counted_approvals, is_approver
from bot.engine.leftover_gate import LeftoverRequest, new_question
from bot.engine.run_results import Refusal, Refused
from bot.settings import PolicySettings

# ---- what a press on a leftover question came to -------------------------------------------


@dataclass(slots=True)
class LeftoverVote:
    """One host's open question and who pressed for it so far (the Slack desk keeps one
    per open question; this service adds to ``pressed``)."""

    request: LeftoverRequest
    question: str
    pressed: list[str] = field(default_factory=list)

    @property
    def pids(self) -> str:
        return ", ".join(map(str, self.request.pids))


@dataclass(frozen=True, slots=True)
class LeftoversApproved:
    """Enough approvers: the host's leftover processes (``pids``) may be terminated."""

    host: str
    approved_by: tuple[str, ...]
    pids: str

    @property
    def text(self) -> str:
        return (
            f"Terminating {self.host}'s leftover processes (PIDs {self.pids}); that "
            "host's run goes on."
        )


@dataclass(frozen=True, slots=True)
class LeftoversCounted:
    """The press counts, and more approvers are needed before anything is signalled."""

    host: str
    approved_by: tuple[str, ...]
    needed: int
    pids: str

    @property
    def text(self) -> str:
        return (
            f"Approval recorded: {len(self.approved_by)} of {self.needed} to terminate "
            f"{self.host}'s leftover processes (PIDs {self.pids}); nothing is signalled "
            f"before {self.needed}."
        )


@dataclass(frozen=True, slots=True)
class LeftoversAlreadyCounted:
    host: str

    @property
    def text(self) -> str:
        return f"You already approved terminating {self.host}'s leftover processes."


@dataclass(frozen=True, slots=True)
class LeftoversTooLate:
    """The host stopped waiting (its window closed, the run was cancelled) meanwhile."""

    run_id: int
    host: str

    @property
    def text(self) -> str:
        return (
            f"Too late: run #{self.run_id} stopped waiting on {self.host}; nothing was signalled."
        )


LeftoverResult = (
    LeftoversApproved | LeftoversCounted | LeftoversAlreadyCounted | LeftoversTooLate | Refused
)


class LeftoverOperations:
    """What ``Operations`` does for leftover processes; it provides ``audit``,
    ``policy_for`` and ``refuse``."""

    audit: AuditLog

    def policy_for(self, service: str) -> PolicySettings:
        raise NotImplementedError

    async def refuse(
        self, *, user: str, channel: str | None, command: str, reason: str, code: Refusal
    ) -> Refused:
        raise NotImplementedError

    # ---- leftover processes -------------------------------------------------------------

    async def terminate_leftovers(
        self,
        vote: LeftoverVote | None,
        *,
        run_id: int,
        user: str,
        membership: Membership,
        channel: str | None,
        command: str,
        waiting: Sequence[str] = (),
    ) -> LeftoverResult:
        """One press on a host's question (``vote``; None when the press names no open
        question of run ``run_id``, and ``waiting`` are the hosts it waits on)."""
        if vote is None:
            now = (
                f" It waits now for {', '.join(waiting)}: use the button beside that "
                "host's list on the card."
                if waiting
                else ""
            )
            return await self.refuse(
                user=user,
                channel=channel,
                command=command,
                code=Refusal.NO_QUESTION,
                reason=f"That Terminate button does not match a question run #{run_id} is "
                f"waiting on (answered already, closed, or not from its card); "
                f"nothing was signalled.{now}",
            )
        host = vote.request.host
        run = await self.audit.get_run(run_id)
        requester, policy = run.requested_by, self.policy_for(run.service)
        if not is_approver(user, policy, membership) or (
            user == requester and not policy.allow_self_approval
        ):
            return await self.refuse(
                user=user,
                channel=channel,
                command=command,
                code=Refusal.NOT_ALLOWED,
                reason=f"Only an approver of {run.service} (not the requester) may "
                f"terminate run #{run_id}'s leftover processes on {host}; nothing was "
                "signalled.",
            )
        if not await self.audit.record_terminate(
            run_id, user, host=host, question=vote.question, pids=vote.request.pids
        ):
            return LeftoversAlreadyCounted(host)
        # Every press recorded for the question so far, on any replica (issue 21), read
        # after this one's: two approvers pressing at once on two replicas (or on one
        # replica and the driving one, whose list is polled) each read the question before
        # the other's press, and counting only this press on that would leave both short.
        asked = await self.audit.question(vote.question)
        if asked is not None:
            vote.pressed[:] = asked[1]
        elif user not in vote.pressed:
            vote.pressed.append(user)
        # The run's rule, judged now: someone no longer an approver stops counting.
        counted = tuple(
            counted_approvals(
                vote.pressed, requester=requester, policy=policy, membership=membership
            )
        )
        needed = policy.min_approvals
        if len(counted) < needed:
            return LeftoversCounted(host, counted, needed, vote.pids)
        # The question as the driving replica asked it (issue 21): closed with who made it
        # enough, once; a wait that ended meanwhile closed it first, unanswered.
        if asked is not None and not await self.audit.close_question(
            vote.question, ", ".join(counted)
        ):
            answered = await self.audit.question(vote.question)
            if answered is None or answered[0].approved_by is None:
                return LeftoversTooLate(run_id, host)
            # The other press that made it enough answered it first.
            by = tuple(answered[0].approved_by.split(", "))
            return LeftoversApproved(host, by, vote.pids)
        return LeftoversApproved(host, counted, vote.pids)

    async def ask_leftovers(self, request: LeftoverRequest, question: str) -> None:
        """The driving replica asks ``question`` (issue 21): recorded, so a press on any
        replica can answer it (``leftover_vote``)."""
        await self.audit.open_question(
            request.run_id, request.host, question, request.question, request.pids
        )

    async def end_question(self, question: str) -> None:
        """The wait for ``question`` ended (answered, its window closed, the run
        cancelled): no press counts for it from now on."""
        await self.audit.close_question(question)

    async def leftover_vote(self, run_id: int, host: str, question: str) -> LeftoverVote | None:
        """Another replica's open question (issue 21), as a press here judges it: what it
        asked and who pressed for it so far; None when run ``run_id``'s ``host`` asks no
        such question (answered, closed, or never asked)."""
        found = await self.audit.question(question)
        if found is None:
            return None
        asked, pressed = found
        if asked.closed or (asked.run_id, asked.host) != (run_id, host):
            return None
        request = LeftoverRequest(run_id, host, asked.ask, asked.pids)
        return LeftoverVote(request, question, list(pressed))

    async def confirm_leftovers(self, request: LeftoverRequest, *, user: str) -> LeftoversApproved:
        """The terminal operator's yes (or ``--kill-leftovers``): their command is the
        approval, recorded with the host and the exact PIDs it was for."""
        await self.audit.record_terminate(
            request.run_id, user, host=request.host, question=new_question(), pids=request.pids
        )
        return LeftoversApproved(request.host, (user,), ", ".join(map(str, request.pids)))
