"""Recovery of runs whose driver died (issue 9): the heartbeat watched on the judge's own
(injected) monotonic clock, recovery on the spot when a request meets a dead run's lock,
the operator's ``runs``/``recover`` commands, and the Slack bot's periodic sweep; and two
instances whose wall clocks disagree by 30 s either way (issue 17, F4)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from bot.audit import EXPIRED_SUMMARY, AuditLog, RunRecord, format_ts
from bot.audit.fence import Fence
from bot.audit.journal import Journal
from bot.audit.resilient import AuditWriter
from bot.audit.view import run_view
from bot.core.plan import Plan, make_plan
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.clocks import Monotonic
from bot.engine.heartbeat import LEASE_S, RENEW_EVERY_S, Heartbeat
from bot.engine.leader import Leader
from bot.engine.lifecycle import CancelRequested, Refusal, Refused, RunLifecycle
from bot.engine.liveness import Judge, settling_after_restart
from bot.engine.owner import Owner, process_owner, read_stat, this_namespace
from bot.engine.recovery import (
    RECOVERY_ACTOR,
    Expired,
    Interrupted,
    NotDriven,
    OwnerAlive,
    Recovered,
    interrupted_message,
    recover_by_hand,
    system_judge,
)
from bot.errors import AuditUnavailable, FencedError, LockHeldError
from bot.settings import LOCAL, PostgresUrl, Settings
from bot.sim.kit import SimKit
from tests.polling import eventually
from tests.slack_harness import CHANNEL, SERVICE, blocks_text, buttons, slack_bot
from tests.support.audit_db import Target, db_arg, db_option, raw_rows
from tests.support.cli import cli, cli_on_terminal
from tests.support.clock import ManualClock
from tests.support.postgres import migrate_pg
from tests.support.wall_clock import ManualWallClock

ALICE, BOB = "U0ALICE", "U0BOB"
# A process on another machine (a rescheduled container): only its heartbeat speaks for it.
ELSEWHERE = (
    "rescheduled-pod-7f9c/boot=5e1d0b0e-0000-4000-8000-000000000009/pidns=4026531836:4242:777"
)
LOCKS = ["host:gpu1", "service:svc"]


def dead_local_owner() -> str:
    """The owner string of a process of this machine that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = read_stat(child.pid)
    child.wait()
    return str(
        Owner(socket.gethostname(), child.pid, stat.start_time if stat else "1", this_namespace())
    )


async def driven_by_a_dead_process(audit: AuditLog, run_id: int) -> None:
    """Approve the pending run and make it running under an owner that has died, as if
    a CLI (or another bot) had taken it and been killed."""
    assert await audit.transition(run_id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,))
    assert await audit.transition(
        run_id, RunStatus.RUNNING, owner=dead_local_owner(), expect=(RunStatus.APPROVED,)
    )


def settings(tmp_path: Path | Target) -> Settings:
    """``tmp_path``: a directory (a SQLite file in it) or the audit database itself."""
    db = tmp_path / "audit.db" if isinstance(tmp_path, Path) and tmp_path.is_dir() else tmp_path
    return Settings(
        hosts={"gpu1": {"address": LOCAL}},
        services={"svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/opt/v/bin/python"}},
        policy={"approvers": [BOB], "min_approvals": 1, "approval_ttl_s": 600},
        db_path=db,
    )


@dataclass
class World:
    settings: Settings
    audit: AuditLog
    clock: ManualWallClock
    told: list[Interrupted]
    started: list[tuple[RunLifecycle, int]]
    # This machine's monotonic clock, which every process of the world judges by.
    mono: ManualClock

    def plan(self) -> Plan:
        return make_plan(self.settings, Action.RESTART, "svc")

    def process(self, owner: str | None = None) -> RunLifecycle:
        """One process's life cycle on the shared database and clocks; what it recovers
        on meeting a lock is collected in ``told``."""
        life = RunLifecycle(
            self.settings,
            self.audit,
            clock=self.clock,
            owner=(lambda: owner) if owner else process_owner,
            sleep=self.clock.sleep,
            monotonic=Monotonic(self.mono, "this-machine"),
            # These tests move this machine's clocks by hand: a driver is judged by its
            # heartbeat seen on them, on either backend (the database's clock, which
            # decides between replicas on PostgreSQL, has tests of its own).
            database_clock=False,
        )

        async def tell(item: Interrupted) -> None:
            self.told.append(item)

        life.recovered.append(tell)
        return life

    def judge(self) -> Judge:
        return self.process().judge

    async def beat(self, sleepers: int = 1) -> None:
        """Move the clock one heartbeat period on, once ``sleepers`` heartbeats wait on it."""
        await eventually(lambda: self.clock.sleepers >= sleepers, "the heartbeat to wait", 5)
        self.clock.advance(RENEW_EVERY_S)

    async def running(self, life: RunLifecycle) -> RunRecord:
        """A run ``life`` requested, approved and started."""
        record = await life.request(self.plan(), requested_by=ALICE, source=Source.CLI)
        assert await life.confirm(record.id, ALICE)
        assert await life.start(record.id) is not None
        self.started.append((life, record.id))
        return await self.audit.get_run(record.id)


@asynccontextmanager
async def a_world(target: Target) -> AsyncIterator[World]:
    s = settings(target)
    async with AuditLog.open(s.db_path) as audit:
        w = World(s, audit, ManualWallClock(), [], [], ManualClock())
        yield w
        for life, run_id in w.started:
            await life.released(run_id)  # stops its heartbeat


@pytest.fixture
async def world(audit_target: Target) -> AsyncIterator[World]:
    async with a_world(audit_target) as w:
        yield w


@pytest.fixture
async def sqlite_world(tmp_path: Path) -> AsyncIterator[World]:
    """For the tests of a judge that watches the heartbeat on this machine's clocks from
    another process (a CLI, a second life cycle): on PostgreSQL every process judges by
    the database's clock instead (``test_replicas.py``)."""
    async with a_world(tmp_path / "audit.db") as w:
        yield w


# ---- the lease ---------------------------------------------------------------------------


async def test_an_owner_elsewhere_lives_while_its_heartbeat_renews_and_dies_when_it_stops(
    world: World,
) -> None:
    elsewhere = world.process(owner=ELSEWHERE)
    run = await world.running(elsewhere)
    start = world.clock()
    assert run.lease_until == format_ts(start + timedelta(seconds=LEASE_S))
    assert run.lease_renewals == 0
    here = world.process()
    assert await here.recover() == []  # the first look: it proves nothing either way

    # Each beat moves the lease on and counts one more renewal; each look sees it change.
    for beat in (1, 2):
        await world.beat()
        until = format_ts(start + timedelta(seconds=beat * RENEW_EVERY_S + LEASE_S))

        async def renewed(until: str = until, beat: int = beat) -> bool:
            record = await world.audit.get_run(run.id)
            return (record.lease_until, record.lease_renewals) == (until, beat)

        await eventually(renewed, f"heartbeat {beat}", timeout_s=5)
        world.mono.advance(RENEW_EVERY_S)
        assert await here.recover() == []

    # Its process dies: nothing renews the lease any more (released stops the heartbeat).
    await elsewhere.released(run.id)
    world.mono.advance(LEASE_S - 1)
    assert await here.recover() == []  # not yet a lease without a change
    with pytest.raises(
        LockHeldError,
        match=rf"busy: run #{run.id} .*; the owner of run "
        rf"#{run.id} may be alive \(last heartbeat change seen 29 s ago, by "
        r"this machine's clock\); try again in 1 s or `python -m bot "
        rf"recover {run.id} --force`$",
    ):
        await here.request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert world.told == []

    world.mono.advance(1)  # a whole lease on this machine's clock with nothing changing
    record = await here.request(world.plan(), requested_by=BOB, source=Source.CLI)
    [item] = world.told
    assert item.run.id == run.id and item.run.status == RunStatus.INTERRUPTED
    assert f"Run #{run.id} (restart svc) was interrupted: the command line" in item.message
    assert (await world.audit.lock_holder("service:svc")) == await world.audit.get_run(record.id)


