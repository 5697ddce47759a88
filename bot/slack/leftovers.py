"""The Slack gate for leftover processes: each host of the run that waits gets its own
**Terminate leftover processes** button beside its own list on the run's card, and waits
for the run's approvers to press it (``LeftoverDesk.press`` decides on a press, once
``SlackFrontEnd.terminate`` has read who is an approver). The executor bounds each wait
by the approval window and a cancel; whatever ends it, that host's button goes and the
thread says how it ended.

Issue 17 F5 and F10: a wait is keyed by run, host and question (a nonce made per question,
in the button's value), so in a batch of two hosts a press releases the host whose list
it was beside and no other, and a press naming no open question (a stale card, a forged
value) is refused and recorded. A press is one approval: the host goes on once
``min_approvals`` distinct approvers pressed its question, judged by the run's rule (the
requester counts only with ``allow_self_approval``; someone no longer an approver stops
counting); the card shows "1 of 2 approvals" meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from bot.core.leftovers import Approval
from bot.engine.leftover_gate import LeftoverRequest, new_question
from bot.engine.operations import (
    LeftoversAlreadyCounted,
    LeftoversApproved,
    LeftoversCounted,
    LeftoversTooLate,
    LeftoverVote,
    Operations,
)
from bot.engine.run_results import Refused
from bot.slack.blocks import LeftoverAsk
from bot.slack.membership import Membership
from bot.slack.reporter import SlackReporter

Progress = Callable[[tuple[str, ...]], None]
# How often a waiting question looks for presses made on other replicas (issue 21).
POLL_S = 1.0


@dataclass
class _Question:
    """One host's open question: its vote (what it asked, who pressed so far), how the
    card shows progress, and its answer."""

    vote: LeftoverVote
    progress: Progress
    answer: asyncio.Future[Approval]

    @property
    def request(self) -> LeftoverRequest:
        return self.vote.request


def parse_terminate_value(value: str) -> tuple[str, str] | None:
    """(host, question) from a Terminate button's value ``<run>:<host>:<question>``
    (``bot.slack.blocks.terminate_value``); None when it is not one."""
    parts = value.split(":")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[1] and parts[2] else None


class LeftoverDesk:
    """The questions waiting on a press, one per host of each run this process drives;
    who may press and how many must is the operations service's decision
    (``Operations.terminate_leftovers``), which also records it."""

    def __init__(self, operations: Operations) -> None:
        self.operations = operations
        self._open: dict[str, _Question] = {}  # by question id

    def gate(self, reporter: SlackReporter) -> SlackGate:
        return SlackGate(self, reporter)

    def waiting(self, run_id: int) -> list[str]:
        """The hosts of run ``run_id`` whose question is open."""
        return [
            q.request.host
            for q in self._open.values()
            if q.request.run_id == run_id and not q.answer.done()
        ]

    def _find(self, run_id: int, value: str) -> _Question | None:
        named = parse_terminate_value(value)
        if named is None:
            return None
        q = self._open.get(named[1])
        if q is None or q.answer.done() or (q.request.run_id, q.request.host) != (run_id, named[0]):
            return None
        return q

    async def press(
        self,
        run_id: int,
        value: str,
        *,
        user: str,
        membership: Membership,
        channel: str | None,
        command: str,
    ) -> str:
        """A host's Terminate leftover processes button (its value names the run, the
        host and the question), pressed by ``user`` (judged on ``membership`` read at
        the press). Returns the sentence for the presser; every refusal is recorded."""
        q = self._find(run_id, value)
        vote = None if q is None else q.vote
        if vote is None and (named := parse_terminate_value(value)) is not None:
            # Asked by another replica (issue 21): judged here, answered through the
            # database, where the driving replica watches its question.
            vote = await self.operations.leftover_vote(run_id, *named)
        result = await self.operations.terminate_leftovers(
            vote,
            run_id=run_id,
            user=user,
            membership=membership,
            channel=channel,
            command=command,
            waiting=self.waiting(run_id),
        )
        match result:
            case LeftoversCounted() | LeftoversApproved() if q is not None and q.answer.done():
                return LeftoversTooLate(run_id, q.request.host).text
            case LeftoversCounted(approved_by=counted) if q is not None:
                q.progress(counted)
            case LeftoversApproved(approved_by=counted) if q is not None:
                q.answer.set_result(Approval(", ".join(counted)))
            case (
                LeftoversCounted()
                | LeftoversApproved()
                | LeftoversAlreadyCounted()
                | LeftoversTooLate()
                | Refused()
            ):
                pass
            case _:
                assert_never(result)
        return result.text

    async def wait(self, request: LeftoverRequest, question: str, progress: Progress) -> Approval:
        """The question is opened in the audit log too, so a press on another replica can
        answer it (issue 21): this replica watches the question's row and its presses
        every ``POLL_S`` meanwhile, and closes it when the wait ends, whatever ended it."""
        q = _Question(
            LeftoverVote(request, question), progress, asyncio.get_running_loop().create_future()
        )
        audit = self.operations.audit
        await audit.open_question(
            request.run_id, request.host, question, request.question, request.pids
        )
        self._open[question] = q
        try:
            return await self._answer(q)
        finally:
            del self._open[question]
            await asyncio.shield(audit.close_question(question))

    async def _answer(self, q: _Question) -> Approval:
        shown: list[str] = []
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(q.answer), POLL_S)
            except TimeoutError:
                pass
            found = await self.operations.audit.question(q.vote.question)
            if found is None:
                continue
            asked, pressed = found
            if asked.approved_by is not None:
                return Approval(asked.approved_by)
            if pressed != shown and pressed != q.vote.pressed:
                shown = list(pressed)
                q.vote.pressed[:] = pressed
                q.progress(tuple(pressed))


class SlackGate:
    """One run's gate: a host's list and button on the card, and the thread's account
    of how each host's wait ended."""

    def __init__(self, desk: LeftoverDesk, reporter: SlackReporter) -> None:
        self._desk = desk
        self._reporter = reporter

    async def ask(self, request: LeftoverRequest) -> Approval:
        operations = self._desk.operations
        service = (await operations.audit.get_run(request.run_id)).service
        ask = LeftoverAsk(
            request.host,
            new_question(),
            request.question,
            request.pids,
            # The run's service's rule (issue 22), as the presses are judged by.
            needed=operations.policy_for(service).min_approvals,
        )
        self._reporter.offer_leftovers(ask)
        pids = ", ".join(map(str, request.pids))
        note = (
            f"{request.host}: the wait for approvers ended without enough presses (the "
            "window closed or the run was cancelled); nothing was signalled."
        )
        try:
            answer = await self._desk.wait(
                request,
                ask.question,
                lambda approvals: self._reporter.leftovers_progress(ask.question, approvals),
            )
            note = (
                f"{request.host}: leftover processes {pids}: termination approved by "
                f"{answer.approved_by}."
            )
            return answer
        finally:
            self._reporter.close_leftovers(ask.question, note)
