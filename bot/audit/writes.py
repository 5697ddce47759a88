"""Every kind of audit write a run makes, as a type: the one schema of the resilient
writer (``bot.audit.resilient``), the fallback journal (``bot.audit.journal``) and its
merge (``bot.audit.replay``).

Each write is a frozen dataclass; ``AuditRecord`` is their union and ``apply`` writes
one with the table modules' statements, in an exhaustive ``match`` (a new kind without
its case fails mypy). The journal keeps a record as its ``op`` (the class's ``OP``) and
its fields, so a line reads back as the same record (``to_fields`` / ``from_fields``).
Text in a record is already redacted and cut as the database stores it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Union, assert_never, get_args, get_origin, get_type_hints

from bot.audit import (
    decisions,
    environments,
    host_outcomes,
    locks,
    release_switches,
    rotations,
    runs,
    snapshots,
    steps,
)
from bot.audit.db import Conn, fetch
from bot.core.releases import SwitchKind
from bot.core.service_state import ServiceState
from bot.core.status import Decision, RunStatus, StepStatus


class Rejected(Exception):
    """The database can never take this record (not a passing condition)."""


@dataclass(frozen=True, slots=True)
class StepStarted:
    """A step is running (and is the run's current step)."""

    OP: ClassVar[str] = "step_started"
    run_id: int
    host: str
    step: str
    command: str


@dataclass(frozen=True, slots=True)
class StepFinished:
    """A step's end; the step by its row id or, started while the database was away, by
    the id of its ``StepStarted`` journal record (``step_ref``)."""

    OP: ClassVar[str] = "step_finished"
    status: StepStatus
    exit_status: int | None
    duration_s: float | None
    output_tail: str
    step_id: int | None = None
    step_ref: str | None = None

    def __post_init__(self) -> None:
        if self.step_id is None and not self.step_ref:
            raise ValueError("step_finished names no step")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A GPU table (``data``: stored JSON text)."""

    OP: ClassVar[str] = "snapshot"
    run_id: int | None
    host: str
    label: str
    data: str


@dataclass(frozen=True, slots=True)
class Environment:
    """A package set of one host's run (``data``: stored JSON text)."""

    OP: ClassVar[str] = "environment"
    run_id: int
    host: str
    kind: str
    data: str


@dataclass(frozen=True, slots=True)
class Versions:
    OP: ClassVar[str] = "versions"
    run_id: int
    before: str | None = None
    after: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionMade:
    OP: ClassVar[str] = "decision"
    run_id: int
    user: str
    decision: Decision


@dataclass(frozen=True, slots=True)
class Finish:
    """The run's end: a transition from one of ``expect``."""

    OP: ClassVar[str] = "finish"
    run_id: int
    status: RunStatus
    summary: str
    # Written by the journal: a finish that waited there wins over the 'interrupted' a
    # recovery guessed meanwhile (see ``apply``).
    expect: tuple[RunStatus, ...] = (RunStatus.RUNNING,)


@dataclass(frozen=True, slots=True)
class RunServiceState:
    """How the run left the service (``bot.core.service_state``), beside its end."""

    OP: ClassVar[str] = "run_service_state"
    run_id: int
    state: ServiceState


@dataclass(frozen=True, slots=True)
class HostFinished:
    """One host's outcome in a run."""

    OP: ClassVar[str] = "host_finished"
    run_id: int
    host: str
    status: str
    summary: str
    state: ServiceState | None = None


@dataclass(frozen=True, slots=True)
class RotationChanged:
    """A replica out of its router's rotation or back in (issue 19)."""

    OP: ClassVar[str] = "rotation"
    run_id: int
    host: str
    router: str
    server: str
    change: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class ReleaseSwitched:
    """A side-by-side service's link switched from one release to another on a host."""

    OP: ClassVar[str] = "release_switch"
    run_id: int
    service: str
    host: str
    from_release: str | None
    to_release: str
    kind: SwitchKind


@dataclass(frozen=True, slots=True)
class Interrupt:
    OP: ClassVar[str] = "interrupt"
    run_id: int
    summary: str


@dataclass(frozen=True, slots=True)
class ReleaseLocks:
    OP: ClassVar[str] = "release_locks"
    run_id: int


AuditRecord = (
    StepStarted
    | StepFinished
    | Snapshot
    | Environment
    | Versions
    | DecisionMade
    | Finish
    | RunServiceState
    | HostFinished
    | RotationChanged
    | ReleaseSwitched
    | Interrupt
    | ReleaseLocks
)

KINDS: dict[str, type[AuditRecord]] = {cls.OP: cls for cls in get_args(AuditRecord)}


# ---- the journal's form: the op's fields as JSON ------------------------------------------


def to_fields(record: AuditRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _load(hint: Any, value: Any) -> Any:
    """A JSON value as the field's type (enums by value, tuples from lists)."""
    if value is None:
        return None
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(hint) if a is not type(None)]
        return _load(inner[0], value) if len(inner) == 1 else value
    if origin is tuple:
        return tuple(_load(get_args(hint)[0], v) for v in value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    return value


def from_fields(op: str, fields: Mapping[str, Any]) -> AuditRecord:
    """The record of journal operation ``op``; ``ValueError`` for an unknown one, a
    missing field or a value its type refuses."""
    cls = KINDS.get(op)
    if cls is None:
        raise ValueError(f"unknown operation {op!r}")
    hints = get_type_hints(cls)
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    if missing := sorted(required - fields.keys()):
        raise ValueError(f"{op} without {', '.join(missing)}")
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _load(hints[k], v) for k, v in fields.items() if k in known})


