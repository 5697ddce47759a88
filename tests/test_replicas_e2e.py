"""Issue 21's faults, end to end: two and three real bot processes (Slack HTTP mode, the
fake Slack at its API boundary) on one real PostgreSQL server, the simulated GPU host
behind a real OpenSSH sshd (tests.support.replicas). Leases are short here (8 s, renewed
every 0.5 s, the leader's sweep every 0.5 s) so a death is noticed in seconds; how long
failover takes with the defaults is measured in bench/replicas.py, not asserted."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from bot.settings import PostgresUrl
from bot.sim.kit import SERVICE, SimKit
from tests.polling import eventually
from tests.support.postgres import PostgresServer, migrate_pg
from tests.support.replicas import ALICE, BOB, CAROL, Cluster, cluster

FINAL = ("succeeded", "failed", "rolled_back", "aborted", "cancelled", "interrupted")


async def approved_and_reinstalling(c: Cluster, run_id: int = 1) -> None:
    """The first replica's request approved there, the run in its reinstall."""
    first = c.replicas[0]
    await c.command(first, f"redeploy {SERVICE} --version 0.31.0", ALICE)
    await eventually(lambda: c.card_of(run_id), "the card", 30)
    await c.click(first, "approve", run_id, BOB)
    await eventually(lambda: c.step_running(run_id, "reinstall"), "the reinstall", 60)


async def test_a_replica_killed_mid_install_is_recovered_by_another_and_its_thread_told(
    tmp_path: Path, sim_sshd_host: SimKit, pg_url: PostgresUrl
) -> None:
    kit = sim_sshd_host
    kit.set_faults(uv_stalls=True)  # the reinstall goes on until the kill
    await migrate_pg(pg_url)
    async with cluster(tmp_path, kit, pg_url) as c:
        for name in ("a", "b", "c"):
            await c.start(name)
        await approved_and_reinstalling(c)
        driver = c.driver_pid(1)
        [victim] = [r for r in c.replicas if r.pid == driver]
        victim.signal(signal.SIGKILL)
        assert await victim.ended == -signal.SIGKILL
        told = await eventually(
            lambda: "was interrupted" in c.thread_text(1) and c.thread_text(1),
            "another replica to recover the run and tell its thread",
            30,
        )
        assert c.status(1) == "interrupted"
        assert "during step `reinstall`" in told and "STOPPED" in told
        # Recovered once, told once, by one of the two survivors.
        assert c.row("SELECT count(*) FROM decisions WHERE decision = 'recover'") == (1,)
        assert told.count("was interrupted") == 1
        assert c.row("SELECT count(*) FROM locks") == (0,)
        # The service is free again: a new request on a survivor gets its card.
        survivor = next(r for r in c.replicas if r is not victim)
        await c.command(survivor, f"restart {SERVICE}", CAROL)
        await eventually(lambda: c.card_of(2), "a card for the next request", 30)
    kit.clear_faults()


