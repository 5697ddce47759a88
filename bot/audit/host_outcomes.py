"""The ``host_outcomes`` table (migration ``0010``): how each host of a run ended, with
the state it left the service in (``bot.core.service_state``)."""

from __future__ import annotations

from dataclasses import dataclass

import aiosqlite

from bot.audit.db import fetch, insert
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
    conn: aiosqlite.Connection,
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


async def of_run(conn: aiosqlite.Connection, run_id: int) -> list[HostOutcome]:
    rows = await fetch(
        conn,
        "SELECT run_id, host, status, summary, service_state, at "
        "FROM host_outcomes WHERE run_id = ? ORDER BY id",
        (run_id,),
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
