"""The fallback journal of the audit log (bot/audit/journal.py, replay.py, resilient.py):
the file format, the merge into a real SQLite file, and the writer's retries, with the
database really locked by a second connection and time injected."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.audit import replay as replay_sql
from bot.audit.journal import Journal, JournalRecord, ordered, parse_lines
from bot.audit.resilient import AuditWriter, unavailable
from bot.audit.store import AuditLog
from bot.audit.writes import StepStarted
from bot.core import events as ev
from bot.core.releases import Switch, SwitchKind
from bot.core.status import Action, Decision, RunStatus, Source, StepStatus
from bot.engine.audit_sink import RunAudit
from bot.engine.executor import CancelToken
from bot.errors import AuditUnavailable, RunNotFoundError
from bot.settings import PostgresUrl
from tests.support.audit_db import Locker, Target, raw_rows
from tests.support.clock import ManualClock
from tests.support.postgres import migrate_pg

SECRET = "hunter2-very-secret"


def rec(
    proc: str, seq: int, op: str = "release_locks", at: str = "2026-11-30T13:00:00Z", **fields: Any
) -> JournalRecord:
    # Through the journal's own reading: the fields as a line of the file holds them.
    return JournalRecord.from_json(
        {
            "v": 1,
            "id": f"{proc}/{seq}",
            "proc": proc,
            "seq": seq,
            "at": at,
            "op": op,
            **(fields or {"run_id": 1}),
        }
    )


class FakeTime:
    """``clock`` and ``sleep`` for the writer: sleeping moves the clock, and each sleep
    runs the test's hook (e.g. release the lock on the second one)."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.sleeps: list[float] = []
        self.on_sleep: list[Any] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.advance(seconds)
        if self.on_sleep:
            self.on_sleep.pop(0)()
        await asyncio.sleep(0)


@pytest.fixture
async def audit(audit_target: Target) -> AsyncIterator[AuditLog]:
    # A short busy timeout: each attempt against the locked database gives up quickly.
    async with AuditLog.open(
        audit_target, busy_timeout_s=0.05, redact=lambda s: s.replace(SECRET, "***")
    ) as log:
        yield log


@pytest.fixture
def locker(audit_target: Target) -> Iterator[Locker]:
    held = Locker(audit_target)
    yield held
    held.close()


def lock(locker: Locker) -> None:
    locker.lock()


def unlock(locker: Locker) -> None:
    locker.unlock()


async def new_run(audit: AuditLog) -> int:
    run_id = await audit.create_run(
        service="kimi",
        action=Action.REDEPLOY,
        hosts=["h1"],
        requested_by="U0ALICE",
        source=Source.CLI,
        plan={},
        package_spec="vllm",
        status=RunStatus.APPROVED,
    )
    assert await audit.transition(run_id, RunStatus.RUNNING, expect=[RunStatus.APPROVED])
    return run_id


def writer_for(
    audit: AuditLog, tmp_path: Path, t: FakeTime, *, background: bool = False, **kw: Any
) -> AuditWriter:
    """A writer whose merges the test drives (unless ``background``)."""
    return AuditWriter(
        audit,
        Journal.for_db(tmp_path / "audit.db", tmp_path / "fallback"),
        clock=t.clock,
        sleep=t.sleep,
        background=background,
        **kw,
    )


# ---- the file -----------------------------------------------------------------------------


