"""The service state a run and its hosts left (issue 18): written through the writer the
engine uses, directly and through the journal's replay, and read back; and a journal
line written before the records were types still replays."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.audit import host_outcomes
from bot.audit.journal import Journal
from bot.audit.resilient import AuditWriter
from bot.audit.store import AuditLog
from bot.core.service_state import ServiceState
from bot.core.status import RunStatus
from tests.test_audit_journal import new_run


@pytest.fixture
async def audit(tmp_path: Path) -> AsyncIterator[AuditLog]:
    async with AuditLog.open(tmp_path / "audit.db") as log:
        yield log


async def _outcomes(audit: AuditLog, run_id: int) -> list[host_outcomes.HostOutcome]:
    return (await audit.host_outcomes([run_id])).get(run_id, [])


async def test_the_state_is_stored_and_shown_in_the_json(audit: AuditLog, tmp_path: Path) -> None:
    run_id = await new_run(audit)
    w = AuditWriter(audit, Journal.for_db(audit.path, tmp_path / "fb"), background=False)
    await w.host_finished(run_id, "h1", "failed", "h1 DOWN", state=ServiceState.DOWN)
    await w.finish(
        run_id,
        RunStatus.FAILED,
        "it failed",
        lambda: audit.transition(
            run_id, RunStatus.FAILED, expect=[RunStatus.RUNNING], summary="it failed"
        ),
        state=ServiceState.DOWN,
    )
    run = await audit.get_run(run_id)
    assert run.service_state is ServiceState.DOWN
    assert run.to_json()["service_state"] == "down"
    [outcome] = await _outcomes(audit, run_id)
    assert (outcome.host, outcome.service_state) == ("h1", ServiceState.DOWN)


async def test_the_state_survives_the_journal(audit: AuditLog, tmp_path: Path) -> None:
    run_id = await new_run(audit)
    j = Journal.for_db(audit.path, tmp_path / "fb")
    w = AuditWriter(audit, j, background=False)
    w.down = "the test says so"  # every write goes to the journal
    await w.host_finished(run_id, "h1", "ok", "h1 UP", state=ServiceState.UP_NOT_READY)
    await w.finish(
        run_id, RunStatus.SUCCEEDED, "done", lambda: _never(), state=ServiceState.UP_NOT_READY
    )
    # The state first: whoever reads the final status reads the state with it.
    assert [r.op for r in j.read()] == ["host_finished", "run_service_state", "finish"]
    assert await w.merge() == 3
    run = await audit.get_run(run_id)
    assert (run.status, run.service_state) == (RunStatus.SUCCEEDED, ServiceState.UP_NOT_READY)
    [outcome] = await _outcomes(audit, run_id)
    assert outcome.service_state is ServiceState.UP_NOT_READY


async def _never() -> None:
    raise AssertionError("the writer is down: nothing goes direct")


async def test_a_journal_line_of_the_untyped_writer_still_replays(
    audit: AuditLog, tmp_path: Path
) -> None:
    run_id = await new_run(audit)
    j = Journal.for_db(audit.path, tmp_path / "fb")
    # As bot/audit/resilient.py wrote it before issue 18 (op and fields, expect as values).
    j.primary.write_bytes(
        b'{"v":1,"id":"h:1:a/1","proc":"h:1:a","seq":1,"at":"2026-11-30T13:12:01Z",'
        b'"op":"finish","run_id":%d,"status":"failed","summary":"old",'
        b'"expect":["running","interrupted"]}\n' % run_id
    )
    assert await AuditWriter(audit, j, background=False).start() == 1
    run = await audit.get_run(run_id)
    assert (run.status, run.summary, run.service_state) == (RunStatus.FAILED, "old", None)
