"""The ``leases`` table (issue 21): named leases held by one replica at a time, by the
database's clock (``bot.audit.db.NOW_S``), so replicas on machines with different
clocks agree on when one ends.

A holder renews its lease before it ends; anyone may take it once it has ended. Each
change of holder moves the lease's ``epoch`` on, so a holder that was away (paused,
cut off) learns at its next renewal that it lost it, and whatever it decided as the
holder can be told apart from what its successor did.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.audit.backend import Dialect
from bot.audit.db import NOW_S, Conn, dialect_of, execute, fetch


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: str
    epoch: int
    left_s: float  # until it ends, by the database's clock (negative: ended)


async def hold(conn: Conn, name: str, holder: str, ttl_s: float) -> int | None:
    """Take or renew lease ``name`` for ``holder`` until ``ttl_s`` from now: its epoch
    when ``holder`` holds it now, None when another holds it and it has not ended.
    Inside the caller's write transaction (one writer at a time: no two can take it)."""
    now = NOW_S[dialect_of(conn)]
    changed = await execute(
        conn,
        f"UPDATE leases SET epoch = CASE WHEN holder = ? THEN epoch ELSE epoch + 1 END, "  # noqa: S608
        f"holder = ?, expires = {now} + ? WHERE name = ? AND (holder = ? OR expires < {now})",
        (holder, holder, ttl_s, name, holder),
    )
    if not changed:
        await execute(
            conn,
            f"INSERT INTO leases (name, holder, epoch, expires) VALUES (?, ?, 1, {now} + ?) "  # noqa: S608
            "ON CONFLICT (name) DO NOTHING",
            (name, holder, ttl_s),
        )
    state = await of(conn, name)
    return state.epoch if state is not None and state.holder == holder else None


async def release(conn: Conn, name: str, holder: str) -> bool:
    """``holder`` lets lease ``name`` go (a clean shutdown: the next may take it at once).
    It ends now rather than going away, so the epoch still moves on at the next holder."""
    return bool(
        await execute(
            conn,
            f"UPDATE leases SET expires = {NOW_S[dialect_of(conn)]} - 1 "  # noqa: S608
            "WHERE name = ? AND holder = ?",
            (name, holder),
        )
    )


async def of(conn: Conn, name: str) -> LeaseState | None:
    rows = await fetch(
        conn,
        f"SELECT holder, epoch, expires - {NOW_S[dialect_of(conn)]} AS left_s "  # noqa: S608
        "FROM leases WHERE name = ?",
        (name,),
    )
    if not rows:
        return None
    row = rows[0]
    return LeaseState(str(row["holder"]), int(row["epoch"]), float(row["left_s"]))


async def server_up_s(conn: Conn) -> float | None:
    """How long the database server has run, by its own clock (None on SQLite, which has
    no server). A lease that ran out less than a lease after the server started may have
    run out while the server was down, its driver not yet able to renew it."""
    if dialect_of(conn) is not Dialect.POSTGRES:
        return None
    rows = await fetch(
        conn,
        "SELECT extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())"
        "::double precision AS up_s",
        (),
    )
    return float(rows[0]["up_s"])
