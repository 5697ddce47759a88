"""The run life cycle against a real SQLite audit log: every transition, its typed result,
the owner every approved or started run records, and expiry by an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.audit import EXPIRED_SUMMARY
from bot.audit.store import AuditLog, RunRecord, parse_ts
from bot.core.plan import DRY_RUN_APPROVER, Plan, make_plan
from bot.core.policy import Membership
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.lifecycle import (
    AlreadyCounted,
    Approved,
    Cancelled,
    CancelRequested,
    Counted,
    Denied,
    NotCancellable,
    Refusal,
    Refused,
    RunLifecycle,
    TooLate,
)
from bot.errors import LockHeldError
from bot.settings import LOCAL, Settings
from tests.support.audit_db import Target
from tests.support.wall_clock import ManualWallClock

ALICE, BOB, CAROL, MALLORY = "U0ALICE", "U0BOB", "U0CAROL", "U0MALLORY"
APPROVERS = "S0APPROVERS"
MEMBERS: Membership = {APPROVERS: frozenset({BOB, CAROL})}
OWNER = "test-host:4242:777"
TTL_S = 600


def settings(tmp_path: Path | Target, **policy: object) -> Settings:
    """The world's settings; ``tmp_path`` a directory (SQLite file in it) or a database."""
    db = tmp_path / "audit.db" if isinstance(tmp_path, Path) and tmp_path.is_dir() else tmp_path
    return Settings(
        hosts={"gpu1": {"address": LOCAL}, "gpu2": {"address": LOCAL}},
        services={
            "svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/opt/v/bin/python"},
            "other": {"hosts": ["gpu2"], "unit": "vllm-o", "python": "/opt/o/bin/python"},
        },
        policy={"approvers": [APPROVERS], "min_approvals": 1, "approval_ttl_s": TTL_S, **policy},
        db_path=db,
    )


@dataclass
class World:
    settings: Settings
    audit: AuditLog
    clock: ManualWallClock
    life: RunLifecycle

    def plan(
        self, action: Action = Action.RESTART, service: str = "svc", *, dry_run: bool = False
    ) -> Plan:
        return make_plan(self.settings, action, service, dry_run=dry_run)

    async def pending(self, service: str = "svc") -> RunRecord:
        return await self.life.request(
            self.plan(service=service), requested_by=ALICE, source=Source.SLACK, channel="C0OPS"
        )

    async def status(self, run_id: int) -> RunStatus:
        return (await self.audit.get_run(run_id)).status

    async def owners(self) -> dict[int, str | None]:
        """Each approved or running run's owner, as recovery reads it."""
        seen: dict[int, str | None] = {}
        rows = await self.audit.list_runs(statuses=[RunStatus.APPROVED, RunStatus.RUNNING])
        owners: list[str | None] = []

        def alive(owner: str | None) -> bool:
            owners.append(owner)
            return True  # leave them all be: this only reads who owns them

        await self.audit.recover_interrupted(alive)
        for record, owner in zip(sorted(rows, key=lambda r: r.id), owners, strict=True):
            seen[record.id] = owner
        return seen


@pytest.fixture
async def world(audit_target: Target) -> AsyncIterator[World]:
    s = settings(audit_target)
    clock = ManualWallClock()
    async with AuditLog.open(s.db_path) as audit:
        # The windows here end by the test's clock, on either backend (on PostgreSQL the
        # database's clock decides between replicas: tests/test_recovery.py).
        life = RunLifecycle(s, audit, clock=clock, owner=lambda: OWNER, database_clock=False)
        yield World(s, audit, clock, life)