async def test_a_request_meeting_a_dead_owners_lock_recovers_the_run_and_proceeds(
    world: World,
) -> None:
    dead = world.process(owner=dead_local_owner())
    run = await world.running(dead)
    await world.audit.step_started(run.id, "gpu1", "drain", "nvidia-smi")
    await dead.released(run.id)

    here = world.process()
    record = await here.request(world.plan(), requested_by=BOB, source=Source.CLI)

    [item] = world.told
    assert item.run.id == run.id
    assert "during step `drain`" in item.message and "STOPPED" in item.message
    recovered = await world.audit.get_run(run.id)
    assert recovered.status == RunStatus.INTERRUPTED and recovered.summary == item.message
    assert [s.status for s in await world.audit.steps(run.id)] == ["interrupted"]
    assert (RECOVERY_ACTOR, Decision.RECOVER) in [
        (d.user, d.decision) for d in await world.audit.decisions(run.id)
    ]
    assert recovered.recovered_by == [RECOVERY_ACTOR] and recovered.approved_by == [ALICE]
    assert f"; recovered by {RECOVERY_ACTOR}\n" in run_view(recovered, [], [])
    assert (await world.audit.locks_held()) == {record.id: LOCKS}


async def test_a_live_owner_or_a_pending_request_keeps_its_lock(world: World) -> None:
    live = world.process()  # this test's own process: alive
    run = await world.running(live)
    other = world.process()
    with pytest.raises(LockHeldError):
        await other.request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert (await world.audit.get_run(run.id)).status == RunStatus.RUNNING
    assert await live.finish(run.id, RunStatus.SUCCEEDED, "done")
    await live.released(run.id)

    pending = await live.request(world.plan(), requested_by=ALICE, source=Source.SLACK)
    with pytest.raises(LockHeldError):  # awaiting approval: its expiry closes it, not this
        await other.request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert (await world.audit.get_run(pending.id)).status == RunStatus.PENDING_APPROVAL
    assert world.told == []


async def test_a_replica_back_from_an_outage_judges_no_lease_until_drivers_could_renew(
    world: World,
) -> None:
    """Issue 21: every replica's driver fails to renew while the database is away for
    everyone (a restart, a fail-over longer than a lease), so when it answers again every
    lease has run out by its clock. A replica that has not reached it for a lease since
    (or has just started) judges no driver dead, whether a request meets the run's locks
    or a sweep looks: the driver renews first. Only the leader's sweep waited before; a
    request on any replica recovered the live driver's run, fencing it off mid-run."""
    driver = world.process(owner=ELSEWHERE)
    run = await world.running(driver)
    await driver.released(run.id)  # its heartbeat, held up by the outage
    raw_rows(
        world.settings.db_path,
        "UPDATE runs SET lease_expires = lease_expires - 100 WHERE id = ?",
        (run.id,),
    )
    here = RunLifecycle(
        world.settings, world.audit, clock=world.clock, sleep=world.clock.sleep, database_clock=True
    )
    boot = ManualClock()
    leader = Leader(world.audit, "replica-b", ttl_s=10.0, lease_s=LEASE_S, boot_clock=boot)
    here.judge.settling = leader.unsteady_s
    assert await leader.bid()  # the database answers again: reached since now
    with pytest.raises(LockHeldError, match=r"could not reach the database.*try again in 30 s"):
        await here.request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert await here.recover() == []
    assert (await world.audit.get_run(run.id)).status == RunStatus.RUNNING
    boot.advance(LEASE_S)  # reached without a break for a lease: a live driver renewed by now
    assert await leader.bid()
    record = await here.request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert (await world.audit.get_run(run.id)).status == RunStatus.INTERRUPTED
    assert (await world.audit.locks_held()) == {record.id: LOCKS}


async def test_the_command_line_judges_no_lease_until_the_server_ran_for_one(
    tmp_path: Path, pg_url: PostgresUrl
) -> None:
    """Issue 21: a command line looks once, so it cannot wait to reach the database for
    a lease as a replica does. After a PostgreSQL restart every driver's lease has run
    out by its clock while no driver could renew; a `recover` (or a request meeting the
    run's locks) then judges no driver dead until the server has run for one lease."""
    await migrate_pg(pg_url)
    async with a_world(pg_url) as world:
        driver = world.process(owner=ELSEWHERE)
        run = await world.running(driver)
        await driver.released(run.id)  # its heartbeat, held up by the restart
        raw_rows(
            pg_url, "UPDATE runs SET lease_expires = lease_expires - 1e5 WHERE id = ?", (run.id,)
        )
        [(up_s,)] = raw_rows(
            pg_url, "SELECT extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())"
        )
        db, env = db_option(pg_url)
        config = tmp_path / "chatops.toml"
        # The server has run for less than a lease: the driver may not have renewed yet.
        config.write_text(f"[replicas]\nlease_s = {float(up_s) + 3600!r}\n")
        code, _, err = await cli("recover", str(run.id), "--yes", *db, cwd=tmp_path, env=env)
        assert code == 1 and "the database server was restarting" in err, err
        assert "try again in" in err and f"recover {run.id} --force" in err
        assert (await world.audit.get_run(run.id)).status == RunStatus.RUNNING
        # For more than a lease: a live driver has renewed by now; this one is dead.
        lease_s = float(up_s) / 2
        config.write_text(f"[replicas]\nlease_s = {lease_s!r}\nrenew_every_s = {lease_s / 4!r}\n")
        code, out, err = await cli("recover", str(run.id), "--yes", *db, cwd=tmp_path, env=env)
        assert code == 0 and f"Run #{run.id} (restart svc) was interrupted" in out, err
        assert (await world.audit.get_run(run.id)).status == RunStatus.INTERRUPTED


class ServerUp:
    """An audit log whose database server has run for ``up_s`` (None: SQLite), or whose
    read of it fails with ``up_s``."""

    def __init__(self, up_s: float | Exception | None) -> None:
        self.up_s = up_s

    async def server_up_s(self) -> float | None:
        if isinstance(self.up_s, Exception):
            raise self.up_s
        return self.up_s


