"""``python -m bot audit --format jsonl [--since T] [--until T] [--service S] [--follow]``:
the audit log streamed as JSON lines for a log shipper (issue 22 item 2).

A page of runs at a time (``AuditLog.export_page``), each line written and flushed as it
is made, so memory holds one page whatever the database's size. ``--follow`` then polls
(``sleep``, injected: tests pass one that drives the database instead of waiting) and
writes each run once, when it has finished: a shipper gets complete records and never
one run twice. A run still in flight when a scan passes it is remembered by id (a few:
runs in flight hold a lock each) and written once it ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from bot.audit.export import ExportFilter
from bot.audit.records import format_ts
from bot.audit.store import AuditLog
from bot.core.redact import masked_json
from bot.errors import InputError

POLL_S = 2.0
# How many remembered ids one query asks about (SQLite's bound on parameters is far above).
_OPEN_CHUNK = 500

Write = Callable[[str], object]
Redact = Callable[[str], str]
Sleep = Callable[[float], Awaitable[None]]


def parse_time(option: str, text: str) -> str:
    """An ISO 8601 time or date (UTC unless it names an offset) in the stored form."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            f"{option} {text!r} is not a time: use ISO 8601, e.g. 2026-12-03T10:00:00Z "
            "or 2026-12-03"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return format_ts(moment)


def export_filter(
    *, service: str | None, since: str | None, until: str | None, follow: bool
) -> ExportFilter:
    """The options as a filter; ``--until`` with ``--follow`` is refused (nothing after
    the end would ever come)."""
    if follow and until is not None:
        raise InputError("--follow streams what comes next: it takes no --until")
    low = None if since is None else parse_time("--since", since)
    high = None if until is None else parse_time("--until", until)
    if low is not None and high is not None and low >= high:
        raise InputError(f"--since ({low}) must be before --until ({high})")
    return ExportFilter(service=service, since=low, until=high, final_only=follow)


def export_line(record: dict[str, Any], redact: Redact) -> str:
    """One run's line: each value masked, then serialized (``masked_json``), so any host
    text leaves the line valid JSON. ASCII only: a control character in an output tail
    reaches a terminal escaped."""
    masked = masked_json(record, redact)
    return json.dumps(masked, ensure_ascii=True, separators=(",", ":")) + "\n"


async def export_jsonl(
    audit: AuditLog,
    write: Write,
    flt: ExportFilter,
    *,
    redact: Redact,
    follow: bool = False,
    poll_s: float = POLL_S,
    sleep: Sleep = asyncio.sleep,
    flush: Callable[[], None] = lambda: None,
) -> int:
    """Write every run ``flt`` selects, a line each, oldest first; with ``follow`` go on
    until cancelled. Returns how many lines were written."""
    flt = replace(flt, final_only=follow)
    after = 0
    open_ids: list[int] = []
    written = 0

    def emit(records: list[dict[str, Any]]) -> None:
        nonlocal written
        for record in records:
            write(export_line(record, redact))
        written += len(records)
        flush()

    while True:
        if open_ids:
            done: set[int] = set()
            for i in range(0, len(open_ids), _OPEN_CHUNK):
                records = await audit.export_finished(open_ids[i : i + _OPEN_CHUNK])
                emit(records)
                done.update(r["id"] for r in records)
            open_ids = [i for i in open_ids if i not in done]
        while True:
            page = await audit.export_page(after, flt)
            if page.last_id is None:
                break
            after = page.last_id
            open_ids.extend(page.open_ids)
            emit(page.records)
        if not follow:
            return written
        await sleep(poll_s)
