"""The executor delivers the events of the flow's notices made with no remote action
between them together, and the audit sink writes them in one transaction: each step's
start is still on disk before its command runs, and before any other sink hears of it
(issue 18's overhead: a step's end and the next step's start were two commits)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from bot.audit.fence import Fence
from bot.audit.journal import Journal, JournalRecord
from bot.audit.resilient import AuditWriter, Written
from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.phases.actions import BeginStep, Emit, EndStep, Flow, HostOutcome, RunCommand
from bot.core.plan import Step
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus, RunStatus, Source
from bot.engine.audit_sink import RunAudit
from bot.engine.executor import CancelToken, Executor
from bot.hosts.mock import Command, MockTransport, Reply, Script


def steps_on_disk(db: Path) -> list[tuple[str, str]]:
    """The steps another process reads now (committed rows only)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT step, status FROM steps ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(str(a), str(b)) for a, b in rows]


def two_steps() -> Flow:
    yield Emit(BeginStep(Step.PREFLIGHT, "systemctl is-active"))
    yield RunCommand(Step.PREFLIGHT, ("systemctl", "is-active", "u"), 5)
    yield Emit(EndStep(Step.PREFLIGHT, True, "active"))
    yield Emit(BeginStep(Step.STOP, "systemctl stop"))
    yield RunCommand(Step.STOP, ("systemctl", "stop", "u"), 5)
    yield Emit(EndStep(Step.STOP, True, "stopped"))
    return HostOutcome(HostStatus.SUCCEEDED, "done", ServiceState.STOPPED)


class Recorder:
    """A later sink: what it heard, and what was on disk when it heard it."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.heard: list[tuple[str, list[tuple[str, str]]]] = []

    async def handle(self, event: ev.Event) -> None:
        match event:
            case ev.OutputLine():
                pass  # live news, never recorded
            case _:
                self.heard.append((type(event).__name__, steps_on_disk(self.db)))


class CountingWriter(AuditWriter):
    def __init__(self, audit: AuditLog, journal: Journal) -> None:
        super().__init__(audit, journal, background=False)
        self.batches: list[list[str]] = []

    async def write_all(
        self, records: Sequence[JournalRecord], fence: Fence | None = None
    ) -> Written:
        self.batches.append([r.op for r in records])
        return await super().write_all(records, fence)


async def test_a_steps_end_and_the_next_start_are_one_commit_on_disk_before_the_command(
    tmp_path: Path,
) -> None:
    db = tmp_path / "audit.db"
    seen: dict[str, list[tuple[str, str]]] = {}

    def answer(c: Command) -> Reply:
        seen[c.argv[1]] = steps_on_disk(db)
        return Reply("ok\n")

    host = MockTransport("gpu-1", Script().on("systemctl", reply=answer))
    async with AuditLog.open(db) as audit:
        run_id = await audit.create_run(
            service="kimi",
            action=Action.REDEPLOY,
            hosts=["gpu-1"],
            requested_by="U1",
            source=Source.CLI,
            plan={},
            package_spec="vllm",
            status=RunStatus.APPROVED,
        )
        assert await audit.transition(run_id, RunStatus.RUNNING, expect=[RunStatus.APPROVED])
        writer = CountingWriter(audit, Journal.for_db(db, None))
        token = CancelToken()
        later = Recorder(db)
        sink = ev.FanOut(RunAudit(writer, run_id, token, later), later)
        outcome = await Executor(run_id, host, sink, cancel=token).drive(two_steps())
        assert outcome.status == HostStatus.SUCCEEDED
        assert await audit.host_outcomes([run_id])

    # Each command found its step's start committed, and every step before it ended.
    assert seen["is-active"] == [("preflight", "running")]
    assert seen["stop"] == [("preflight", "ok"), ("stop", "running")]
    # One transaction per gap between remote actions: the end, the next start...
    assert writer.batches == [
        ["step_started"],
        ["step_finished", "step_started"],
        ["step_finished", "host_finished"],
    ]
    # ...and the later sink heard each event only once it was on disk.
    assert later.heard == [
        ("StepStarted", [("preflight", "running")]),
        ("StepFinished", [("preflight", "ok"), ("stop", "running")]),
        ("StepStarted", [("preflight", "ok"), ("stop", "running")]),
        ("StepFinished", [("preflight", "ok"), ("stop", "ok")]),
        ("HostFinished", [("preflight", "ok"), ("stop", "ok")]),
    ]


async def test_a_step_that_starts_and_ends_in_one_batch_is_finished_by_its_own_row(
    tmp_path: Path,
) -> None:
    def instant() -> Flow:
        yield Emit(BeginStep(Step.PREFLIGHT, "nothing to run"))
        yield Emit(EndStep(Step.PREFLIGHT, False, "refused", detail="why"))
        return HostOutcome(HostStatus.ABORTED, "refused", ServiceState.UP)

    db = tmp_path / "audit.db"
    async with AuditLog.open(db) as audit:
        run_id = await audit.create_run(
            service="kimi",
            action=Action.REDEPLOY,
            hosts=["gpu-1"],
            requested_by="U1",
            source=Source.CLI,
            plan={},
            package_spec="vllm",
            status=RunStatus.APPROVED,
        )
        writer = AuditWriter(audit, Journal.for_db(db, None), background=False)
        token = CancelToken()
        sink = RunAudit(writer, run_id, token, ev.FanOut())
        host = MockTransport("gpu-1", Script())
        await Executor(run_id, host, sink, cancel=token).drive(instant())
        [step] = await audit.steps(run_id)
        assert (step.step, step.status, step.output_tail) == ("preflight", "failed", "why")
