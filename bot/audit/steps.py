"""The ``steps`` table: each remote step of a run, its command, outcome and output tail."""

from __future__ import annotations

from bot.audit.db import INTEGRITY, Conn, execute, fetch, insert, run_not_found
from bot.audit.records import StepRecord, stored
from bot.core.status import RunStatus, StepStatus

_COLUMNS = (
    "id, run_id, host, step, command, status, exit_status, started_at, finished_at, "
    "duration_s, output_tail"
)


async def start(conn: Conn, run_id: int, host: str, step: str, command: str, now: str) -> int:
    """A new step, 'running' from ``now``; returns its id."""
    try:
        return await insert(
            conn,
            "INSERT INTO steps (run_id, host, step, command, status, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, host, step, command, StepStatus.RUNNING, now),
        )
    except INTEGRITY as exc:
        raise run_not_found(run_id) from exc


async def finish(
    conn: Conn,
    step_id: int,
    *,
    status: StepStatus,
    exit_status: int | None,
    duration_s: float | None,
    output_tail: str,
    now: str,
) -> None:
    changed = await execute(
        conn,
        "UPDATE steps SET status = ?, exit_status = ?, finished_at = ?, "
        "duration_s = ?, output_tail = ? WHERE id = ?",
        (status, exit_status, now, duration_s, output_tail, step_id),
    )
    if not changed:
        raise ValueError(f"there is no step #{step_id} in the audit log")


async def interrupt_running(conn: Conn, run_id: int, now: str) -> None:
    """The run's driver is gone: its running steps will never finish."""
    await execute(
        conn,
        "UPDATE steps SET status = ?, finished_at = ? WHERE run_id = ? AND status = ?",
        (StepStatus.INTERRUPTED, now, run_id, StepStatus.RUNNING),
    )


async def start_durations(conn: Conn, service: str, limit: int) -> list[float]:
    """How long the health gate of this service's last successful runs took (from
    ``systemctl start`` to /health answering 200), newest first."""
    rows = await fetch(
        conn,
        "SELECT s.duration_s FROM steps s JOIN runs r ON r.id = s.run_id "
        "WHERE r.service = ? AND r.status = ? AND s.step = ? AND s.status = ? "
        "AND s.duration_s IS NOT NULL ORDER BY s.id DESC LIMIT ?",
        (service, RunStatus.SUCCEEDED, "health", StepStatus.OK, limit),
    )
    return [float(r["duration_s"]) for r in rows]


async def of_run(conn: Conn, run_id: int) -> list[StepRecord]:
    rows = await fetch(
        conn,
        f"SELECT {_COLUMNS} FROM steps WHERE run_id = ? ORDER BY id",  # noqa: S608 - constant
        (run_id,),
    )
    return [
        StepRecord(
            id=r["id"],
            run_id=r["run_id"],
            host=r["host"],
            step=r["step"],
            command=r["command"],
            status=stored(StepStatus, r["status"], "step status"),
            exit_status=r["exit_status"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            duration_s=r["duration_s"],
            output_tail=r["output_tail"],
        )
        for r in rows
    ]
