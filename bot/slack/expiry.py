"""The approval window's timers: one per pending card, firing at its deadline.

Time is the run life cycle's injected clock and the wait an injectable ``sleep``, so
a test moves a manual clock past the deadline and the timer fires at once, instead
of the suite waiting a real ``approval_ttl_s``. The timer only says "due"; closing
the request (a compare-and-set that a click may win first) is the caller's, and the
life cycle's judge may decline it: a card another instance opened has a deadline on
that instance's wall clock, which this one does not read, so it is expired only once
this process has watched it pending for the whole window (``bot.engine.liveness``),
by the sweep that follows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]


class ExpiryTimers:
    """``due(run_id)`` runs once the clock reaches the deadline a run was armed with."""

    def __init__(
        self, due: Callable[[int], Awaitable[object]], *, clock: Clock, sleep: Sleep = asyncio.sleep
    ) -> None:
        self._due = due
        self._clock = clock
        self._sleep = sleep
        self._timers: dict[int, asyncio.Task[None]] = {}

    def arm(self, run_id: int, deadline: datetime) -> None:
        """(Re)arm ``run_id``'s timer; an earlier one for it is dropped."""
        old = self._timers.pop(run_id, None)
        if old is not None:
            old.cancel()
        self._timers[run_id] = asyncio.create_task(
            self._wait(run_id, deadline), name=f"expiry-{run_id}"
        )

    def disarm(self, run_id: int) -> None:
        """The request was decided: its timer goes (unless it is the one firing now)."""
        timer = self._timers.pop(run_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    def armed(self, run_id: int) -> bool:
        return run_id in self._timers

    async def _wait(self, run_id: int, deadline: datetime) -> None:
        # Checked again after each sleep: a sleep may end early, and the clock is the judge.
        while (left := (deadline - self._clock()).total_seconds()) > 0:
            await self._sleep(left)
        try:
            await self._due(run_id)
        finally:
            if self._timers.get(run_id) is asyncio.current_task():
                del self._timers[run_id]

    async def aclose(self) -> None:
        timers = list(self._timers.values())
        self._timers.clear()
        for timer in timers:
            timer.cancel()
        await asyncio.gather(*timers, return_exceptions=True)
