"""The start: ``systemctl start``, the health gate while following the journal, the
readiness checks, what a failed start left, the post-check, and the restart after a cancel."""

from __future__ import annotations

from dataclasses import dataclass, field

from bot.core import remote
from bot.core.gpu import memory_summary
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Flow,
    HostOutcome,
    Phase,
    Progress,
    Snapshot,
    http,
    pause,
    run,
    service_is,
)
from bot.core.phases.common import (
    HEALTH_REQUEST_TIMEOUT_S,
    journal_tail,
    lost,
    read_installed,
    read_snapshot,
    reason_of,
    tail_of,
)
from bot.core.phases.ready import READINESS_OF, readiness_checks
from bot.core.plan import Step, cmd
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.startup import StartupWatch, describe_failure, failure_block, new_lines, thread_block
from bot.core.status import HostStatus
from bot.core.versions import version_text
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings


@dataclass(frozen=True, slots=True)
class StartFailed:
    """Why a start did not end ready (``reason``: the run's words), and what that tells of
    the service (``left_as``)."""

    reason: str
    # sudo refused `systemctl start`: it never ran, the unit is as the stop left it.
    never_ran: bool = False
    # A journal line said the start failed: that process serves nothing and exits,
    # however long systemd still shows it active.
    in_journal: bool = False


def start_and_gate(
    svc: ServiceSettings, start_step: Step, health_step: Step
) -> Phase[StartFailed | None]:
    """systemctl start, then wait for the unit to stay up and /health to answer 200
    (following the journal meanwhile), then the readiness checks. Returns None when
    ready, else why not (journal tail in the failed step's detail)."""
    started, cursor = yield from _start_unit(svc, start_step)
    if started is not None:
        return started
    unhealthy = yield from _health_wait(svc, health_step, cursor)
    if unhealthy is not None:
        return unhealthy
    not_ready = yield from readiness_checks(svc, READINESS_OF[health_step])
    return None if not_ready is None else StartFailed(not_ready)


def left_as(svc: ServiceSettings, step: Step, err: StartFailed) -> Phase[tuple[ServiceState, str]]:
    """What a failed start (``err``) left, as systemd says now. UP but NOT READY only for
    a unit that runs a server that may answer clients (failed /health or readiness:
    another model, a failing smoke test). DOWN when the unit does not run, when systemd
    is restarting it (``activating``: a Restart= wait), and when the start failed in the
    journal (an OOM, "Engine core initialization failed"): that process serves nothing
    and exits, however long systemd still shows it active. Returns the state and the
    sentence that says it (its words rendered from the state). A start that never ran
    left the service STOPPED (every start comes after this run's stop)."""
    if err.never_ran:
        return ServiceState.STOPPED, f"{service_is(ServiceState.STOPPED)}."
    r = yield from run(step, remote.unit_is_active(svc), svc.command_timeout_s, quiet=True)
    unit = r.stdout.strip()
    left, detail = (
        _left_by(unit, err)
        if unit and not lost(r)
        else (ServiceState.UNKNOWN, f" ({reason_of(r)})")
    )
    return left, f"{service_is(left)}{detail}."


def _left_by(unit: str, err: StartFailed) -> tuple[ServiceState, str]:
    """``left_as``'s judgement of ``systemctl is-active``'s answer: the state and what the
    sentence adds to its words."""
    if unit in ("inactive", "failed", "deactivating"):
        return ServiceState.DOWN, ""
    if unit == "activating":
        return ServiceState.DOWN, (
            " (unit activating: systemd is starting it again or still starting it)"
        )
    if err.in_journal:
        return ServiceState.DOWN, (
            f": its start failed (the unit is still {unit} until "
            "its process exits; it may hold the GPUs until then)"
        )
    if unit in ("active", "reloading"):
        return ServiceState.UP_NOT_READY, f" (unit {unit})"
    return ServiceState.UNKNOWN, f" (unit {unit})"


