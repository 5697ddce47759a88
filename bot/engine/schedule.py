"""Maintenance windows and scheduled runs (issue 22, item 3): when a request may run, and
starting the runs approved for later.

A scheduled run is a record, not a timer: ``runs.scheduled_at`` with the status
'scheduled'. Whichever process looks when it is due (the Slack bot's tick, or
``python -m bot scheduled --start-due``) claims it with one compare-and-set
(``RunLifecycle.claim``: scheduled -> approved, that process its owner), so a bot that
restarted meanwhile still starts it, and two lookers never start it twice. At its start
it is judged again: the window must still be open, it must not be later than
``start_grace_s`` (a bot that was down at 02:00 does not redeploy at 09:00), and the
approvals recorded in chat must still approve it under the policy and the user groups as
they are now (an approver removed since, or ``min_approvals`` raised, leaves it short:
it is refused, and the team asks again); then the engine checks, as for every approved
run, that the plan is unchanged and the locks free. A run asked for on a terminal was
approved by its operator's confirmation, which no approvers list judges: nothing to judge
again there.

Which changes the windows govern: redeploy, restart and rollback, the runs that stop a
service. A status query, a dry run and a rotation change (drain/undrain: the service
keeps running, and taking a sick replica out is what one does during an incident) are
never held back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum, auto
from typing import assert_never

from bot.audit.store import RunRecord, parse_ts
from bot.core.plan import Plan
from bot.core.policy import Membership, approvals_lapsed, groups_to_resolve
from bot.core.status import Action, RunStatus, Source
from bot.core.windows import Windows, countdown, parse_at, when
from bot.engine.lifecycle import RunLifecycle
from bot.engine.run_results import Refusal
from bot.settings import PolicySettings, WindowSettings

log = logging.getLogger(__name__)

# Who is in these user groups now, read fresh; None when it cannot be told (Slack did not
# answer): a scheduled run is then judged at the next look, never on part of an answer.
MembersNow = Callable[[frozenset[str]], Awaitable[Membership | None]]


async def no_groups(groups: frozenset[str]) -> Membership | None:
    """Where no chat can be asked: a policy naming no group is judged; one that names a
    group cannot be."""
    return {} if not groups else None


WINDOWED = frozenset(
    {Action.REDEPLOY, Action.RESTART, Action.ROLLBACK, Action.REBOOT, Action.GPU_RESET}
)
_DEFAULTS = WindowSettings()


@dataclass(frozen=True, slots=True)
class Timing:
    """When the person asked for it to run: ``at`` as typed (``--at``), or ``now``
    (``--now``: an emergency override outside the window); neither: at once, inside a
    window."""

    at: str | None = None
    now: bool = False


AT_ONCE = Timing()


@dataclass(frozen=True, slots=True)
class RunAt:
    """The request may be recorded: at once (``at`` None) or for ``at``; ``override``:
    outside its window, with more approvals."""

    at: datetime | None = None
    override: bool = False


@dataclass(frozen=True, slots=True)
class NotNow:
    """The request is refused: ``code`` and the sentence for the person."""

    code: Refusal
    reason: str


def judge_request(
    plan: Plan, timing: Timing, policy: PolicySettings, *, now: datetime
) -> RunAt | NotNow:
    """May ``plan`` run as ``timing`` asks, under ``policy``'s windows, at ``now``?"""
    windowed = plan.action in WINDOWED and not plan.dry_run
    if timing.at is not None and timing.now:
        return NotNow(
            Refusal.BAD_TIME,
            "--at and --now contradict each other: --at runs it later inside a window, "
            "--now runs it at once outside one.",
        )
    if (timing.at is not None or timing.now) and not windowed:
        return NotNow(
            Refusal.BAD_TIME,
            f"--at and --now apply to redeploy, restart and rollback, not to a "
            f"{'dry run' if plan.dry_run else plan.action}: it runs at once.",
        )
    if not windowed:
        return RunAt()
    settings = policy.windows
    windows = Windows.of(settings) if settings is not None else None
    if timing.at is not None:
        return _judge_at(plan, timing.at, settings or _DEFAULTS, windows, now)
    if windows is None or windows.is_open(now):
        # Inside the window --now changes nothing: it is no override.
        return RunAt()
    assert settings is not None
    nxt = windows.next_open(now)
    extra = settings.override_extra_approvals
    opens = (
        f"The next opens {when(nxt, windows.zone)} (in {countdown((nxt - now).total_seconds())})"
        if nxt is not None
        else "None opens within a year"
    )
    if timing.now:
        return RunAt(override=True)
    return NotNow(
        Refusal.OUTSIDE_WINDOW,
        f"{plan.service} may {plan.action} only inside its maintenance windows "
        f"({windows.text}). {opens}. Schedule it with `--at HH:MM` (approved now, it "
        f"starts then), or ask for an emergency override with `--now` (it needs "
        f"{policy.min_approvals + extra} approvals).",
    )