def test_a_torn_last_line_is_ignored_and_the_next_append_starts_a_new_line(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.append([rec("p", 1), rec("p", 2)])
    whole = j.primary.read_bytes()
    # A crash mid-append: the third record's line is cut short, without its newline.
    j.primary.write_bytes(whole + rec("p", 3).to_line()[:25])
    assert [r.seq for r in j.read()] == [1, 2]
    j.append([rec("p", 4)])
    assert [r.seq for r in j.read()] == [1, 2, 4]  # the cut record stays out, 4 is whole
    assert j.primary.read_bytes().endswith(b"\n")


def test_lines_that_are_no_records_are_skipped_not_fatal() -> None:
    lines = (
        rec("p", 1).to_line()
        + b'{"v": 1, "id": "x"}\n'
        + b"garbage\n"
        + json.dumps({**rec("p", 2).to_json(), "op": "drop_table"}).encode()
        + b"\n"
        + rec("p", 3).to_line()
    )
    assert [r.seq for r in parse_lines(lines)] == [1, 3]


def test_replay_order_keeps_each_process_in_its_own_order_across_both_files(tmp_path: Path) -> None:
    j = Journal(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    # Process p switched to the fallback file (disk full) and back; q wrote later.
    j.primary.write_bytes(
        rec("p", 1).to_line()
        + rec("p", 4).to_line()
        + rec("q", 1, at="2026-11-30T13:00:05Z").to_line()
    )
    j.fallback.write_bytes(rec("p", 2).to_line() + rec("p", 3).to_line())  # type: ignore[union-attr]
    assert [r.id for r in j.read()] == ["p/1", "p/2", "p/3", "p/4", "q/1"]
    assert [r.id for r in ordered([rec("q", 2), rec("q", 1)])] == ["q/1", "q/2"]


def test_dropping_merged_records_keeps_the_rest_and_removes_an_empty_file(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.append([rec("p", 1), rec("p", 2), rec("p", 3)])
    j.drop(["p/1", "p/3"])
    assert [r.id for r in j.read()] == ["p/2"]
    j.drop(["p/2"])
    assert not j.primary.exists()


# ---- the merge ----------------------------------------------------------------------------


async def test_a_batch_the_database_refuses_goes_to_the_journal_whole_and_in_order(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    """``write_all`` (the records of events made together, issue 18): one transaction
    when the database takes it; else every record into the journal, in order, a step
    started and finished within it named by its record, and merged as written."""
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=0.0)
    first = w.step_started_record(run_id, "h1", "preflight", "uv pip show")
    written = await w.write_all([first])
    assert not written.journaled and isinstance(written.row_ids[first.id], int)
    done = w.step_finished_record(
        written.row_ids[first.id],
        status=StepStatus.OK,
        exit_status=0,
        duration_s=0.1,
        output_tail="ok",
    )
    lock(locker)
    stop = w.step_started_record(run_id, "h1", "stop", "systemctl stop u")
    batch = [
        done,
        stop,
        w.step_finished_record(
            stop.id,
            status=StepStatus.FAILED,
            exit_status=1,
            duration_s=0.2,
            output_tail=f"refused {SECRET}",
        ),
        w.versions_record(run_id, before="0.15.1", after=None),
    ]
    written = await w.write_all(batch)
    assert written.journaled and not written.row_ids
    assert [r.id for r in await asyncio.to_thread(w.journal.read)] == [r.id for r in batch]
    unlock(locker)
    assert await w.merge() == 4
    steps = await audit.steps(run_id)
    assert [(s.step, s.status, s.output_tail) for s in steps] == [
        ("preflight", "ok", "ok"),
        ("stop", "failed", "refused ***"),
    ]
    assert (await audit.get_run(run_id)).version_before == "0.15.1"


async def test_a_journal_merged_twice_is_applied_once(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=0.0)
    lock(locker)
    ref, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
    assert written.journaled and isinstance(ref, str)  # no row id: a placeholder
    await w.step_finished(
        ref,
        status=StepStatus.OK,
        exit_status=0,
        duration_s=1.5,
        output_tail=f"stopped; token {SECRET}",
    )
    await w.add_snapshot(run_id, "h1", "after drain", {"gpus": [], "note": SECRET})
    await w.record_decision(run_id, "system:audit-unavailable", Decision.CANCEL)
    await w.finish(
        run_id,
        RunStatus.CANCELLED,
        "cancelled during drain",
        lambda: audit.transition(run_id, RunStatus.CANCELLED),
    )
    # Redacted on disk as the database would store it.
    on_disk = w.journal.primary.read_text()
    assert SECRET not in on_disk and "***" in on_disk
    saved = on_disk.encode()
    unlock(locker)

    assert await w.merge() == 5
    assert w.down is None and not w.journal.primary.exists()
    # A crash between the commit and the clean-up leaves the file: merging it again
    # changes nothing.
    w.journal.primary.write_bytes(saved)
    assert await w.merge() == 0
    [step] = await audit.steps(run_id)
    assert (step.step, step.status, step.output_tail) == ("stop", "ok", "stopped; token ***")
    assert len(await audit.snapshots(run_id)) == 1
    assert [(d.user, d.decision) for d in await audit.decisions(run_id)] == [
        ("system:audit-unavailable", "cancel")
    ]
    run = await audit.get_run(run_id)
    assert (run.status, run.summary, run.current_step) == (
        "cancelled",
        "cancelled during drain",
        "stop",
    )


async def test_a_release_switch_the_database_cannot_take_waits_in_the_journal_then_merges(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    """A switch is what a later rollback by hand goes by: from the run's event, through
    the audit sink, into the database at once, or into the journal and merged later;
    never lost. Read back per service and host, oldest first."""
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=0.0)
    sink = RunAudit(w, run_id, CancelToken(), ev.FanOut())
    to_new = ev.ReleaseSwitched(run_id, "h1", "kimi", "0.15.1-a", "0.16.0-b", SwitchKind.SWITCH)
    await sink.handle(to_new)
    assert sink.fell is None
    lock(locker)
    back = ev.ReleaseSwitched(run_id, "h1", "kimi", "0.16.0-b", "0.15.1-a", SwitchKind.SWITCH_BACK)
    await sink.handle(back)
    assert sink.fell is not None
    journaled = await asyncio.to_thread(w.journal.read)
    assert journaled[0].op == "release_switch"
    unlock(locker)
    assert await w.merge() == len(journaled)
    assert [r.switch() for r in await audit.switch_history("kimi", "h1")] == [
        Switch("0.15.1-a", "0.16.0-b", run_id, SwitchKind.SWITCH),
        Switch("0.16.0-b", "0.15.1-a", run_id, SwitchKind.SWITCH_BACK),
    ]
    # Another host's or service's link has a history of its own.
    assert await audit.switch_history("kimi", "h2") == []
    assert await audit.switch_history("other", "h1") == []
    [first, second] = (await audit.release_switches([run_id]))[run_id]
    assert (first.host, first.from_release, first.to_release) == ("h1", "0.15.1-a", "0.16.0-b")
    assert second.kind == SwitchKind.SWITCH_BACK and second.at


async def test_a_merged_row_keeps_the_time_it_happened(audit: AuditLog, tmp_path: Path) -> None:
    run_id = await new_run(audit)
    j = Journal.for_db(tmp_path / "audit.db", tmp_path / "fallback")
    j.append(
        [
            JournalRecord(
                "p/1",
                "p",
                1,
                "2026-01-02T03:04:05Z",
                StepStarted(run_id=run_id, host="h1", step="stop", command="x"),
            )
        ]
    )
    await AuditWriter(audit, j, background=False).start()
    [step] = await audit.steps(run_id)
    assert step.started_at == "2026-01-02T03:04:05Z"


async def test_a_record_the_database_refuses_is_kept_with_the_reason_and_the_rest_merges(
    audit: AuditLog, tmp_path: Path
) -> None:
    run_id = await new_run(audit)
    j = Journal.for_db(tmp_path / "audit.db", tmp_path / "fallback")
    j.append(
        [
            rec("p", 1, op="decision", run_id=9999, user="U0X", decision="cancel"),
            rec(
                "p",
                2,
                op="step_finished",
                step_ref="p/77",
                status="ok",
                exit_status=0,
                duration_s=1.0,
                output_tail="",
            ),
            rec("p", 3, op="versions", run_id=run_id, before="0.15.1", after=None),
        ]
    )
    assert await AuditWriter(audit, j, background=False).start() == 1
    assert (await audit.get_run(run_id)).version_before == "0.15.1"
    rejects = dict(await audit.journal_rejects())
    assert "no run #9999" in rejects["p/1"] and "p/77" in rejects["p/2"]
    assert json.loads(rejects["p/2"])["record"]["step_ref"] == "p/77"  # kept whole
    assert not j.primary.exists()


async def test_a_late_finish_wins_over_an_interrupted_guessed_meanwhile(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    w = writer_for(audit, tmp_path, FakeTime(), retry_s=0.0)
    lock(locker)
    await w.finish(
        run_id,
        RunStatus.SUCCEEDED,
        "0.15.1 -> 0.16.0, healthy",
        lambda: audit.transition(run_id, RunStatus.SUCCEEDED),
    )
    unlock(locker)
    # Another process took the silence for a dead driver.
    assert await audit.interrupt(run_id, "interrupted: no heartbeat")
    await w.merge()
    run = await audit.get_run(run_id)
    assert (run.status, run.summary) == ("succeeded", "0.15.1 -> 0.16.0, healthy")


# ---- the writer's retries -------------------------------------------------------------------


async def test_a_lock_shorter_than_the_retry_window_loses_nothing_and_journals_nothing(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=15.0, first_delay_s=0.25)
    lock(locker)
    t.on_sleep = [lambda: None, lambda: unlock(locker)]  # released during the 2nd wait
    ref, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
    assert not written.journaled and isinstance(ref, int)
    assert t.sleeps == [0.25, 0.5]  # exponential back-off
    assert w.down is None and not w.journal.primary.exists()
    assert [s.id for s in await audit.steps(run_id)] == [ref]


async def test_a_lock_past_the_retry_window_goes_to_the_journal_then_everything_follows(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=2.0, first_delay_s=0.25)
    lock(locker)
    _, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
    assert written.journaled and written.reason and "locked" in written.reason
    # 0.25 + 0.5 + 1.0 waited; the next wait (2.0) would pass the 2 s bound.
    assert t.sleeps[:3] == [0.25, 0.5, 1.0]
    retries = len(t.sleeps)
    unlock(locker)
    # Down: later writes queue behind the journal without trying the database, even now
    # that it could take them (nothing may overtake what waits in the journal).
    await w.add_snapshot(run_id, "h1", "after drain", {})
    assert len(t.sleeps) == retries
    assert [r.op for r in w.journal.read()] == ["step_started", "snapshot"]
    assert await audit.steps(run_id) == []
    await w.merge()
    assert w.down is None
    written = await w.add_snapshot(run_id, "h1", "after restart", {})
    assert not written.journaled  # up again: straight to the database
    assert [s.label for s in await audit.snapshots(run_id)] == ["after drain", "after restart"]
    await w.close()


def lose_first_answer(audit: AuditLog) -> list[bool]:
    """The first ``write_records`` commits, then fails as a connection dropped before
    its answer (PostgreSQL); the list says whether that happened."""
    real, lost = audit.write_records, list[bool]()

    async def answer_lost(records: Sequence[JournalRecord], **kw: Any) -> Any:
        applied = await real(records, **kw)
        if not lost:
            lost.append(True)
            raise AuditUnavailable("audit database: server closed the connection")
        return applied

    audit.write_records = answer_lost  # type: ignore[method-assign]
    return lost


@pytest.mark.parametrize("database_back", [True, False])
async def test_a_commit_whose_answer_was_lost_is_written_once(
    pg_url: PostgresUrl, tmp_path: Path, database_back: bool
) -> None:
    """Issue 21: PostgreSQL commits a transaction, then the connection drops before its
    answer arrives; the writer sees the database away. Its retry (the database back at
    once), or the merge of the records it journaled (the database away past the retry
    window), must find them written: twice was a second step row, forever running."""
    await migrate_pg(pg_url)
    async with AuditLog.open(pg_url) as audit:
        run_id = await new_run(audit)
        t = FakeTime()
        w = writer_for(audit, tmp_path, t, retry_s=15.0 if database_back else 0.0)
        lost = lose_first_answer(audit)
        ref, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
        assert lost and written.journaled is not database_back
        if database_back:
            assert isinstance(ref, int) and len(t.sleeps) == 1
        else:
            assert await w.merge() == 0  # already in: none merged, none refused
            assert await audit.journal_rejects() == []
        await w.step_finished(
            ref, status=StepStatus.OK, exit_status=0, duration_s=0.1, output_tail="stopped"
        )
        assert [(s.step, s.status) for s in await audit.steps(run_id)] == [("stop", "ok")]


async def test_only_postgresql_marks_a_direct_write(
    audit: AuditLog, audit_target: Target, tmp_path: Path
) -> None:
    """A direct write marks its records in journal_applied on PostgreSQL, whose commit
    can lose its answer; SQLite's cannot, and its hot path (issue 18) writes no marks."""
    run_id = await new_run(audit)
    w = writer_for(audit, tmp_path, FakeTime())
    ref, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
    assert not written.journaled and isinstance(ref, int)
    marks = raw_rows(audit_target, "SELECT row_id FROM journal_applied")
    assert marks == ([] if isinstance(audit_target, Path) else [(ref,)])
    await w.close()


async def test_a_retry_racing_its_lost_commit_finds_it_written(
    pg_url: PostgresUrl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: the retry can begin while the server still finishes the commit whose
    answer was lost: its look finds no mark yet, and its own mark then meets the first
    try's (the key waits for that commit, then refuses it). That is the batch written
    once, not a refusal that stops the run."""
    await migrate_pg(pg_url)
    async with AuditLog.open(pg_url) as audit:
        run_id = await new_run(audit)
        t = FakeTime()
        w = writer_for(audit, tmp_path, t)
        lost = lose_first_answer(audit)
        looks, look = list[bool](), replay_sql.already_applied

        async def not_yet(conn: Any, records: list[JournalRecord]) -> Any:
            looks.append(True)  # the retry's look runs before the first commit lands
            return None if len(looks) == 1 else await look(conn, records)

        monkeypatch.setattr(replay_sql, "already_applied", not_yet)
        ref, written = await w.step_started(run_id, "h1", "stop", "systemctl stop u")
        assert lost and looks and not written.journaled and isinstance(ref, int)
        await w.step_finished(
            ref, status=StepStatus.OK, exit_status=0, duration_s=0.1, output_tail="stopped"
        )
        assert [(s.step, s.status) for s in await audit.steps(run_id)] == [("stop", "ok")]


async def test_the_background_merge_brings_the_writer_back_up(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    t = FakeTime()
    w = writer_for(audit, tmp_path, t, retry_s=0.0, background=True)
    lock(locker)
    await w.record_decision(run_id, "U0ALICE", Decision.CANCEL)
    assert w.down is not None
    unlock(locker)
    # The task started by the fall retries on its own (its sleeps are the fake's).
    for _ in range(200):
        if w.down is None:
            break
        await asyncio.sleep(0.01)
    assert w.down is None
    assert [d.user for d in await audit.decisions(run_id)] == ["U0ALICE"]
    await w.close()


async def test_with_no_journal_file_writable_records_are_held_in_memory_then_merged(
    audit: AuditLog, tmp_path: Path, locker: Locker
) -> None:
    run_id = await new_run(audit)
    nowhere = tmp_path / "not-a-dir"
    nowhere.write_text("")  # both files would be inside a plain file: ENOTDIR
    w = AuditWriter(
        audit,
        Journal(nowhere / "a.jsonl", nowhere / "b.jsonl"),
        retry_s=0.0,
        sleep=FakeTime().sleep,
        background=False,
    )
    lock(locker)
    written = await w.set_versions(run_id, before="0.15.1", after=None)
    assert written.journaled and w.where == "memory"
    unlock(locker)
    assert await w.merge() == 1
    assert (await audit.get_run(run_id)).version_before == "0.15.1"


async def test_a_bug_is_raised_not_journaled(audit: AuditLog, tmp_path: Path) -> None:
    w = writer_for(audit, tmp_path, FakeTime())
    with pytest.raises(RunNotFoundError, match="no run #4242"):
        await w.record_decision(4242, "U0ALICE", Decision.CANCEL)
    assert w.down is None and not w.journal.primary.exists()
    assert not unavailable(ValueError("x"))
