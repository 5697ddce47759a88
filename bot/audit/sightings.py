"""The ``lease_sightings`` table: what a judge saw of a run, and when by its own
monotonic clock (``bot.engine.liveness``).

One row per run and clock id: the token last seen (the run's owner, lease and renewal
count, or a pending card's deadline) and the clock's reading when that token was first
seen. Seeing the same token again keeps the first reading, so "unchanged since" is the
earliest time anyone on that clock saw it; a new token replaces the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bot.audit.db import Conn, execute, fetch, qmarks


@dataclass(frozen=True, slots=True)
class Sighting:
    token: str
    seen: float  # the clock's reading when ``token`` was first seen


async def sight(
    conn: Conn, clock: str, now: float, tokens: Mapping[int, str]
) -> dict[int, Sighting]:
    """Record that ``clock`` sees each run's token at ``now``; returns each run's
    sighting as it stands after (the first reading of an unchanged token)."""
    for run_id, token in tokens.items():
        await execute(
            conn,
            "INSERT INTO lease_sightings (run_id, clock, token, seen) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run_id, clock) DO UPDATE SET token = excluded.token, "
            "seen = excluded.seen WHERE lease_sightings.token != excluded.token",
            (run_id, clock, token, now),
        )
    # Sightings of runs that ended are of no more use to anyone.
    # (A lookup by primary key per sighting: the table holds the few runs in flight.)
    await execute(
        conn,
        "DELETE FROM lease_sightings WHERE (SELECT finished_at FROM runs "
        "WHERE runs.id = lease_sightings.run_id) IS NOT NULL",
    )
    if not tokens:
        return {}
    rows = await fetch(
        conn,
        "SELECT run_id, token, seen FROM lease_sightings "  # noqa: S608 - placeholders only
        f"WHERE clock = ? AND run_id IN ({qmarks(tokens)})",
        (clock, *tokens),
    )
    return {int(row["run_id"]): Sighting(row["token"], float(row["seen"])) for row in rows}
