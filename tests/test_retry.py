"""bot.retry: the one back-off (exponential, capped, with jitter) and the one retry loop,
on injected time: no test here sleeps."""

from __future__ import annotations

import math

import pytest

from bot.retry import Backoff, retry
from tests.support.clock import ManualClock


class Locked(Exception):
    """A failure a later try can fix."""


class Refused(Exception):
    """One it cannot."""


class FakeTime:
    """A clock that moves only when the code under test sleeps on it."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.advance(seconds)


class Failing:
    """A call that raises ``exc`` its first ``times`` calls, then works."""

    def __init__(self, times: int, exc: Exception) -> None:
        self.times, self.exc, self.calls = times, exc, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise self.exc
        return "done"


def test_the_waits_double_up_to_the_cap() -> None:
    b = Backoff(initial_s=1.0, max_s=30.0)
    assert [b.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert Backoff(initial_s=0.25).delay(4) == 2.0  # no cap by default
    assert Backoff(initial_s=1.0, max_s=30.0).delay(100_000) == 30.0  # no overflow
    it = Backoff(initial_s=0.5, max_s=1.0).delays()
    assert [next(it) for _ in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_jitter_adds_up_to_jitter_s_and_never_passes_the_cap() -> None:
    b = Backoff(initial_s=1.0, max_s=30.0, jitter_s=1.0)
    assert [b.delay(n, rand=lambda: 0.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert [b.delay(n, rand=lambda: 0.5) for n in (1, 2, 3)] == [1.5, 2.5, 4.5]
    assert b.delay(5, rand=lambda: 0.999) == pytest.approx(16.999)
    assert b.delay(6, rand=lambda: 0.999) == 30.0
    # With the real randomness: within the bounds, and not all equal.
    waits = [b.delay(1) for _ in range(200)]
    assert all(1.0 <= w < 2.0 for w in waits) and len(set(waits)) > 1


async def test_retry_retries_what_on_accepts_until_it_works() -> None:
    t = FakeTime()
    call = Failing(3, Locked("busy"))
    result = await retry(
        call,
        on=lambda e: isinstance(e, Locked),
        backoff=Backoff(initial_s=0.25),
        clock=t.clock,
        sleep=t.sleep,
    )
    assert result == "done" and call.calls == 4
    assert t.sleeps == [0.25, 0.5, 1.0]


async def test_retry_raises_what_on_refuses_at_once() -> None:
    t = FakeTime()
    call = Failing(3, Refused("no"))
    with pytest.raises(Refused):
        await retry(
            call,
            on=lambda e: isinstance(e, Locked),
            backoff=Backoff(initial_s=0.25),
            clock=t.clock,
            sleep=t.sleep,
        )
    assert call.calls == 1 and t.sleeps == []


async def test_retry_stops_when_the_next_wait_would_pass_the_budget() -> None:
    # The audit writer's window: 0.25 + 0.5 + 1.0 ends at 1.75 s; one more wait (2 s)
    # would end past the 2 s budget, so the fourth failure is raised.
    t = FakeTime()
    call = Failing(10, Locked("busy"))
    with pytest.raises(Locked):
        await retry(
            call,
            on=lambda e: isinstance(e, Locked),
            backoff=Backoff(initial_s=0.25),
            budget_s=2.0,
            clock=t.clock,
            sleep=t.sleep,
        )
    assert t.sleeps == [0.25, 0.5, 1.0] and call.calls == 4
    # A zero budget: tried once.
    t = FakeTime()
    call = Failing(10, Locked("busy"))
    with pytest.raises(Locked):
        await retry(
            call,
            on=lambda e: True,
            backoff=Backoff(initial_s=0.25),
            budget_s=0.0,
            clock=t.clock,
            sleep=t.sleep,
        )
    assert (t.sleeps, call.calls) == ([], 1)


async def test_retry_with_jitter_waits_within_the_bounds() -> None:
    t = FakeTime()
    b = Backoff(initial_s=1.0, max_s=4.0, jitter_s=1.0)
    call = Failing(5, Locked("busy"))
    await retry(call, on=lambda e: True, backoff=b, clock=t.clock, sleep=t.sleep)
    lows = [1, 2, 4, 4, 4]
    assert all(low <= w <= min(low + 1, 4.0) for low, w in zip(lows, t.sleeps, strict=True))
    assert call.calls == 6 and not math.isclose(sum(t.sleeps), 0.0)
