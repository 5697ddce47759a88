"""The ``leftover_questions`` table (issue 21): a run's open question to terminate the
processes that outlived its service's stop, so a press on any replica can answer the
question the driving replica asked.

The driving replica opens a question when it asks (its id is the nonce in the card's
button) and closes it when the wait ends; a press on whichever replica Slack sends it
to is judged there and recorded (``leftover_approvals``), and the press that makes the
approvals enough closes the question with who made it so (``answer``, a compare-and-set:
one answer). The driving replica watches its question's row and its presses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bot.audit.db import INTEGRITY, Conn, execute, fetch, run_not_found


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    run_id: int
    host: str
    ask: str  # what the card says of the processes
    pids: tuple[int, ...]
    closed: bool
    approved_by: str | None  # who made it enough (None: not answered)


async def open_(
    conn: Conn, run_id: int, host: str, question: str, ask: str, pids: Sequence[int], at: str
) -> None:
    try:
        await execute(
            conn,
            "INSERT INTO leftover_questions (question, run_id, host, ask, pids, asked_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (question, run_id, host, ask, json.dumps([int(p) for p in pids]), at),
        )
    except INTEGRITY as exc:  # the foreign key: no such run
        raise run_not_found(run_id) from exc


async def get(conn: Conn, question: str) -> Question | None:
    rows = await fetch(
        conn,
        "SELECT question, run_id, host, ask, pids, closed_at, approved_by "
        "FROM leftover_questions WHERE question = ?",
        (question,),
    )
    if not rows:
        return None
    r = rows[0]
    return Question(
        r["question"],
        int(r["run_id"]),
        r["host"],
        r["ask"],
        tuple(int(p) for p in json.loads(r["pids"])),
        r["closed_at"] is not None,
        r["approved_by"],
    )


async def close(conn: Conn, question: str, at: str, approved_by: str | None) -> bool:
    """Close an open question, answered (``approved_by``) or not: True for the one call
    that closed it."""
    return bool(
        await execute(
            conn,
            "UPDATE leftover_questions SET closed_at = ?, approved_by = ? "
            "WHERE question = ? AND closed_at IS NULL",
            (at, approved_by, question),
        )
    )


async def pressed(conn: Conn, question: str) -> list[str]:
    """Who pressed for ``question`` so far, in order."""
    rows = await fetch(
        conn, 'SELECT "user" FROM leftover_approvals WHERE question = ? ORDER BY id', (question,)
    )
    return [str(r["user"]) for r in rows]
