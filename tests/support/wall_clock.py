"""A wall clock the test moves by hand, for code that takes ``clock: Callable[[], datetime]``
and ``sleep: Callable[[float], Awaitable[None]]`` (the run life cycle, the expiry timers):
an approval window passes when the test says so, not after real seconds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class ManualWallClock:
    """UTC time that changes only in ``advance``; ``sleep`` wakes when it has passed."""

    def __init__(self, now: datetime | None = None) -> None:
        # Whole seconds, as the audit log stores them, so a deadline read back is exact.
        self.now = now or datetime.now(UTC).replace(microsecond=0)
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        for deadline, waiter in self._sleepers:
            if deadline <= self.now and not waiter.done():
                waiter.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Return once the test has moved the clock ``seconds`` on (at once for <= 0)."""
        deadline = self.now + timedelta(seconds=seconds)
        if deadline <= self.now:
            await asyncio.sleep(0)
            return
        entry = (deadline, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    @property
    def sleepers(self) -> int:
        """How many sleeps the clock has not woken yet (a test can wait for a timer to
        arm, and see that moving the clock short of a deadline woke nothing)."""
        return sum(not waiter.done() for _, waiter in self._sleepers)
