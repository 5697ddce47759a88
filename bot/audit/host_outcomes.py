"""The ``host_outcomes`` table (migration ``0010``): how each host of a run ended, with
the state it left the service in (``bot.core.service_state``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.audit.db import Conn, fetch, insert, qmarks
from bot.core.service_state import ServiceState


@dataclass(frozen=True, slots=True)
class HostOutcome:
    run_id: int
    host: str
    status: str
    summary: str
    service_state: ServiceState | None
    at: str


async def add(
    conn: Conn,
    run_id: int,
    host: str,
    status: str,
    summary: str,
    state: ServiceState | None,
    now: str,
) -> int:
    return await insert(
        conn,
        "INSERT INTO host_outcomes (run_id, host, status, summary, service_state, at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, host, status, summary, None if state is None else str(state), now),
    )


async def of_runs(conn: Conn, run_ids: Sequence[int]) -> list[HostOutcome]:
    """Every host outcome of these runs, in the order they were written."""
    if not run_ids:
        return []
    rows = await fetch(
        conn,
        "SELECT run_id, host, status, summary, service_state, at "  # noqa: S608 - constant
        f"FROM host_outcomes WHERE run_id IN ({qmarks(run_ids)}) ORDER BY id",
        tuple(run_ids),
    )
    return [
        HostOutcome(
            r["run_id"],
            r["host"],
            r["status"],
            r["summary"],
            None if r["service_state"] is None else ServiceState(r["service_state"]),
            r["at"],
        )
        for r in rows
    ]