# ---- writing one record -----------------------------------------------------------------


async def _step_id(conn: Conn, record: StepFinished, row_ids: Mapping[str, int]) -> int:
    if record.step_id is not None:
        return record.step_id
    ref = str(record.step_ref)
    if ref in row_ids:
        return row_ids[ref]
    row = await fetch(conn, "SELECT row_id FROM journal_applied WHERE id = ?", (ref,))
    if row and row[0]["row_id"] is not None:
        return int(row[0]["row_id"])
    raise Rejected(f"the step it finishes (journal record {ref}) was never recorded")


async def _finish(conn: Conn, r: Finish, at: str) -> None:
    # A finish that waited in the journal may find the run 'interrupted' by a recovery
    # that took the silence for a dead driver: what the driver recorded is the evidence,
    # so it wins over that guess.
    if not await runs.transition(
        conn, r.run_id, r.status, expect=list(r.expect), summary=r.summary, owner=None, now=at
    ):
        current = await fetch(conn, "SELECT status FROM runs WHERE id = ?", (r.run_id,))
        raise Rejected(
            f"run #{r.run_id} is {current[0]['status']}, not one of {', '.join(r.expect)}"
        )


async def apply(
    conn: Conn, record: AuditRecord, *, at: str, row_ids: Mapping[str, int]
) -> int | None:
    """The statements of ``record``, as of ``at`` (when it happened), in the caller's
    transaction; the new row's id for a ``StepStarted``, a ``Snapshot`` or an
    ``Environment``. ``row_ids``: the steps made
    earlier in the same merge (journal record id -> row id)."""
    match record:
        case StepStarted():
            step_id = await steps.start(
                conn, record.run_id, record.host, record.step, record.command, at
            )
            await runs.update(conn, record.run_id, {"current_step": record.step})
            return step_id
        case StepFinished():
            await steps.finish(
                conn,
                await _step_id(conn, record, row_ids),
                status=record.status,
                exit_status=record.exit_status,
                duration_s=record.duration_s,
                output_tail=record.output_tail,
                now=at,
            )
        case Snapshot():
            return await snapshots.add(
                conn, record.run_id, record.host, record.label, record.data, at
            )
        case Environment():
            return await environments.add(
                conn, record.run_id, record.host, record.kind, record.data, at
            )
        case HostFinished():
            await host_outcomes.add(
                conn, record.run_id, record.host, record.status, record.summary, record.state, at
            )
        case RotationChanged():
            await rotations.add(
                conn,
                record.run_id,
                record.host,
                record.router,
                record.server,
                record.change,
                record.ok,
                record.detail,
                at,
            )
        case ReleaseSwitched():
            await release_switches.add(
                conn,
                record.run_id,
                record.service,
                record.host,
                record.from_release,
                record.to_release,
                record.kind,
                at,
            )
        case _:
            await _apply_to_run(conn, record, at)
    return None


RunWrite = Versions | DecisionMade | Finish | RunServiceState | Interrupt | ReleaseLocks


async def _apply_to_run(conn: Conn, record: RunWrite, at: str) -> None:
    """The records that change the run itself (its row, decisions, locks)."""
    match record:
        case Versions():
            sets = {
                column: value
                for column, value in (
                    ("version_before", record.before),
                    ("version_after", record.after),
                )
                if value is not None
            }
            if sets:
                await runs.update(conn, record.run_id, sets)
        case DecisionMade():
            await decisions.record(conn, record.run_id, record.user, record.decision, at)
        case Finish():
            await _finish(conn, record, at)
        case RunServiceState():
            await runs.update(conn, record.run_id, {"service_state": str(record.state)})
        case Interrupt():
            if await runs.has_status(conn, record.run_id, RunStatus.RUNNING):
                await runs.interrupt(conn, record.run_id, record.summary, at)
        case ReleaseLocks():
            await locks.release(conn, record.run_id)
        case _:
            assert_never(record)
