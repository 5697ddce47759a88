"""A clock the test moves by hand, for code that takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds that only change when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