def _start_unit(
    svc: ServiceSettings, start_step: Step
) -> Phase[tuple[StartFailed | None, str | None]]:
    """systemctl start. (None, the journal's cursor before the start) when started (or
    the connection was lost: systemd carries on, the health gate decides); else why not."""
    argv = remote.unit_start(svc)
    yield Emit(BeginStep(start_step, cmd(argv)))
    # Where the unit's journal is now: following the start reads only what comes after,
    # so an old run's traceback never ends this one's wait.
    c = yield from run(start_step, remote.journal_cursor(svc), svc.command_timeout_s, quiet=True)
    cursor = new_lines(c.stdout)[1] if c.ok else None
    r = yield from run(start_step, argv, svc.command_timeout_s)
    if lost(r):
        # systemd carries on with a start job whose client went away; if the command
        # never arrived, the gate finds the unit inactive and says so.
        yield Emit(
            EndStep(
                start_step,
                True,
                f"connection lost while systemctl start ran "
                f"({reason_of(r)}); the health gate decides",
            )
        )
    elif not r.ok:
        msg = f"systemctl start failed ({reason_of(r)})"
        journal = yield from journal_tail(start_step, svc)
        yield Emit(
            EndStep(start_step, False, msg, r.exit_status, tail_of(r.output) + "\n" + journal)
        )
        return StartFailed(msg, never_ran=r.refused is not None), None
    else:
        yield Emit(EndStep(start_step, True, f"{svc.unit} started", r.exit_status))
    return None, cursor


@dataclass
class _Follow:
    """Following a start's journal: where it is, what it showed, and when."""

    cursor: str | None
    watch: StartupWatch = field(default_factory=StartupWatch)
    shown: str = ""
    shown_at: float = float("-inf")
    # Why the journal cannot be read (set once, then no more reads for this start): on a
    # become = "sudo" host no rule allows `journalctl --after-cursor` (bot.core.sudoers).
    unreadable: str | None = None
    failed_reads: int = 0  # in a row (see FOLLOW_FAILED_READS)

    def text(self) -> str:
        if self.unreadable is not None:
            return f"journal not readable ({self.unreadable}); phase unknown"
        return self.watch.text()


def _unreadable_why(r: CommandResult) -> str:
    """A journal read's failure in a few words, for the progress line."""
    if r.refused is not None:
        return "sudo refused it"
    first = next((ln.strip() for ln in r.stderr.splitlines() if ln.strip()), "")
    return f"{reason_of(r)}: {first[:80]}" if first else reason_of(r)


# Journal reads per poll at most. journalctl gives the first ``journal_follow_lines``
# entries after the cursor (systemd issue #14722): a start that logged more since the
# last poll is read on until caught up, so its failure line is seen at once; the bound
# keeps a runaway log from starving the unit and health checks.
FOLLOW_READS_PER_POLL = 10


# Failing journal reads in a row (not refusals: those stop at once) before the follower
# gives up for this start and says the journal is not readable.
FOLLOW_FAILED_READS = 3


def _follow(
    svc: ServiceSettings, step: Step, follow: _Follow, started: float, now: float
) -> Phase[None]:
    """Read the journal's new lines (``journal_follow_lines`` a read, until caught up)
    and show the phase: at once when it changes, else every ``progress_interval_s``
    (the elapsed time), so the card's updates do not grow with the log."""
    for _ in range(FOLLOW_READS_PER_POLL if follow.unreadable is None else 0):
        r = yield from run(
            step, remote.journal_follow(svc, follow.cursor), svc.command_timeout_s, quiet=True
        )
        if not r.ok:
            # Refused by sudo, it would be the same at every poll: say so once and stop
            # reading (the health gate decides as ever). Anything else (a lost result, a
            # slow journal's timeout, a failing read) is tried again at the next poll, so
            # one bad read does not switch off the early failure detection.
            if r.refused is not None:
                follow.unreadable = _unreadable_why(r)
            elif not lost(r):
                follow.failed_reads += 1
                if follow.failed_reads >= FOLLOW_FAILED_READS:
                    follow.unreadable = _unreadable_why(r)
            break
        follow.failed_reads = 0
        lines, cursor = new_lines(r.stdout)
        follow.watch.feed(lines)
        follow.cursor = cursor or follow.cursor
        if (
            len(lines) < svc.journal_follow_lines
            or cursor is None
            or follow.watch.failure is not None
        ):
            break
    text = follow.text()
    if text != follow.shown or now - follow.shown_at >= svc.progress_interval_s:
        follow.shown, follow.shown_at = text, now
        yield Progress(step, text, now - started, start_up=True)


