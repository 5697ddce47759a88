"""Replicas on PostgreSQL (issue 21): how long a failover takes, and what a lock costs on
each backend.

    ./dev python bench/replicas.py [--runs 3] [--lease-s 30 --renew-s 5 --sweep-s 5]
                                   [--locks 200] [--skip-failover]

*failover*: two real replicas (``python -m bot``, Slack HTTP mode, forked from one that
imported the bot) on a real PostgreSQL 15 started here, the fake Slack, the simulated
host behind a real OpenSSH sshd; a redeploy approved on one, stalled in its reinstall;
``kill -9`` of the driving replica; the time until the run is ``interrupted`` in the
database and until its thread says so. The bound is the lease (from the driver's last
renewal, up to ``--renew-s`` before the kill) plus one sweep of the surviving leader.

*lock round trip*: ``acquire_locks`` then ``release_locks`` of a service's and a host's
scope for one run, awaited one after the other (each a write transaction: SQLite's
``BEGIN IMMEDIATE`` with ``synchronous=FULL``; PostgreSQL's advisory write lock and a
commit over loopback TCP), median and p90 of ``--locks`` round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bot.audit.store import AuditLog
from bot.core.status import Action, Source
from bot.settings import PostgresUrl
from bot.sim.kit import SERVICE, SimKit, fast_config
from tests.polling import eventually
from tests.support.postgres import PostgresServer, migrate_pg
from tests.support.replicas import ALICE, BOB, cluster


async def failover(
    base: Path, url: PostgresUrl, lease_s: float, renew_s: float, sweep_s: float, ttl_s: float
) -> tuple[float, float]:
    async with SimKit(base / "host", config=fast_config(), access="sshd") as kit:
        kit.set_faults(uv_stalls=True)
        timings = {
            "lease_s": lease_s,
            "renew_every_s": renew_s,
            "leader_ttl_s": ttl_s,
            "sweep_every_s": sweep_s,
        }
        async with cluster(base, kit, url, **timings) as c:
            a = await c.start("a")
            await c.start("b")
            await c.command(a, f"redeploy {SERVICE} --version 0.31.0", ALICE)
            await eventually(lambda: c.card_of(1), "the card", 30)
            await c.click(a, "approve", 1, BOB)
            await eventually(lambda: c.step_running(1, "reinstall"), "the reinstall", 60)
            [driver] = [r for r in c.replicas if r.pid == c.driver_pid(1)]
            killed = time.monotonic()
            driver.signal(signal.SIGKILL)
            await eventually(lambda: c.status(1) == "interrupted", "the recovery", lease_s * 4)
            recovered = time.monotonic() - killed
            await eventually(
                lambda: "was interrupted" in c.thread_text(1), "the thread", lease_s * 4
            )
            told = time.monotonic() - killed
        kit.clear_faults()
    return recovered, told


async def lock_round_trips(target: Path | PostgresUrl, count: int) -> list[float]:
    async with AuditLog.open(target) as audit:
        run_id = await audit.create_run(
            service=SERVICE,
            action=Action.RESTART,
            hosts=["gpu-node-1"],
            requested_by=ALICE,
            source=Source.CLI,
            plan={},
            package_spec=None,
        )
        scopes = [f"service:{SERVICE}", "host:gpu-node-1"]
        took = []
        for _ in range(count):
            started = time.perf_counter()
            await audit.acquire_locks(run_id, scopes)
            await audit.release_locks(run_id)
            took.append((time.perf_counter() - started) * 1000)
    return took


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"median {statistics.median(ms):.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms"


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--renew-s", type=float, default=5.0)
    p.add_argument("--sweep-s", type=float, default=5.0)
    p.add_argument("--leader-ttl-s", type=float, default=10.0)
    p.add_argument("--locks", type=int, default=200)
    p.add_argument("--skip-failover", action="store_true")
    args = p.parse_args()
    print(f"CPython {platform.python_version()}, {platform.machine()}")
    server = PostgresServer.start_new()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
            base = Path(tmp)
            lite = await lock_round_trips(base / "locks.db", args.locks)
            pg_url = server.fresh_url()
            await migrate_pg(pg_url)
            pg = await lock_round_trips(pg_url, args.locks)
            print(
                f"lock round trip ({args.locks}): SQLite {summary(lite)}; "
                f"PostgreSQL {server.sql('SHOW server_version').strip()} {summary(pg)}"
            )
            if args.skip_failover:
                return
            print(
                f"failover, lease {args.lease_s:g} s, renewed every {args.renew_s:g} s, "
                f"sweep every {args.sweep_s:g} s:"
            )
            for n in range(args.runs):
                url = server.fresh_url()
                await migrate_pg(url)
                run_dir = base / f"failover-{n}"
                run_dir.mkdir()
                recovered, told = await failover(
                    run_dir, url, args.lease_s, args.renew_s, args.sweep_s, args.leader_ttl_s
                )
                print(
                    f"  run {n + 1}: kill -9 -> interrupted {recovered:.1f} s, "
                    f"-> thread told {told:.1f} s"
                )
    finally:
        server.destroy()


if __name__ == "__main__":
    asyncio.run(main())
