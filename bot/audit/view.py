"""Render audit records for people (a fixed-width table) and for programs (JSON).

Pure functions: the CLI prints them, the Slack handlers wrap the table in a code block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from bot.audit.host_outcomes import HostOutcome
from bot.audit.records import EnvironmentRecord, RunRecord, StepRecord
from bot.audit.release_switches import SwitchRow
from bot.audit.rotations import RotationRow
from bot.core import table
from bot.core.packages import PackageDiff, Restoration
from bot.core.releases import SwitchKind
from bot.core.table import Column
from bot.core.versions import change_text

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


def _when(stamp: str) -> str:
    # 2026-11-30T13:12:01Z -> 2026-11-30 13:12
    return stamp[:16].replace("T", " ")


def _version(record: RunRecord) -> str:
    return change_text(record.version_before, record.version_after) or "-"


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
    columns = [Column(header, max_width=cap) for header, cap in _COLUMNS]
    return table.render(columns, [_cells(r) for r in records])


def runs_json(
    records: Sequence[RunRecord],
    packages_changed: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
    restorations: Mapping[int, Restoration] | None = None,
    hosts: Mapping[int, Sequence[HostOutcome]] | None = None,
    rotations: Mapping[int, Sequence[RotationRow]] | None = None,
    switches: Mapping[int, Sequence[SwitchRow]] | None = None,
) -> str:
    """A pretty JSON array of ``RunRecord.to_json()`` objects, each with
    ``packages_changed``: what the run's install really changed on its first host
    (``[{name, before, after}]``), or null when it installed nothing; and
    ``environment_after_rollback``: on that host, after a rollback, ``equals_snapshot``
    (those changes were undone), ``differs_from_snapshot`` or ``unknown``; null when no
    rollback ran there (the changes are what the host has); and ``host_outcomes``: each host's
    end, ``[{host, status, service_state}]`` (empty for a run that reached none); and
    ``rotations``: each change of a replica's place in its router's rotation, in order,
    ``[{host, router, server, change, ok, detail, at}]`` (issue 19); and
    ``release_switches``: each switch of a side-by-side service's link, in order,
    ``[{host, from_release, to_release, kind, at}]``."""
    changed, restored, ends = packages_changed or {}, restorations or {}, hosts or {}
    moved, switched = rotations or {}, switches or {}
    return json.dumps(
        [
            {
                **r.to_json(),
                "packages_changed": (list(changed[r.id]) if r.id in changed else None),
                "environment_after_rollback": restored.get(r.id),
                "host_outcomes": [
                    {
                        "host": h.host,
                        "status": h.status,
                        "service_state": None if h.service_state is None else str(h.service_state),
                    }
                    for h in ends.get(r.id, ())
                ],
                "rotations": [
                    {
                        "host": m.host,
                        "router": m.router,
                        "server": m.server,
                        "change": m.change,
                        "ok": m.ok,
                        "detail": m.detail,
                        "at": m.at,
                    }
                    for m in moved.get(r.id, ())
                ],
                "release_switches": [
                    {
                        "host": s.host,
                        "from_release": s.from_release,
                        "to_release": s.to_release,
                        "kind": str(s.kind),
                        "at": s.at,
                    }
                    for s in switched.get(r.id, ())
                ],
            }
            for r in records
        ],
        indent=2,
        ensure_ascii=False,
    )


_ENV_TITLES = {
    "preview": "Package changes shown on the card (dry run at request time)",
    "planned": "Package changes planned at preflight (dry run)",
    "installed": "Package changes the install made",
    "restored": "After the rollback, compared with the snapshot",
}


# After the install's changes, what a rollback on that host then did to them.
_UNDONE = {
    Restoration.EQUALS_SNAPSHOT: " (undone: the rollback restored the snapshot)",
    Restoration.DIFFERS_FROM_SNAPSHOT: " (a rollback ran, but the environment still "
    "DIFFERS from the snapshot)",
    Restoration.UNKNOWN: " (a rollback ran; whether it restored the snapshot is unknown)",
}


def _env_lines(env: EnvironmentRecord, restored: Restoration | None = None) -> list[str]:
    data = env.data
    if env.kind == "snapshot":
        n = len(data.get("freeze") or {}) + len(data.get("others") or [])
        where = data.get("lock")
        return [
            f"{env.host}: environment snapshot of {n} packages"
            + (f", kept on the host as {where}" if where else " (dry run: not kept)")
        ]
    title = _ENV_TITLES.get(env.kind, env.kind)
    if "changes" not in data:
        return [f"{env.host}: {title}: unknown ({data.get('note') or 'not read'})"]
    diff = PackageDiff.from_json(data)
    if env.kind == "restored":
        state = "equals the snapshot" if not diff.changes else "DIFFERS from the snapshot:"
        return [
            f"{env.host}: {title}: {state}",
            *(f"    {line}" for line in diff.lines() if diff.changes),
        ]
    undone = _UNDONE[restored] if env.kind == "installed" and restored is not None else ""
    return [f"{env.host}: {title}{undone}:", *(f"    {line}" for line in diff.lines())]


def _switch_line(s: SwitchRow) -> str:
    back = " (switched back: the release it went to failed)"
    return (
        f"  {s.host}: {s.from_release or '(no release)'} -> {s.to_release}"
        f"{back if s.kind == SwitchKind.SWITCH_BACK else ''} at {s.at}"
    )


def run_view(
    record: RunRecord,
    steps: Sequence[StepRecord],
    environments: Sequence[EnvironmentRecord],
    switches: Sequence[SwitchRow] = (),
) -> str:
    """One run for people: who, what, how it ended, each step, each switch of a
    side-by-side service's link, and what it did to the environment (``python -m bot
    audit --run N``, ``/vllm audit <run-id>``)."""
    lines = [
        f"run #{record.id}: {record.action}{' (dry run)' if record.dry_run else ''} "
        f"{record.service} on {', '.join(record.hosts)}: {record.status}",
        f"requested by {record.requested_by} at {record.created_at}; approved by "
        f"{', '.join(record.approved_by) or '-'}"
        + (f"; recovered by {', '.join(record.recovered_by)}" if record.recovered_by else ""),
        f"{record.package_spec or '-'}; version {_version(record)}",
    ]
    if record.summary:
        lines.append(f"summary: {record.summary}")
    if steps:
        lines.append("steps:")
        for s in steps:
            took = f"{s.duration_s:.1f}s" if s.duration_s is not None else "-"
            code = f" exit {s.exit_status}" if s.exit_status is not None else ""
            lines.append(f"  {s.host} {s.step}: {s.status} ({took}{code})")
    if switches:
        lines.append("release switches:")
        lines += [_switch_line(s) for s in switches]
    # The last rollback on each host says whether its install's changes still hold.
    restored = {e.host: Restoration.of(e.data) for e in environments if e.kind == "restored"}
    for env in environments:
        lines += _env_lines(env, restored.get(env.host))
    return "\n".join(lines)
