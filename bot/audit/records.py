"""What the audit log hands back: one frozen record per row, typed with the words of
``bot.core.status``, and the stored timestamp form.

Pure: no SQL here. The tables these records are read from are described in the
``bot.audit`` package docstring; the table modules (``runs``, ``steps``...) turn rows
into these records, converting the stored words into enum members as they read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from bot.core.service_state import ServiceState
from bot.core.status import Action, Decision, RunStatus, Source, StepStatus
from bot.errors import AuditError

E = TypeVar("E", bound=StrEnum)

TS_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# A step keeps the last this many characters of its output (after redaction).
OUTPUT_TAIL_CHARS = 4000
# The summary of a request nobody approved in time, whoever expired it.
EXPIRED_SUMMARY = "approval window expired"


def format_ts(moment: datetime) -> str:
    """An aware datetime as the stored form, e.g. ``2026-11-30T13:12:01Z``."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: pass an aware (UTC) datetime")
    return moment.astimezone(UTC).strftime(TS_FORMAT)


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, TS_FORMAT).replace(tzinfo=UTC)


def now_ts() -> str:
    return format_ts(datetime.now(UTC))


def checked(kind: type[E], value: str, what: str) -> E:
    """A caller's ``value`` as a member of ``kind``. Callers typed with the enums pass
    members already; this catches the plain strings an untyped caller still sends,
    with the choices in the message."""
    try:
        return kind(value)
    except ValueError:
        choices = sorted(member.value for member in kind)
        raise ValueError(f"unknown {what} {value!r}; expected one of {choices}") from None


def stored(kind: type[E], value: str, what: str) -> E:
    """A stored word as a member of ``kind``. The columns have no CHECK constraint (see
    the package docstring), so a newer bot may have written a word this one does not
    know: say so, rather than hand back an untyped string."""
    try:
        return kind(value)
    except ValueError:
        raise AuditError(
            f"the audit log holds {what} {value!r}, which this bot does not know "
            "(written by a newer bot?)"
        ) from None


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    user: str
    decision: Decision
    at: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: int
    service: str
    action: Action
    hosts: list[str]
    requested_by: str
    source: Source
    status: RunStatus
    current_step: str | None
    summary: str | None
    version_before: str | None
    version_after: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    expires_at: str | None
    channel: str | None
    message_ts: str | None
    plan: dict[str, Any]
    package_spec: str | None
    index_name: str | None
    dry_run: bool
    approved_by: list[str]
    denied_by: list[str]
    # The process driving the run (``host:pid:start-time``) and until when its heartbeat
    # vouches for it; see ``bot.engine.owner``. Defaults keep older callers building one.
    owner: str | None = None
    lease_until: str | None = None
    # How many times the heartbeat renewed the lease (issue 17: what a judge reading
    # another wall clock watches), and whose wall clock wrote ``expires_at``.
    lease_renewals: int = 0
    expires_clock: str | None = None
    # Who marked it interrupted after its driver died (an operator's ``recover``, or
    # ``system:recovery``), or whose ``recover`` expired it past its approval window
    # (then its status is 'expired'): the 'recover' decisions.
    recovered_by: list[str] = field(default_factory=list)
    # How the run left the service (issue 18); None before it was recorded.
    service_state: ServiceState | None = None
    # Issue 22: the UTC start time of a run scheduled with ``--at`` (None: at once), and
    # whether it was requested outside its window as an emergency override (``--now``).
    scheduled_at: str | None = None
    override: bool = False
    # Issue 21: the fencing token of its ownership (``bot.audit.fence``), how long its
    # owner's lease has left by the database's clock when it was read (None: no lease;
    # negative: lapsed), a cancel asked on a replica that does not drive it, and how
    # long its approval window has left by that clock.
    epoch: int = 0
    # Readings of the database's clock at the read, not the run's own state: two reads
    # of an unchanged run are still equal (``compare=False``).
    lease_left_s: float | None = field(default=None, compare=False)
    cancel_requested_by: str | None = None
    # How long its approval window has left by the database's clock when it was read.
    expires_left_s: float | None = field(default=None, compare=False)

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    def to_json(self) -> dict[str, Any]:
        # The fields people scan for first lead; the rest follow. Enum members become
        # their plain words: this is what `audit --json` prints for other programs.
        return {
            "id": self.id,
            "service": self.service,
            "action": self.action.value,
            "requested_by": self.requested_by,
            "approved_by": list(self.approved_by),
            "status": self.status.value,
            "version_before": self.version_before,
            "version_after": self.version_after,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "denied_by": list(self.denied_by),
            "recovered_by": list(self.recovered_by),
            "hosts": list(self.hosts),
            "source": self.source.value,
            "channel": self.channel,
            "message_ts": self.message_ts,
            "current_step": self.current_step,
            "summary": self.summary,
            "service_state": None if self.service_state is None else self.service_state.value,
            "scheduled_at": self.scheduled_at,
            "override": self.override,
            "package_spec": self.package_spec,
            "index_name": self.index_name,
            "dry_run": self.dry_run,
            "owner": self.owner,
            "lease_until": self.lease_until,
            "plan": self.plan,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    id: int
    run_id: int
    host: str
    step: str
    command: str
    status: StepStatus
    exit_status: int | None
    started_at: str
    finished_at: str | None
    duration_s: float | None
    output_tail: str

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "status": self.status.value}


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    id: int
    run_id: int | None
    host: str
    label: str
    taken_at: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EnvironmentRecord:
    """A package set of one host's run (``bot.core.packages.EnvKind``); ``data`` holds
    ``changes`` ([{name, before, after}]), ``unchanged``, and for a snapshot ``freeze``
    and ``lock`` (its file on the host)."""

    id: int
    run_id: int
    host: str
    kind: str
    taken_at: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    id: int
    at: str
    user: str
    channel: str | None
    command: str
    reason: str
