"""The audit log against real SQLite files: API, races, restarts, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.audit import EXPIRED_SUMMARY, OUTPUT_TAIL_CHARS, AuditLog, RunRecord, parse_ts
from bot.audit.db import Database
from bot.audit.migrations import MIGRATIONS
from bot.audit.runs import runs_query
from bot.audit.view import runs_json, runs_table
from bot.core.status import Action, Decision, RunStatus, Source, StepStatus
from bot.errors import AuditError, LockHeldError, RunNotFoundError
from bot.settings import PostgresUrl
from tests.polling import eventually
from tests.support.audit_db import Target, raw_dump, raw_rows

REPO = Path(__file__).resolve().parents[1]
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
SECRETS = ("s3cret", 'pa"ss\\word')


def redact(text: str) -> str:
    for secret in SECRETS:
        text = text.replace(secret, "[REDACTED]")
    return text


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.db"


@pytest.fixture
async def log(audit_target: Path | PostgresUrl) -> AsyncIterator[AuditLog]:
    """The audit log on each backend (SQLite, PostgreSQL): same records, same queries."""
    async with AuditLog.open(audit_target, redact=redact) as opened:
        yield opened


async def new_run(log: AuditLog, **overrides: Any) -> int:
    fields: dict[str, Any] = {
        "service": "kimi-k25",
        "action": "redeploy",
        "hosts": ["gpu1", "gpu2"],
        "requested_by": "U1",
        "source": "slack",
        "plan": {"steps": ["preflight", "stop", "drain"], "hosts": ["gpu1", "gpu2"]},
        "package_spec": "vllm==0.9.1",
    }
    fields.update(overrides)
    return await log.create_run(**fields)


def child(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


# -- opening -------------------------------------------------------------------


async def test_open_sets_wal_and_both_open_styles_work(db: Path) -> None:
    log = await AuditLog.open(db)
    async with log:
        await new_run(log)
    async with AuditLog.open(db) as log:
        assert len(await log.list_runs()) == 1
        # synchronous=FULL (2) is what makes a commit survive power loss, not just kill -9.
        assert await log.pragmas() == {
            "journal_mode": "wal",
            "synchronous": 2,
            "foreign_keys": 1,
            "busy_timeout": 10_000,
        }
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_close_is_idempotent_and_use_after_close_is_an_audit_error(db: Path) -> None:
    log = await AuditLog.open(db)
    await log.close()
    await log.close()
    with pytest.raises(AuditError, match="already closed"):
        await log.list_runs()


async def test_corrupt_file_is_an_audit_error(db: Path) -> None:
    db.write_bytes(b"this is not sqlite at all\n" * 400)
    with pytest.raises(AuditError, match=r"audit database .*audit\.db: not a database"):
        await AuditLog.open(db)


async def test_missing_directory_and_directory_path_are_audit_errors(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match=r"directory .*nowhere does not exist"):
        await AuditLog.open(tmp_path / "nowhere" / "audit.db")
    with pytest.raises(AuditError, match="is a directory"):
        await AuditLog.open(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
async def test_read_only_database_is_an_audit_error(db: Path) -> None:
    async with AuditLog.open(db) as log:
        await new_run(log)
    db.chmod(0o444)
    with pytest.raises(AuditError, match=r"audit\.db: read-only"):
        await AuditLog.open(db)


# -- runs ----------------------------------------------------------------------


async def test_create_and_get_run_round_trips_every_field(log: AuditLog) -> None:
    expires = datetime(2026, 11, 30, 13, 12, 1, 500, tzinfo=UTC)
    run_id = await new_run(
        log, index_name="nightly", dry_run=True, channel="C1", expires_at=expires, source="cli"
    )
    run = await log.get_run(run_id)
    assert run.id == run_id
    assert (run.service, run.action, run.hosts) == ("kimi-k25", "redeploy", ["gpu1", "gpu2"])
    assert (run.requested_by, run.source, run.channel) == ("U1", "cli", "C1")
    assert run.plan == {"steps": ["preflight", "stop", "drain"], "hosts": ["gpu1", "gpu2"]}
    assert (run.package_spec, run.index_name, run.dry_run) == ("vllm==0.9.1", "nightly", True)
    assert run.status == "pending_approval"
    assert run.expires_at == "2026-11-30T13:12:01Z"
    assert TS.match(run.created_at)
    assert run.started_at is run.finished_at is run.current_step is run.summary is None
    assert run.approved_by == run.denied_by == []
    assert not run.is_final


async def test_create_run_rejects_unknown_values(log: AuditLog) -> None:
    with pytest.raises(ValueError, match="action"):
        await new_run(log, action="frobnicate")
    with pytest.raises(ValueError, match="source"):
        await new_run(log, source="email")
    with pytest.raises(ValueError, match="status"):
        await new_run(log, status="done")
    with pytest.raises(ValueError, match="naive"):
        await new_run(log, expires_at=datetime(2026, 1, 1))
    assert await log.list_runs() == []


async def test_records_carry_the_enums_and_store_their_plain_words(
    audit_target: Target, log: AuditLog
) -> None:
    run_id = await new_run(log, action=Action.RESTART, source=Source.DEMO)
    assert await log.transition(run_id, RunStatus.RUNNING, expect={RunStatus.PENDING_APPROVAL})
    await log.record_decision(run_id, "U2", Decision.APPROVE)
    step = await log.step_started(run_id, "gpu1", "stop", "systemctl stop vllm")
    await log.step_finished(step, status=StepStatus.SKIPPED)
    run = await log.get_run(run_id)
    assert (run.action, run.source, run.status) == (Action.RESTART, Source.DEMO, RunStatus.RUNNING)
    assert type(run.status) is RunStatus and type(run.action) is Action
    [decision] = await log.decisions(run_id)
    assert type(decision.decision) is Decision and decision.decision is Decision.APPROVE
    [stored_step] = await log.steps(run_id)
    assert stored_step.status is StepStatus.SKIPPED
    # Programs reading `audit --json` and older bots reading the file see the plain words.
    assert json.dumps(run.to_json()["status"]) == '"running"'
    assert type(stored_step.to_json()["status"]) is str
    assert raw_rows(audit_target, "SELECT action, source, status FROM runs") == [
        ("restart", "demo", "running")
    ]


async def test_a_stored_word_this_bot_does_not_know_is_an_audit_error(
    audit_target: Target, log: AuditLog
) -> None:
    # No CHECK constraint: a newer bot may store a status this one has never heard of.
    run_id = await new_run(log)
    raw_rows(audit_target, "UPDATE runs SET status = 'paused' WHERE id = ?", (run_id,))
    with pytest.raises(AuditError, match="status 'paused'"):
        await log.get_run(run_id)


async def test_a_transaction_runs_only_inside_a_shielded_task(db: Path) -> None:
    database = await Database.open(db, migrations=MIGRATIONS, busy_timeout_s=1.0)
    try:
        with pytest.raises(RuntimeError, match="shielded"):
            async with database.transaction(write=False):
                pass

        async def count() -> int:
            async with database.transaction(write=False) as conn:
                async with conn.execute("SELECT count(*) FROM runs") as cur:
                    row = await cur.fetchone()
            assert row is not None
            return int(row[0])

        assert await database.shielded(count()) == 0
    finally:
        await database.close()


async def test_unknown_run_ids_raise_run_not_found(log: AuditLog) -> None:
    with pytest.raises(RunNotFoundError, match="#42"):
        await log.get_run(42)
    for call in (
        log.set_message(42, "C1", "1.2"),
        log.set_step(42, "stop"),
        log.set_versions(42, before="0.9.0"),
        log.record_decision(42, "U2", Decision.APPROVE),
        log.transition(42, RunStatus.APPROVED),
        log.step_started(42, "gpu1", "stop", "systemctl stop vllm"),
        log.add_snapshot(42, "gpu1", "before", {}),
        log.acquire_locks(42, ["service:kimi-k25"]),
    ):
        with pytest.raises(RunNotFoundError):
            await call


async def test_message_step_and_versions(log: AuditLog) -> None:
    run_id = await new_run(log)
    await log.set_message(run_id, "C9", "1700000000.000100")
    await log.set_step(run_id, "drain")
    await log.set_versions(run_id, before="0.9.0")
    await log.set_versions(run_id, after="0.9.1")
    run = await log.get_run(run_id)
    assert (run.channel, run.message_ts, run.current_step) == ("C9", "1700000000.000100", "drain")
    assert (run.version_before, run.version_after) == ("0.9.0", "0.9.1")
    await log.set_step(run_id, None)
    await log.set_versions(run_id)  # nothing given: nothing overwritten
    run = await log.get_run(run_id)
    assert run.current_step is None
    assert (run.version_before, run.version_after) == ("0.9.0", "0.9.1")


async def test_list_runs_newest_first_with_filters(log: AuditLog) -> None:
    ids = [await new_run(log, service=f"svc{i % 2}") for i in range(5)]
    await log.transition(ids[1], RunStatus.RUNNING)
    assert [r.id for r in await log.list_runs()] == ids[::-1]
    assert [r.id for r in await log.list_runs(limit=2)] == [ids[4], ids[3]]
    assert [r.id for r in await log.list_runs(service="svc1")] == [ids[3], ids[1]]
    assert [r.id for r in await log.list_runs(statuses=[RunStatus.RUNNING])] == [ids[1]]
    assert [r.id for r in await log.list_runs(service="svc0", statuses={RunStatus.RUNNING})] == []
    assert await log.list_runs(statuses=[]) == []
    assert await log.list_runs(limit=0) == []
    with pytest.raises(ValueError):
        await log.list_runs(limit=-1)


async def test_list_queries_use_an_index_and_no_sort(db: Path) -> None:
    # The query plan, not a stopwatch, is what keeps `audit --limit 20` fast at 1M runs.
    async with AuditLog.open(db):
        pass
    with sqlite3.connect(db) as raw:
        for service, statuses, index in (
            (None, None, None),
            ("kimi-k25", None, "runs_service_id"),
            (None, [RunStatus.RUNNING], "runs_status_id"),
        ):
            sql, params = runs_query(service=service, statuses=statuses, limit=20)
            plan = " | ".join(r[3] for r in raw.execute("EXPLAIN QUERY PLAN " + sql, params))
            assert "TEMP B-TREE" not in plan, plan
            if index:
                assert f"USING INDEX {index}" in plan, plan


# -- decisions and transitions ---------------------------------------------------


async def test_decisions_count_once_and_fill_approved_and_denied(log: AuditLog) -> None:
    run_id = await new_run(log)
    assert await log.record_decision(run_id, "U2", Decision.APPROVE) is True
    assert await log.record_decision(run_id, "U2", Decision.APPROVE) is False  # double click
    assert await log.record_decision(run_id, "U3", Decision.APPROVE) is True
    assert await log.record_decision(run_id, "U4", Decision.DENY) is True
    assert await log.record_decision(run_id, "U1", Decision.CANCEL) is True
    with pytest.raises(ValueError, match="decision"):
        await log.record_decision(run_id, "U5", "maybe")  # type: ignore[arg-type]
    decisions = await log.decisions(run_id)
    assert [(d.user, d.decision) for d in decisions] == [
        ("U2", "approve"),
        ("U3", "approve"),
        ("U4", "deny"),
        ("U1", "cancel"),
    ]
    assert all(TS.match(d.at) for d in decisions)
    run = await log.get_run(run_id)
    assert (run.approved_by, run.denied_by) == (["U2", "U3"], ["U4"])
    [listed] = await log.list_runs()
    assert listed.approved_by == ["U2", "U3"]


async def test_transition_is_compare_and_set_and_stamps_times(log: AuditLog) -> None:
    run_id = await new_run(log)
    pending = {RunStatus.PENDING_APPROVAL}
    assert await log.transition(run_id, RunStatus.APPROVED, expect=pending) is True
    assert await log.transition(run_id, RunStatus.APPROVED, expect=pending) is False
    assert await log.transition(run_id, RunStatus.DENIED, expect=()) is False
    assert (await log.get_run(run_id)).status == "approved"

    assert await log.transition(run_id, RunStatus.RUNNING, expect=[RunStatus.APPROVED]) is True
    running = await log.get_run(run_id)
    assert running.started_at is not None and TS.match(running.started_at)
    assert running.finished_at is None

    assert await log.transition(run_id, RunStatus.SUCCEEDED, summary="0.9.0 -> 0.9.1 on 2 hosts")
    done = await log.get_run(run_id)
    assert done.status == "succeeded" and done.is_final
    assert done.finished_at is not None
    assert parse_ts(done.finished_at) >= parse_ts(running.started_at)
    assert done.started_at == running.started_at
    assert done.summary == "0.9.0 -> 0.9.1 on 2 hosts"

    # What a caller the type checker does not see (or ignores) may still pass.
    with pytest.raises(TypeError):
        await log.transition(run_id, RunStatus.FAILED, expect="running")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        await log.transition(run_id, "exploded")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        await log.transition(run_id, RunStatus.FAILED, expect={"runing"})  # type: ignore[arg-type]


async def test_concurrent_transitions_from_two_connections_have_one_winner(
    audit_target: Path | PostgresUrl,
) -> None:
    async with AuditLog.open(audit_target) as a, AuditLog.open(audit_target) as b:
        run_id = await new_run(a)
        targets = [RunStatus.APPROVED, RunStatus.DENIED, RunStatus.CANCELLED, RunStatus.EXPIRED] * 3
        results = await asyncio.gather(
            *(
                (a if i % 2 else b).transition(run_id, to, expect={RunStatus.PENDING_APPROVAL})
                for i, to in enumerate(targets)
            )
        )
        assert results.count(True) == 1
        winner = targets[results.index(True)]
        assert (await b.get_run(run_id)).status == winner


async def test_cancelled_caller_does_not_break_the_connection(log: AuditLog) -> None:
    started = asyncio.Event()

    async def write() -> int:
        started.set()
        return await new_run(log)  # runs on, without yielding, until the write is in flight

    task = asyncio.create_task(write())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The write carried on by itself and committed; the connection is usable. (On
    # PostgreSQL the read takes another pooled connection: it may come before the commit.)
    [run] = await eventually(log.list_runs, "the cancelled caller's write to commit", 10)
    assert run.service == "kimi-k25"
    await new_run(log)
    assert len(await log.list_runs()) == 2


# -- steps, snapshots, refusals --------------------------------------------------


async def test_steps_record_start_finish_and_keep_the_output_tail(log: AuditLog) -> None:
    run_id = await new_run(log)
    first = await log.step_started(run_id, "gpu1", "stop", "systemctl stop vllm")
    assert (await log.get_run(run_id)).current_step == "stop"  # what recovery reports
    second = await log.step_started(run_id, "gpu1", "install", "uv pip install vllm==0.9.1")
    assert (await log.get_run(run_id)).current_step == "install"
    output = "x" * 10_000 + "LAST LINE"
    await log.step_finished(
        first, status=StepStatus.OK, exit_status=0, duration_s=1.25, output_tail="ok\n"
    )
    await log.step_finished(
        second, status=StepStatus.FAILED, exit_status=2, duration_s=30.0, output_tail=output
    )
    steps = await log.steps(run_id)
    assert [s.id for s in steps] == [first, second]
    assert (steps[0].host, steps[0].step, steps[0].command) == (
        "gpu1",
        "stop",
        "systemctl stop vllm",
    )
    assert (steps[0].status, steps[0].exit_status, steps[0].duration_s) == ("ok", 0, 1.25)
    assert steps[0].output_tail == "ok\n"
    assert TS.match(steps[0].started_at) and steps[0].finished_at is not None
    assert steps[1].status == "failed"
    assert len(steps[1].output_tail) == OUTPUT_TAIL_CHARS
    assert steps[1].output_tail.endswith("LAST LINE")
    assert steps[1].to_json()["exit_status"] == 2
    assert await log.steps(run_id + 1) == []

    with pytest.raises(ValueError, match="step status"):
        await log.step_finished(first, status=StepStatus.RUNNING)
    with pytest.raises(ValueError, match="no step #999"):
        await log.step_finished(999, status=StepStatus.OK)


async def test_a_nul_byte_in_a_commands_output_is_stored_on_either_backend(log: AuditLog) -> None:
    """Binary junk in a tool's output (a log padded with NULs after a crash): PostgreSQL's
    text refuses a NUL byte, which failed the write and so the run mid-step (issue 21:
    the same records on both backends). Every stored text has it as U+FFFD instead."""
    run_id = await new_run(log)
    step = await log.step_started(run_id, "gpu1", "stop", "systemctl stop vllm")
    await log.step_finished(
        step, status=StepStatus.OK, exit_status=0, duration_s=0.5, output_tail="a\x00b\n"
    )
    await log.record_refusal(user="U1", channel=None, command="restart\x00", reason="no\x00")
    [stored] = await log.steps(run_id)
    assert stored.output_tail == "a\ufffdb\n"
    [refusal] = await log.refusals()
    assert (refusal.command, refusal.reason) == ("restart\ufffd", "no\ufffd")


async def test_snapshots_with_and_without_a_run(log: AuditLog) -> None:
    run_id = await new_run(log)
    data = {"gpus": [{"index": 0, "memory_used_mib": 71000}], "host": "gpu1"}
    snap = await log.add_snapshot(run_id, "gpu1", "before", data)
    await log.add_snapshot(None, "gpu2", "status", {"gpus": []})
    [stored] = await log.snapshots(run_id)
    assert (stored.id, stored.run_id, stored.host, stored.label) == (snap, run_id, "gpu1", "before")
    assert stored.data == data
    assert TS.match(stored.taken_at)


async def test_refusals_newest_first(log: AuditLog) -> None:
    first = await log.record_refusal(
        user="U7", channel="C1", command="/vllm redeploy x", reason="not a requester"
    )
    second = await log.record_refusal(
        user="U8", channel=None, command="approve #3", reason="self-approval"
    )
    refusals = await log.refusals()
    assert [r.id for r in refusals] == [second, first]
    assert (refusals[1].user, refusals[1].channel, refusals[1].command, refusals[1].reason) == (
        "U7",
        "C1",
        "/vllm redeploy x",
        "not a requester",
    )
    assert refusals[0].channel is None
    assert [r.id for r in await log.refusals(limit=1)] == [second]


async def test_every_stored_text_is_redacted(audit_target: Target, log: AuditLog) -> None:
    quoted = SECRETS[1]
    run_id = await new_run(
        log,
        requested_by="U1",
        plan={"env": {"HF_TOKEN": "s3cret"}, quoted: [quoted, 1]},
        package_spec="vllm @ https://user:s3cret@example.com/vllm.whl",
        index_name="s3cret-index",
        hosts=["gpu1", "s3cret"],
    )
    await log.set_message(run_id, "C1", "1.2")
    await log.set_step(run_id, "install s3cret")
    await log.set_versions(run_id, before="s3cret", after="s3cret")
    await log.transition(run_id, RunStatus.FAILED, summary=f"token {quoted} leaked in s3cret")
    step = await log.step_started(run_id, "gpu1", "install", "curl -H 'Bearer s3cret'")
    # A secret straddling the 4000-character cut: cutting before redacting would keep "cret".
    await log.step_finished(step, status=StepStatus.FAILED, output_tail="s3cret" + "y" * 3996)
    await log.add_snapshot(run_id, "gpu1", "after", {"note": "s3cret", quoted: quoted})
    await log.record_refusal(user="U2", channel="C1", command="/vllm s3cret", reason="s3cret")

    run = await log.get_run(run_id)
    assert run.plan == {"env": {"HF_TOKEN": "[REDACTED]"}, "[REDACTED]": ["[REDACTED]", 1]}
    assert "[REDACTED]" in (run.summary or "")
    dump = raw_dump(audit_target)
    assert "s3cret" not in dump and "cret" not in dump
    assert "pa" + '"ss' not in dump and "pa\\" + '"ss' not in dump
    assert "[REDACTED]" in dump


# -- locks -----------------------------------------------------------------------


async def test_locks_are_all_or_nothing_and_name_the_holder(log: AuditLog) -> None:
    holder = await new_run(log, requested_by="U1")
    other = await new_run(log, requested_by="U2", service="other")
    await log.transition(holder, RunStatus.RUNNING)
    await log.acquire_locks(holder, ["service:kimi-k25", "host:gpu1"])
    await log.acquire_locks(holder, ["service:kimi-k25"])  # re-acquiring your own is fine

    with pytest.raises(LockHeldError) as caught:
        await log.acquire_locks(other, ["host:gpu9", "host:gpu1"])
    assert caught.value.run_id == holder
    assert caught.value.requested_by == "U1"
    assert str(caught.value) == (
        f"host:gpu1 is locked by run #{holder} (redeploy kimi-k25, requested by U1, running)"
    )
    assert await log.lock_holder("host:gpu9") is None  # nothing taken

    found = await log.lock_holder("host:gpu1")
    assert found is not None and found.id == holder
    await log.release_locks(holder)
    assert await log.lock_holder("host:gpu1") is None
    await log.acquire_locks(other, ["host:gpu9", "host:gpu1"])
    assert (await log.lock_holder("host:gpu9") or pytest.fail()).id == other


async def test_a_final_status_releases_the_runs_locks(log: AuditLog) -> None:
    run_id = await new_run(log)
    await log.acquire_locks(run_id, ["service:kimi-k25"])
    await log.transition(run_id, RunStatus.RUNNING)
    assert await log.lock_holder("service:kimi-k25") is not None
    await log.transition(run_id, RunStatus.FAILED)
    assert await log.lock_holder("service:kimi-k25") is None


async def test_concurrent_acquires_for_one_service_have_exactly_one_winner(
    audit_target: Path | PostgresUrl,
) -> None:
    async with AuditLog.open(audit_target) as a, AuditLog.open(audit_target) as b:
        runs = [await new_run(a, requested_by=f"U{i}") for i in range(6)]

        async def attempt(log: AuditLog, run_id: int) -> int | None:
            try:
                await log.acquire_locks(run_id, ["service:kimi-k25", f"host:h{run_id}"])
            except LockHeldError:
                return None
            return run_id

        results = await asyncio.gather(
            *(attempt(a if i % 2 else b, run_id) for i, run_id in enumerate(runs))
        )
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert (await a.lock_holder("service:kimi-k25") or pytest.fail()).id == winners[0]
        for loser in set(runs) - set(winners):  # all-or-nothing: no stray host locks
            assert await a.lock_holder(f"host:h{loser}") is None


async def test_locks_survive_a_restart(audit_target: Path | PostgresUrl) -> None:
    async with AuditLog.open(audit_target) as log:
        first = await new_run(log)
        await log.acquire_locks(first, ["service:kimi-k25"])
    async with AuditLog.open(audit_target) as log:
        second = await new_run(log, requested_by="U2")
        with pytest.raises(LockHeldError) as caught:
            await log.acquire_locks(second, ["service:kimi-k25"])
        assert caught.value.run_id == first


# -- start-up housekeeping ---------------------------------------------------------


async def test_recover_interrupted_after_a_restart(audit_target: Path | PostgresUrl) -> None:
    async with AuditLog.open(audit_target) as log:
        running = await new_run(log)
        await log.transition(running, RunStatus.RUNNING)
        await log.acquire_locks(running, ["service:kimi-k25", "host:gpu1"])
        await log.set_step(running, "drain")
        done_step = await log.step_started(running, "gpu1", "stop", "systemctl stop vllm")
        await log.step_finished(done_step, status=StepStatus.OK, exit_status=0)
        await log.step_started(running, "gpu1", "drain", "nvidia-smi")
        approved = await new_run(log, service="other", hosts=["gpu5"])
        await log.transition(approved, RunStatus.APPROVED)
        await log.acquire_locks(approved, ["service:other"])
        pending = await new_run(log, service="third")
        finished = await new_run(log, service="fourth")
        await log.transition(finished, RunStatus.SUCCEEDED)

    async with AuditLog.open(audit_target) as log:
        recovered = await log.recover_interrupted()
        assert [r.id for r in recovered] == [running, approved]
        assert all(r.status == "interrupted" and r.finished_at for r in recovered)
        assert "'drain'" in (recovered[0].summary or "")
        assert "after approval" in (recovered[1].summary or "")
        assert [s.status for s in await log.steps(running)] == ["ok", "interrupted"]
        for scope in ("service:kimi-k25", "host:gpu1", "service:other"):
            assert await log.lock_holder(scope) is None
        assert (await log.get_run(pending)).status == "pending_approval"
        assert (await log.get_run(finished)).status == "succeeded"
        assert await log.recover_interrupted() == []


async def test_expire_pending(log: AuditLog) -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    old = await new_run(log, expires_at=now - timedelta(seconds=1))
    exact = await new_run(log, expires_at=now)
    fresh = await new_run(log, expires_at=now + timedelta(minutes=5))
    forever = await new_run(log)
    approved = await new_run(log, expires_at=now - timedelta(hours=1))
    await log.transition(approved, RunStatus.APPROVED)
    await log.acquire_locks(old, ["service:kimi-k25"])

    # One run only (a request meeting its lock): the other overdue one is left as it is,
    # and a run still in its window is not expired though named.
    assert await log.expire_pending(now, run_ids=[fresh]) == []
    [only] = await log.expire_pending(now, run_ids=[exact])
    assert (only.id, only.status, only.summary) == (exact, "expired", EXPIRED_SUMMARY)
    assert (await log.get_run(old)).status == "pending_approval"

    expired = await log.expire_pending(now)
    assert [r.id for r in expired] == [old]
    assert all(
        r.status == "expired" and r.finished_at == "2026-11-30T12:00:00Z" for r in [*expired, only]
    )
    assert await log.lock_holder("service:kimi-k25") is None
    for run_id, status in (
        (fresh, "pending_approval"),
        (forever, "pending_approval"),
        (approved, "approved"),
    ):
        assert (await log.get_run(run_id)).status == status
    assert await log.expire_pending(now) == []


# -- crash safety ------------------------------------------------------------------

KILLED_MID_RUN = """
import asyncio, os, signal, sys
from pathlib import Path
from bot.audit.store import AuditLog

