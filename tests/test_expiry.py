"""The approval window's timers, on a manual clock: they fire when the clock reaches the
deadline and not before, a re-armed timer replaces the old one, a disarmed one never
fires, and none of it waits real seconds."""

from __future__ import annotations

from datetime import timedelta

from bot.slack.expiry import ExpiryTimers
from tests.polling import eventually
from tests.support.wall_clock import ManualWallClock


class Due:
    def __init__(self) -> None:
        self.fired: list[int] = []

    async def __call__(self, run_id: int) -> None:
        self.fired.append(run_id)


async def test_a_timer_fires_at_its_deadline_and_not_before() -> None:
    clock, due = ManualWallClock(), Due()
    timers = ExpiryTimers(due, clock=clock, sleep=clock.sleep)
    timers.arm(1, clock() + timedelta(seconds=600))
    await eventually(lambda: clock.sleepers == 1, "the timer to sleep")
    clock.advance(599)
    assert clock.sleepers == 1 and due.fired == [] and timers.armed(1)  # nothing woken
    clock.advance(1)
    await eventually(lambda: due.fired == [1], "the timer to fire")
    assert not timers.armed(1)  # a fired timer leaves nothing behind
    await timers.aclose()


async def test_rearming_replaces_the_timer_and_disarming_stops_it() -> None:
    clock, due = ManualWallClock(), Due()
    timers = ExpiryTimers(due, clock=clock, sleep=clock.sleep)
    timers.arm(1, clock() + timedelta(seconds=10))
    timers.arm(1, clock() + timedelta(seconds=100))
    timers.arm(2, clock() + timedelta(seconds=10))
    timers.disarm(2)
    await eventually(lambda: clock.sleepers == 1, "one timer to sleep")
    clock.advance(50)
    assert clock.sleepers == 1 and due.fired == []
    clock.advance(50)
    await eventually(lambda: due.fired == [1], "the re-armed timer to fire")
    await timers.aclose()
    assert not timers.armed(1) and not timers.armed(2)


async def test_a_deadline_already_past_fires_at_once() -> None:
    clock, due = ManualWallClock(), Due()
    timers = ExpiryTimers(due, clock=clock, sleep=clock.sleep)
    timers.arm(7, clock() - timedelta(seconds=1))  # e.g. armed after a slow start
    await eventually(lambda: due.fired == [7], "the overdue timer to fire")
    await timers.aclose()


async def test_close_cancels_the_waiting_timers() -> None:
    clock, due = ManualWallClock(), Due()
    timers = ExpiryTimers(due, clock=clock, sleep=clock.sleep)
    for run_id in (1, 2, 3):
        timers.arm(run_id, clock() + timedelta(seconds=60))
    await eventually(lambda: clock.sleepers == 3, "three timers to sleep")
    await timers.aclose()
    assert clock.sleepers == 0
    clock.advance(120)
    assert due.fired == [] and not any(timers.armed(r) for r in (1, 2, 3))