async def test_a_request_holds_its_locks_and_its_window_comes_from_the_clock(world: World) -> None:
    record = await world.pending()
    assert record.status == RunStatus.PENDING_APPROVAL
    assert record.expires_at is not None
    assert (parse_ts(record.expires_at) - world.clock()).total_seconds() == TTL_S
    assert (await world.audit.lock_holder("service:svc")) == await world.audit.get_run(record.id)
    with pytest.raises(LockHeldError) as busy:
        await world.life.request(world.plan(), requested_by=CAROL, source=Source.CLI)
    assert f"svc is busy: run #{record.id}" in str(busy.value) and ALICE in str(busy.value)
    [refused] = await world.audit.list_runs(statuses=[RunStatus.REFUSED])
    assert refused.requested_by == CAROL and (refused.summary or "").startswith("not started")
    assert [r.user for r in await world.audit.refusals()] == [CAROL]


async def test_n_of_m_counts_then_approves_once_and_records_the_owner(audit_target: Target) -> None:
    s = settings(audit_target, min_approvals=2)
    clock = ManualWallClock()
    async with AuditLog.open(s.db_path) as audit:
        w = World(s, audit, clock, RunLifecycle(s, audit, clock=clock, owner=lambda: OWNER))
        record = await w.pending()
        first = await w.life.approve(record.id, user=BOB, membership=MEMBERS)
        assert first == Counted(record.id, 1, 2)
        assert first.text == f"Approval recorded: 1 of 2 for run #{record.id}."
        again = await w.life.approve(record.id, user=BOB, membership=MEMBERS)
        assert again == Refused("You have already approved this (1 of 2 approvals so far).")
        assert await w.status(record.id) == RunStatus.PENDING_APPROVAL
        second = await w.life.approve(record.id, user=CAROL, membership=MEMBERS)
        assert second == Approved(record.id, start=True)
        assert await w.status(record.id) == RunStatus.APPROVED
        assert await w.owners() == {record.id: OWNER}


async def test_a_concurrent_double_click_counts_once(audit_target: Target) -> None:
    s = settings(audit_target, min_approvals=2)
    async with AuditLog.open(s.db_path) as audit:
        life = RunLifecycle(s, audit, clock=ManualWallClock())
        record = await life.request(
            make_plan(s, Action.RESTART, "svc"), requested_by=ALICE, source=Source.SLACK
        )
        results = await asyncio.gather(
            *(life.approve(record.id, user=BOB, membership=MEMBERS) for _ in range(3))
        )
        assert results.count(Counted(record.id, 1, 2)) == 1, results
        # The others were judged before or after the first was recorded: either way a note.
        for other in results:
            if isinstance(other, AlreadyCounted):
                assert other.text == f"Your approve of run #{record.id} was already counted."
            else:
                assert isinstance(other, Counted | Refused), results
        assert (await audit.get_run(record.id)).approved_by == [BOB]


async def test_concurrent_final_approvals_start_the_run_exactly_once(world: World) -> None:
    record = await world.pending()
    results = await asyncio.gather(
        world.life.approve(record.id, user=BOB, membership=MEMBERS),
        world.life.approve(record.id, user=CAROL, membership=MEMBERS),
    )
    starts = [r for r in results if isinstance(r, Approved) and r.start]
    assert len(starts) == 1, results
    assert all(isinstance(r, Approved | Refused) for r in results), results


async def test_self_approval_and_outsiders_are_refused_and_recorded(world: World) -> None:
    record = await world.pending()
    own = await world.life.approve(record.id, user=ALICE, membership=MEMBERS, channel="C0OPS")
    assert isinstance(own, Refused) and "cannot approve your own request" in own.text
    outsider = await world.life.approve(record.id, user=MALLORY, membership=MEMBERS)
    assert isinstance(outsider, Refused) and not outsider.expired
    rows = await world.audit.refusals()
    assert sorted(r.user for r in rows) == [ALICE, MALLORY]
    assert all(r.command == f"approve run #{record.id}" for r in rows)
    assert await world.status(record.id) == RunStatus.PENDING_APPROVAL


