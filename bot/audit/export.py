"""The audit log as one JSON object per run, for a log shipper or a SIEM (issue 22
item 2; ``python -m bot audit --format jsonl``).

Read a page at a time: ``page`` reads the next ``limit`` runs after a run id (keyset
pagination on the primary key, never OFFSET, never every row at once), and what belongs
to those runs (decisions, steps, package changes, environment snapshots) in one query
per table for the page, so memory is bounded by the page whatever the database holds.
A snapshot's freeze is not read into Python at all: SQLite's ``json_extract`` hands back
its digest and where the host keeps it.

The field names are a contract (README, "Audit export"); add fields, never rename.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.audit.backend import Dialect, Row
from bot.audit.db import Conn, dialect_of, fetch, qmarks
from bot.core.status import FINAL_STATUSES

# Bumped only if a field changes meaning; new fields do not bump it.
EXPORT_VERSION = 1
PAGE_RUNS = 100

_RUN_COLUMNS = (
    "id, service, action, status, service_state, hosts, requested_by, source, channel, "
    "dry_run, package_spec, index_name, version_before, version_after, summary, "
    "created_at, started_at, finished_at, expires_at, scheduled_at, override"
)
_FINAL = tuple(sorted(str(s) for s in FINAL_STATUSES))
# The run's own fields as exported, in this order (hosts and dry_run are converted).
_RUN_FIELDS = (
    "id",
    "service",
    "action",
    "status",
    "service_state",
    "requested_by",
    "source",
    "channel",
    "package_spec",
    "index_name",
    "version_before",
    "version_after",
    "summary",
    "created_at",
    "started_at",
    "finished_at",
    "expires_at",
    "scheduled_at",
)
_STEP_FIELDS = (
    "host",
    "step",
    "command",
    "status",
    "exit_status",
    "started_at",
    "finished_at",
    "duration_s",
    "output_tail",
)


@dataclass(frozen=True, slots=True)
class ExportFilter:
    """Which runs: of ``service``; requested at or after ``since`` and before ``until``
    (stored-form timestamps, ``2026-12-03T10:00:00Z``, which sort as text); only the
    finished ones (``final_only``: what ``--follow`` emits, each run once, complete)."""

    service: str | None = None
    since: str | None = None
    until: str | None = None
    final_only: bool = False

    def where(self) -> tuple[list[str], list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.service is not None:
            clauses.append("service = ?")
            params.append(self.service)
        if self.since is not None:
            clauses.append("created_at >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("created_at < ?")
            params.append(self.until)
        if self.final_only:
            clauses.append(f"status IN ({qmarks(_FINAL)})")
            params.extend(_FINAL)
        return clauses, params


@dataclass(frozen=True, slots=True)
class Page:
    """One page of runs as exported; the last run id the page's scan passed (None: no
    run after the cursor) and, with ``final_only``, the unfinished runs it passed."""

    records: list[dict[str, Any]]
    last_id: int | None
    open_ids: list[int]


async def page(conn: Conn, after_id: int, flt: ExportFilter, limit: int = PAGE_RUNS) -> Page:
    """The next ``limit`` runs after ``after_id`` that ``flt`` selects, oldest first.
    With ``final_only`` the unfinished runs the page passed are named in ``open_ids``
    (``--follow`` looks at them again later), so none is skipped for good."""
    unfinished = ExportFilter(flt.service, flt.since, flt.until, final_only=False)
    clauses, params = unfinished.where()
    where = " AND ".join(["id > ?", *clauses])
    rows = await fetch(
        conn,
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where} ORDER BY id LIMIT ?",  # noqa: S608
        (after_id, *params, limit),
    )
    if not rows:
        return Page([], None, [])
    final = [r for r in rows if r["status"] in _FINAL] if flt.final_only else rows
    open_ids = [r["id"] for r in rows if r["status"] not in _FINAL] if flt.final_only else []
    return Page(await _complete(conn, final), rows[-1]["id"], open_ids)


async def finished(conn: Conn, run_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Those of ``run_ids`` that have finished by now, exported, oldest first."""
    if not run_ids:
        return []
    rows = await fetch(
        conn,
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE id IN ({qmarks(run_ids)}) "  # noqa: S608
        f"AND status IN ({qmarks(_FINAL)}) ORDER BY id",
        (*run_ids, *_FINAL),
    )
    return await _complete(conn, rows)


