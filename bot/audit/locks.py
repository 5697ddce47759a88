"""The ``locks`` table: which run holds which ``service:``/``host:`` scope.

Taking locks is all-or-nothing inside the caller's (``BEGIN IMMEDIATE``) transaction,
so two processes asking for the same scope cannot both get it.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.audit.db import INTEGRITY, Conn, execute, fetch, qmarks, run_not_found


async def acquire(
    conn: Conn, run_id: int, scopes: Sequence[str], now: str
) -> tuple[str, int] | None:
    """Take every scope for ``run_id`` (those it holds already are fine), or none of
    them: then returns the first scope another run holds, and that run's id."""
    held = {
        row["scope"]: row["run_id"]
        for row in await fetch(
            conn,
            f"SELECT scope, run_id FROM locks WHERE scope IN ({qmarks(scopes)})",  # noqa: S608
            scopes,
        )
    }
    for scope in scopes:
        holder_id = held.get(scope)
        if holder_id is not None and holder_id != run_id:
            return scope, holder_id
    try:
        for scope in scopes:
            if scope not in held:
                await execute(
                    conn,
                    "INSERT INTO locks (scope, run_id, acquired_at) VALUES (?, ?, ?)",
                    (scope, run_id, now),
                )
    except INTEGRITY as exc:
        raise run_not_found(run_id) from exc
    return None


async def release(conn: Conn, run_id: int) -> None:
    await execute(conn, "DELETE FROM locks WHERE run_id = ?", (run_id,))


async def holder(conn: Conn, scope: str) -> int | None:
    """The id of the run holding ``scope``, or None."""
    rows = await fetch(conn, "SELECT run_id FROM locks WHERE scope = ?", (scope,))
    return int(rows[0]["run_id"]) if rows else None


async def held(conn: Conn) -> dict[int, list[str]]:
    """Every held scope, by the run holding it (scopes in name order)."""
    rows = await fetch(conn, "SELECT run_id, scope FROM locks ORDER BY scope")
    out: dict[int, list[str]] = {}
    for row in rows:
        out.setdefault(int(row["run_id"]), []).append(row["scope"])
    return out
