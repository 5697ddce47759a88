"""The ``decisions`` table: who approved, denied, cancelled or recovered which run."""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.audit.backend import Dialect
from bot.audit.db import INTEGRITY, Conn, dialect_of, execute, fetch, run_not_found
from bot.audit.records import DecisionRecord, stored
from bot.core.status import Decision


async def record(conn: Conn, run_id: int, user: str, decision: Decision, at: str) -> bool:
    """False when this user already made this decision on this run (a double click)."""
    try:
        changed = await execute(
            conn,
            'INSERT INTO decisions (run_id, "user", decision, at) VALUES (?, ?, ?, ?) '
            'ON CONFLICT (run_id, "user", decision) DO NOTHING',
            (run_id, user, decision, at),
        )
    except INTEGRITY as exc:  # the foreign key: no such run
        raise run_not_found(run_id) from exc
    return changed == 1


async def of_run(conn: Conn, run_id: int) -> list[DecisionRecord]:
    rows = await fetch(
        conn, 'SELECT "user", decision, at FROM decisions WHERE run_id = ? ORDER BY id', (run_id,)
    )
    return [
        DecisionRecord(r["user"], stored(Decision, r["decision"], "decision"), r["at"])
        for r in rows
    ]


async def deciders(conn: Conn, run_ids: Sequence[int]) -> dict[Decision, dict[int, list[str]]]:
    """For each run, who approved it, who denied it and who recovered it (marked it
    interrupted after its driver died), in the order they did."""
    found: dict[Decision, dict[int, list[str]]] = {
        Decision.APPROVE: {},
        Decision.DENY: {},
        Decision.RECOVER: {},
    }
    if run_ids:
        # The ids as one parameter, however many runs a listing holds.
        ids = (
            "run_id IN (SELECT value FROM json_each(?))"
            if dialect_of(conn) is Dialect.SQLITE
            else "run_id IN (SELECT value::bigint FROM json_array_elements_text(?::json))"
        )
        rows = await fetch(
            conn,
            f'SELECT run_id, "user", decision FROM decisions WHERE {ids} '  # noqa: S608
            "AND decision IN (?, ?, ?) ORDER BY id",
            (json.dumps(list(run_ids)), *found),
        )
        for d in rows:
            found[stored(Decision, d["decision"], "decision")].setdefault(d["run_id"], []).append(
                d["user"]
            )
    return found