def _health_wait(svc: ServiceSettings, step: Step, cursor: str | None) -> Phase[StartFailed | None]:
    """Until the unit stays up and /health answers 200; a failure line in the journal
    (``bot.core.startup``) or the unit failing ends the wait at once."""
    yield Emit(
        BeginStep(
            step,
            f"{cmd(remote.unit_is_active(svc))}; GET {svc.health_url}; "
            f"{cmd(remote.journal_follow(svc, '<cursor>'))}",
        )
    )
    start = (yield from pause(0.0)).now
    follow = _Follow(cursor)
    last = "no answer yet"
    while True:
        yield from _follow(svc, step, follow, start, (yield from pause(0.0)).now)
        if follow.watch.failure is not None:
            return (yield from _failed_start(svc, step, follow))
        active = yield from run(step, remote.unit_is_active(svc), svc.command_timeout_s, quiet=True)
        state = active.stdout.strip() or reason_of(active)
        if state in ("failed", "inactive"):
            msg = f"{svc.unit} is {state} after start"
            journal = yield from journal_tail(step, svc)
            yield Emit(EndStep(step, False, msg, active.exit_status, journal))
            return StartFailed(msg)
        if active.ok:
            h = yield from http(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
            if h.ok:
                now = (yield from pause(0.0)).now
                # What the server logged since the last poll is this start's too: the last
                # phase, a thread that died (a warning, issue 17 D4), a failure line.
                yield from _follow(svc, step, follow, start, now)
                if follow.watch.failure is not None:
                    return (yield from _failed_start(svc, step, follow))
                # A thread's death is a warning: its lines go in the step's output, its
                # last line is in the summary's phase text.
                yield Emit(
                    EndStep(
                        step,
                        True,
                        f"{svc.health_url} answered 200 after "
                        f"{now - start:.1f}s (last phase: {follow.text()})",
                        None,
                        thread_block(follow.watch),
                    )
                )
                return None
            last = f"HTTP {h.status}" if h.status is not None else (h.error or "no response")
        else:
            last = f"unit {state}"
        tick = yield from pause(svc.health_poll_s)
        if tick.now - start >= svc.start_timeout_s:
            msg = f"not healthy after {svc.start_timeout_s:g}s (last: {last})"
            journal = yield from journal_tail(step, svc)
            yield Emit(EndStep(step, False, msg, None, journal))
            return StartFailed(msg)


# How a failed start's reason begins when a journal line said so (bot.core.startup).
STARTUP_FAILED = "start-up failed: "


def _failed_start(svc: ServiceSettings, step: Step, follow: _Follow) -> Phase[StartFailed]:
    """A journal line said the start failed: read once more (the rest of a traceback
    names its cause), then end with those lines and the journal's tail."""
    r = yield from run(
        step, remote.journal_follow(svc, follow.cursor), svc.command_timeout_s, quiet=True
    )
    if r.ok:
        follow.watch.feed(new_lines(r.stdout)[0])
    failure = follow.watch.failure
    assert failure is not None
    msg = f"{STARTUP_FAILED}{describe_failure(failure)}"
    journal = yield from journal_tail(step, svc)
    # The lines that said so last: a tail (the thread's code block, the audit log's
    # output_tail) keeps them.
    yield Emit(EndStep(step, False, msg, None, f"{journal}\n\n{failure_block(failure)}"))
    return StartFailed(msg, in_journal=True)


def postcheck(svc: ServiceSettings, host: str, note: str = "") -> Phase[str | None]:
    """The version and the GPUs after a start; ``note`` (which release is live, for a
    side-by-side service) goes in the summary after the version."""
    yield Emit(
        BeginStep(Step.POSTCHECK, f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}")
    )
    after = yield from read_installed(Step.POSTCHECK, svc)
    said = f"version {version_text(after)}" + (f"; {note}" if note else "")
    try:
        snap = yield from read_snapshot(Step.POSTCHECK, svc, host)
    except GpuQueryError as e:
        yield Emit(EndStep(Step.POSTCHECK, True, f"{said}; GPU table unavailable: {e.reason}"))
        return after
    yield Emit(Snapshot("after restart", snap))
    yield Emit(EndStep(Step.POSTCHECK, True, f"{said}; {memory_summary(snap)}"))
    return after


def recover_after_cancel(svc: ServiceSettings, host: str, before: str | None, what: str) -> Flow:
    """Cancelled once the service is down: bring it back on what is installed."""
    err = yield from start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        state, left = yield from left_as(svc, Step.HEALTH, err)
        return HostOutcome(
            HostStatus.FAILED,
            f"cancelled {what}; restarting failed: {err.reason}. {left}",
            state,
            before,
            None,
        )
    after = yield from postcheck(svc, host)
    return HostOutcome(
        HostStatus.CANCELLED,
        f"cancelled {what}; service restarted on {version_text(after)}",
        ServiceState.UP,
        before,
        after,
    )
