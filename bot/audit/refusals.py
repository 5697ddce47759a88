"""The ``refusals`` table: one row per refused command or click, with the reason."""

from __future__ import annotations

from bot.audit.db import Conn, fetch, insert
from bot.audit.records import Refusal


async def add(
    conn: Conn,
    *,
    at: str,
    user: str,
    channel: str | None,
    command: str,
    reason: str,
) -> int:
    return await insert(
        conn,
        'INSERT INTO refusals (at, "user", channel, command, reason) VALUES (?, ?, ?, ?, ?)',
        (at, user, channel, command, reason),
    )


async def newest(conn: Conn, limit: int) -> list[Refusal]:
    rows = await fetch(
        conn,
        'SELECT id, at, "user", channel, command, reason FROM refusals ORDER BY id DESC LIMIT ?',
        (limit,),
    )
    return [Refusal(*row) for row in rows]
