"""The audit sink of a run this process drives, and what it does when the audit log
cannot be written.

``RunAudit`` is the first sink of the engine's fan-out: each step is recorded before
and after its remote action, with the GPU snapshots and the versions, through
``AuditWriter`` (``bot.audit.resilient``): retried with back-off while the database
is locked or full, kept in the fallback journal when it stays so.

When a record lands in the journal, going on would change a production service with
no audit trail, and stopping dead would leave it stopped. So the sink asks the run to
cancel, as ``system:audit-unavailable``, and the flow's own cancel path
(``bot.core.flows``) brings the service back to where it was: before the stop nothing
is changed; from the drain on it is started again on what is installed, through the
health gate; a cancel that meets a reinstall takes effect after it (an install is never
cut), so the service starts on the new version; a rollback or a start already under way
runs to its end. If the restart fails, the outcome says what systemd says of the unit
then: DOWN, or UP but NOT READY. The thread
and the terminal are told when it happens and, if the records still wait in the
journal, at the end; the run's end, who cancelled it and the release of its locks go
to the journal too, so the database tells the whole story once the journal is merged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from bot.audit.fence import Fence
from bot.audit.journal import Journal, JournalRecord
from bot.audit.resilient import AuditWriter, StepRef, Written, unavailable
from bot.audit.rotations import left_out
from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.gpu import GpuSnapshot
from bot.core.packages import parse_freeze
from bot.core.service_state import ServiceState
from bot.core.status import Decision, RunStatus, StepStatus
from bot.engine.executor import CancelToken
from bot.engine.recovery import interrupted_message
from bot.errors import AuditError
from bot.settings import Settings

log = logging.getLogger(__name__)

# Who cancels a run whose audit log cannot be written (in the decisions table).
AUDIT_UNAVAILABLE = "system:audit-unavailable"


def audit_writer(audit: AuditLog, settings: Settings) -> AuditWriter:
    """The process's resilient writer, its journal named after the database
    (``Settings.journal_base``: next to a SQLite file)."""
    return AuditWriter(
        audit,
        Journal.for_db(settings.journal_base(), settings.audit.journal_fallback_dir),
        retry_s=settings.audit.retry_s,
    )


def snapshot_json(s: GpuSnapshot) -> dict[str, object]:
    return {
        "host": s.host,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "utilization_pct": g.utilization_pct,
            }
            for g in s.gpus
        ],
        "processes": [
            {"pid": p.pid, "name": p.name, "used_mib": p.used_mib, "gpu_uuid": p.gpu_uuid}
            for p in s.processes
        ],
    }


def environment_json(e: ev.PackagesKnown) -> dict[str, object]:
    """What the ``environments`` table keeps of a package set (bot.audit.environments).
    A snapshot is kept as ``{name: version}`` (and its other lines), not as the freeze's
    text: every string is redacted on its way in, and a pin such as ``tiktoken==0.12.0``
    reads like a ``token=`` secret as one line, never as a name and a version apart. The
    text itself, byte for byte, is the host's file (``lock``; ``sha256`` names it)."""
    data: dict[str, object] = e.diff.to_json() if e.diff is not None else {}
    if e.freeze is not None:
        frozen = parse_freeze(e.freeze)
        data.update(freeze=dict(frozen.versions), others=list(frozen.others), sha256=frozen.digest)
    for key, value in (("lock", e.lock), ("note", e.note)):
        if value:
            data[key] = value
    return data


@dataclass
class _Batch:
    """What ``RunAudit.handle_all`` gathers from the events it is given."""

    records: list[JournalRecord] = field(default_factory=list)
    # The steps started among them, by (host, step), with the record that starts each.
    started: list[tuple[tuple[str, str], JournalRecord]] = field(default_factory=list)
    run_finished: bool = False