async def main():
    log = await AuditLog.open(Path(sys.argv[1]))
    run = await log.create_run(service="kimi-k25", action="redeploy", hosts=["gpu1"],
                               requested_by="U1", source="cli", plan={}, package_spec="vllm")
    await log.transition(run, "running")
    await log.acquire_locks(run, ["service:kimi-k25", "host:gpu1"])
    await log.set_step(run, "stop")
    step = await log.step_started(run, "gpu1", "stop", "systemctl stop vllm")
    await log.step_finished(step, status="ok", exit_status=0, duration_s=1.5,
                            output_tail="stopped")
    await log.set_step(run, "drain")
    await log.step_started(run, "gpu1", "drain", "nvidia-smi")
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as raw:
        return str(raw.execute("PRAGMA integrity_check").fetchone()[0])


async def test_kill_9_mid_run_keeps_every_committed_write(db: Path) -> None:
    proc = child(KILLED_MID_RUN, str(db))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    assert integrity(db) == "ok"

    async with AuditLog.open(db) as log:
        [run] = await log.list_runs()
        assert (run.status, run.current_step) == ("running", "drain")
        steps = await log.steps(run.id)
        assert [(s.step, s.status) for s in steps] == [("stop", "ok"), ("drain", "running")]
        assert (steps[0].exit_status, steps[0].output_tail) == (0, "stopped")
        assert (await log.lock_holder("host:gpu1") or pytest.fail()).id == run.id

        [recovered] = await log.recover_interrupted()
        assert recovered.status == "interrupted"
        assert [s.status for s in await log.steps(run.id)] == ["ok", "interrupted"]


