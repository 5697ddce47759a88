"""The ``environments`` table: what each run did to a host's whole Python environment
(issue 10): the planned and the actual package changes, the snapshot a rollback restores,
and how the restored environment compares with it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.audit.backend import Row
from bot.audit.db import INTEGRITY, Conn, fetch, insert, qmarks, run_not_found
from bot.audit.records import EnvironmentRecord

_COLUMNS = "id, run_id, host, kind, taken_at, data"


async def add(conn: Conn, run_id: int, host: str, kind: str, data_json: str, now: str) -> int:
    try:
        return await insert(
            conn,
            "INSERT INTO environments (run_id, host, kind, taken_at, data) VALUES (?, ?, ?, ?, ?)",
            (run_id, host, kind, now, data_json),
        )
    except INTEGRITY as exc:
        raise run_not_found(run_id) from exc


def _record(r: Row) -> EnvironmentRecord:
    return EnvironmentRecord(
        r["id"], r["run_id"], r["host"], r["kind"], r["taken_at"], json.loads(r["data"])
    )


async def of_run(conn: Conn, run_id: int) -> list[EnvironmentRecord]:
    rows = await fetch(
        conn,
        f"SELECT {_COLUMNS} FROM environments WHERE run_id = ? ORDER BY id",  # noqa: S608
        (run_id,),
    )
    return [_record(r) for r in rows]


async def of_kind(conn: Conn, run_ids: Sequence[int], kind: str) -> list[EnvironmentRecord]:
    """Every record of ``kind`` for these runs, oldest first."""
    if not run_ids:
        return []
    rows = await fetch(
        conn,
        f"SELECT {_COLUMNS} FROM environments WHERE kind = ? "  # noqa: S608 - constant
        f"AND run_id IN ({qmarks(run_ids)}) ORDER BY id",
        (kind, *run_ids),
    )
    return [_record(r) for r in rows]
