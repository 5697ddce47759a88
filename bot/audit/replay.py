"""Writing journal records into the database: the direct path of a resilient write, and
the merge of the fallback journal (``bot.audit.journal``) once the database is back.

Both go through ``apply`` (one record: ``bot.audit.writes.apply``), inside the caller's
one write transaction (``AuditLog``'s ``write_records``), with the table modules'
statements and each record's own timestamp, so a row written late reads as if it had
been written on time.

A merged record leaves its id in ``journal_applied`` (migration ``0003``), in the same
transaction as its rows: replaying a journal twice applies each record once, and a
step's row id found there serves the records that name the step by its
``step_started`` record (``step_ref``). A record the database refuses for good (its
run is gone, a step it names was never recorded) is kept in ``journal_applied`` too,
whole, with the reason: a merge never stops on one bad record, and never loses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from bot.audit import writes
from bot.audit.backend import Dialect
from bot.audit.db import INTEGRITY, Conn, dialect_of, execute, fetch
from bot.audit.journal import JournalRecord
from bot.errors import RunNotFoundError

# What the database refuses for good: the record is kept aside, the merge goes on.
_REFUSED: tuple[type[Exception], ...] = (writes.Rejected, RunNotFoundError, ValueError, *INTEGRITY)


@dataclass
class Applied:
    """What one ``apply`` did."""

    row_ids: dict[str, int] = field(default_factory=dict)  # record id -> the row it made
    merged: list[str] = field(default_factory=list)  # applied now
    skipped: list[str] = field(default_factory=list)  # applied by an earlier merge
    rejected: list[tuple[JournalRecord, str]] = field(default_factory=list)


async def already_applied(conn: Conn, records: list[JournalRecord]) -> Applied | None:
    """What an earlier try of this same direct write did, if it committed (None: it did
    not). One transaction wrote the whole batch, so its first record's mark says."""
    if not records:
        return None
    ids = [r.id for r in records]
    rows = await fetch(
        conn,
        f"SELECT id, row_id FROM journal_applied WHERE id IN ({', '.join('?' * len(ids))})",  # noqa: S608
        tuple(ids),
    )
    found = {str(r["id"]): r["row_id"] for r in rows}
    if ids[0] not in found:
        return None
    return Applied(
        row_ids={k: int(v) for k, v in found.items() if v is not None}, skipped=list(found)
    )


async def apply(
    conn: Conn, records: list[JournalRecord], *, merge: bool, now: str, mark: bool = False
) -> Applied:
    """Apply ``records`` in order. ``merge``: they come from the journal, so each is
    applied at most once (``journal_applied``) and one the database refuses is kept
    there with the reason; otherwise (the direct path) a refusal raises. ``mark``: the
    direct path leaves each record's id in ``journal_applied`` too, so a retry of a
    commit whose answer was lost (PostgreSQL over a network), or a merge of the same
    records journaled after it, finds them written instead of writing them twice."""
    done = Applied()
    for record in records:
        if merge:
            row = await fetch(conn, "SELECT row_id FROM journal_applied WHERE id = ?", (record.id,))
            if row:
                if row[0]["row_id"] is not None:
                    done.row_ids[record.id] = int(row[0]["row_id"])
                done.skipped.append(record.id)
                continue
        if not merge:
            row_id = await writes.apply(conn, record.write, at=record.at, row_ids=done.row_ids)
            if mark:
                await execute(
                    conn,
                    "INSERT INTO journal_applied (id, row_id, applied_at) VALUES (?, ?, ?)",
                    (record.id, row_id, now),
                )
        else:
            # A savepoint per record: one the database refuses leaves no half of itself.
            await conn.execute("SAVEPOINT journal_record")
            try:
                row_id = await writes.apply(conn, record.write, at=record.at, row_ids=done.row_ids)
            except _REFUSED as exc:
                await conn.execute("ROLLBACK TO journal_record")
                await conn.execute("RELEASE journal_record")
                reason = f"{type(exc).__name__}: {exc}"
                await execute(
                    conn,
                    "INSERT INTO journal_applied (id, row_id, applied_at, "
                    "rejected) VALUES (?, NULL, ?, ?)",
                    (record.id, now, json.dumps({"reason": reason, "record": record.to_json()})),
                )
                done.rejected.append((record, reason))
                continue
            await conn.execute("RELEASE journal_record")
            await execute(
                conn,
                "INSERT INTO journal_applied (id, row_id, applied_at) VALUES (?, ?, ?)",
                (record.id, row_id, now),
            )
        if row_id is not None:
            done.row_ids[record.id] = row_id
        done.merged.append(record.id)
    return done


async def rejected(conn: Conn) -> list[tuple[str, str]]:
    """(record id, what was refused and why) of every record a merge kept aside."""
    # In the order the merges kept them (PostgreSQL has no rowid: its table has ``seq``).
    order = "rowid" if dialect_of(conn) is Dialect.SQLITE else "seq"
    rows = await fetch(
        conn,
        "SELECT id, rejected FROM journal_applied "  # noqa: S608 - a column name of ours
        f"WHERE rejected IS NOT NULL ORDER BY {order}",
    )
    return [(str(r["id"]), str(r["rejected"])) for r in rows]
