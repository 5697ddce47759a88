"""The Slack bot's tick for scheduled runs (issue 22): every ``every_s`` it starts the
runs approved for later whose time has come (``Operations.start_due``: claimed once,
whichever bot looks first), says in a run's card and thread why one was refused at its
start, and moves each waiting card's countdown on.

Scheduled runs are records, so a bot that restarts finds them again on its first tick;
nothing is kept here but the task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import assert_never

from bot.core.status import Source
from bot.engine.operations import Operations
from bot.engine.schedule import MembersNow, NotStarted, Started, no_groups
from bot.slack.card_updates import CardUpdates

log = logging.getLogger(__name__)

# Often enough that a run starts within half a minute of its time and the countdown
# (whole minutes) stays near; each waiting card costs one chat.update a tick.
TICK_S = 30.0


class ScheduledStarts:
    def __init__(
        self,
        operations: Operations,
        cards: CardUpdates,
        start_run: Callable[[int], object],
        leading: Callable[[], Awaitable[bool]] | None = None,
        members: MembersNow = no_groups,
    ) -> None:
        self.operations = operations
        self.cards = cards
        self.start_run = start_run
        # The user groups read from Slack now: a due run's approvals are judged again on
        # them (someone removed from the approvers' group since no longer counts).
        self.members = members
        # Only the leader ticks (issue 21): one replica moves the countdowns on.
        self.leading = leading
        self._task: asyncio.Task[None] | None = None

    async def once(self) -> None:
        """Start (or refuse) what is due now; refresh the countdown of what waits."""
        # Only Slack's own: a run scheduled on a terminal has no card to tell, and its
        # operator starts it there (``python -m bot scheduled --start-due``).
        due = await self.operations.start_due(source=Source.SLACK, members=self.members)
        for outcome in due:
            match outcome:
                case Started(record=record):
                    self.start_run(record.id)
                case NotStarted(record=record, reason=reason):
                    await self.cards.refresh(record.id)
                    await self.cards.tell_thread(
                        record,
                        f":no_entry: Run #{record.id} did not start at its scheduled time: "
                        f"{reason}. The service was not touched.",
                    )
                case _:
                    assert_never(outcome)
        for record in await self.operations.scheduled(source=Source.SLACK):
            await self.cards.refresh(record.id)

    def start(
        self, *, every_s: float = TICK_S, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """Tick every ``every_s`` from now on (a second call does nothing); the first tick
        is at once, so a bot that was down at a run's time decides on it at start."""
        if self._task is None:
            self._task = asyncio.create_task(self._every(every_s, sleep), name="scheduled-starts")

    async def _every(self, every_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        while True:
            try:
                if self.leading is None or await self.leading():
                    await self.once()
            except Exception:
                # A locked database now is no reason to miss the next tick.
                log.exception("starting scheduled runs failed; trying again in %.0f s", every_s)
            await sleep(every_s)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
