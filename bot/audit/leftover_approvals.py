"""The ``leftover_approvals`` table (issue 17 F5): each approver's go to terminate the
processes that outlived a service's stop, per host and per question, with the exact PIDs
that question listed. A run whose batch has two hosts with leftovers asks twice; each
answer names its host and its PIDs, so the audit log says what was approved, not only that
something was. (The run's ``decisions`` row ``terminate`` is kept too, once per person.)
The table is made by migration ``0009_leftover_approvals`` (bot.audit.migrations)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bot.audit.db import INTEGRITY, Conn, execute, fetch, run_not_found


@dataclass(frozen=True, slots=True)
class LeftoverApproval:
    """One approver's go for one host's question: terminate exactly ``pids``."""

    host: str
    question: str  # the question's id (the nonce in its button)
    user: str
    pids: tuple[int, ...]
    at: str


async def record(
    conn: Conn,
    run_id: int,
    *,
    host: str,
    question: str,
    user: str,
    pids: Sequence[int],
    at: str,
) -> bool:
    """False when this user already approved this question (a double click)."""
    try:
        changed = await execute(
            conn,
            'INSERT INTO leftover_approvals (run_id, host, question, "user", pids, at) '
            'VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, host, question, "user") DO NOTHING',
            (run_id, host, question, user, json.dumps([int(p) for p in pids]), at),
        )
    except INTEGRITY as exc:  # the foreign key: no such run
        raise run_not_found(run_id) from exc
    return changed == 1


async def of_run(conn: Conn, run_id: int) -> list[LeftoverApproval]:
    rows = await fetch(
        conn,
        'SELECT host, question, "user", pids, at FROM leftover_approvals '
        "WHERE run_id = ? ORDER BY id",
        (run_id,),
    )
    return [
        LeftoverApproval(
            r["host"],
            r["question"],
            r["user"],
            tuple(int(p) for p in json.loads(r["pids"])),
            r["at"],
        )
        for r in rows
    ]