async def test_deny_closes_the_request_and_a_later_click_is_refused(world: World) -> None:
    record = await world.pending()
    assert await world.life.deny(record.id, user=CAROL, membership=MEMBERS) == Denied(record.id)
    denied = await world.audit.get_run(record.id)
    assert (denied.status, denied.summary) == (RunStatus.DENIED, f"denied by {CAROL}")
    assert await world.audit.lock_holder("service:svc") is None
    late = await world.life.approve(record.id, user=BOB, membership=MEMBERS)
    assert late == Refused(f"Run #{record.id} is already denied.", code=Refusal.CLOSED)


async def test_a_click_after_the_window_expires_the_request(world: World) -> None:
    record = await world.pending()
    world.clock.advance(TTL_S - 1)
    assert await world.life.expire_overdue() == []
    world.clock.advance(1)  # the deadline itself is late
    late = await world.life.approve(record.id, user=BOB, membership=MEMBERS)
    assert late == Refused(
        "This request has expired; ask for it again.", expired=True, code=Refusal.EXPIRED
    )
    expired = await world.audit.get_run(record.id)
    assert (expired.status, expired.summary) == (RunStatus.EXPIRED, EXPIRED_SUMMARY)
    assert await world.audit.lock_holder("service:svc") is None


async def test_overdue_requests_expire_by_the_clock_and_a_decided_one_does_not(
    world: World,
) -> None:
    overdue = await world.pending()
    decided = await world.pending("other")
    assert await world.life.deny(decided.id, user=BOB, membership=MEMBERS) == Denied(decided.id)
    world.clock.advance(TTL_S)
    assert [r.id for r in await world.life.expire_overdue()] == [overdue.id]
    assert await world.life.expire(decided.id) is False
    assert await world.status(decided.id) == RunStatus.DENIED
    # Closed as expired before this click: its card may still have buttons to remove.
    assert await world.life.deny(overdue.id, user=BOB, membership=MEMBERS) == Refused(
        f"Run #{overdue.id} is already expired.", expired=True, code=Refusal.CLOSED
    )


async def test_a_deny_that_loses_the_race_is_too_late(world: World) -> None:
    record = await world.pending()
    results = await asyncio.gather(
        world.life.approve(record.id, user=BOB, membership=MEMBERS),
        world.life.deny(record.id, user=CAROL, membership=MEMBERS),
    )
    final = await world.status(record.id)
    assert final in (RunStatus.APPROVED, RunStatus.DENIED)
    # Exactly one of the two took effect; the other was refused or too late.
    won = [r for r in results if isinstance(r, Approved | Denied)]
    assert len(won) == 1, results
    lost = next(r for r in results if r not in won)
    assert isinstance(lost, Refused | TooLate), results


async def test_confirm_is_the_system_or_operator_approval_and_records_the_owner(
    world: World,
) -> None:
    record = await world.life.request(
        world.plan(dry_run=True), requested_by=ALICE, source=Source.CLI
    )
    assert await world.life.confirm(record.id, DRY_RUN_APPROVER)
    approved = await world.audit.get_run(record.id)
    assert approved.status == RunStatus.APPROVED and approved.approved_by == [DRY_RUN_APPROVER]
    assert await world.owners() == {record.id: OWNER}
    assert await world.life.confirm(record.id, BOB) is False  # no longer pending