KILLED_WHILE_WRITING = """
import asyncio, sys
from pathlib import Path
from bot.audit.store import AuditLog

async def main():
    log = await AuditLog.open(Path(sys.argv[1]))
    run = await log.create_run(service="kimi-k25", action="redeploy", hosts=["gpu1"],
                               requested_by="U1", source="cli", plan={}, package_spec="vllm")
    n = 0
    while True:
        step = await log.step_started(run, "gpu1", f"step{n}", "true")
        await log.step_finished(step, status="ok", exit_status=0, output_tail="z" * 3000)
        n += 1
        print(n, flush=True)  # printed only after the commit returned

asyncio.run(main())
"""


async def test_kill_9_while_writing_loses_nothing_that_was_acknowledged(db: Path) -> None:
    proc = child(KILLED_WHILE_WRITING, str(db))
    assert proc.stdout is not None
    acknowledged = 0
    while acknowledged < 25:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        acknowledged = int(line)
    proc.send_signal(signal.SIGKILL)  # the child is mid-way through its next writes
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert integrity(db) == "ok"
    async with AuditLog.open(db) as log:
        [run] = await log.list_runs()
        finished = [s for s in await log.steps(run.id) if s.status == "ok"]
        assert len(finished) >= acknowledged


# -- views -------------------------------------------------------------------------