async def test_a_replica_stopped_past_its_lease_wakes_fenced_off_and_acts_on_nothing(
    tmp_path: Path, sim_sshd_host: SimKit, pg_url: PostgresUrl
) -> None:
    """SIGSTOP freezes the driver mid-install (a GC pause, a frozen VM); the other replica
    sees its lease run out by the database's clock, recovers the run and tells the thread.
    SIGCONT: the install it was waiting on ends, and it must neither write as the owner nor
    go on to start the service; it says so in its log."""
    kit = sim_sshd_host
    kit.set_faults(uv_stalls=True)
    await migrate_pg(pg_url)
    async with cluster(tmp_path, kit, pg_url) as c:
        for name in ("a", "b"):
            await c.start(name)
        await approved_and_reinstalling(c)
        [frozen] = [r for r in c.replicas if r.pid == c.driver_pid(1)]
        frozen.signal(signal.SIGSTOP)
        await eventually(lambda: c.status(1) == "interrupted", "the run to be recovered", 30)
        await eventually(lambda: "was interrupted" in c.thread_text(1), "the thread told", 30)
        epoch = c.row("SELECT epoch FROM runs WHERE id = 1")
        steps = c.row("SELECT count(*) FROM steps WHERE run_id = 1")
        changes = kit.changes()
        assert changes[-1] == "install"  # the stalled reinstall is the last change so far

        frozen.signal(signal.SIGCONT)
        kit.clear_faults()  # the install it waited on ends now
        await eventually(
            lambda: "lost the run's lease" in frozen.text() or "is no longer this" in frozen.text(),
            "the woken replica to say it lost the run",
            30,
        )
        # It wrote nothing more and started nothing: the service stays as the thread said.
        assert c.row("SELECT epoch FROM runs WHERE id = 1") == epoch
        assert c.row("SELECT count(*) FROM steps WHERE run_id = 1") == steps
        assert c.status(1) == "interrupted"
        assert "start" not in kit.changes()[len(changes) :]
        assert not frozen.ended.done()  # alive, serving, just not driving that run


async def test_the_same_click_on_two_replicas_records_one_decision_and_drives_one_run(
    tmp_path: Path, sim_sshd_host: SimKit, pg_url: PostgresUrl
) -> None:
    kit = sim_sshd_host
    await migrate_pg(pg_url)
    async with cluster(tmp_path, kit, pg_url) as c:
        a, b = await c.start("a"), await c.start("b")
        await c.command(a, f"restart {SERVICE}", ALICE)
        await eventually(lambda: c.card_of(1), "the card", 30)
        click = c.click_payload("approve", 1, BOB)
        await asyncio.gather(c.send_click(a, click), c.send_click(b, click))
        await eventually(lambda: c.status(1) in FINAL, "the run to end", 60)
        assert c.status(1) == "succeeded"
        assert c.row(
            "SELECT count(*) FROM decisions WHERE run_id = 1 AND decision = 'approve'"
        ) == (1,)
        assert kit.changes().count("start") == 1 and kit.changes().count("stop") == 1


async def test_a_database_restart_mid_run_loses_no_record_and_abandons_no_service(
    tmp_path: Path, sim_sshd_host: SimKit
) -> None:
    """PostgreSQL restarts while a replica drives a redeploy: writes that cannot wait go to
    that replica's fallback journal (the run then brings the service back rather than go
    on unaudited), the journal is merged once the database is back, and every step that
    started has its end in the database."""
    kit = sim_sshd_host
    server = PostgresServer.start_new()  # its own: the others' tests must not see it go
    url = server.fresh_url()
    await migrate_pg(url)
    kit.set_faults(uv_stalls=True)
    try:
        async with cluster(tmp_path, kit, url, lease_s=10.0, renew_every_s=1.0) as c:
            for name in ("a", "b"):
                await c.start(name)
            await approved_and_reinstalling(c)
            await asyncio.to_thread(server.stop)
            kit.clear_faults()  # the install ends while the database is away
            await asyncio.sleep(0)
            await eventually(
                lambda: any("fallback journal" in r.text() for r in c.replicas),
                "the driver to keep its records in its journal",
                30,
            )
            await asyncio.to_thread(server.start)
            await eventually(lambda: c.status(1) in FINAL, "the run to end", 60)
            status = c.status(1)
            # Brought back up (or finished on the new version): never left stopped.
            assert status in ("cancelled", "succeeded"), status
            assert kit.unit_state() == "active"
            # Every step that started has its end; the journals are merged and gone.
            assert c.row("SELECT count(*) FROM steps WHERE run_id = 1 AND finished_at IS NULL") == (
                0,
            )
            assert not list(tmp_path.glob("*.fallback.jsonl"))
            assert c.row("SELECT count(*) FROM journal_applied WHERE rejected IS NOT NULL") == (0,)
    finally:
        server.destroy()