async def test_cancel_before_approval_before_start_while_running_and_after(world: World) -> None:
    pending = await world.pending()
    assert await world.life.cancel(pending.id, user=ALICE, membership=MEMBERS) == Cancelled(
        pending.id, RunStatus.PENDING_APPROVAL
    )
    assert await world.status(pending.id) == RunStatus.CANCELLED

    approved = await world.pending()
    assert await world.life.confirm(approved.id, BOB)
    cancelled = await world.life.cancel(approved.id, user=BOB, membership=MEMBERS)
    assert cancelled == Cancelled(approved.id, RunStatus.APPROVED)
    assert cancelled.text == f"Run #{approved.id} cancelled before it started."

    running = await world.pending()
    assert await world.life.confirm(running.id, BOB)
    token = await world.life.start(running.id)
    assert token is not None and not token.requested
    assert await world.life.cancel(running.id, user=CAROL, membership=MEMBERS) == (
        CancelRequested(running.id)
    )
    assert token.requested_by == CAROL
    await world.life.released(running.id)  # the driver saw it and stopped
    assert await world.life.finish(running.id, RunStatus.CANCELLED, "cancelled at preflight")
    after = await world.life.cancel(running.id, user=CAROL, membership=MEMBERS)
    assert after == NotCancellable(running.id, RunStatus.CANCELLED)
    assert after.text == f"Run #{running.id} has already finished: cancelled."

    cancels = {
        (r.id, d.user)
        for r in (pending, approved, running)
        for d in await world.audit.decisions(r.id)
        if d.decision == Decision.CANCEL
    }
    assert cancels == {(pending.id, ALICE), (approved.id, BOB), (running.id, CAROL)}


async def test_only_the_requester_or_an_approver_may_cancel(world: World) -> None:
    record = await world.pending()
    refused = await world.life.cancel(record.id, user=MALLORY, membership=MEMBERS)
    assert refused == Refused(
        f"Only the requester or an approver of {record.service} can cancel run #{record.id}."
    )
    assert [r.user for r in await world.audit.refusals()] == [MALLORY]
    missing = await world.life.cancel(record.id + 99, user=ALICE, membership=MEMBERS)
    assert isinstance(missing, Refused)
    assert await world.status(record.id) == RunStatus.PENDING_APPROVAL


async def test_a_running_run_driven_elsewhere_is_asked_to_cancel_through_the_database(
    world: World,
) -> None:
    """Issue 21: another replica drives it, so the cancel is left for its driver's next
    heartbeat (tests/test_recovery.py shows the driver picking it up); it stays running
    and owned by its driver meanwhile, and the first who asked is the one recorded."""
    record = await world.pending()
    assert await world.life.confirm(record.id, BOB)
    other = RunLifecycle(
        world.settings, world.audit, clock=world.clock, owner=lambda: "elsewhere:1:1"
    )
    assert await other.start(record.id) is not None
    result = await world.life.cancel(record.id, user=BOB, membership=MEMBERS)
    assert result == CancelRequested(record.id, elsewhere=True)
    assert "another replica" in result.text
    again = await world.life.cancel(record.id, user=ALICE, membership=MEMBERS)
    assert again == CancelRequested(record.id, elsewhere=True)
    run = await world.audit.get_run(record.id)
    assert (run.status, run.cancel_requested_by) == (RunStatus.RUNNING, BOB)
    assert await world.owners() == {record.id: "elsewhere:1:1"}
    await other.released(record.id)


async def test_start_needs_an_approved_run_and_records_its_owner(world: World) -> None:
    record = await world.pending()
    assert await world.life.start(record.id) is None  # still pending: nothing starts
    assert await world.status(record.id) == RunStatus.PENDING_APPROVAL
    assert await world.life.confirm(record.id, BOB)
    assert await world.life.start(record.id) is not None
    started = await world.audit.get_run(record.id)
    assert started.status == RunStatus.RUNNING and started.started_at is not None
    assert await world.owners() == {record.id: OWNER}
    assert await world.life.start(record.id) is None  # a second start is refused


async def test_interrupt_says_what_the_service_may_look_like(world: World) -> None:
    record = await world.pending()
    assert await world.life.confirm(record.id, BOB)
    assert await world.life.start(record.id) is not None
    await world.audit.step_started(record.id, "gpu1", "drain", "nvidia-smi")
    assert await world.life.interrupt(record.id)
    run = await world.audit.get_run(record.id)
    assert run.status == RunStatus.INTERRUPTED and "during step `drain`" in (run.summary or "")
    assert await world.audit.lock_holder("service:svc") is None
