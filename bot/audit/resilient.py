"""Audit writes that ride out a database that cannot be written for a while.

A running job's audit writes (its steps, GPU snapshots, versions, who cancelled it,
its end) go through ``AuditWriter``. Each is tried on the database and, while the
database is locked or full, retried with exponential back-off (``first_delay_s``,
doubling) for up to ``retry_s`` in all. A write that still fails goes to the fallback
journal (``bot.audit.journal``) and the writer is *down*:

* every later write goes straight to the journal, behind it: nothing may overtake
  what waits there, and a stopped service must not wait a retry window per record;
* a background task merges the journal into the database, with the same back-off
  capped at ``retry_s``; the first merge that empties the journal brings the writer
  back up, and writes go to the database again.

The caller learns of the fall from the ``Written`` it gets back (``journaled``): the
engine's audit sink (``bot.engine.audit_sink``) then brings the service back rather
than carry on with a maintenance job nobody can audit.

The journal is merged at start-up too (``start``, from ``open_runtime``, before the
runs are recovered) and once more at ``close``; what is still waiting then is merged
at the next start. If neither journal file can be written (both disks full), the
records are held in memory, in order, and written at the next chance; the log says
that a restart before then would lose them.

Only a database that cannot be written *for now* counts (locked, busy, full, an I/O
error, read-only: ``unavailable``); any other error (a bug, a run that does not
exist) is raised as before. Time is injected (``clock``, ``sleep``), so the back-off is
tested without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from bot.audit import writes as w
from bot.audit.fence import Fence
from bot.audit.journal import Journal, JournalRecord
from bot.audit.records import OUTPUT_TAIL_CHARS, checked, now_ts
from bot.audit.store import AuditLog
from bot.core.releases import SwitchKind
from bot.core.service_state import ServiceState
from bot.core.status import STORED_STEP_STATUSES, Decision, RunStatus, StepStatus
from bot.errors import AuditError, AuditUnavailable
from bot.retry import Backoff, retry

log = logging.getLogger(__name__)

T = TypeVar("T")

# A step's id in the database, or (started while the database was away) the id of the
# journal record that started it.
StepRef = int | str

_STEP_ENDS = STORED_STEP_STATUSES - {StepStatus.RUNNING}


def unavailable(exc: BaseException) -> bool:
    """Whether an error means the audit database cannot be written for now (locked,
    busy, full, an I/O error, read-only), as opposed to a bug or a refusal."""
    if isinstance(exc, AuditUnavailable):
        return True
    if not isinstance(exc, AuditError):
        return False
    # An AuditError raised around SQLite's error by hand (not through the backend's
    # ``audit_error``) says the same with its cause.
    cause = exc.__cause__
    return isinstance(cause, sqlite3.OperationalError) or type(cause) is sqlite3.DatabaseError


@dataclass(frozen=True, slots=True)
class Written:
    """Where a write went."""

    row_id: int | None = None  # the row a direct ``step_started`` made
    journaled: bool = False  # kept in the fallback journal: the database could not take it
    reason: str | None = None  # why not, when journaled
    # Of a ``write_all``: each record id -> the row it made (steps, snapshots, environments).
    row_ids: Mapping[str, int] = field(default_factory=dict)


class JournaledWriter:
    """How a record reaches the audit log: the database when it takes it, else the
    fallback journal, merged back once it can be written (retries through ``bot.retry``)."""

    def __init__(
        self,
        audit: AuditLog,
        journal: Journal,
        *,
        retry_s: float = 15.0,
        first_delay_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        background: bool = True,
    ) -> None:
        """``background``: merge the journal in a task of its own while down (tests that
        drive ``merge`` by hand turn it off)."""
        self.audit = audit
        self.journal = journal
        self.retry_s = retry_s
        self.first_delay_s = first_delay_s
        self._clock = clock
        self._sleep = sleep
        self._background = background
        # Unique per writer (a pid may be reused after a restart): groups its records.
        self._proc = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()  # one write (or journal clean-up) at a time
        self._merging = asyncio.Lock()  # one merge at a time
        self._held: list[JournalRecord] = []  # records no journal file could take
        self._row_ids: dict[str, int] = {}  # journal record id -> the row it made
        self._merger: asyncio.Task[None] | None = None
        self.down: str | None = None  # why the database is not being written, when it is not
        self.waiting = 0  # records written to the journal and not merged yet
        self.where: str | None = None  # where the latest journaled record went

    def _record(self, write: w.AuditRecord) -> JournalRecord:
        seq = next(self._seq)
        return JournalRecord(
            id=f"{self._proc}/{seq}", proc=self._proc, seq=seq, at=now_ts(), write=write
        )

    async def write(
        self, record: JournalRecord, direct: Callable[[], Awaitable[object]] | None = None
    ) -> Written:
        """``record`` into the database (through ``direct`` when given), retried; else into
        the journal."""
        if direct is None:
            written = await self.write_all([record])
            return replace(written, row_id=written.row_ids.get(record.id))
        return await self._write([record], direct)

    async def write_all(
        self, records: Sequence[JournalRecord], fence: Fence | None = None
    ) -> Written:
        """``records`` into the database in one transaction, retried; else every one of
        them into the journal, in order. The engine's audit sink writes the records of
        events made with no remote action between them so (a step's end, what it found,
        the next step's start): one commit, on disk before the next action as each alone
        would be. ``fence``: the run's epoch its driver took; if another replica has
        recovered the run since, nothing is written and ``FencedError`` says so
        (``bot.audit.fence``; never journaled: the run is not this writer's any more)."""
        return await self._write(records, None, fence)

    async def _write(
        self,
        records: Sequence[JournalRecord],
        direct: Callable[[], Awaitable[object]] | None,
        fence: Fence | None = None,
    ) -> Written:
        async with self._lock:
            if self.down is None:
                try:
                    if direct is not None:
                        await self._retrying(direct)
                        return Written()
                    tries = 0

                    def attempt() -> Awaitable[dict[str, int]]:
                        nonlocal tries
                        tries += 1
                        return self._direct(records, fence, again=tries > 1)

                    return Written(row_ids=await self._retrying(attempt))
                except AuditError as exc:
                    if not unavailable(exc):
                        raise
                    self.down = str(exc)
                    log.error(
                        "%s; keeping the audit records in the fallback journal (%s) "
                        "until it can be written",
                        exc,
                        ", ".join(map(str, self.journal.paths)),
                    )
            await self._keep(records)
            self._start_merger()
            return Written(journaled=True, reason=self.down)

    async def _direct(
        self, records: Sequence[JournalRecord], fence: Fence | None, *, again: bool = False
    ) -> dict[str, int]:
        applied = await self.audit.write_records(records, merge=False, fence=fence, again=again)
        return applied.row_ids

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt`` until it succeeds, retrying while the database is unavailable:
        back-off from ``first_delay_s``, doubling, for up to ``retry_s`` in all (no
        jitter: one writer per process, and its tests count the exact waits)."""
        return await retry(
            attempt,
            on=unavailable,
            backoff=Backoff(self.first_delay_s),
            budget_s=self.retry_s,
            clock=self._clock,
            sleep=self._sleep,
        )

    async def _keep(self, records: Sequence[JournalRecord]) -> None:
        """Append to the journal, behind anything held in memory."""
        self._held.extend(records)
        self.waiting += len(records)
        try:
            where = await asyncio.to_thread(self.journal.append, list(self._held))
        except OSError as exc:
            if self.where != "memory":
                log.error(
                    "cannot write the audit journal either (%s): audit records are "
                    "held in memory only until it can be; a restart before then "
                    "would lose them",
                    exc,
                )
            self.where = "memory"
            return
        self._held.clear()
        self.where = str(where)

    async def start(self) -> int:
        """At start-up: merge what an earlier outage left in the journal. Returns how many
        records were merged; if the database cannot take them yet, a background task
        keeps trying (the bot starts anyway)."""
        try:
            waiting = await asyncio.to_thread(self.journal.read)
        except OSError as exc:
            # The bot starts anyway; the background merge keeps trying to read it.
            log.error("cannot read the fallback journal %s: %s", self.journal.paths, exc)
            self.down = f"the fallback journal cannot be read: {exc}"
            self._start_merger()
            return 0
        if not waiting:
            return 0
        log.warning(
            "%d audit record(s) from an earlier outage wait in the fallback journal; merging them",
            len(waiting),
        )
        async with self._lock:
            self.down = self.down or "records of an earlier outage wait in the journal"
            self.waiting += len(waiting)
        try:
            return await self.merge()
        except AuditError as exc:
            if not unavailable(exc):
                raise
            log.error("cannot merge the fallback journal yet: %s", exc)
            self._start_merger()
            return 0

    async def merge(self) -> int:
        """Merge the journal into the database; returns how many records were merged now.
        Raises ``AuditError`` while the database cannot be written. When the journal is
        empty afterwards, the writer is up again."""
        merged = 0
        async with self._merging:
            while True:
                async with self._lock:
                    records = await asyncio.to_thread(self.journal.read)
                    records += [r for r in self._held if r.id not in {x.id for x in records}]
                    if not records:
                        if self.down is not None:
                            log.warning(
                                "the audit database takes writes again; the fallback "
                                "journal is merged"
                            )
                        self.down, self.waiting, self.where = None, 0, None
                        return merged
                # Outside the write lock: a run's records go on into the journal meanwhile
                # (behind these), instead of waiting for a database that may be locked.
                applied = await self.audit.write_records(records, merge=True)
                for record, reason in applied.rejected:
                    log.error(
                        "the audit database refused journal record %s (%s %s): %s; it "
                        "is kept in journal_applied",
                        record.id,
                        record.op,
                        record.write,
                        reason,
                    )
                done = {*applied.merged, *applied.skipped, *(r.id for r, _ in applied.rejected)}
                async with self._lock:
                    self._row_ids.update(applied.row_ids)
                    self._held = [r for r in self._held if r.id not in done]
                    self.waiting = max(0, self.waiting - len(applied.merged))
                    try:
                        await asyncio.to_thread(self.journal.drop, done)
                    except OSError as exc:
                        # They are in journal_applied: a later merge skips them.
                        log.warning("cannot clean the merged records out of the journal: %s", exc)
                        return merged + len(applied.merged)
                merged += len(applied.merged)

    def _start_merger(self) -> None:
        if self._background and (self._merger is None or self._merger.done()):
            self._merger = asyncio.create_task(self._merge_until_done(), name="audit-journal-merge")

    async def _merge_until_done(self) -> None:
        # Sleeps before each try (the write that fell just failed), capped at the window.
        backoff = Backoff(self.first_delay_s, max_s=max(self.retry_s, self.first_delay_s))
        for delay in backoff.delays():
            if self.down is None:
                return
            await self._sleep(delay)
            try:
                await self.merge()
            except AuditError as exc:
                if not unavailable(exc):
                    log.exception("merging the fallback journal failed")
            except OSError:
                log.exception("reading the fallback journal failed")

    async def close(self) -> None:
        """Stop the background merge; one last try; say what is left for the next start."""
        merger, self._merger = self._merger, None
        if merger is not None:
            merger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await merger
        if self.down is None:
            return
        with contextlib.suppress(AuditError, OSError):
            await self.merge()
        if self.down is not None:
            where = (
                self.where if self.where is not None else " or ".join(map(str, self.journal.paths))
            )
            log.error(
                "the audit database still cannot be written: %d audit record(s) wait in "
                "%s and are merged at the next start%s",
                self.waiting,
                where or "memory",
                f"; {len(self._held)} held in memory are LOST" if self._held else "",
            )


class AuditWriter(JournaledWriter):
    """The resilient writes of the runs this process drives; one per process. Each
    ``*_record`` method builds one typed record (``bot.audit.writes``), redacted as the
    database stores it, for ``write_all``; the method of the same name writes it alone."""

    def step_started_record(self, run_id: int, host: str, step: str, command: str) -> JournalRecord:
        r = self.audit.redaction
        return self._record(
            w.StepStarted(run_id=run_id, host=r(host), step=r(step), command=r(command))
        )

    async def step_started(
        self, run_id: int, host: str, step: str, command: str
    ) -> tuple[StepRef, Written]:
        record = self.step_started_record(run_id, host, step, command)
        written = await self.write(record)
        return (written.row_id if written.row_id is not None else record.id), written

    def step_finished_record(
        self,
        step: StepRef,
        *,
        status: StepStatus,
        exit_status: int | None,
        duration_s: float | None,
        output_tail: str,
    ) -> JournalRecord:
        status = checked(StepStatus, status, "step status")
        if status not in _STEP_ENDS:
            raise ValueError(f"a step cannot end with step status {status.value!r}")
        if isinstance(step, str) and step in self._row_ids:
            step = self._row_ids[step]  # merged since: its row id is known
        # Redact before cutting, as the database does: a cut could hide half a secret.
        tail = self.audit.redaction(output_tail)[-OUTPUT_TAIL_CHARS:]
        return self._record(
            w.StepFinished(
                status=status,
                exit_status=exit_status,
                duration_s=duration_s,
                output_tail=tail,
                step_id=step if isinstance(step, int) else None,
                step_ref=step if isinstance(step, str) else None,
            )
        )

    async def step_finished(
        self,
        step: StepRef,
        *,
        status: StepStatus,
        exit_status: int | None,
        duration_s: float | None,
        output_tail: str,
    ) -> Written:
        return await self.write(
            self.step_finished_record(
                step,
                status=status,
                exit_status=exit_status,
                duration_s=duration_s,
                output_tail=output_tail,
            )
        )

    def snapshot_record(
        self, run_id: int, host: str, label: str, data: Mapping[str, Any]
    ) -> JournalRecord:
        r = self.audit.redaction
        return self._record(
            w.Snapshot(run_id=run_id, host=r(host), label=r(label), data=r.json(data))
        )

    async def add_snapshot(
        self, run_id: int, host: str, label: str, data: Mapping[str, Any]
    ) -> Written:
        return await self.write(self.snapshot_record(run_id, host, label, data))

    def versions_record(
        self, run_id: int, *, before: str | None, after: str | None
    ) -> JournalRecord:
        r = self.audit.redaction
        return self._record(w.Versions(run_id=run_id, before=r.opt(before), after=r.opt(after)))

    async def set_versions(self, run_id: int, *, before: str | None, after: str | None) -> Written:
        return await self.write(self.versions_record(run_id, before=before, after=after))

    def environment_record(
        self, run_id: int, host: str, kind: str, data: Mapping[str, Any]
    ) -> JournalRecord:
        r = self.audit.redaction
        return self._record(
            w.Environment(run_id=run_id, host=r(host), kind=r(kind), data=r.json(data))
        )

    async def add_environment(
        self, run_id: int, host: str, kind: str, data: Mapping[str, Any]
    ) -> Written:
        return await self.write(self.environment_record(run_id, host, kind, data))

    async def record_decision(self, run_id: int, user: str, decision: Decision) -> Written:
        decision = checked(Decision, decision, "decision")
        return await self.write(
            self._record(
                w.DecisionMade(run_id=run_id, user=self.audit.redaction(user), decision=decision)
            )
        )

    def host_finished_record(
        self,
        run_id: int,
        host: str,
        status: str,
        summary: str,
        *,
        state: ServiceState | None = None,
    ) -> JournalRecord:
        """One host's outcome, and the state it left the service in."""
        r = self.audit.redaction
        return self._record(
            w.HostFinished(
                run_id=run_id,
                host=r(host),
                status=str(status),
                summary=r(summary),
                state=None if state is None else checked(ServiceState, state, "service state"),
            )
        )

    async def host_finished(
        self,
        run_id: int,
        host: str,
        status: str,
        summary: str,
        *,
        state: ServiceState | None = None,
    ) -> Written:
        return await self.write(
            self.host_finished_record(run_id, host, status, summary, state=state)
        )

    def rotation_record(
        self,
        run_id: int,
        host: str,
        router: str,
        server: str,
        change: str,
        ok: bool,
        detail: str,
    ) -> JournalRecord:
        """A replica taken out of its router's rotation or put back (issue 19)."""
        r = self.audit.redaction
        return self._record(
            w.RotationChanged(
                run_id=run_id,
                host=r(host),
                router=router,
                server=r(server),
                change=change,
                ok=ok,
                detail=r(detail),
            )
        )

    async def rotation_changed(
        self,
        run_id: int,
        host: str,
        router: str,
        server: str,
        change: str,
        ok: bool,
        detail: str,
    ) -> Written:
        return await self.write(
            self.rotation_record(run_id, host, router, server, change, ok, detail)
        )

    def switch_record(
        self,
        run_id: int,
        service: str,
        host: str,
        from_release: str | None,
        to_release: str,
        kind: SwitchKind,
    ) -> JournalRecord:
        """A side-by-side service's link switched from one release to another."""
        r = self.audit.redaction
        return self._record(
            w.ReleaseSwitched(
                run_id=run_id,
                service=service,
                host=r(host),
                from_release=None if from_release is None else r(from_release),
                to_release=r(to_release),
                kind=checked(SwitchKind, kind, "release switch kind"),
            )
        )

    async def finish(
        self,
        run_id: int,
        status: RunStatus,
        summary: str,
        direct: Callable[[], Awaitable[object]],
        *,
        state: ServiceState | None = None,
    ) -> Written:
        """The run's end: ``direct`` (the life cycle's own transition) when the database
        takes it; in the journal, a transition from 'running' that a merge applies even
        over an 'interrupted' that a recovery guessed meanwhile (see
        ``bot.audit.writes``). ``state``, how the run left the service, is a record of
        its own (the life cycle's transition does not carry it), written first: whoever
        reads the run's final status then reads its state too, never a final run
        without one."""
        status = checked(RunStatus, status, "status")
        kept: Written | None = None
        if state is not None:
            kept = await self.write(
                self._record(
                    w.RunServiceState(
                        run_id=run_id, state=checked(ServiceState, state, "service state")
                    )
                )
            )
        record = self._record(
            w.Finish(
                run_id=run_id,
                status=status,
                summary=self.audit.redaction(summary),
                expect=(RunStatus.RUNNING, RunStatus.INTERRUPTED),
            )
        )
        written = await self.write(record, direct=direct)
        return written if kept is None or written.journaled else kept

    async def interrupt(
        self, run_id: int, summary: str, direct: Callable[[], Awaitable[object]]
    ) -> Written:
        record = self._record(w.Interrupt(run_id=run_id, summary=self.audit.redaction(summary)))
        return await self.write(record, direct=direct)

    async def release_locks(self, run_id: int) -> Written:
        return await self.write(self._record(w.ReleaseLocks(run_id=run_id)))
