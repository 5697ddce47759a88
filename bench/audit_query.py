"""`audit --limit 20` latency with a million runs in the audit database.

    ./dev python bench/audit_query.py [--runs 1000000] [--db PATH]

The database is created by ``AuditLog.open`` (the real schema and migrations),
then filled in one transaction with ``executemany``: runs with the plans the bot
really stores (status, redeploy and restart plans, about 0.5 to 1.4 kB of JSON
each) over 20 services, and one approval per run (``list_runs`` reads decisions
too).  Steps and snapshots are left out: ``list_runs`` never reads them.

Measured: ``AuditLog.list_runs(limit=20)`` on an open log (what the Slack bot
does), the same filtered by service, open + query + close (the CLI's work after
start-up), and ``python -m bot audit --limit 20`` as a subprocess (what an
operator waits for), next to the bare start-up of ``python -c 'import bot.cli.main'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.audit.store import AuditLog, format_ts
from bot.audit.view import runs_table
from bot.core.plan import make_plan
from bot.core.status import Action
from bot.settings import Settings

SERVICES = [f"svc-{i:02d}" for i in range(20)]
ROOT = Path(__file__).resolve().parent.parent


def plans() -> dict[tuple[str, str], str]:
    """The JSON the bot stores for each service and action, built by the real planner."""
    hosts = {
        f"gpu-node-{i}": {"address": f"10.0.0.{i}", "known_hosts": "/etc/chatops/kh"}
        for i in range(1, 9)
    }
    services = {
        name: {
            "hosts": [f"gpu-node-{1 + i % 8}", f"gpu-node-{1 + (i + 1) % 8}"],
            "unit": f"vllm-{name}",
            "python": f"/opt/venvs/{name}/bin/python",
            "indexes": {"nightly": "https://wheels.vllm.ai/nightly"},
        }
        for i, name in enumerate(SERVICES)
    }
    settings = Settings(hosts=hosts, services=services, db_path=Path("unused.db"))
    return {
        (s, a): json.dumps(make_plan(settings, Action(a), s).to_json())
        for s in SERVICES
        for a in ("redeploy", "restart", "status")
    }


def rows(n: int) -> Iterator[tuple[Any, ...]]:
    plan = plans()
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for i in range(n):
        service = SERVICES[i % len(SERVICES)]
        action = ("status", "redeploy", "status", "restart", "redeploy", "status")[i % 6]
        at = format_ts(start + timedelta(seconds=30 * i))
        redeploy = action == "redeploy"
        yield (
            service,
            action,
            json.dumps(["gpu-node-1", "gpu-node-2"]),
            f"U0{i % 97:05d}",
            "slack" if i % 3 else "cli",
            "C0CHATOPS",
            plan[(service, action)],
            "vllm==0.31.0" if redeploy else "vllm",
            "nightly" if redeploy else None,
            0,
            "succeeded" if i % 50 else "rolled_back",
            at,
            at,
            at,
            at,
            "0.30.0" if redeploy else None,
            "0.31.0" if redeploy else None,
        )


def fill(path: Path, n: int) -> float:
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO runs (service, action, hosts, requested_by, source, channel, plan, "
            "package_spec, index_name, dry_run, status, created_at, started_at, finished_at, "
            "expires_at, version_before, version_after) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows(n),
        )
        conn.execute(
            "INSERT INTO decisions (run_id, user, decision, at) "
            "SELECT id, 'U0APPROVER', 'approve', created_at FROM runs"
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.perf_counter() - t0


def stats(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(len(xs) * 0.95))]
    return f"{statistics.median(xs) * 1000:.2f} | {xs[0] * 1000:.2f} | {p95 * 1000:.2f} | {len(xs)}"


async def in_process(path: Path, calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"list": [], "service": [], "open": []}
    async with await AuditLog.open(path) as log:
        await log.list_runs(limit=20)  # warm the page cache and the connection
        for i in range(calls):
            t0 = time.perf_counter()
            records = await log.list_runs(limit=20)
            runs_table(records)
            out["list"].append(time.perf_counter() - t0)
            assert len(records) == 20
            t0 = time.perf_counter()
            records = await log.list_runs(service=SERVICES[i % len(SERVICES)], limit=20)
            out["service"].append(time.perf_counter() - t0)
            assert len(records) == 20
    for _ in range(max(calls // 10, 5)):
        t0 = time.perf_counter()
        async with await AuditLog.open(path) as log:
            runs_table(await log.list_runs(limit=20))
        out["open"].append(time.perf_counter() - t0)
    return out


def subprocess_times(argv: list[str], env: dict[str, str], times: int) -> list[float]:
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
        out.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise RuntimeError(f"{argv}: exit {p.returncode}: {p.stderr[-2000:]}")
    return out


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        path = args.db or Path(tmp) / "audit.db"
        async with await AuditLog.open(path) as log:
            existing = len(await log.list_runs(limit=1))
        fill_s = 0.0
        if not existing:
            fill_s = fill(path, args.runs)
        with sqlite3.connect(path) as conn:
            (count,) = conn.execute("SELECT count(*) FROM runs").fetchone()
        size_mb = path.stat().st_size / 2**20
        times = await in_process(path, args.calls)
        config = Path(tmp) / "empty.toml"
        config.write_text("")
        env = {
            **os.environ,
            "CHATOPS_CONFIG": str(config),
            "CHATOPS_DB": str(path),
            "PYTHONPATH": str(ROOT),
        }
        cli = subprocess_times(
            [sys.executable, "-m", "bot", "audit", "--limit", "20"], env, args.cli_runs
        )
        cli_json = subprocess_times(
            [sys.executable, "-m", "bot", "audit", "--limit", "20", "--json"], env, args.cli_runs
        )
        startup = subprocess_times(
            [sys.executable, "-c", "import bot.cli.main"], env, args.cli_runs
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; SQLite {sqlite3.sqlite_version}"
    )
    print(
        f"runs in the database: {count:,} ({size_mb:,.0f} MiB)"
        + (f", filled in {fill_s:.1f} s" if fill_s else "")
    )
    print("| what | median ms | min ms | p95 ms | samples |")
    print("|---|---|---|---|---|")
    print(f"| `list_runs(limit=20)` + table, open log | {stats(times['list'])} |")
    print(f"| `list_runs(service=..., limit=20)`, open log | {stats(times['service'])} |")
    print(f"| open + `list_runs(limit=20)` + table + close | {stats(times['open'])} |")
    print(f"| `python -m bot audit --limit 20` (subprocess) | {stats(cli)} |")
    print(f"| `python -m bot audit --limit 20 --json` (subprocess) | {stats(cli_json)} |")
    print(f"| `python -c 'import bot.cli.main'` (start-up alone) | {stats(startup)} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, help="keep the database here (reused when it has runs)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cli-runs", type=int, default=10)
    asyncio.run(main(ap.parse_args()))
