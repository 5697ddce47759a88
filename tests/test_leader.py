"""The leader lease (issue 21, bot/engine/leader.py) on both backends: one holder at a
time, handed over when it is let go or runs out by the database's clock, counted by the
holder on a clock that keeps going through a pause, and the recovery sweep's extra wait
for a database that was away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from bot.audit.store import AuditLog
from bot.engine.leader import LEADER, Leader
from tests.polling import eventually
from tests.support.audit_db import Locker, Target
from tests.support.clock import ManualClock


@pytest.fixture
async def audit(audit_target: Target) -> AsyncIterator[AuditLog]:
    async with AuditLog.open(audit_target, busy_timeout_s=0.05) as opened:
        yield opened


def leader(audit: AuditLog, holder: str, clock: ManualClock, ttl_s: float = 10.0) -> Leader:
    return Leader(audit, holder, ttl_s=ttl_s, lease_s=30.0, boot_clock=clock)


async def test_one_replica_leads_and_hands_over_when_it_lets_go(audit: AuditLog) -> None:
    clock = ManualClock()
    a, b = leader(audit, "replica-a", clock), leader(audit, "replica-b", clock)
    assert await a.bid() and a.leading and a.epoch == 1
    assert not await b.bid() and not b.leading
    assert await a.bid() and a.epoch == 1  # a renewal keeps the epoch
    await a.aclose()  # a clean shutdown lets the lease go: the next leads at once
    assert not a.leading
    assert await b.bid() and b.epoch == 2
    state = await audit.lease(LEADER)
    assert state is not None and state.holder == "replica-b" and state.left_s > 9


async def test_a_lease_nobody_renews_is_taken_once_it_runs_out_by_the_databases_clock(
    audit: AuditLog,
) -> None:
    clock = ManualClock()
    a, b = leader(audit, "replica-a", clock, ttl_s=0.3), leader(audit, "replica-b", clock)
    assert await a.bid()
    assert not await b.bid()  # not yet run out
    # Nothing renews a's lease (it died): b takes it once the database says it ended.
    await eventually(b.bid, "the lease to run out and b to take it", 10)
    assert b.epoch == 2 and not await a.bid()


async def test_a_leader_counts_its_lease_on_its_own_clock_and_stops_leading_when_paused(
    audit: AuditLog,
) -> None:
    clock = ManualClock()
    a = leader(audit, "replica-a", clock)
    assert await a.bid() and a.leading
    clock.advance(10 * 2 / 3 - 0.01)
    assert a.leading
    clock.advance(0.02)  # paused past the lease it last renewed, less its margin
    assert not a.leading


async def test_the_sweep_waits_for_a_database_reached_without_a_break_for_a_lease(
    audit: AuditLog, audit_target: Target
) -> None:
    """A driver that could not renew while the database was away is not dead: after an
    outage the leader judges nobody until drivers have had a lease to renew."""
    clock = ManualClock()
    a = leader(audit, "replica-a", clock)
    assert await a.lead() and not await a.may_recover()  # just started: wait a lease
    clock.advance(30)
    assert await a.may_recover()
    locker = Locker(audit_target)
    try:
        locker.lock()  # the database cannot be written (another process holds it)
        assert not await a.may_recover()
        locker.unlock()
    finally:
        locker.close()
    assert await a.lead() and not await a.may_recover()  # back: a lease to wait again
    clock.advance(30)
    assert await a.may_recover()


class _Housekeeping:
    """What the sweep and the scheduled starts call on a replica, counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def recover(self) -> list[object]:
        self.calls.append("recover")
        return []

    async def tell_untold(self) -> None:
        self.calls.append("tell_untold")

    async def start_due(self, *, source: object, members: object) -> list[object]:
        self.calls.append("start_due")
        return []

    async def scheduled(self, *, source: object) -> list[object]:
        self.calls.append("scheduled")
        return []


async def test_only_the_leader_sweeps_and_starts_scheduled_runs() -> None:
    """Issue 21: the recovery sweep and the scheduled starts run on one replica at a
    time; a replica that does not lead ticks and does nothing, until it leads."""
    from bot.slack.recovery_sweep import RecoverySweep
    from bot.slack.scheduled_starts import ScheduledStarts

    leads = False
    ticks = 0

    async def leading() -> bool:
        return leads

    async def tick(_s: float) -> None:
        nonlocal ticks
        ticks += 1
        await asyncio.sleep(0)

    work = _Housekeeping()
    sweep = RecoverySweep(cast(Any, work), cast(Any, work), leading)
    starts = ScheduledStarts(cast(Any, work), cast(Any, work), lambda _run: None, leading)
    sweep.start(every_s=1, sleep=tick)
    starts.start(every_s=1, sleep=tick)
    try:
        await eventually(lambda: ticks >= 20, "both to tick a few times")
        assert work.calls == []
        leads = True
        await eventually(
            lambda: {"recover", "start_due"} <= set(work.calls), "the leader's housekeeping"
        )
    finally:
        await sweep.aclose()
        await starts.aclose()
