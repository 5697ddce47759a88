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
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.audit.db import Conn, fetch, qmarks
from bot.core.status import FINAL_STATUSES

# Bumped only if a field changes meaning; new fields do not bump it.
EXPORT_VERSION = 1
PAGE_RUNS = 100

_RUN_COLUMNS = (
    "id, service, action, status, service_state, hosts, requested_by, source, channel, "
    "dry_run, package_spec, index_name, version_before, version_after, summary, "
    "created_at, started_at, finished_at, expires_at"
)
_FINAL = tuple(sorted(str(s) for s in FINAL_STATUSES))


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


def _by_run(rows: list[sqlite3.Row]) -> dict[int, list[sqlite3.Row]]:
    out: dict[int, list[sqlite3.Row]] = {}
    for r in rows:
        out.setdefault(r["run_id"], []).append(r)
    return out


async def _complete(conn: Conn, runs: list[sqlite3.Row]) -> list[dict[str, Any]]:
    if not runs:
        return []
    ids = [r["id"] for r in runs]
    marks = qmarks(ids)
    decisions = _by_run(
        await fetch(
            conn,
            f"SELECT run_id, user, decision, at FROM decisions "  # noqa: S608
            f"WHERE run_id IN ({marks}) ORDER BY id",
            ids,
        )
    )
    steps = _by_run(
        await fetch(
            conn,
            "SELECT run_id, host, step, command, status, exit_status, started_at, "  # noqa: S608
            f"finished_at, duration_s, output_tail FROM steps WHERE run_id IN ({marks}) "
            "ORDER BY id",
            ids,
        )
    )
    environments = _by_run(
        await fetch(
            conn,
            "SELECT run_id, host, kind, taken_at, "  # noqa: S608
            "json_extract(data, '$.sha256') AS sha256, json_extract(data, '$.lock') AS lock, "
            "CASE WHEN kind IN ('planned', 'installed') "
            "THEN json_extract(data, '$.changes') END AS changes "
            f"FROM environments WHERE run_id IN ({marks}) "
            "AND kind IN ('snapshot', 'planned', 'installed') ORDER BY id",
            ids,
        )
    )
    outcomes = _by_run(
        await fetch(
            conn,
            "SELECT run_id, host, status, service_state, summary, at "  # noqa: S608
            f"FROM host_outcomes WHERE run_id IN ({marks}) ORDER BY id",
            ids,
        )
    )
    # Who let the bot signal which processes: a kill is what a SIEM most needs to see.
    kills = _by_run(
        await fetch(
            conn,
            "SELECT run_id, host, user, pids, at FROM leftover_approvals "  # noqa: S608
            f"WHERE run_id IN ({marks}) ORDER BY id",
            ids,
        )
    )
    rotations = _by_run(
        await fetch(
            conn,
            "SELECT run_id, host, router, server, change, ok, detail, at "  # noqa: S608
            f"FROM rotations WHERE run_id IN ({marks}) ORDER BY id",
            ids,
        )
    )
    return [
        {
            **_record(
                r,
                decisions.get(r["id"], []),
                steps.get(r["id"], []),
                environments.get(r["id"], []),
            ),
            "host_outcomes": [
                {
                    "host": o["host"],
                    "status": o["status"],
                    "service_state": o["service_state"],
                    "summary": o["summary"],
                    "at": o["at"],
                }
                for o in outcomes.get(r["id"], [])
            ],
            "leftover_approvals": [
                {"host": k["host"], "user": k["user"], "pids": json.loads(k["pids"]), "at": k["at"]}
                for k in kills.get(r["id"], [])
            ],
            "rotations": [
                {
                    "host": t["host"],
                    "router": t["router"],
                    "server": t["server"],
                    "change": t["change"],
                    "ok": bool(t["ok"]),
                    "detail": t["detail"],
                    "at": t["at"],
                }
                for t in rotations.get(r["id"], [])
            ],
        }
        for r in runs
    ]


def _record(
    run: sqlite3.Row,
    decisions: list[sqlite3.Row],
    steps: list[sqlite3.Row],
    environments: list[sqlite3.Row],
) -> dict[str, Any]:
    return {
        "export_version": EXPORT_VERSION,
        "id": run["id"],
        "service": run["service"],
        "action": run["action"],
        "status": run["status"],
        "service_state": run["service_state"],
        "hosts": json.loads(run["hosts"]),
        "requested_by": run["requested_by"],
        "source": run["source"],
        "channel": run["channel"],
        "dry_run": bool(run["dry_run"]),
        "package_spec": run["package_spec"],
        "index_name": run["index_name"],
        "version_before": run["version_before"],
        "version_after": run["version_after"],
        "summary": run["summary"],
        "created_at": run["created_at"],
        "started_at": run["started_at"],
        "finished_at": run["finished_at"],
        "expires_at": run["expires_at"],
        "decisions": [
            {"user": d["user"], "decision": d["decision"], "at": d["at"]} for d in decisions
        ],
        "steps": [
            {
                "host": s["host"],
                "step": s["step"],
                "command": s["command"],
                "status": s["status"],
                "exit_status": s["exit_status"],
                "started_at": s["started_at"],
                "finished_at": s["finished_at"],
                "duration_s": s["duration_s"],
                "output_tail": s["output_tail"],
            }
            for s in steps
        ],
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
        "snapshots": [
            {"host": e["host"], "taken_at": e["taken_at"], "sha256": e["sha256"], "lock": e["lock"]}
            for e in environments
            if e["kind"] == "snapshot"
        ],
    }