def _judge_at(
    plan: Plan, text: str, settings: WindowSettings, windows: Windows | None, now: datetime
) -> RunAt | NotNow:
    zone = windows.zone if windows is not None else settings.zone()
    try:
        at = parse_at(text, now=now, zone=zone)
    except ValueError as exc:
        return NotNow(Refusal.BAD_TIME, str(exc))
    shown = when(at, zone)
    if at <= now:
        return NotNow(Refusal.BAD_TIME, f"--at {shown} is in the past.")
    if at - now > timedelta(seconds=settings.max_ahead_s):
        days = settings.max_ahead_s / 86400
        return NotNow(
            Refusal.BAD_TIME,
            f"--at {shown} is more than {days:g} days ahead (max_ahead_s); ask nearer the time.",
        )
    if windows is not None and not windows.is_open(at):
        nxt = windows.next_open(at)
        hint = f"; the next window opens {when(nxt, zone)}" if nxt is not None else ""
        return NotNow(
            Refusal.OUTSIDE_WINDOW,
            f"--at {shown} is outside {plan.service}'s maintenance windows ({windows.text}){hint}.",
        )
    return RunAt(at=at)


def start_refusal(record: RunRecord, policy: PolicySettings, *, now: datetime) -> str | None:
    """Why a scheduled run due at ``now`` must not start (None: it may)."""
    assert record.scheduled_at is not None
    at = parse_ts(record.scheduled_at)
    settings = policy.windows or _DEFAULTS
    late = (now - at).total_seconds()
    zone = settings.zone()
    if late > settings.start_grace_s:
        return (
            f"it was due at {when(at, zone)} and nothing started it within "
            f"{settings.start_grace_s} s (start_grace_s; was the bot down?); it is "
            f"{countdown(late)} late, so it is not run now: request it again"
        )
    if policy.windows is not None and not record.override:
        windows = Windows.of(policy.windows)
        if not windows.is_open(now):
            nxt = windows.next_open(now)
            hint = f"; the next opens {when(nxt, zone)}" if nxt is not None else ""
            return (
                f"its maintenance window is closed at its start ({windows.text}){hint}: "
                "request it again"
            )
    return None


# ---- starting what is due ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """Claimed by this process (now 'approved', this process its owner): drive it."""

    record: RunRecord


@dataclass(frozen=True, slots=True)
class NotStarted:
    """Judged at its start and refused ('refused', with a refusals row): say why."""

    record: RunRecord
    reason: str


StartOutcome = Started | NotStarted


class Unread(Enum):
    """A due run's user groups could not be read: not judged this time."""

    UNREAD = auto()


class Scheduler:
    """Finds the scheduled runs that are due and claims or refuses each, once."""

    def __init__(self, lifecycle: RunLifecycle) -> None:
        self.lifecycle = lifecycle

    async def waiting(self, *, source: Source | None = None) -> list[RunRecord]:
        """The runs approved for later, soonest first (``source``: only that front end's,
        as only it can tell the person)."""
        runs = await self.lifecycle.audit.list_runs(statuses=[RunStatus.SCHEDULED], limit=10_000)
        mine = [r for r in runs if source is None or r.source == source]
        return sorted(mine, key=lambda r: (r.scheduled_at or "", r.id))

    async def start_due(
        self, *, source: Source | None = None, members: MembersNow = no_groups
    ) -> list[StartOutcome]:
        """Claim or refuse each due run (``members``: the user groups read fresh, to judge
        its approvals again)."""
        life = self.lifecycle
        now = life.clock()
        out: list[StartOutcome] = []
        for record in await self.waiting(source=source):
            assert record.scheduled_at is not None
            if parse_ts(record.scheduled_at) > now:
                break
            reason = start_refusal(record, life.policy_of(record), now=now)
            if reason is None:
                lapsed = await self._approvals_lapsed(record, members)
                if lapsed is Unread.UNREAD:
                    continue
                reason = lapsed
            if reason is not None:
                if await life.refuse(record, reason, expect=(RunStatus.SCHEDULED,)):
                    out.append(NotStarted(await life.audit.get_run(record.id), reason))
            elif await life.claim(record.id):
                out.append(Started(await life.audit.get_run(record.id)))
        return out

    async def _approvals_lapsed(
        self, record: RunRecord, members: MembersNow
    ) -> str | Unread | None:
        """Why the approvals recorded in chat no longer approve ``record`` (None: they
        do); ``UNREAD`` when its groups cannot be read now (it waits for the next look,
        until it is too late and ``start_refusal`` says so)."""
        if record.source != Source.SLACK:
            return None  # a terminal operator's confirmation: no approvers list judged it
        policy = self.lifecycle.policy_of(record)
        membership = await members(groups_to_resolve(policy))
        if membership is None:
            log.warning(
                "run #%d is due but its approvers' user groups cannot be read now; "
                "judged again at the next look",
                record.id,
            )
            return Unread.UNREAD
        lapsed = approvals_lapsed(
            record.approved_by,
            requester=record.requested_by,
            policy=policy,
            membership=membership,
        )
        return None if lapsed is None else f"{lapsed}: request it again"


def describe_outcome(outcome: StartOutcome) -> str:
    """One line for a terminal or a log."""
    match outcome:
        case Started(record=r):
            return f"run #{r.id} ({r.action} {r.service}): starting now"
        case NotStarted(record=r, reason=reason):
            return f"run #{r.id} ({r.action} {r.service}): not started: {reason}"
        case _:
            assert_never(outcome)
