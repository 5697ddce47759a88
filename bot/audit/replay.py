"""Writing journal records into the database: the direct path of a resilient write, and
the merge of the fallback journal (``bot.audit.journal``) once the database is back.

Both go through ``apply``, inside the caller's one write transaction (``AuditLog``'s
``write_records``), with the table modules' statements and each record's own
timestamp, so a row written late reads as if it had been written on time.

A merged record leaves its id in ``journal_applied`` (migration ``0003``), in the same
transaction as its rows: replaying a journal twice applies each record once, and a
step's row id found there serves the records that name the step by its
``step_started`` record (``step_ref``). A record the database refuses for good (its
run is gone, a step it names was never recorded) is kept in ``journal_applied`` too,
whole, with the reason: a merge never stops on one bad record, and never loses it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

import aiosqlite

from bot.audit import decisions, environments, locks, runs, snapshots, steps
from bot.audit.db import execute, fetch
from bot.audit.journal import JournalRecord
from bot.core.status import Decision, RunStatus, StepStatus
from bot.errors import RunNotFoundError


class Rejected(Exception):
    """The database can never take this record (not a passing condition)."""


@dataclass
class Applied:
    """What one ``apply`` did."""

    row_ids: dict[str, int] = field(default_factory=dict)  # record id -> the row it made
    merged: list[str] = field(default_factory=list)  # applied now
    skipped: list[str] = field(default_factory=list)  # applied by an earlier merge
    rejected: list[tuple[JournalRecord, str]] = field(default_factory=list)


async def apply(conn: aiosqlite.Connection, records: list[JournalRecord], *, merge: bool,
                now: str) -> Applied:
    """Apply ``records`` in order. ``merge``: they come from the journal, so each is
    applied at most once (``journal_applied``) and one the database refuses is kept
    there with the reason; otherwise (the direct path) a refusal raises."""
    done = Applied()
    for record in records:
        if merge:
            row = await fetch(conn, "SELECT row_id FROM journal_applied WHERE id = ?",
                              (record.id,))
            if row:
                if row[0]["row_id"] is not None:
                    done.row_ids[record.id] = int(row[0]["row_id"])
                done.skipped.append(record.id)
                continue
        if not merge:
            row_id = await _apply_one(conn, record, done.row_ids)
        else:
            # A savepoint per record: one the database refuses leaves no half of itself.
            await conn.execute("SAVEPOINT journal_record")
            try:
                row_id = await _apply_one(conn, record, done.row_ids)
            except (Rejected, RunNotFoundError, sqlite3.IntegrityError, ValueError) as exc:
                await conn.execute("ROLLBACK TO journal_record")
                await conn.execute("RELEASE journal_record")
                reason = f"{type(exc).__name__}: {exc}"
                await execute(conn, "INSERT INTO journal_applied (id, row_id, applied_at, "
                              "rejected) VALUES (?, NULL, ?, ?)",
                              (record.id, now, json.dumps({"reason": reason,
                                                           "record": record.to_json()})))
                done.rejected.append((record, reason))
                continue
            await conn.execute("RELEASE journal_record")
            await execute(conn, "INSERT INTO journal_applied (id, row_id, applied_at) "
                          "VALUES (?, ?, ?)", (record.id, row_id, now))
        if row_id is not None:
            done.row_ids[record.id] = row_id
        done.merged.append(record.id)
    return done


async def _step_id(conn: aiosqlite.Connection, record: JournalRecord,
                   row_ids: dict[str, int]) -> int:
    f = record.fields
    if f.get("step_id") is not None:
        return int(f["step_id"])
    ref = str(f["step_ref"])
    if ref in row_ids:
        return row_ids[ref]
    row = await fetch(conn, "SELECT row_id FROM journal_applied WHERE id = ?", (ref,))
    if row and row[0]["row_id"] is not None:
        return int(row[0]["row_id"])
    raise Rejected(f"the step it finishes (journal record {ref}) was never recorded")


async def _add_record(conn: aiosqlite.Connection, record: JournalRecord) -> None:
    """A GPU table or a package set: rows that are only ever added."""
    f, at = record.fields, record.at
    if record.op == "snapshot":
        await snapshots.add(conn, f["run_id"], f["host"], f["label"], f["data"], at)
    else:
        await environments.add(conn, int(f["run_id"]), f["host"], f["kind"], f["data"], at)


async def _apply_one(conn: aiosqlite.Connection, record: JournalRecord,
                     row_ids: dict[str, int]) -> int | None:
    """The statements of one record; the new row's id for a ``step_started``."""
    f, at = record.fields, record.at
    op = record.op
    if op == "step_started":
        step_id = await steps.start(conn, int(f["run_id"]), f["host"], f["step"],
                                    f["command"], at)
        await runs.update(conn, int(f["run_id"]), {"current_step": f["step"]})
        return step_id
    if op == "step_finished":
        await steps.finish(conn, await _step_id(conn, record, row_ids),
                           status=StepStatus(f["status"]), exit_status=f["exit_status"],
                           duration_s=f["duration_s"], output_tail=f["output_tail"], now=at)
    elif op in ("snapshot", "environment"):
        await _add_record(conn, record)
    elif op == "versions":
        sets = {column: f[key] for key, column in (("before", "version_before"),
                                                   ("after", "version_after"))
                if f.get(key) is not None}
        if sets:
            await runs.update(conn, int(f["run_id"]), sets)
    elif op == "decision":
        await decisions.record(conn, int(f["run_id"]), f["user"], Decision(f["decision"]), at)
    elif op == "finish":
        # A finish that waited in the journal may find the run 'interrupted' by a
        # recovery that took the silence for a dead driver: what the driver recorded is
        # the evidence, so it wins over that guess.
        expect = [RunStatus(s) for s in f.get("expect", [RunStatus.RUNNING])]
        if not await runs.transition(conn, int(f["run_id"]), RunStatus(f["status"]),
                                     expect=expect, summary=f["summary"], owner=None, now=at):
            current = await fetch(conn, "SELECT status FROM runs WHERE id = ?", (f["run_id"],))
            raise Rejected(f"run #{f['run_id']} is {current[0]['status']}, not one of "
                           f"{', '.join(expect)}")
    elif op == "interrupt":
        if await runs.has_status(conn, int(f["run_id"]), RunStatus.RUNNING):
            await runs.interrupt(conn, int(f["run_id"]), f["summary"], at)
    elif op == "release_locks":
        await locks.release(conn, int(f["run_id"]))
    else:  # parse_lines only lets known operations through
        raise Rejected(f"unknown operation {op!r}")
    return None


async def rejected(conn: aiosqlite.Connection) -> list[tuple[str, str]]:
    """(record id, what was refused and why) of every record a merge kept aside."""
    rows = await fetch(conn, "SELECT id, rejected FROM journal_applied "
                             "WHERE rejected IS NOT NULL ORDER BY rowid")
    return [(str(r["id"]), str(r["rejected"])) for r in rows]
