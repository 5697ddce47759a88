"""The Slack gate for leftover processes: the run's card gets a **Terminate leftover
processes** button, and the run waits for an approver to press it
(``LeftoverDesk.press`` decides on the press, once ``SlackFrontEnd.terminate`` has read
who is an approver). The executor bounds the wait by the approval window and a cancel;
whatever ends it, the button goes and the thread says how it ended."""

from __future__ import annotations

import asyncio

from bot.audit.store import AuditLog
from bot.core.leftovers import Approval
from bot.core.policy import is_approver
from bot.core.status import Decision
from bot.engine.leftover_gate import LeftoverRequest
from bot.settings import PolicySettings
from bot.slack.membership import Membership
from bot.slack.reporter import SlackReporter


class LeftoverDesk:
    """The questions waiting on a press, one per run this process drives."""

    def __init__(self, audit: AuditLog, policy: PolicySettings) -> None:
        self.audit = audit
        self.policy = policy
        self._waiting: dict[int, asyncio.Future[Approval]] = {}

    def gate(self, reporter: SlackReporter) -> SlackGate:
        return SlackGate(self, reporter)

    def waiting(self, run_id: int) -> bool:
        future = self._waiting.get(run_id)
        return future is not None and not future.done()

    async def press(self, run_id: int, *, user: str, membership: Membership,
                    channel: str | None, command: str) -> str:
        """The card's Terminate leftover processes button, pressed by ``user`` (judged on
        ``membership`` read at the press): only an approver (the requester only where
        self-approval is allowed) lets the run signal them; the press is recorded, and a
        refused one too. Returns the sentence for the presser."""
        if not self.waiting(run_id):
            return (f"Run #{run_id} is not waiting to terminate leftover processes (any more); "
                    "nothing was done.")
        record = await self.audit.get_run(run_id)
        if (not is_approver(user, self.policy, membership)
                or (user == record.requested_by and not self.policy.allow_self_approval)):
            reason = (f"Only an approver (not the requester) may terminate run #{run_id}'s "
                      "leftover processes; nothing was signalled.")
            await self.audit.record_refusal(user=user, channel=channel, command=command,
                                            reason=reason)
            return reason
        await self.audit.record_decision(run_id, user, Decision.TERMINATE)
        if not self.answer(run_id, user):
            return f"Too late: run #{run_id} stopped waiting; nothing was signalled."
        return f"Terminating run #{run_id}'s leftover processes; the run goes on."

    def answer(self, run_id: int, user: str) -> bool:
        """An approver pressed: the run goes on. False when nothing waits any more."""
        future = self._waiting.get(run_id)
        if future is None or future.done():
            return False
        future.set_result(Approval(user))
        return True

    async def wait(self, request: LeftoverRequest) -> Approval:
        future: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._waiting[request.run_id] = future
        try:
            return await future
        finally:
            if self._waiting.get(request.run_id) is future:
                del self._waiting[request.run_id]


class SlackGate:
    """One run's gate: the card's button, and the thread's account of how it ended."""

    def __init__(self, desk: LeftoverDesk, reporter: SlackReporter) -> None:
        self._desk = desk
        self._reporter = reporter

    async def ask(self, request: LeftoverRequest) -> Approval:
        self._reporter.offer_leftovers(request.question)
        note = "The wait for an approver ended without a press (the window closed or the " \
               "run was cancelled); nothing was signalled."
        try:
            answer = await self._desk.wait(request)
            note = (f"Leftover processes {', '.join(map(str, request.pids))}: termination "
                    f"approved by {answer.approved_by}.")
            return answer
        finally:
            self._reporter.close_leftovers(note)