@pytest.mark.parametrize(
    ("up_s", "settles_s"),
    [
        (10.0, 20.0),  # the rest of the lease
        (45.0, 0.0),  # ran for more than a lease: judged at once
        # The read failed: cannot tell, so as if the server had just started.
        (AuditUnavailable("audit database: connection refused"), 30.0),
        # Its clock set back an hour since it started: as if just started, not an hour
        # and a lease.
        (-3600.0, 30.0),
    ],
)
async def test_the_command_lines_settling_is_at_most_one_lease(
    up_s: float | Exception, settles_s: float
) -> None:
    now = [100.0]
    settling = await settling_after_restart(
        ServerUp(up_s),  # type: ignore[arg-type]  # only server_up_s is asked
        30.0,
        monotonic=lambda: now[0],
    )
    assert settling is not None and settling() == settles_s
    now[0] += settles_s
    assert settling() == 0.0


async def test_the_command_line_on_sqlite_settles_nothing() -> None:
    assert await settling_after_restart(ServerUp(None), 30.0) is None  # type: ignore[arg-type]


async def test_a_heartbeat_that_finds_its_run_recovered_asks_it_to_stop(world: World) -> None:
    run = await world.running(world.process(owner=ELSEWHERE))
    lost: list[bool] = []
    beat = Heartbeat(
        world.audit,
        run.id,
        ELSEWHERE,
        clock=world.clock,
        sleep=world.clock.sleep,
        margin_s=world.settings.lease_margin_s(),
        lost=lambda: lost.append(True),
    ).start()
    try:
        await world.beat(sleepers=2)  # the run's own heartbeat, and this one
        await eventually(lambda: beat.renewals == 1, "a renewal", timeout_s=5)
        result = await recover_by_hand(
            world.audit, run.id, by="cli:op@host", force=True, judge=world.judge()
        )
        assert isinstance(result, Recovered)
        await world.beat(sleepers=2)  # both beat again; this one finds the run gone
        await eventually(lambda: lost, "the heartbeat to notice", timeout_s=5)
        assert beat.renewals == 1
    finally:
        await beat.stop()


async def test_a_cancel_asked_on_another_replica_reaches_the_driver_at_its_next_heartbeat(
    world: World,
) -> None:
    """Issue 21: the cancel is asked where the click landed; the driving process hears it
    through its heartbeat and its token is set, named for who asked."""
    elsewhere = world.process(owner=ELSEWHERE)
    record = await elsewhere.request(world.plan(), requested_by=ALICE, source=Source.CLI)
    assert await elsewhere.confirm(record.id, ALICE)
    token = await elsewhere.start(record.id)
    assert token is not None and token.epoch == (await world.audit.get_run(record.id)).epoch
    world.started.append((elsewhere, record.id))
    result = await world.process().cancel(record.id, user=BOB, membership={})
    assert result == CancelRequested(record.id, elsewhere=True)
    assert not token.requested
    await world.beat()
    await eventually(lambda: token.requested, "the driver to hear the cancel", timeout_s=5)
    assert token.requested_by == BOB


async def test_a_driver_whose_run_was_recovered_is_fenced_off_writes_and_actions(
    world: World,
) -> None:
    """Issue 21: recovering a run moves its epoch on; its old driver (paused past its
    lease, say) can then neither write as its owner nor renew its lease, and its lease,
    asked before each action on a host, says no."""
    elsewhere = world.process(owner=ELSEWHERE)
    record = await elsewhere.request(world.plan(), requested_by=ALICE, source=Source.CLI)
    assert await elsewhere.confirm(record.id, ALICE)
    token = await elsewhere.start(record.id)
    assert token is not None and token.epoch is not None and token.lease is not None
    world.started.append((elsewhere, record.id))
    writer = AuditWriter(world.audit, Journal.for_db(Path("/nonexistent/audit.db")))
    fence = Fence(record.id, token.epoch)
    await writer.write_all([writer.step_started_record(record.id, "gpu1", "stop", "x")], fence)
    result = await recover_by_hand(
        world.audit, record.id, by="cli:op@host", force=True, judge=world.judge()
    )
    assert isinstance(result, Recovered)
    recovered = await world.audit.get_run(record.id)
    assert recovered.epoch == token.epoch + 1
    with pytest.raises(FencedError, match=rf"run #{record.id} is no longer"):
        await writer.write_all(
            [writer.step_started_record(record.id, "gpu1", "start", "systemctl start")], fence
        )
    assert [s.step for s in await world.audit.steps(record.id)] == ["stop"]
    assert writer.down is None  # fenced is no outage: nothing went to the journal
    # Its next heartbeat finds the run gone: from then on its lease holds no more.
    await world.beat()
    await eventually(lambda: token.requested, "the heartbeat to find the run gone", 5)
    assert not await token.lease.holds()


async def test_a_start_whose_run_was_recovered_before_it_read_its_epoch_drives_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: exactly one driver. A start takes the run, then reads the epoch it took;
    paused past its lease between the two (a GC pause, a frozen VM) while another replica
    recovered the run, it reads the recovery's epoch. It must not drive with that as its
    fencing token: its writes would pass the fence and it would act on the hosts of a
    run that is no longer its own, its locks already released."""
    elsewhere = world.process(owner=ELSEWHERE)
    record = await elsewhere.request(world.plan(), requested_by=ALICE, source=Source.CLI)
    assert await elsewhere.confirm(record.id, ALICE)
    get_run = world.audit.get_run

    async def recovered_meanwhile(run_id: int) -> RunRecord:
        monkeypatch.setattr(world.audit, "get_run", get_run)
        result = await recover_by_hand(
            world.audit, run_id, by="cli:op@host", force=True, judge=world.judge()
        )
        assert isinstance(result, Recovered)
        return await get_run(run_id)

    monkeypatch.setattr(world.audit, "get_run", recovered_meanwhile)
    token = await elsewhere.start(record.id)
    if token is not None:
        world.started.append((elsewhere, record.id))
    assert token is None
    assert (await world.audit.get_run(record.id)).status == RunStatus.INTERRUPTED


async def test_a_lease_asks_the_database_once_its_own_clock_says_it_ran_out(
    world: World,
) -> None:
    """Before each action the executor asks the lease: while it is fresh by the clock
    that counts a pause (CLOCK_BOOTTIME), no round trip; once a pause has outlasted it,
    the database decides, and a run recovered meanwhile is no longer this process's."""
    elsewhere = world.process(owner=ELSEWHERE)
    run = await world.running(elsewhere)
    boot = ManualClock()
    lease = Heartbeat(
        world.audit,
        run.id,
        ELSEWHERE,
        clock=world.clock,
        margin_s=world.settings.lease_margin_s(),
        epoch=run.epoch,
        boot_clock=boot,
    )
    assert await lease.holds() and lease.renewals == 0  # fresh: nothing asked
    boot.advance(LEASE_S)  # a pause as long as the lease: the database is asked, and renews
    assert await lease.holds() and lease.renewals == 1
    result = await recover_by_hand(
        world.audit, run.id, by="cli:op@host", force=True, judge=world.judge()
    )
    assert isinstance(result, Recovered)
    assert await lease.holds()  # still fresh by its own clock
    boot.advance(LEASE_S)  # paused again past it: the database says the run is gone
    assert not await lease.holds()
    assert not await lease.holds() and lease.renewals == 1  # and it stays gone


