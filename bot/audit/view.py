"""Render audit records for people (a fixed-width table) and for programs (JSON).

Pure functions: the CLI prints them, the Slack handlers wrap the table in a code block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.audit.records import RunRecord

# (header, widest a cell may get); long values are cut with an ellipsis so one odd
# package spec cannot push every other row off a Slack code block.
_COLUMNS: tuple[tuple[str, int], ...] = (
    ("ID", 10),
    ("WHEN (UTC)", 16),
    ("SERVICE", 24),
    ("ACTION", 20),
    ("STATUS", 16),
    ("REQUESTED BY", 16),
    ("APPROVED BY", 24),
    ("VERSION", 40),
)
_GAP = "  "


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _when(stamp: str) -> str:
    # 2026-11-30T13:12:01Z -> 2026-11-30 13:12
    return stamp[:16].replace("T", " ")


def _version(record: RunRecord) -> str:
    if record.version_before is None and record.version_after is None:
        return "-"
    return f"{record.version_before or '?'} -> {record.version_after or '?'}"


def _cells(record: RunRecord) -> list[str]:
    return [
        str(record.id),
        _when(record.created_at),
        record.service,
        record.action + (" (dry run)" if record.dry_run else ""),
        record.status,
        record.requested_by,
        ", ".join(record.approved_by) or "-",
        _version(record),
    ]


def runs_table(records: Sequence[RunRecord]) -> str:
    """One line per run under a header; ``no runs`` when there are none."""
    if not records:
        return "no runs"
    rows = [[_cut(cell, cap) for cell, (_, cap) in zip(_cells(r), _COLUMNS, strict=True)]
            for r in records]
    headers = [header for header, _ in _COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return _GAP.join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def runs_json(records: Sequence[RunRecord]) -> str:
    """A pretty JSON array of ``RunRecord.to_json()`` objects."""
    return json.dumps([r.to_json() for r in records], indent=2, ensure_ascii=False)
