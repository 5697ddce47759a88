"""The ``rotations`` table (migration ``0011``, issue 19): every change of a replica's
place in its router's rotation a run made, and whether the router took it. Who made it
is the run's record (requester, approvers); when, which router and server, and the
result are the row's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.audit.backend import Row
from bot.audit.db import Conn, fetch, insert, qmarks


@dataclass(frozen=True, slots=True)
class RotationRow:
    run_id: int
    host: str
    router: str
    server: str
    change: str  # "out" | "in"
    ok: bool
    detail: str
    at: str


async def add(
    conn: Conn,
    run_id: int,
    host: str,
    router: str,
    server: str,
    change: str,
    ok: bool,
    detail: str,
    now: str,
) -> int:
    return await insert(
        conn,
        "INSERT INTO rotations (run_id, host, router, server, change, ok, detail, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, host, router, server, change, int(ok), detail, now),
    )


def _row(r: Row) -> RotationRow:
    return RotationRow(
        r["run_id"],
        r["host"],
        r["router"],
        r["server"],
        r["change"],
        bool(r["ok"]),
        r["detail"],
        r["at"],
    )


async def of_runs(conn: Conn, run_ids: Sequence[int]) -> list[RotationRow]:
    """Every rotation change of these runs, in the order they were made."""
    if not run_ids:
        return []
    rows = await fetch(
        conn,
        "SELECT run_id, host, router, server, change, ok, detail, at "  # noqa: S608 - constant
        f"FROM rotations WHERE run_id IN ({qmarks(run_ids)}) ORDER BY id",
        tuple(run_ids),
    )
    return [_row(r) for r in rows]


def left_out(rows: Sequence[RotationRow]) -> list[RotationRow]:
    """The replicas these changes (in order) may have left out of rotation: the last
    change of each server is an "out" (taken, or attempted: the router may have taken an
    unanswered one), or a failed "in"."""
    last: dict[tuple[str, str], RotationRow] = {}
    for r in rows:
        last[(r.router, r.server)] = r
    return [r for r in last.values() if r.change == "out" or not r.ok]


async def latest(conn: Conn, router: str, servers: Sequence[str]) -> dict[str, RotationRow]:
    """Each server's last recorded change at ``router`` by any run (what the command kind,
    which cannot read its state, goes by)."""
    if not servers:
        return {}
    rows = await fetch(
        conn,
        "SELECT run_id, host, router, server, change, ok, detail, at FROM rotations "  # noqa: S608
        f"WHERE router = ? AND server IN ({qmarks(servers)}) ORDER BY id",
        (router, *servers),
    )
    out: dict[str, RotationRow] = {}
    for r in rows:
        out[r["server"]] = _row(r)
    return out