async def test_a_lease_counts_an_ssh_connect_and_a_commands_start_as_already_spent(
    world: World,
) -> None:
    """Fencing ends at the bot: the command reaches the host a connect and a command's
    start after the lease was asked. A host whose connect may take 20 s makes the margin
    22 s, so 9 s before the database's end the driver asks the database again (with a
    fixed 5 s margin it went on, and could reach the host after the run was taken over)."""
    far = {"address": "10.0.0.9", "known_hosts": "/tmp/kh", "connect_timeout_s": 20.0}
    world.settings = Settings(
        **{
            **world.settings.model_dump(),
            "hosts": {**{n: h.model_dump() for n, h in world.settings.hosts.items()}, "far": far},
        }
    )
    assert world.settings.lease_margin_s() == 22.0
    # The bot's own driver counts it so.
    life = world.process(owner=ELSEWHERE)
    record = await life.request(world.plan(), requested_by=ALICE, source=Source.CLI)
    assert await life.confirm(record.id, ALICE)
    token = await life.start(record.id)
    assert token is not None
    world.started.append((life, record.id))
    assert isinstance(token.lease, Heartbeat) and token.lease.margin_s == 22.0
    run = await world.audit.get_run(record.id)
    boot = ManualClock()
    lease = Heartbeat(
        world.audit,
        run.id,
        ELSEWHERE,
        clock=world.clock,
        margin_s=world.settings.lease_margin_s(),
        epoch=run.epoch,
        boot_clock=boot,
    )
    boot.advance(LEASE_S - 22.0 - 1.0)
    assert await lease.holds() and lease.renewals == 0  # more than the margin left
    boot.advance(2.0)
    assert await lease.holds() and lease.renewals == 1  # within it: the database is asked
    # The renewed lease keeps the same margin (counted from when it was asked).
    boot.advance(LEASE_S - 22.0 - 1.0)
    assert await lease.holds() and lease.renewals == 1
    boot.advance(2.0)
    assert await lease.holds() and lease.renewals == 2


def test_a_lease_no_longer_than_its_margin_is_refused_naming_both() -> None:
    """An SRE's config: a host whose SSH connect may take 30 s, and the default lease
    (30 s). The driver could reach the host after its lease ran out: refused, naming the
    lease, the host's connect timeout and the margin they make. A lease past it loads."""
    host = {"address": "10.0.0.9", "known_hosts": "/tmp/kh", "connect_timeout_s": 30}
    with pytest.raises(ValueError) as refused:
        Settings(hosts={"gpu-far": host})
    said = str(refused.value)
    assert "replicas.lease_s (30) must exceed the lease margin (32 s" in said
    assert "hosts.gpu-far.connect_timeout_s = 30" in said
    ok = Settings(hosts={"gpu-far": host}, replicas={"lease_s": 45, "renew_every_s": 5})
    assert ok.lease_margin_s() == 32.0
    # A local host needs no connect: its margin is a command's start alone.
    assert Settings(hosts={"here": {"address": LOCAL}}).lease_margin_s() == 2.0


# ---- a request nobody approved in time -------------------------------------------------------


async def test_an_overdue_request_is_expired_when_a_request_meets_its_lock(world: World) -> None:
    # A Slack request, and no bot running to expire it when its window closes.
    slack = world.process()
    pending = await slack.request(world.plan(), requested_by=ALICE, source=Source.SLACK)
    cli_process = world.process()
    closed: list[RunRecord] = []

    async def on_closed(run: RunRecord) -> None:
        closed.append(run)

    cli_process.expired.append(on_closed)
    world.clock.advance(599)  # its window is 600 s: still open
    with pytest.raises(LockHeldError, match=f"busy: run #{pending.id}"):
        await cli_process.request(world.plan(), requested_by=BOB, source=Source.CLI)
    waiting = await recover_by_hand(world.audit, pending.id, by="cli:op@host", judge=world.judge())
    assert isinstance(waiting, NotDriven)
    assert f"awaiting approval until {pending.expires_at}" in waiting.reason
    assert (await world.audit.get_run(pending.id)).status == RunStatus.PENDING_APPROVAL

    world.clock.advance(1)  # the deadline itself is late, as for a click
    record = await cli_process.request(world.plan(), requested_by=BOB, source=Source.CLI)
    expired = await world.audit.get_run(pending.id)
    # Recorded as a timer's expiry is: the status and summary, no 'recover' decision.
    assert (expired.status, expired.summary) == (RunStatus.EXPIRED, EXPIRED_SUMMARY)
    assert await world.audit.decisions(pending.id) == []
    assert [r.id for r in closed] == [pending.id] and world.told == []
    assert (await world.audit.locks_held()) == {record.id: LOCKS}


async def test_recover_by_hand_expires_an_overdue_request(world: World) -> None:
    pending = await world.process().request(world.plan(), requested_by=ALICE, source=Source.SLACK)
    world.clock.advance(600)
    result = await recover_by_hand(world.audit, pending.id, by="cli:op@host", judge=world.judge())
    assert isinstance(result, Expired) and result.run.status == RunStatus.EXPIRED
    assert f"window closed at {pending.expires_at}: it is now expired" in result.message
    assert (await world.audit.get_run(pending.id)).summary == EXPIRED_SUMMARY
    assert (await world.audit.locks_held()) == {}
    # Unlike a timer's expiry (or a request's meeting its lock), the operator's is theirs.
    assert [(d.user, d.decision) for d in await world.audit.decisions(pending.id)] == [
        ("cli:op@host", Decision.RECOVER)
    ]
    assert result.run.recovered_by == ["cli:op@host"]


