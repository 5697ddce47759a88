"""Close the runs a dead process left behind, and say what that means.

A run is 'running' or 'approved' under an owner, the process that drives it (see
``bot.engine.owner``). When that process is gone (killed, a zombie nobody reaped yet,
a container rescheduled elsewhere whose heartbeat stopped), nothing will ever finish
the run or release its locks, so it is recovered: marked ``interrupted`` (with the step
it was in; its running steps too), its locks released, a 'recover' decision recording
who did it, and a message for its thread and the terminal saying what state the
service may be in after stopping at that step, and what to run next.

Who is dead is the ``Judge``'s call (``bot.engine.liveness``): by the owner's process
where this process sees its PIDs, otherwise by its heartbeat watched on this process's
own monotonic clock, which takes two looks at least ``LEASE_S`` apart.

Recovery is not only a start-up event. It happens:

* when a request or an approved run meets a lock (``take_locks``): the holder is
  judged and, if dead, recovered on the spot before the lock is taken (the same code
  for the Slack bot and the CLI). A holder judged by its heartbeat that this machine
  has not yet watched for ``LEASE_S`` is not waited for: the request is refused with
  when to try again (``HolderMayBeAlive``), and the look it took counts towards the
  next one (a retry, ``recover``, or the Slack bot's sweep);
* at the bot's start, and every minute after (``recover``, the sweep in
  ``bot.slack.front_end``): the sweep is the second look that ends an owner whose
  heartbeat stopped;
* by hand (``recover_by_hand``, ``python -m bot recover RUN_ID``), which refuses a
  live owner unless forced.

A request still awaiting approval past its window holds its locks until something
expires it, and only the Slack bot has expiry timers: with no bot running (or one that
was down at the deadline) it would lock the service for good. So a lock held by such a
request is freed the same way: ``take_locks`` and ``recover_by_hand`` expire it
(``expire_if_closed``: 'expired', with the summary a timer's expiry writes), once the
judge says its window has closed (by the deadline where this process reads the clock
that wrote it, else by watching it for the window's length). An operator's ``recover``
also records a 'recover' decision by them (it shows in ``recovered_by`` beside the
'expired' status); a request meeting the lock records none, as a timer does.

Runs owned by a live process (another bot or a CLI on the same database) are left
alone; the verdict is passed inside the write transaction that interrupts the run
(``AuditLog.recover_dead``), on the run as it is then, so two processes recovering at
once recover it once, and a heartbeat that beat in between saves its run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bot.audit.rotations import RotationRow, left_out
from bot.audit.store import AuditLog, RunRecord
from bot.core.plan import Step
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.clocks import system_monotonic, wall_clock_id
from bot.engine.liveness import DRIVEN, Judge, JudgedBy, Verdict
from bot.errors import LockHeldError

Clock = Callable[[], datetime]
# Whether a run's driver may still be driving it (then it is left alone).
Alive = Callable[[RunRecord], bool]
# Told of a request this process expired because it was overdue (the Slack bot closes
# its card).
Closed = Callable[[RunRecord], Awaitable[None]]
# Who is recorded as having recovered a run that a process found dead by itself.
RECOVERY_ACTOR = "system:recovery"
# How often the Slack bot looks for runs whose driver died while nobody asked: a dead
# run's thread hears of it within a minute when its process is seen here, within two
# when only its heartbeat speaks for it (one look to see it, the next to judge it).
SWEEP_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class Interrupted:
    run: RunRecord
    message: str  # for the run's thread (and the terminal)


Tell = Callable[[Interrupted], Awaitable[None]]


# What the service may look like when the bot stopped during each step.
_STATE_AFTER: dict[str, str] = {
    Step.PREFLIGHT: "Nothing was changed: the bot stopped before stopping the service, "
    "so it should still be running.",
    Step.STATUS: "Nothing was changed: it was a read-only status query.",
    Step.STOP: "The service may be running, stopping or stopped: `systemctl stop` may "
    "have been sent.",
    Step.DRAIN: "The service was stopped and nothing was reinstalled; it is probably still "
    "STOPPED.",
    Step.REINSTALL: "The service is STOPPED, and the reinstall may have completed, failed "
    "or still be running on the host (a bot restart does not stop `uv`).",
    Step.ROLLBACK: "The service is STOPPED, and the rollback may have completed, failed or "
    "still be running on the host (a bot restart does not stop `uv`); it "
    "restores the environment snapshot kept in `.chatops/` next to the venv "
    "(`uv pip sync`).",
    Step.PREFETCH: "Nothing was changed: the bot stopped while fetching packages into uv's "
    "cache, before stopping the service, so it should still be running.",
    Step.GATE: "The service is STOPPED and the new version is installed but had not passed "
    "the import gate; the environment snapshot to restore is in `.chatops/` next "
    "to the venv.",
    Step.ROLLBACK_STOP: "The new version had started but was not healthy; it may be running, "
    "stopping or stopped, and nothing was rolled back yet.",
    Step.START: "The service may be starting, running or failed: `systemctl start` may have "
    "been sent.",
    Step.ROLLBACK_START: "The previous environment was restored; the service may be starting, "
    "running or failed.",
    Step.HEALTH: "The service was started but had not yet passed the health gate.",
    Step.ROLLBACK_HEALTH: "The previous environment was restored and started but had not yet "
    "passed the health gate.",
    Step.WATCH: "The new version had passed readiness and was being watched; it may be "
    "running or failed, and nothing was rolled back.",
    Step.POSTCHECK: "The service had passed the health gate; only the post-check was left.",
    Step.BUILD: "Nothing was changed: the bot stopped while building the new release beside "
    "the live one, before stopping the service, so it should still be running; a "
    "half-built release directory may be left in the releases directory.",
    Step.SWITCH: "The service is STOPPED, and the venv's link may point at the new release "
    "or still at the previous one (`readlink` it).",
    Step.ROLLBACK_SWITCH: "The new release had started but was not healthy; the venv's link "
    "may point at it or back at the previous release (`readlink` it), and the service is "
    "probably STOPPED.",
    Step.PRUNE: "The new release had passed its gates and was serving; old releases were "
    "being removed.",
    Step.GPU_CHECK: "Nothing was changed: the bot stopped while checking the GPUs, before "
    "stopping the service, so it should still be running.",
    Step.LEFTOVERS: "The service is STOPPED, and leftover processes an approver let the bot "
    "end were being signalled; some may still hold its GPUs (see the "
    "thread's list of PIDs).",
    Step.GPU_RECHECK: "The service had passed its gates; only the GPU recheck was left.",
    Step.ROTATION_OUT: "The replica was being taken out of its router's rotation; the service "
    "itself was not touched and should still be running.",
    Step.ROTATION_IN: "The service had passed its gates and was being put back in its "
    "router's rotation.",
    # Issue 23: a host's maintenance.
    Step.REBOOT: "The host had been told to reboot, or was being waited for: it may be down, "
    "booting or back. Its services were stopped for it; the boot may have started the "
    "enabled ones, without the bot's health gate or deep GPU check.",
    Step.GPU_RESET: "The host's services were stopped and its GPUs were being reset: a GPU "
    "may be mid-reset, or left with persistence mode off (`nvidia-smi -q | grep -i "
    "persistence`; `nvidia-smi -i N -pm 1` as root turns it back on).",
    Step.DEEP_CHECK: "The reboot or reset was done; the deep GPU check was running and the "
    "services had not been started again.",
}


# What drove a run, by where it was requested: a demo run is driven by its own command
# line too, not by a bot.
_DRIVERS: dict[Source, str] = {
    Source.CLI: "the command line (`python -m bot`)",
    Source.DEMO: "the demo (`python -m bot demo`)",
    Source.SLACK: "the bot",
}


def _driver(run: RunRecord) -> str:
    return _DRIVERS.get(run.source, "the bot")


def out_of_rotation(run: RunRecord, left_out: Sequence[RotationRow]) -> str:
    """What a run that stopped left out of its router's rotation (issue 19), and how to
    put each replica back; "" when it left none out."""
    return "".join(
        f" {r.host} may be OUT of rotation at router {r.router} (server {r.server}; its "
        f"last change: {r.change}{'' if r.ok else ', failed'}): once `/vllm status "
        f"{run.service}` shows it healthy, put it back with `/vllm undrain {run.service} "
        f"{r.host}` (or `python -m bot undrain {run.service} {r.host}`)."
        for r in left_out
    )


def interrupted_message(run: RunRecord, left_out: Sequence[RotationRow] = ()) -> str:
    """The sentence for an interrupted run's thread: where it stopped, what the service
    may look like, what to run next (``left_out``: replicas the run may have left out of
    its router's rotation)."""
    if run.started_at is None:
        return (
            f"Run #{run.id} ({run.action} {run.service}) was approved, but "
            f"{_driver(run)} stopped before it began; nothing was changed. Request it "
            "again if it is still needed."
        )
    step = run.current_step
    where = f"during step `{step}`" if step else "before its first step"
    state = _STATE_AFTER.get(step or Step.PREFLIGHT, "The state of the service is unknown.")
    if Action(run.action).host_wide:
        return _host_interrupted(run, where, state, left_out)
    return (
        f"Run #{run.id} ({run.action} {run.service}) was interrupted: {_driver(run)} "
        f"stopped {where}. {state} Check with `/vllm status {run.service}` (or "
        f"`python -m bot status {run.service}`) before doing anything else."
        f"{out_of_rotation(run, left_out)}"
    )


def _host_interrupted(
    run: RunRecord, where: str, state: str, left_out: Sequence[RotationRow]
) -> str:
    """A host maintenance's: each service on the host to check, and the GPUs."""
    host = run.hosts[0] if run.hosts else "the host"
    services = [str(p.get("service")) for p in run.plan.get("parts") or ()]
    checks = ", ".join(f"`/vllm status {s}`" for s in services) or "`/vllm status`"
    out = "".join(
        f" {r.host} may be OUT of rotation at router {r.router} (server {r.server}): once it "
        f"is healthy, `/vllm undrain <service> {r.host}` puts it back."
        for r in left_out
    )
    return (
        f"Run #{run.id} ({run.action} of host {host}) was interrupted: {_driver(run)} "
        f"stopped {where}. {state} Check {checks} and `/vllm gpus --deep {host}` before "
        f"doing anything else.{out}"
    )


def utc_now() -> datetime:
    return datetime.now(UTC)


def system_judge(ttl_s: float, clock: Clock = utc_now) -> Judge:
    """A judge with this machine's clocks (``ttl_s``: the approval window's length)."""
    return Judge(wall=clock, monotonic=system_monotonic(), wall_id=wall_clock_id(), ttl_s=ttl_s)


async def _recover(
    audit: AuditLog,
    dead: Callable[[RunRecord], bool],
    *,
    by: str,
    run_ids: Sequence[int] | None = None,
) -> list[Interrupted]:
    runs = await audit.recover_dead(dead, summary=interrupted_message, run_ids=run_ids, by=by)
    out = await audit.rotations([r.id for r in runs]) if runs else {}
    return [
        Interrupted(run, interrupted_message(run, left_out(out.get(run.id, [])))) for run in runs
    ]


async def recover(
    audit: AuditLog,
    alive: Alive | None = None,
    *,
    judge: Judge | None = None,
    by: str = RECOVERY_ACTOR,
) -> list[Interrupted]:
    """Mark the runs of dead drivers interrupted; one message per run, oldest first.

    ``alive`` judges a run's driver; by default ``judge`` (this machine's clocks when
    None) looks at every run first, then judges."""
    if alive is None:
        judge = judge if judge is not None else system_judge(ttl_s=0.0)
        await judge.look(audit)
        alive = judge.alive
    judged = alive
    return await _recover(audit, lambda run: not judged(run), by=by)


async def expire_if_closed(audit: AuditLog, run_id: int, judge: Judge) -> RunRecord | None:
    """Close request ``run_id`` as 'expired' (releasing its locks) if ``judge`` says its
    window has closed, as a timer's expiry does (in one transaction); the run, or None
    when it has not closed or a click decided it first. ``judge`` must have looked."""
    expired = await audit.expire_closed(judge.window_closed, run_ids=[run_id])
    return expired[0] if expired else None


def expired_message(run: RunRecord) -> str:
    """What a process that expired an overdue request on meeting its lock says."""
    return (
        f"Run #{run.id} ({run.action} {run.service}), requested by {run.requested_by}, "
        f"was still awaiting approval after its window closed at {run.expires_at}: it "
        "is now expired and holds no locks."
    )


class HolderMayBeAlive(LockHeldError):
    """The holder is judged by a heartbeat this machine has not watched long enough to
    call it dead: refused now, with when a retry (or the sweep) can tell."""

    def __init__(self, held: LockHeldError, note: str) -> None:
        super().__init__(f"{held}; {note}", run_id=held.run_id, requested_by=held.requested_by)
        self.note = note


def window_note(run: RunRecord, judge: Judge) -> str | None:
    """Why another clock's request still holds its locks past what this clock reads."""
    left = judge.window_left_s(run)
    if left is None:
        return None
    if judge.by_database and run.expires_left_s is not None:
        return (
            f"run #{run.id} awaits approval for {left} s more by the database's clock "
            f"(until about {run.expires_at})"
        )
    return (
        f"run #{run.id} awaits approval until {run.expires_at} by the clock of the "
        "process that asked for it, which this one does not read; this one expires "
        f"it after seeing it pending for {judge.ttl_s:.0f} s ({left} s more)"
    )


def _held(exc: LockHeldError, holder: RunRecord, judge: Judge) -> LockHeldError:
    if holder.status in DRIVEN:
        verdict = judge.verdict(holder)
        if verdict.by in (JudgedBy.LEASE, JudgedBy.DATABASE):
            return HolderMayBeAlive(exc, verdict.note(holder.id))
    elif (note := window_note(holder, judge)) is not None:
        return HolderMayBeAlive(exc, note)
    return exc


async def take_locks(
    audit: AuditLog,
    run_id: int,
    scopes: Sequence[str],
    *,
    judge: Judge,
    tell: Tell,
    by: str = RECOVERY_ACTOR,
    closed: Closed | None = None,
) -> None:
    """Take every scope for ``run_id``. A holder whose driver is dead is recovered on the
    spot (``tell`` hears of it, to post in its thread or print), and a request awaiting
    approval past its window is expired (``closed`` hears of it), and the lock is taken;
    a live holder, or a request still in its window, raises ``LockHeldError``
    (``HolderMayBeAlive`` when only a later look can tell).

    Each pass either takes the locks or ends one more holder, which then holds
    nothing, so this ends."""
    while True:
        try:
            await audit.acquire_locks(run_id, scopes)
            return
        except LockHeldError as exc:
            await judge.look(audit, [exc.run_id])
            expired = await expire_if_closed(audit, exc.run_id, judge)
            if expired is not None:
                if closed is not None:
                    await closed(expired)
                continue
            found = await _recover(
                audit, lambda run: not judge.alive(run), by=by, run_ids=[exc.run_id]
            )
            if not found:
                raise _held(exc, await audit.get_run(exc.run_id), judge) from exc
            for item in found:
                await tell(item)


# ---- by hand -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recovered:
    item: Interrupted


@dataclass(frozen=True, slots=True)
class OwnerAlive:
    """Refused: its driver may still be driving it."""

    run: RunRecord
    verdict: Verdict | None = None

    @property
    def reason(self) -> str:
        # By a lease (this machine's sightings or the database's clock): when it ends.
        if self.verdict is not None and self.verdict.by is not JudgedBy.PROCESS:
            return f"run #{self.run.id} is {self.run.status} and {self.verdict.note(self.run.id)}"
        lease = f", lease until {self.run.lease_until}" if self.run.lease_until else ""
        return (
            f"run #{self.run.id} is {self.run.status} and its owner {self.run.owner} "
            f"is alive{lease}; stop that process, or use --force if you are sure it "
            "no longer drives the run"
        )


@dataclass(frozen=True, slots=True)
class Expired:
    """A request awaiting approval past its window, expired (nobody can approve it)."""

    run: RunRecord

    @property
    def message(self) -> str:
        return expired_message(self.run)


@dataclass(frozen=True, slots=True)
class NotDriven:
    """Refused: nothing drives it, so there is nothing to recover."""

    run: RunRecord
    # For a request of another clock: why its window is still open here.
    note: str | None = None

    @property
    def reason(self) -> str:
        if self.run.status == RunStatus.PENDING_APPROVAL:
            until = f" until {self.run.expires_at}" if self.run.expires_at else ""
            extra = f" ({self.note})" if self.note else ""
            return (
                f"run #{self.run.id} is awaiting approval{until}, when it expires and "
                "releases its locks (after that, `recover` expires it at once); before "
                f"then its requester or an approver can deny or cancel it on its card{extra}"
            )
        return (
            f"run #{self.run.id} is {self.run.status}; only a running or approved run "
            "can be recovered"
        )


ByHand = Recovered | Expired | OwnerAlive | NotDriven


async def recover_by_hand(
    audit: AuditLog,
    run_id: int,
    *,
    by: str,
    judge: Judge,
    force: bool = False,
    alive: Alive | None = None,
) -> ByHand:
    """An operator's recovery of one run: refused while ``judge`` (or ``alive``) says its
    owner may be alive, unless ``force``; ``by`` is recorded as who recovered it. A
    request awaiting approval past its window is expired instead (it holds locks nobody
    can use), and ``by`` recorded as who expired it. Raises ``RunNotFoundError``."""
    await judge.look(audit, [run_id])
    expired = await expire_if_closed(audit, run_id, judge)
    if expired is not None:
        # Who closed it, as for every other ``recover``: the status says it was expired,
        # not interrupted (``recovered_by`` means who ran ``recover`` on the run).
        await audit.record_decision(run_id, by, Decision.RECOVER)
        return Expired(await audit.get_run(run_id))
    judged = alive if alive is not None else judge.alive
    found = await _recover(audit, lambda run: force or not judged(run), by=by, run_ids=[run_id])
    if found:
        return Recovered(found[0])
    run = await audit.get_run(run_id)
    if run.status in DRIVEN:
        return OwnerAlive(run, None if alive is not None else judge.verdict(run))
    return NotDriven(run, window_note(run, judge))