class RunAudit:
    """Writes one run's steps, snapshots and versions as they happen, and its end; see
    the module doc for what happens when they cannot reach the database.

    ``notify`` is the rest of the run's sinks (the thread, the terminal), for the
    notices this sink adds."""

    def __init__(
        self, writer: AuditWriter, run_id: int, token: CancelToken, notify: ev.EventSink
    ) -> None:
        self.writer = writer
        self.run_id = run_id
        self.token = token
        self.notify = notify
        self._open: dict[tuple[str, str], StepRef] = {}
        self._versions_seen = False
        self.fell: str | None = None  # why the audit log could not be written, if it could not

    async def handle(self, event: ev.Event) -> None:
        await self.handle_all((event,))

    async def handle_all(self, events: Sequence[ev.Event]) -> None:
        """Events the executor delivers together (made with no remote action between
        them: a step's end, what it found, the next step's start): their records in one
        transaction, on disk before the executor's next action as each alone would be,
        and before any other sink hears of them (``FanOut``)."""
        batch = _Batch()
        for event in events:
            if (record := self._record_of(event, batch)) is not None:
                batch.records.append(record)
        if batch.records:
            # Fenced by the epoch this process took the run at (issue 21): a replica that
            # lost the run writes nothing of it, and stops (``FencedError``).
            epoch = self.token.epoch
            fence = None if epoch is None else Fence(self.run_id, epoch)
            written = await self.writer.write_all(batch.records, fence=fence)
            for key, record in batch.started:
                # A step started and finished in the same batch was named by its record
                # (the writer resolves that); one still open is named by its row from now.
                if self._open.get(key) == record.id and record.id in written.row_ids:
                    self._open[key] = written.row_ids[record.id]
            await self._check(written)
        if batch.run_finished:
            await self._still_waiting()

    def _record_of(self, event: ev.Event, batch: _Batch) -> JournalRecord | None:
        """The audit record of ``event``, or None for an event this sink does not record
        (what ``batch`` must know of it is noted there)."""
        w, run_id = self.writer, self.run_id
        match event:
            case ev.StepStarted():
                # Also makes it the run's current step (what recovery reports after a crash).
                # Named by its record until its row is known (see ``handle_all``).
                record = w.step_started_record(run_id, event.host, str(event.step), event.command)
                self._open[(event.host, event.step)] = record.id
                batch.started.append(((event.host, event.step), record))
                return record
            case ev.StepFinished():
                step = self._open.pop((event.host, event.step), None)
                if step is None:
                    return None
                return w.step_finished_record(
                    step,
                    status=StepStatus(event.status),
                    exit_status=event.exit_status,
                    # Whole: the writer redacts before it cuts, so no half secret survives.
                    duration_s=round(event.duration_s, 3),
                    output_tail=event.output,
                )
            case ev.GpuTable():
                return w.snapshot_record(
                    run_id, event.host, event.label, snapshot_json(event.snapshot)
                )
            case ev.PackagesKnown():
                return w.environment_record(
                    run_id, event.host, str(event.kind), environment_json(event)
                )
            case ev.VersionsKnown():
                if self._versions_seen:
                    return None
                # The first host's versions stand for the run; every host's are in its steps.
                self._versions_seen = True
                return w.versions_record(run_id, before=event.before, after=event.after)
            case ev.HostFinished():
                # Each host's end and the state it left the service in (`audit --json`).
                return w.host_finished_record(
                    run_id, event.host, str(event.status), event.summary, state=event.state
                )
            case ev.RotationChanged() | ev.ReleaseSwitched():
                return self._change_record(event)
            case ev.RunFinished():
                # The run's end itself is written by the life cycle (``finish`` below).
                batch.run_finished = True
                return None
            # Not recorded here: the run's row is made by the life cycle at the request
            # (RunStarted); progress and output lines are live news for the thread, the
            # step's output is in its end (StepProgress, OutputLine); the approval card's
            # GPU verdict is no step of a run (GpuHealthKnown); this sink's own notices go
            # to the others (Notice).
            case (
                ev.RunStarted()
                | ev.StepProgress()
                | ev.OutputLine()
                | ev.GpuHealthKnown()
                | ev.Notice()
            ):
                return None
            case _:
                assert_never(event)

    def _change_record(self, event: ev.RotationChanged | ev.ReleaseSwitched) -> JournalRecord:
        """A change the run made beside its steps: a replica's place in its router's
        rotation, a side-by-side service's link (the switch history a rollback by hand
        goes by: never lost, the journal keeps it when the database cannot)."""
        w, run_id = self.writer, self.run_id
        match event:
            case ev.RotationChanged():
                return w.rotation_record(
                    run_id,
                    event.host,
                    event.router,
                    event.server,
                    event.change,
                    event.ok,
                    event.detail,
                )
            case ev.ReleaseSwitched():
                return w.switch_record(
                    run_id, event.service, event.host, event.before, event.after, event.kind
                )
            case _:
                assert_never(event)

    async def _check(self, written: Written) -> None:
        if not written.journaled or self.fell is not None:
            return
        self.fell = written.reason or "the audit database cannot be written"
        where = self.writer.where or "the fallback journal"
        if not self.token.requested:
            self.token.request(AUDIT_UNAVAILABLE)
            # Who cancelled, with when: in the journal now (the life cycle's recorder
            # may add the same decision later; a decision counts once).
            await self.writer.record_decision(self.run_id, AUDIT_UNAVAILABLE, Decision.CANCEL)
            what = (
                "The run stops at its next safe point and brings the service back "
                "rather than go on without an audit trail: started again through the "
                "health gate (on the new version if the reinstall already ran)."
            )
        else:
            what = "The run was already stopping; it goes on bringing the service back."
        await self._tell(
            f"The audit log cannot be written: {self.fell}. {what} Its "
            f"records are kept in {where} and merged into the audit database "
            "as soon as it can be written."
        )

    async def _still_waiting(self) -> None:
        if self.fell is None:
            return
        if self.writer.down is None:
            await self._tell(
                "The audit database can be written again: every record of this run is in it."
            )
        else:
            where = self.writer.where or "the fallback journal"
            await self._tell(
                f"The audit database still cannot be written ({self.writer.down})"
                f": this run's records wait in {where} and are merged into it "
                "as soon as it can be written (at the latest when the bot "
                "starts again)."
            )

    async def _tell(self, text: str) -> None:
        log.warning("run #%d: %s", self.run_id, text)
        await self.notify.handle(ev.Notice(self.run_id, text))

    # ---- the run's end, through the life cycle when the database takes it --------------

    async def set_versions(self, *, before: str | None, after: str | None) -> None:
        await self._check(await self.writer.set_versions(self.run_id, before=before, after=after))

    async def finish(
        self,
        status: RunStatus,
        summary: str,
        direct: Callable[[], Awaitable[object]],
        *,
        state: ServiceState | None = None,
    ) -> None:
        await self._check(
            await self.writer.finish(self.run_id, status, summary, direct, state=state)
        )

    async def interrupt(self, direct: Callable[[], Awaitable[object]]) -> None:
        """Its driver stops mid-run (the bot shutting down, a bug): 'interrupted', through
        ``direct`` (the life cycle's) or, when the database cannot take it, the journal."""
        try:
            await direct()
            return
        except AuditError as exc:
            if not unavailable(exc):
                raise
        try:
            audit, run_id = self.writer.audit, self.run_id
            out = left_out((await audit.rotations([run_id])).get(run_id, []))
            text = interrupted_message(await audit.get_run(run_id), out)
        except AuditError:
            text = "interrupted: the bot stopped while the audit log could not be written"
        await self._check(await self.writer.interrupt(self.run_id, text, direct=direct))

    async def released(self, released: Callable[[int], Awaitable[None]]) -> None:
        """The driver is done: the life cycle forgets the run (who cancelled it is
        recorded, in the journal if need be) and its locks go."""
        try:
            await released(self.run_id)
        except AuditError as exc:
            if not unavailable(exc) or self.token.requested_by is None:
                raise
            await self.writer.record_decision(self.run_id, self.token.requested_by, Decision.CANCEL)
        await self._check(await self.writer.release_locks(self.run_id))