async def test_recover_from_the_command_line_expires_an_overdue_request(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    db = ["--db", db_arg(world.settings.db_path)]
    life = world.process()
    # The command line judges by the wall clock: one request made an hour ago (its window
    # of 600 s is over), one made now.
    now = world.clock.now
    world.clock.now = now - timedelta(hours=1)
    old = await life.request(world.plan(), requested_by=ALICE, source=Source.SLACK)
    world.clock.now = now
    code, out, err = await cli("recover", str(old.id), *db, cwd=tmp_path)
    assert code == 0, err
    assert f"Run #{old.id} (restart svc), requested by {ALICE}, was still awaiting" in out
    assert (await world.audit.get_run(old.id)).status == RunStatus.EXPIRED
    assert (await world.audit.locks_held()) == {}
    # Who expired it is recorded as who recovers a run is, and shows in the audit log.
    [decision] = await world.audit.decisions(old.id)
    assert decision.decision == Decision.RECOVER and decision.user.startswith("cli:")
    code, out, err = await cli("audit", "--json", *db, cwd=tmp_path)
    assert code == 0, err
    assert (_runs(out)[old.id]["status"], _runs(out)[old.id]["recovered_by"]) == (
        "expired",
        [decision.user],
    )

    new = await life.request(world.plan(), requested_by=ALICE, source=Source.SLACK)
    code, out, err = await cli("recover", str(new.id), "--yes", *db, cwd=tmp_path)
    assert code == 1 and f"awaiting approval until {new.expires_at}" in err
    assert (await world.audit.get_run(new.id)).status == RunStatus.PENDING_APPROVAL


async def test_on_postgresql_a_cards_window_ends_by_the_databases_clock(
    tmp_path: Path, pg_url: PostgresUrl
) -> None:
    """Replicas (issue 21): whichever process asked, a request's window ends by the clock
    every replica shares; a CLI expires it then, not after watching it for a window of its
    own, and until then says how long is left by that clock."""
    await migrate_pg(pg_url)
    base = settings(pg_url)

    def with_ttl(ttl_s: int) -> Settings:
        return base.model_copy(
            update={"policy": base.policy.model_copy(update={"approval_ttl_s": ttl_s})}
        )

    db, env = db_option(pg_url)
    async with AuditLog.open(pg_url) as audit:
        # Asked by a process whose wall clock is an hour behind: its own deadline says
        # nothing to the others.
        clock = ManualWallClock()
        clock.now = clock.now - timedelta(hours=1)

        def request(s: Settings) -> Awaitable[RunRecord]:
            life = RunLifecycle(s, audit, clock=clock, wall_id="another-machine")
            plan = make_plan(s, Action.RESTART, "svc")
            return life.request(plan, requested_by=ALICE, source=Source.SLACK)

        # A window long enough that a CLI started on a loaded machine still finds it open
        # (a 2 s one was over before the interpreter had started).
        pending = await request(with_ttl(600))
        assert pending.expires_left_s is not None and 590 < pending.expires_left_s <= 600
        code, _, err = await cli("recover", str(pending.id), "--yes", *db, cwd=tmp_path, env=env)
        assert code == 1 and "more by the database's clock" in err, err
        assert (await audit.get_run(pending.id)).status == RunStatus.PENDING_APPROVAL
        await RunLifecycle(with_ttl(600), audit).withdraw(pending.id, "the test is done with it")

        # A window of 1 s: once the database's clock says it is over (however late this
        # machine notices), a CLI expires it.
        short = await request(with_ttl(1))

        async def window_over() -> bool:
            run = await audit.get_run(short.id)
            return run.expires_left_s is not None and run.expires_left_s <= 0

        await eventually(window_over, "the window to end by the database's clock", 30)
        code, out, err = await cli("recover", str(short.id), *db, cwd=tmp_path, env=env)
        assert code == 0, err
        assert "was still awaiting" in out
        assert (await audit.get_run(short.id)).status == RunStatus.EXPIRED


async def test_the_bot_closes_the_card_of_an_overdue_request_it_or_a_cli_expired(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock()
    async with slack_bot(tmp_path, sim_host, clock=clock) as bot:
        await bot.command(f"restart {SERVICE}")
        first = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await eventually(lambda: bot.front_end.timers.armed(first.id), "the expiry timer")
        # Its timer has not fired yet when a request meets the lock after the deadline.
        bot.front_end.timers.disarm(first.id)
        clock.advance(600)
        await bot.command(f"restart {SERVICE}")
        second = await bot.wait_for_run(
            lambda r: r.id != first.id and r.message_ts is not None, "the second card"
        )
        assert (await bot.run(first.id)).status == RunStatus.EXPIRED
        await bot.fake.wait_for(
            lambda: "Approve" not in buttons(bot.fake.message(CHANNEL, first.message_ts or "")),
            what="the first card to lose its buttons",
        )
        assert "Approve" in buttons(await bot.card(second.id))

        # A CLI with no bot watching the deadline expired it: the card still offers
        # Approve until someone clicks it, then it says what happened.
        cli_process = RunLifecycle(
            bot.runtime.settings, bot.runtime.audit, clock=lambda: clock() + timedelta(seconds=600)
        )
        bot.front_end.timers.disarm(second.id)
        await cli_process.request(
            make_plan(bot.runtime.settings, Action.RESTART, SERVICE),
            requested_by="cli:op@host",
            source=Source.CLI,
        )
        assert (await bot.run(second.id)).status == RunStatus.EXPIRED
        assert "Approve" in buttons(await bot.card(second.id))
        await bot.click("approve", second.id, user=BOB)
        notes = await bot.ephemerals_for(BOB)
        assert "already expired" in notes[-1]["text"]
        await bot.fake.wait_for(
            lambda: "Approve" not in buttons(bot.fake.message(CHANNEL, second.message_ts or "")),
            what="the second card to lose its buttons",
        )
        assert "expired" in blocks_text(await bot.card(second.id))


async def test_an_expiry_timer_that_finds_a_cli_expired_its_request_closes_the_card(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock()
    async with slack_bot(tmp_path, sim_host, clock=clock) as bot:
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await eventually(lambda: bot.front_end.timers.armed(record.id), "the expiry timer")
        # A CLI whose clock is past the deadline before the bot's timer fires.
        cli_process = RunLifecycle(
            bot.runtime.settings, bot.runtime.audit, clock=lambda: clock() + timedelta(seconds=600)
        )
        await cli_process.request(
            make_plan(bot.runtime.settings, Action.RESTART, SERVICE),
            requested_by="cli:op@host",
            source=Source.CLI,
        )
        assert (await bot.run(record.id)).status == RunStatus.EXPIRED
        assert "Approve" in buttons(await bot.card(record.id))
        clock.advance(600)
        await bot.fake.wait_for(
            lambda: "Approve" not in buttons(bot.fake.message(CHANNEL, record.message_ts or "")),
            what="the card to lose its buttons",
        )
        assert "expired" in blocks_text(await bot.card(record.id))


# ---- by hand -------------------------------------------------------------------------------


async def test_recover_by_hand_refuses_a_live_owner_unless_forced(world: World) -> None:
    run = await world.running(world.process())  # owned by this (live) process
    refused = await recover_by_hand(world.audit, run.id, by="cli:op@host", judge=world.judge())
    assert isinstance(refused, OwnerAlive) and "--force" in refused.reason
    assert (await world.audit.get_run(run.id)).status == RunStatus.RUNNING
    assert (await world.audit.locks_held()) == {run.id: LOCKS}

    forced = await recover_by_hand(
        world.audit, run.id, by="cli:op@host", force=True, judge=world.judge()
    )
    assert isinstance(forced, Recovered)
    assert forced.item.run.status == RunStatus.INTERRUPTED
    assert (await world.audit.locks_held()) == {}
    assert ("cli:op@host", Decision.RECOVER) in [
        (d.user, d.decision) for d in await world.audit.decisions(run.id)
    ]

    again = await recover_by_hand(
        world.audit, run.id, by="cli:op@host", force=True, judge=world.judge()
    )
    assert isinstance(again, NotDriven) and "is interrupted" in again.reason


def _runs(out: str) -> dict[int, dict[str, object]]:
    return {row["id"]: row for row in json.loads(out)}


async def test_runs_and_recover_from_the_command_line(sqlite_world: World, tmp_path: Path) -> None:
    world = sqlite_world
    finished = await world.running(world.process())
    assert await world.process().finish(finished.id, RunStatus.SUCCEEDED, "done")
    live = await world.running(world.process())  # this process owns it: alive
    db = ["--db", db_arg(world.settings.db_path)]

    code, out, err = await cli("runs", "--active", "--json", *db, cwd=tmp_path)
    assert code == 0, err
    [row] = _runs(out).values()
    assert (row["id"], row["status"], row["owner"], row["owner_alive"]) == (
        live.id,
        "running",
        process_owner(),
        True,
    )
    assert row["locks"] == LOCKS and row["lease_until"] == live.lease_until
    assert (row["owner_judged_by"], row["heartbeat_unchanged_s"], row["lease_renewals"]) == (
        "process",
        None,
        0,
    )
    code, out, err = await cli("runs", *db, cwd=tmp_path)
    assert code == 0 and "OWNER" in out and process_owner() in out and "LEASE UNTIL" in out
    assert "JUDGED BY" in out and " process " in out

    # A live owner: refused (and recorded) before anyone is asked to confirm.
    code, out, err = await cli("recover", str(live.id), *db, cwd=tmp_path)
    assert code == 1 and "refused" in err and "--force" in err
    assert (await world.audit.get_run(live.id)).status == RunStatus.RUNNING
    [refusal] = await world.audit.refusals(1)
    assert refusal.user.startswith("cli:") and refusal.command == f"recover run #{live.id}"
    code, _, err = await cli("recover", str(live.id), "--force", *db, cwd=tmp_path)
    # Off a terminal, only --yes confirms, and the refusal says so.
    assert code == 2 and "not confirmed (use --yes when not on a terminal)" in err
    assert (await world.audit.get_run(live.id)).status == RunStatus.RUNNING
    # On a terminal the operator said no: that is all there is to say.
    code, _, err = await cli_on_terminal(
        "recover", str(live.id), "--force", *db, answer="n\n", cwd=tmp_path
    )
    assert code == 5 and "Mark run" in err, err
    assert err.endswith("not confirmed: nothing was done\n"), err
    assert (await world.audit.get_run(live.id)).status == RunStatus.RUNNING

    code, out, err = await cli("recover", str(live.id), "--force", "--yes", *db, cwd=tmp_path)
    assert code == 0, err
    assert f"Run #{live.id} (restart svc) was interrupted" in out
    assert "`/vllm status svc` (or `python -m bot status svc`)" in out
    record = await world.audit.get_run(live.id)
    assert record.status == RunStatus.INTERRUPTED and (record.summary or "?") in out
    assert (await world.audit.locks_held()) == {}
    [decision] = [d for d in await world.audit.decisions(live.id) if d.decision == Decision.RECOVER]
    assert decision.user == refusal.user  # cli:<user>@<host>
    # Who recovered it shows in the audit log's views, beside who approved it.
    code, out, err = await cli("audit", "--run", str(live.id), *db, cwd=tmp_path)
    assert code == 0 and f"; recovered by {refusal.user}\n" in out, err
    code, out, err = await cli("audit", "--json", *db, cwd=tmp_path)
    assert code == 0, err
    assert _runs(out)[live.id]["recovered_by"] == [refusal.user]
    assert _runs(out)[finished.id]["recovered_by"] == []

    code, out, err = await cli("recover", str(live.id), "--yes", *db, cwd=tmp_path)
    assert code == 1 and "only a running or approved run" in err
    code, out, err = await cli("runs", "--active", *db, cwd=tmp_path)
    assert (code, out) == (0, "no active runs\n"), err


async def test_the_command_line_judges_an_owner_elsewhere_by_its_heartbeat(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    # Its owner is on another machine: `runs` says what this machine has seen of its
    # heartbeat, and `recover` refuses with when to try again, or --force.
    run = await world.running(world.process(owner=ELSEWHERE))
    db = ["--db", db_arg(world.settings.db_path)]
    code, out, err = await cli("runs", "--active", "--json", *db, cwd=tmp_path)
    assert code == 0, err
    [row] = _runs(out).values()
    assert (row["owner"], row["owner_alive"], row["owner_judged_by"]) == (ELSEWHERE, True, "lease")
    assert row["lease_renewals"] == 0 and isinstance(row["heartbeat_unchanged_s"], float)
    code, out, err = await cli("runs", *db, cwd=tmp_path)
    assert code == 0 and "lease, unchanged" in out, err
    code, out, err = await cli("recover", str(run.id), "--yes", *db, cwd=tmp_path)
    assert code == 1, err
    assert f"refused: run #{run.id} is running and the owner of run #{run.id} may be alive" in err
    assert "try again in" in err and f"`python -m bot recover {run.id} --force`" in err
    assert (await world.audit.get_run(run.id)).status == RunStatus.RUNNING
    code, out, err = await cli("recover", str(run.id), "--force", "--yes", *db, cwd=tmp_path)
    assert code == 0 and f"Run #{run.id} (restart svc) was interrupted" in out, err


async def test_the_operator_commands_explain_their_arguments(tmp_path: Path) -> None:
    code, out, _ = await cli("runs", "--help", cwd=tmp_path)
    assert code == 0 and "the newest N runs" in out and "a JSON array" in out
    code, out, _ = await cli("recover", "--help", cwd=tmp_path)
    assert code == 0 and "the run's id, as `runs` or the busy refusal names it" in out


async def test_the_interrupted_message_names_what_drove_the_run(world: World) -> None:
    # A demo run is driven by `python -m bot demo`, not by a bot; a Slack run by the bot.
    for source, driver in (
        (Source.DEMO, "the demo (`python -m bot demo`)"),
        (Source.SLACK, "the bot"),
        (Source.CLI, "the command line (`python -m bot`)"),
    ):
        life = world.process()
        record = await life.request(world.plan(), requested_by=ALICE, source=source)
        assert await life.confirm(record.id, BOB)
        assert interrupted_message(await world.audit.get_run(record.id)).startswith(
            f"Run #{record.id} (restart svc) was approved, but {driver} stopped before"
        )
        assert await life.start(record.id) is not None
        world.started.append((life, record.id))
        message = interrupted_message(await world.audit.get_run(record.id))
        assert f"was interrupted: {driver} stopped before its first step" in message
        assert message.endswith(
            "Check with `/vllm status svc` (or `python -m bot status "
            "svc`) before doing anything else."
        )
        assert await life.finish(record.id, RunStatus.SUCCEEDED, "done")  # frees the lock


# ---- the Slack bot's sweep -------------------------------------------------------------------


async def test_the_sweep_recovers_a_run_whose_owner_died_and_tells_its_thread(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock()
    async with slack_bot(tmp_path, sim_host) as bot:
        bot.front_end.start_sweep(every_s=60, sleep=clock.sleep)
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        # A CLI (or another bot) took the run and died while nobody asked for the service.
        audit = bot.runtime.audit
        await driven_by_a_dead_process(audit, record.id)
        await audit.step_started(record.id, "gpu-node-1", "stop", "systemctl stop")
        await eventually(lambda: clock.sleepers, "the sweep to wait", timeout_s=5)
        assert (await bot.run(record.id)).status == RunStatus.RUNNING

        clock.advance(60)
        await bot.wait_status(record.id, "interrupted", timeout_s=5)
        told = await eventually(
            lambda: [
                m
                for m in bot.fake.thread("C0OPS", record.message_ts or "")[1:]
                if "was interrupted" in blocks_text(m)
            ],
            "the thread to be told",
            5,
        )
        assert "during step `stop`" in blocks_text(told[0])
        assert "interrupted" in blocks_text(await bot.card(record.id))
        assert await audit.locks_held() == {}


async def test_the_sweep_is_the_second_look_that_ends_an_owner_only_its_heartbeat_vouches_for(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock, mono = ManualWallClock(), ManualClock()
    async with slack_bot(tmp_path, sim_host) as bot:
        # The bot's monotonic clock, moved by the test from here on.
        bot.runtime.lifecycle.judge.monotonic = Monotonic(mono, "the-bots-machine")
        bot.front_end.start_sweep(every_s=60, sleep=clock.sleep)
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        # A bot on another machine took the run and died: no process here to look at.
        audit = bot.runtime.audit
        assert await audit.transition(
            record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
        )
        assert await audit.transition(
            record.id, RunStatus.RUNNING, owner=ELSEWHERE, expect=(RunStatus.APPROVED,)
        )

        async def sweep() -> None:
            await eventually(lambda: clock.sleepers, "the sweep to wait", timeout_s=5)
            mono.advance(60)
            clock.advance(60)
            await eventually(lambda: clock.sleepers, "the sweep to look", timeout_s=5)

        await sweep()  # the first look: its heartbeat, as it is now, seen at this time
        assert (await bot.run(record.id)).status == RunStatus.RUNNING
        await sweep()  # a minute on, nothing changed: dead
        await bot.wait_status(record.id, "interrupted", timeout_s=5)
        await eventually(
            lambda: [
                m
                for m in bot.fake.thread(CHANNEL, record.message_ts or "")[1:]
                if "was interrupted" in blocks_text(m)
            ],
            "the thread to be told",
            5,
        )
        assert await audit.locks_held() == {}


async def test_a_request_meeting_a_dead_runs_lock_tells_its_thread_and_posts_a_card(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:  # no sweep: only the request finds it
        await bot.command(f"restart {SERVICE}")
        old = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        audit = bot.runtime.audit
        await driven_by_a_dead_process(audit, old.id)
        await audit.step_started(old.id, "gpu-node-1", "drain", "nvidia-smi")

        await bot.command(f"restart {SERVICE}", user=BOB)
        new = await bot.wait_for_run(
            lambda r: r.id != old.id and r.message_ts is not None, "the new request's card"
        )
        assert new.status == RunStatus.PENDING_APPROVAL
        assert "Approve" in buttons(await bot.card(new.id))
        assert (await bot.run(old.id)).status == RunStatus.INTERRUPTED
        told = await eventually(
            lambda: [
                m
                for m in bot.fake.thread(CHANNEL, old.message_ts or "")[1:]
                if "was interrupted" in blocks_text(m)
            ],
            "the old thread to be told",
            5,
        )
        assert "during step `drain`" in blocks_text(told[0])
        assert "interrupted" in blocks_text(await bot.card(old.id))
        assert await audit.locks_held() == {new.id: ["host:gpu-node-1", f"service:{SERVICE}"]}


async def test_a_slack_run_recovered_by_a_cli_is_told_in_its_thread_once(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock()
    async with slack_bot(tmp_path, sim_host) as bot:
        bot.front_end.start_sweep(every_s=60, sleep=clock.sleep)
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        audit = bot.runtime.audit
        await driven_by_a_dead_process(audit, record.id)
        # A CLI met the dead run's lock and recovered it; a CLI cannot post to Slack.
        assert isinstance(
            await recover_by_hand(audit, record.id, by="cli:op@host", judge=system_judge(600)),
            Recovered,
        )
        ts = record.message_ts or ""

        def told() -> list[str]:
            return [
                blocks_text(m)
                for m in bot.fake.thread("C0OPS", ts)[1:]
                if "was interrupted" in blocks_text(m)
            ]

        for _ in range(2):  # told at the first sweep, and not again at the next
            await eventually(lambda: clock.sleepers, "the sweep to wait", timeout_s=5)
            clock.advance(60)
            await eventually(told, "the thread to be told", timeout_s=5)
        await eventually(lambda: clock.sleepers, "the sweep to wait again", timeout_s=5)
        assert len(told()) == 1
        assert "interrupted" in blocks_text(await bot.card(record.id))


# ---- two instances whose wall clocks disagree (issue 17, F4) ---------------------------

TTL_S = 600


def two_services(tmp_path: Path) -> Settings:
    return Settings(
        hosts={"gpu1": {"address": LOCAL}, "gpu2": {"address": LOCAL}},
        services={
            "svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/opt/v/bin/python"},
            "svc2": {"hosts": ["gpu2"], "unit": "vllm-svc2", "python": "/opt/w/bin/python"},
        },
        policy={"approvers": [BOB], "min_approvals": 1, "approval_ttl_s": TTL_S},
        db_path=tmp_path / "audit.db",
    )


@dataclass
class Instance:
    """One bot instance on its own machine: its own connection to the shared file, its
    own wall clock (skewed against the other's) and monotonic clock, and an owner string
    no other machine can judge by its process."""

    name: str
    settings: Settings
    audit: AuditLog
    wall: ManualWallClock
    mono: ManualClock
    life: RunLifecycle

    @classmethod
    def on(cls, name: str, settings: Settings, audit: AuditLog, wall: ManualWallClock) -> Instance:
        mono = ManualClock()
        owner = (
            f"machine-{name}/boot=00000000-0000-4000-8000-00000000000{len(name)}"
            f"{name[0]}/pidns=4026531836:4242:777"
        )
        life = RunLifecycle(
            settings,
            audit,
            clock=wall,
            owner=lambda: owner,
            sleep=wall.sleep,
            monotonic=Monotonic(mono, f"machine-{name}"),
            wall_id=f"machine-{name}",
        )
        return cls(name, settings, audit, wall, mono, life)

    async def running(self, service: str) -> RunRecord:
        plan = make_plan(self.settings, Action.RESTART, service)
        record = await self.life.request(plan, requested_by=ALICE, source=Source.CLI)
        assert await self.life.confirm(record.id, ALICE)
        assert await self.life.start(record.id) is not None
        return await self.audit.get_run(record.id)

    def wall_sleeping(self) -> bool:
        return self.wall.sleepers > 0

    def pass_time(self, seconds: float) -> None:
        """``seconds`` pass on this machine: its wall clock (heartbeats wake) and its
        monotonic clock move together."""
        self.wall.advance(seconds)
        self.mono.advance(seconds)

    async def request(self, service: str) -> RunRecord:
        return await self.life.request(
            make_plan(self.settings, Action.RESTART, service), requested_by=BOB, source=Source.CLI
        )


@asynccontextmanager
async def two_instances(tmp_path: Path, skew_s: float) -> AsyncIterator[tuple[Instance, Instance]]:
    """Instances a and b on one SQLite file; b's wall clock reads ``skew_s`` more."""
    s = two_services(tmp_path)
    base = ManualWallClock()
    async with AuditLog.open(s.db_path) as audit_a, AuditLog.open(s.db_path) as audit_b:
        a = Instance.on("a", s, audit_a, ManualWallClock(base.now))
        b = Instance.on("b", s, audit_b, ManualWallClock(base.now + timedelta(seconds=skew_s)))
        yield a, b


async def renewals(audit: AuditLog, run_id: int, count: int) -> None:
    async def done() -> bool:
        return (await audit.get_run(run_id)).lease_renewals == count

    await eventually(done, f"renewal {count} of run #{run_id}", timeout_s=5)


@pytest.mark.parametrize("skew_s", [30, -30], ids=["b-ahead", "b-behind"])
async def test_instances_with_skewed_clocks_never_free_each_others_live_runs(
    tmp_path: Path, skew_s: float
) -> None:
    # Judged on timestamps each instance takes on its own clock, as client-go's leader
    # election does (tests/samples/SOURCES.md, owner); 30 s is the skew.
    async with two_instances(tmp_path, skew_s) as (a, b):
        run_a, run_b = await a.running("svc"), await b.running("svc2")
        # A lease written with one clock, read with the other, is off by 30 s: ended
        # before it was written, for the instance ahead. Two leases' worth of beats.
        for beat in range(1, 13):
            for instance in (a, b):
                await eventually(instance.wall_sleeping, "a heartbeat to wait", 5)
                instance.pass_time(RENEW_EVERY_S)
            await renewals(a.audit, run_a.id, beat)
            await renewals(b.audit, run_b.id, beat)
            assert await a.life.recover() == [] and await b.life.recover() == []
        # A request meeting the other's lock sees a live owner too, and says when to retry.
        for asker, holder in ((a, run_b), (b, run_a)):
            with pytest.raises(
                LockHeldError,
                match=rf"the owner of run #{holder.id} may "
                r"be alive \(last heartbeat change seen 0 s",
            ):
                await asker.request(holder.service)

        # a dies: its heartbeat stops. b frees its run after a lease on b's own clock.
        await a.life.released(run_a.id)
        b.pass_time(LEASE_S - 1)
        assert await b.life.recover() == []
        b.pass_time(1)
        [item] = await b.life.recover()
        assert item.run.id == run_a.id and item.run.status == RunStatus.INTERRUPTED
        assert (await b.audit.get_run(run_b.id)).status == RunStatus.RUNNING
        await b.life.released(run_b.id)


async def test_a_process_on_the_same_machine_judges_by_an_earlier_processs_look(
    sqlite_world: World,
) -> None:
    world = sqlite_world
    # A CLI refused with "try again in 30 s" must be right: the next CLI on this machine
    # (the same monotonic clock) sees what the first one saw, not a first sighting.
    elsewhere = world.process(owner=ELSEWHERE)
    run = await world.running(elsewhere)
    await elsewhere.released(run.id)  # it died: nothing renews its lease
    with pytest.raises(LockHeldError, match="try again in 30 s"):
        await world.process().request(world.plan(), requested_by=BOB, source=Source.CLI)
    world.mono.advance(LEASE_S)
    # A process on another machine (another monotonic clock) has seen nothing yet...
    other = RunLifecycle(
        world.settings,
        world.audit,
        clock=world.clock,
        monotonic=Monotonic(ManualClock(), "another-machine"),
    )
    with pytest.raises(LockHeldError, match="last heartbeat change seen 0 s ago"):
        await other.request(world.plan(), requested_by=BOB, source=Source.CLI)
    # ...and the next one here has, for a whole lease.
    record = await world.process().request(world.plan(), requested_by=BOB, source=Source.CLI)
    assert (await world.audit.get_run(run.id)).status == RunStatus.INTERRUPTED
    assert (await world.audit.locks_held()) == {record.id: LOCKS}


@pytest.mark.parametrize("skew_s", [30, -30], ids=["b-ahead", "b-behind"])
async def test_another_instances_card_expires_after_its_window_on_the_judges_own_clock(
    tmp_path: Path, skew_s: float
) -> None:
    async with two_instances(tmp_path, skew_s) as (a, b):
        card = await a.life.request(
            make_plan(a.settings, Action.RESTART, "svc"), requested_by=ALICE, source=Source.SLACK
        )
        assert card.expires_clock == "machine-a"
        assert await b.life.recover() == []  # b's sweep sees the card: its watch begins
        for instance in (a, b):
            instance.pass_time(TTL_S - 1)
        # b's wall clock may say the window closed 29 s ago: b has watched 599 s of 600.
        with pytest.raises(
            LockHeldError,
            match=rf"busy: run #{card.id} .*this one "
            r"expires it after seeing it pending for "
            r"600 s \(1 s more\)",
        ):
            await b.request("svc")
        assert (await a.audit.get_run(card.id)).status == RunStatus.PENDING_APPROVAL
        for instance in (a, b):
            instance.pass_time(1)
        # ...and whatever b's wall clock says (30 s to go, if behind), 600 s have passed.
        record = await b.request("svc")
        expired = await b.audit.get_run(card.id)
        assert (expired.status, expired.summary) == (RunStatus.EXPIRED, EXPIRED_SUMMARY)
        assert (await b.audit.locks_held()) == {record.id: LOCKS}


async def test_a_card_of_this_clock_is_judged_by_its_deadline_as_before(tmp_path: Path) -> None:
    # Two processes reading one wall clock (the same machine): the deadline decides, even
    # for a process that never saw the card before.
    async with two_instances(tmp_path, 0) as (a, _):
        card = await a.life.request(
            make_plan(a.settings, Action.RESTART, "svc"), requested_by=ALICE, source=Source.SLACK
        )
        later = RunLifecycle(
            a.settings,
            a.audit,
            clock=a.wall,
            wall_id="machine-a",
            monotonic=Monotonic(ManualClock(), "machine-a-later"),
        )
        a.wall.advance(TTL_S - 1)
        with pytest.raises(LockHeldError, match=f"busy: run #{card.id}"):
            await later.request(
                make_plan(a.settings, Action.RESTART, "svc"), requested_by=BOB, source=Source.CLI
            )
        a.wall.advance(1)
        await later.request(
            make_plan(a.settings, Action.RESTART, "svc"), requested_by=BOB, source=Source.CLI
        )
        assert (await a.audit.get_run(card.id)).status == RunStatus.EXPIRED


@pytest.mark.parametrize("skew_s", [30, -30], ids=["b-ahead", "b-behind"])
async def test_a_click_on_another_instances_card_never_closes_it_early(
    tmp_path: Path, skew_s: float
) -> None:
    members: dict[str, frozenset[str]] = {}  # no user groups in this policy
    async with two_instances(tmp_path, skew_s) as (a, b):
        card = await a.life.request(
            make_plan(a.settings, Action.RESTART, "svc"), requested_by=ALICE, source=Source.SLACK
        )
        assert await b.life.recover() == []
        if skew_s > 0:
            # 10 s before the end: b's clock says 20 s past it. The click is judged by
            # b's clock (refused), but the card and its locks stay until the window ends.
            for instance in (a, b):
                instance.pass_time(TTL_S - 10)
            refused = await b.life.approve(card.id, user=BOB, membership=members)
            assert refused == Refused(
                "This request has expired; ask for it again.", expired=False, code=Refusal.EXPIRED
            )
            assert (await b.audit.get_run(card.id)).status == RunStatus.PENDING_APPROVAL
            assert (await b.audit.locks_held()) == {card.id: LOCKS}
        else:
            # At the end: b's clock says 30 s to go, but b has watched the whole window.
            for instance in (a, b):
                instance.pass_time(TTL_S)
            refused = await b.life.approve(card.id, user=BOB, membership=members)
            assert refused == Refused(
                "This request has expired; ask for it again.", expired=True, code=Refusal.EXPIRED
            )
            assert (await b.audit.get_run(card.id)).status == RunStatus.EXPIRED
            assert (await b.audit.locks_held()) == {}