# What belongs to a run, one query per table for a whole page (``{marks}``: its ids).
_PARTS: dict[str, str] = {
    "decisions": 'SELECT run_id, "user", decision, at FROM decisions WHERE run_id IN ({marks}) '
    "ORDER BY id",
    "steps": "SELECT run_id, host, step, command, status, exit_status, started_at, "
    "finished_at, duration_s, output_tail FROM steps WHERE run_id IN ({marks}) ORDER BY id",
    # A snapshot's freeze stays in SQLite: only its digest and the host's file come out.
    "environments": "SELECT run_id, host, kind, taken_at, "
    "{sha256} AS sha256, {lock} AS lock, "
    "CASE WHEN kind IN ('planned', 'installed') THEN {changes} END "
    "AS changes FROM environments WHERE run_id IN ({marks}) "
    "AND kind IN ('snapshot', 'planned', 'installed') ORDER BY id",
    "host_outcomes": "SELECT run_id, host, status, service_state, summary, at "
    "FROM host_outcomes WHERE run_id IN ({marks}) ORDER BY id",
    # Who let the bot signal which processes: a kill is what a SIEM most needs to see.
    "leftover_approvals": 'SELECT run_id, host, "user", pids, at FROM leftover_approvals '
    "WHERE run_id IN ({marks}) ORDER BY id",
    "rotations": "SELECT run_id, host, router, server, change, ok, detail, at "
    "FROM rotations WHERE run_id IN ({marks}) ORDER BY id",
    "release_switches": "SELECT run_id, host, from_release, to_release, kind, at "
    "FROM release_switches WHERE run_id IN ({marks}) ORDER BY id",
}

# The JSON fields of ``environments.data`` read in SQL, in each dialect: the digest and
# the file as text, the changes as JSON text (PostgreSQL stores ``data`` as text too).
_JSON: dict[Dialect, dict[str, str]] = {
    Dialect.SQLITE: {
        "sha256": "json_extract(data, '$.sha256')",
        "lock": "json_extract(data, '$.lock')",
        "changes": "json_extract(data, '$.changes')",
    },
    Dialect.POSTGRES: {
        "sha256": "(data::jsonb ->> 'sha256')",
        "lock": "(data::jsonb ->> 'lock')",
        "changes": "(data::jsonb -> 'changes')::text",
    },
}

Parts = dict[str, list[Row]]


async def _complete(conn: Conn, runs: list[Row]) -> list[dict[str, Any]]:
    if not runs:
        return []
    ids = [r["id"] for r in runs]
    per_run: dict[int, Parts] = {i: {name: [] for name in _PARTS} for i in ids}
    json_of = _JSON[dialect_of(conn)]
    for name, sql in _PARTS.items():
        for row in await fetch(conn, sql.format(marks=qmarks(ids), **json_of), ids):
            per_run[row["run_id"]][name].append(row)
    return [_record(r, per_run[r["id"]]) for r in runs]


def _row(row: Row, *keys: str) -> dict[str, Any]:
    return {k: row[k] for k in keys}


def _pick(rows: list[Row], *keys: str) -> list[dict[str, Any]]:
    return [_row(row, *keys) for row in rows]


def _record(run: Row, parts: Parts) -> dict[str, Any]:
    environments = parts["environments"]
    return {
        "export_version": EXPORT_VERSION,
        **{k: run[k] for k in _RUN_FIELDS},
        "hosts": json.loads(run["hosts"]),
        "dry_run": bool(run["dry_run"]),
        "override": bool(run["override"]),
        "decisions": _pick(parts["decisions"], "user", "decision", "at"),
        "steps": _pick(parts["steps"], *_STEP_FIELDS),
        "package_changes": [
            {
                "host": e["host"],
                "kind": e["kind"],
                "taken_at": e["taken_at"],
                "changes": json.loads(e["changes"]) if e["changes"] else [],
            }
            for e in environments
            if e["kind"] != "snapshot"
        ],
        "snapshots": _pick(
            [e for e in environments if e["kind"] == "snapshot"],
            "host",
            "taken_at",
            "sha256",
            "lock",
        ),
        "host_outcomes": _pick(
            parts["host_outcomes"], "host", "status", "service_state", "summary", "at"
        ),
        "leftover_approvals": [
            {**_row(k, "host", "user"), "pids": json.loads(k["pids"]), "at": k["at"]}
            for k in parts["leftover_approvals"]
        ],
        "rotations": [
            {**_row(t, "host", "router", "server", "change"), "ok": bool(t["ok"])}
            | _row(t, "detail", "at")
            for t in parts["rotations"]
        ],
        "release_switches": _pick(
            parts["release_switches"], "host", "from_release", "to_release", "kind", "at"
        ),
    }
