"""The ``decisions`` table: who approved, denied or cancelled which run."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

import aiosqlite

from bot.audit.db import execute, fetch, run_not_found
from bot.audit.records import DecisionRecord, stored
from bot.core.status import Decision


async def record(
    conn: aiosqlite.Connection, run_id: int, user: str, decision: Decision, at: str
) -> bool:
    """False when this user already made this decision on this run (a double click)."""
    try:
        changed = await execute(
            conn,
            "INSERT INTO decisions (run_id, user, decision, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run_id, user, decision) DO NOTHING",
            (run_id, user, decision, at),
        )
    except sqlite3.IntegrityError as exc:  # the foreign key: no such run
        raise run_not_found(run_id) from exc
    return changed == 1


async def of_run(conn: aiosqlite.Connection, run_id: int) -> list[DecisionRecord]:
    rows = await fetch(
        conn, "SELECT user, decision, at FROM decisions WHERE run_id = ? ORDER BY id", (run_id,)
    )
    return [DecisionRecord(r["user"], stored(Decision, r["decision"], "decision"), r["at"])
            for r in rows]


async def approvers_and_deniers(
    conn: aiosqlite.Connection, run_ids: Sequence[int]
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """For each run, who approved it and who denied it, in the order they did."""
    approved: dict[int, list[str]] = {}
    denied: dict[int, list[str]] = {}
    if run_ids:
        rows = await fetch(
            conn,
            "SELECT run_id, user, decision FROM decisions "
            "WHERE run_id IN (SELECT value FROM json_each(?)) "
            "AND decision IN (?, ?) ORDER BY id",
            (json.dumps(list(run_ids)), Decision.APPROVE, Decision.DENY),
        )
        for d in rows:
            target = approved if d["decision"] == Decision.APPROVE else denied
            target.setdefault(d["run_id"], []).append(d["user"])
    return approved, denied
