"""Typed events the engine emits while a run goes on; Slack, the terminal and the
audit log are sinks of the same stream, so the engine never imports any of them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from bot.core.gpu import GpuSnapshot
from bot.core.health import GpuCheck
from bot.core.packages import EnvKind, PackageDiff
from bot.core.plan import Plan, Step
from bot.core.releases import SwitchKind
from bot.core.results import Stream
from bot.core.service_state import ServiceState
from bot.core.startup import StartHistory, progress_text
from bot.core.status import HostStatus, RunStatus, StepStatus


@dataclass(frozen=True, slots=True)
class RunStarted:
    run_id: int
    plan: Plan
    requested_by: str
    approved_by: tuple[str, ...]
    # From the request until this start (approvals included); None: not known.
    waited_s: float | None = None


@dataclass(frozen=True, slots=True)
class StepStarted:
    run_id: int
    host: str
    step: Step
    command: str


@dataclass(frozen=True, slots=True)
class StepProgress:
    """What a running step is doing now ("loading weights 60 %", "3 running, 0 waiting
    requests"); a card shows the latest in place. Not recorded in the audit log."""

    run_id: int
    host: str
    step: Step
    text: str
    elapsed_s: float | None = None
    # For a start-up wait: how long this service's previous starts took.
    history: StartHistory | None = None

    def shown(self) -> str:
        return progress_text(self.text, self.elapsed_s, self.history)


@dataclass(frozen=True, slots=True)
class OutputLine:
    run_id: int
    host: str
    step: Step
    stream: Stream
    line: str


@dataclass(frozen=True, slots=True)
class StepFinished:
    run_id: int
    host: str
    step: Step
    status: StepStatus  # ok | failed | skipped
    exit_status: int | None
    duration_s: float
    summary: str
    output: str  # everything the step printed (streamed output, then detail)


@dataclass(frozen=True, slots=True)
class GpuTable:
    run_id: int
    host: str
    label: str
    snapshot: GpuSnapshot


@dataclass(frozen=True, slots=True)
class VersionsKnown:
    run_id: int
    host: str
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class PackagesKnown:
    """A package set a host's run learned (``bot.core.flows.Packages``): the planned or
    the actual change, the snapshot a rollback restores, or the restored environment."""

    run_id: int
    host: str
    kind: EnvKind
    diff: PackageDiff | None
    freeze: str | None = None  # the snapshot's text (kind SNAPSHOT)
    lock: str | None = None  # where the snapshot is kept on the host
    note: str = ""


@dataclass(frozen=True, slots=True)
class GpuHealthKnown:
    """A host's GPU check verdict read at the request, for the approval card
    (``bot.core.flows.gpu_health_flow``); a run's own check is its step."""

    run_id: int
    host: str
    check: GpuCheck


@dataclass(frozen=True, slots=True)
class RotationChanged:
    """A replica taken out of its router's rotation or put back (issue 19): who is in the
    run's record, when is the row's time, which router and server, and the result."""

    run_id: int
    host: str
    router: str
    server: str
    change: Literal["out", "in"]
    ok: bool
    detail: str = ""
    # Out before the run (by hand) and left so: nothing was sent to the router.
    held: bool = False


@dataclass(frozen=True, slots=True)
class ReleaseSwitched:
    """A side-by-side service's link on ``host`` switched from release ``before`` (None:
    no release) to ``after``: the switch history a rollback by hand goes by."""

    run_id: int
    host: str
    service: str
    before: str | None
    after: str
    kind: SwitchKind


@dataclass(frozen=True, slots=True)
class HostFinished:
    run_id: int
    host: str
    status: HostStatus
    summary: str
    # How the run left the service on this host (``bot.core.flows.HostOutcome.state``);
    # UNKNOWN for a host the rollout never reached (nothing read it).
    state: ServiceState


@dataclass(frozen=True, slots=True)
class RunFinished:
    run_id: int
    status: RunStatus
    summary: str
    version_before: str | None
    version_after: str | None
    # The worst of the states the run left its hosts in (``service_state.worst``).
    state: ServiceState


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the people following a run must know that is no step of it (the audit
    log cannot be written, and what the run does about it): a line on the terminal, a
    reply in the thread."""

    run_id: int
    text: str


Event = (
    RunStarted
    | StepStarted
    | StepProgress
    | OutputLine
    | StepFinished
    | GpuTable
    | VersionsKnown
    | PackagesKnown
    | GpuHealthKnown
    | RotationChanged
    | ReleaseSwitched
    | HostFinished
    | RunFinished
    | Notice
)


log = logging.getLogger(__name__)


class EventSink(Protocol):
    async def handle(self, event: Event) -> None: ...


@runtime_checkable
class BatchSink(Protocol):
    """A sink that takes events made together at once (the audit sink: one transaction)."""

    async def handle(self, event: Event) -> None: ...

    async def handle_all(self, events: Sequence[Event]) -> None: ...


async def deliver_all(sink: EventSink, events: Sequence[Event]) -> None:
    """``events`` to ``sink`` in order: together where it takes them so (``BatchSink``),
    else one by one."""
    if isinstance(sink, BatchSink):
        await sink.handle_all(events)
        return
    for event in events:
        await sink.handle(event)


class FanOut:
    """Deliver each event to several sinks in order (the audit sink first, so the
    record is on disk before anything slower runs)."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    async def handle(self, event: Event) -> None:
        for sink in self.sinks:
            await sink.handle(event)

    async def handle_all(self, events: Sequence[Event]) -> None:
        """Events made together: all of them to each sink in turn, so every one is on
        the audit sink's disk before any later sink hears of the first."""
        for sink in self.sinks:
            await deliver_all(sink, events)


class BestEffort:
    """A sink whose failures are logged, never raised into the engine."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink

    async def handle(self, event: Event) -> None:
        try:
            await self.sink.handle(event)
        except Exception:
            log.exception(
                "event sink %s failed on %s", type(self.sink).__name__, type(event).__name__
            )
