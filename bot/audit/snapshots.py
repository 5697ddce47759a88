"""The ``gpu_snapshots`` table: GPU tables taken during a run or for a status query."""

from __future__ import annotations

import json

from bot.audit.db import INTEGRITY, Conn, fetch, insert, run_not_found
from bot.audit.records import SnapshotRecord


async def add(
    conn: Conn,
    run_id: int | None,
    host: str,
    label: str,
    data_json: str,
    now: str,
) -> int:
    try:
        return await insert(
            conn,
            "INSERT INTO gpu_snapshots (run_id, host, label, taken_at, data) "
            "VALUES (?, ?, ?, ?, ?)",
            (run_id, host, label, now, data_json),
        )
    except INTEGRITY as exc:
        raise run_not_found(run_id or 0) from exc


async def of_run(conn: Conn, run_id: int) -> list[SnapshotRecord]:
    rows = await fetch(
        conn,
        "SELECT id, run_id, host, label, taken_at, data FROM gpu_snapshots "
        "WHERE run_id = ? ORDER BY id",
        (run_id,),
    )
    return [
        SnapshotRecord(
            r["id"], r["run_id"], r["host"], r["label"], r["taken_at"], json.loads(r["data"])
        )
        for r in rows
    ]


async def last_of_host(conn: Conn, host: str, label: str) -> SnapshotRecord | None:
    """The host's newest snapshot with ``label`` (run or not), or None."""
    rows = await fetch(
        conn,
        "SELECT id, run_id, host, label, taken_at, data FROM gpu_snapshots "
        "WHERE host = ? AND label = ? ORDER BY id DESC LIMIT 1",
        (host, label),
    )
    return next(
        (
            SnapshotRecord(
                r["id"], r["run_id"], r["host"], r["label"], r["taken_at"], json.loads(r["data"])
            )
            for r in rows
        ),
        None,
    )