async def test_runs_table_and_json(log: AuditLog) -> None:
    plain = await new_run(log)
    await log.record_decision(plain, "U2", Decision.APPROVE)
    await log.record_decision(plain, "U3", Decision.APPROVE)
    await log.set_versions(plain, before="0.9.0", after="0.9.1")
    await log.transition(plain, RunStatus.SUCCEEDED)
    dry = await new_run(log, service="a-service-with-a-really-long-name", dry_run=True)
    records = await log.list_runs()

    table = runs_table(records)
    header, first, second = table.splitlines()
    assert header.split() == [
        "ID",
        "WHEN",
        "(UTC)",
        "SERVICE",
        "ACTION",
        "STATUS",
        "REQUESTED",
        "BY",
        "APPROVED",
        "BY",
        "VERSION",
    ]
    status_col = header.index("STATUS")
    assert first[status_col:].startswith("pending_approval")
    assert second[status_col:].startswith("succeeded")
    assert first.startswith(f"{dry} ") and second.startswith(f"{plain} ")
    assert "redeploy (dry run)" in first
    assert "a-service-with-a-really…" in first
    approved_col, version_col = header.index("APPROVED BY"), header.index("VERSION")
    assert second[approved_col:].startswith("U2, U3 ")
    assert (first[version_col:], second[version_col:]) == ("-", "0.9.0 -> 0.9.1")
    assert first.rstrip() == first
    assert runs_table([]) == "no runs"

    parsed = json.loads(runs_json(records))
    assert [p["id"] for p in parsed] == [dry, plain]
    assert list(parsed[1])[:10] == [
        "id",
        "service",
        "action",
        "requested_by",
        "approved_by",
        "status",
        "version_before",
        "version_after",
        "started_at",
        "finished_at",
    ]
    assert parsed[1]["approved_by"] == ["U2", "U3"]
    assert parsed[1]["plan"] == records[1].plan
    # Each run also says what its install changed: null when it installed nothing.
    assert parsed == [
        {
            **r.to_json(),
            "packages_changed": None,
            "environment_after_rollback": None,
            "host_outcomes": [],
            "rotations": [],
            "release_switches": [],
        }
        for r in records
    ]
    changed = [{"name": "torch", "before": "2.9.1", "after": "2.10.0"}]
    assert json.loads(runs_json(records, {plain: changed}))[1]["packages_changed"] == changed
    assert isinstance(records[0], RunRecord)
