"""What the Prometheus exporter reads from the audit database at each scrape
(``bot.engine.exporter``): the state every replica shares and a restart must not reset
(runs waiting or running, locks held, each service's last successful redeploy)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.audit.db import Conn
from bot.core.status import ACTIVE_STATUSES, Action, RunStatus


@dataclass(frozen=True, slots=True)
class LastSuccess:
    service: str
    finished_at: str  # ISO 8601, UTC (the runs table's format)
    version: str | None


@dataclass(frozen=True, slots=True)
class MetricsReads:
    runs_by_status: dict[RunStatus, int]  # the active statuses only, each present
    locks_held: int
    last_success: tuple[LastSuccess, ...]


async def read(conn: Conn) -> MetricsReads:
    active = sorted(ACTIVE_STATUSES)
    marks = ",".join("?" * len(active))
    counts = dict.fromkeys(active, 0)
    async with conn.execute(
        f"SELECT status, count(*) FROM runs WHERE status IN ({marks}) GROUP BY status",  # noqa: S608
        [str(s) for s in active],
    ) as cur:
        for status, n in await cur.fetchall():
            counts[RunStatus(status)] = int(n)
    async with conn.execute("SELECT count(*) FROM locks") as cur:
        row = await cur.fetchone()
        locks = int(row[0]) if row else 0
    # The newest successful real redeploy per service (index runs_service_id).
    async with conn.execute(
        "SELECT service, finished_at, version_after FROM runs WHERE id IN ("
        "SELECT max(id) FROM runs WHERE action = ? AND status = ? AND dry_run = 0 "
        "AND finished_at IS NOT NULL GROUP BY service) ORDER BY service",
        [str(Action.REDEPLOY), str(RunStatus.SUCCEEDED)],
    ) as cur:
        last = tuple(LastSuccess(str(s), str(f), v) for s, f, v in await cur.fetchall())
    return MetricsReads(counts, locks, last)
