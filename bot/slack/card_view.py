"""What a run's card shows, as plain data (``CardView``, its checklist's ``StepLine``,
a host's ``LeftoverAsk``): the card and the thread replies are pure functions of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from bot.core.health import HealthNote
from bot.core.plan import (
    Plan,
    Step,
)
from bot.core.status import HostStatus, RunStatus, StepStatus


@dataclass(frozen=True, slots=True)
class StepLine:
    """One row of the status card's checklist."""

    host: str
    step: Step
    state: StepStatus = StepStatus.PENDING
    duration_s: float | None = None
    summary: str = ""
    # While it runs: what it does now ("loading weights 60 % · 4m10s elapsed").
    progress: str = ""


@dataclass(frozen=True, slots=True)
class LeftoverAsk:
    """One host's question while its run waits to terminate the processes that outlived
    its service's stop (issue 17 F5): its own list and its own button, whose value names
    the run, the host and this question (``question``, a nonce made per question), so a
    press answers exactly the list shown beside it and no other host's."""

    host: str
    question: str
    text: str  # the list the approvers see: PIDs, names, memory, why they are the service's
    pids: tuple[int, ...]
    needed: int = 1  # the run's rule: min_approvals distinct approvers
    approvals: tuple[str, ...] = ()  # who pressed so far and still counts


def terminate_value(run_id: int, host: str, question: str) -> str:
    """The value of a host's Terminate button: ``<run>:<host>:<question>`` (host names
    hold no colon; a question id is URL-safe base64)."""
    return f"{run_id}:{host}:{question}"


@dataclass(frozen=True, slots=True)
class CardView:
    """Everything the run's card shows; the card is a pure function of it."""

    run_id: int
    plan: Plan
    requested_by: str
    status: RunStatus
    needed: int = 1
    # Who may approve (the service's policy entries: user and user-group IDs); empty:
    # anyone (the bot refuses to start so, but an older record may be shown).
    approvers: tuple[str, ...] = ()
    approvals: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    version_now: str | None = None
    version_after: str | None = None
    expires_at: datetime | None = None
    steps: tuple[StepLine, ...] = ()
    summary: str | None = None
    cancel_requested_by: str | None = None
    notes: tuple[str, ...] = field(default=())
    # (host, state) once a host is done: its outcome, or NOT_STARTED for a host a
    # stopped rollout never reached.
    host_states: tuple[tuple[str, HostStatus], ...] = ()
    # While a run waits for approvers to let it terminate leftover processes: each
    # host's question (its list, its button, its approvals so far), in the order asked.
    leftovers: tuple[LeftoverAsk, ...] = ()
    # What the redeploy changes besides vLLM, from the dry run at request time
    # (bot.engine.preview.preview_lines): "! torch 2.9.1 → 2.10.0" lines (! = highlighted).
    packages: tuple[str, ...] = ()
    # The service's GPUs on hosts where they are not all ok, read at the request
    # (bot.engine.gpu_health): critical ones, the preflight will refuse.
    gpu_health: tuple[HealthNote, ...] = ()
    # Issue 22: when a run approved for later starts (UTC), the time zone its windows are
    # read in, and the instant the countdown counts from (None: no countdown shown);
    # ``override``: asked for outside its window as an emergency (more approvals).
    scheduled_at: datetime | None = None
    schedule_zone: str = "UTC"
    now: datetime | None = None
    override: bool = False


def initial_steps(plan: Plan) -> tuple[StepLine, ...]:
    return tuple(StepLine(host, s.step) for host in plan.hosts for s in plan.steps)
