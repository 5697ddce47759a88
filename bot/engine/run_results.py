"""What a request, a click or a cancel came to: typed results, not sentences to parse.

Each carries ``text``, the sentence for the person (None when the card or the terminal
shows it); a front end renders it and decides what else to do (start the run, re-render
the card). Shared by the run life cycle (``bot.engine.lifecycle``) and the operations
service (``bot.engine.operations``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from bot.core.status import Decision, RunStatus
from bot.engine.heartbeat import RENEW_EVERY_S


@dataclass(frozen=True, slots=True)
class Approved:
    """The run is approved. ``start``: this call's approval completed N of M, so its
    caller starts the run now; False when a concurrent click got there first."""

    run_id: int
    start: bool

    @property
    def text(self) -> None:
        return None  # the card (or the terminal) shows it


@dataclass(frozen=True, slots=True)
class Scheduled:
    """The run is approved for its ``--at`` time (``at``, UTC): the scheduler starts it
    then, after checking its window again (issue 22)."""

    run_id: int
    at: datetime

    @property
    def text(self) -> None:
        return None  # the card shows when, counting down


@dataclass(frozen=True, slots=True)
class Counted:
    """The approval counts, and more are needed."""

    run_id: int
    count: int
    needed: int

    @property
    def text(self) -> str:
        return f"Approval recorded: {self.count} of {self.needed} for run #{self.run_id}."


@dataclass(frozen=True, slots=True)
class Denied:
    run_id: int

    @property
    def text(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class AlreadyCounted:
    """A second identical click: not a refusal, just a note."""

    run_id: int
    decision: Decision

    @property
    def text(self) -> str:
        return f"Your {self.decision} of run #{self.run_id} was already counted."


class Refusal(StrEnum):
    """Why something was refused, as a value (the sentence is ``Refused.reason``)."""

    NOT_FOUND = "not_found"  # no such run
    NOT_ALLOWED = "not_allowed"  # the policy says no to this person
    NOT_REQUESTER = "not_requester"  # not on the requesters list
    CLOSED = "closed"  # the run is past the state this needs (decided, finished)
    EXPIRED = "expired"  # the approval window has closed
    WRONG_CHANNEL = "wrong_channel"
    OFF_CARD = "off_card"  # a click not on the run's own (complete) card
    BAD_INPUT = "bad_input"  # a command or a button value that does not parse
    RATE_LIMITED = "rate_limited"
    MEMBERSHIP_UNKNOWN = "membership_unknown"  # Slack could not say who is in the groups
    NO_QUESTION = "no_question"  # a Terminate press that answers no open question
    NOT_DRIVEN = "not_driven"  # recover: nothing drives the run
    OWNER_ALIVE = "owner_alive"  # recover: its owner is alive (and no --force)
    CHANGED = "changed"  # recover: the run changed between the look and the recovery
    # Approved, but it could not start: its service was busy, or the plan drifted.
    NOT_STARTED = "not_started"
    # Issue 22: a change asked for outside its service's maintenance window (no --at or
    # --now), and an --at/--now that does not make sense (unparsable, past, too far).
    OUTSIDE_WINDOW = "outside_window"
    BAD_TIME = "bad_time"


@dataclass(frozen=True, slots=True)
class Refused:
    """Not allowed, with why (``code``) and the sentence (``reason``); recorded as a
    refusal. ``expired``: the request is closed as 'expired', by this click (its window
    had passed) or before it, maybe by a process that could not update its card (a CLI
    meeting its lock): the card should lose its buttons."""

    reason: str
    expired: bool = False
    code: Refusal = Refusal.NOT_ALLOWED

    @property
    def text(self) -> str:
        return self.reason


@dataclass(frozen=True, slots=True)
class TooLate:
    """Another decision won the race; the run is now ``status``."""

    run_id: int
    status: RunStatus

    @property
    def text(self) -> str:
        return f"Too late: run #{self.run_id} is already {self.status}."


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Closed before it ran: ``was`` pending approval, or approved but not started."""

    run_id: int
    was: RunStatus

    @property
    def text(self) -> str:
        if self.was == RunStatus.PENDING_APPROVAL:
            return f"Run #{self.run_id} cancelled."
        if self.was == RunStatus.SCHEDULED:
            return f"Run #{self.run_id} cancelled before its scheduled start."
        return f"Run #{self.run_id} cancelled before it started."


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """The run stops at its next safe point: it is driven here, or (``elsewhere``) by
    another process, which hears of it at its next heartbeat (issue 21)."""

    run_id: int
    elsewhere: bool = False

    @property
    def text(self) -> str:
        if self.elsewhere:
            return (
                f"Cancel requested: run #{self.run_id} is driven by another replica of the "
                f"bot, which hears of it within {RENEW_EVERY_S:.0f} s and stops it at its "
                "next safe point."
            )
        return f"Cancel requested: run #{self.run_id} stops at its next safe point."


@dataclass(frozen=True, slots=True)
class NotCancellable:
    """Nothing to cancel here: finished, or driven by another process."""

    run_id: int
    status: RunStatus

    @property
    def text(self) -> str:
        if self.status.is_final:
            return f"Run #{self.run_id} has already finished: {self.status}."
        if self.status == RunStatus.RUNNING:
            return (
                f"Run #{self.run_id} is driven by another process (the CLI or another "
                "bot); cancel it there."
            )
        return f"Run #{self.run_id} is {self.status}; nothing to cancel."


ApproveResult = Approved | Scheduled | Counted | AlreadyCounted | Refused | TooLate
DenyResult = Denied | AlreadyCounted | Refused | TooLate
CancelResult = Cancelled | CancelRequested | NotCancellable | Refused
