"""How one process judges, with its own clocks, whether a run's driver may still be
driving it and whether a card's approval window has closed.

The run's owner (``bot.engine.owner``) is judged by its process where this process sees
its PIDs: that is the strongest evidence there is (a slow heartbeat never gets a live
run interrupted, a dead process is recovered at once).

Everywhere else (another machine, another PID namespace, an owner string from before
issue 17) the heartbeat decides, but not by comparing ``lease_until`` with our wall
clock: that deadline was written with the owner's wall clock, and 30 s of skew between
two machines would call a live run dead (issue 17, F4). Instead the judge watches the
run's *token* (status, owner, lease and the heartbeat's renewal count, which moves at
every beat, every 5 s) on its own monotonic clock: the owner is dead only once the judge
has seen the token unchanged for ``LEASE_S``. A first sighting is not evidence, so the
judge must look twice: the first look records (token, monotonic reading), a later one
decides. The sightings are kept in the audit log per monotonic clock id
(``bot.engine.clocks``): every process on one machine shares CLOCK_MONOTONIC, so a
CLI's first look serves the next CLI or the bot there, and a restarted bot picks up
where it left off.

A card's approval window ends at ``expires_at``, written with the requesting
process's wall clock (``runs.expires_clock`` says whose). A process reading that same
clock judges the deadline by it, as before. Any other process never ends the window
early: it expires the card (freeing its locks) only once it has itself seen the card
pending for ``approval_ttl_s`` on its monotonic clock. That can be late by as long as
the card went unseen (every bot instance's sweep looks every minute), never early. A
click on another instance's card is still judged against the deadline by the
clicking instance's wall clock (the policy, ``bot.core.policy``): it may be refused up
to the skew early or accepted up to the skew late, but it closes the card only by the
rule above.

Replicas on PostgreSQL (issue 21, ``by_database``) share one clock, the database's: a
driver's lease (``runs.lease_expires``) and a card's window (``runs.expires_db``) are
judged by it, read with each run (``lease_left_s``, ``expires_left_s``), so the leader
recovers a dead replica's run and closes its card on time whichever machine it is on. A
process it can see dead is still dead at once; one it sees alive but whose lease ran out
(stopped, frozen) is not alive for this purpose: its run is recovered and it is fenced
off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from bot.audit.records import RunRecord, parse_ts
from bot.audit.sightings import Sighting
from bot.audit.store import AuditLog
from bot.core.status import RunStatus
from bot.engine.clocks import Clock, Monotonic
from bot.engine.heartbeat import LEASE_S
from bot.engine.owner import PROC, Namespace, ProcessSays, judge_process, this_namespace
from bot.errors import AuditError

# The statuses a driver holds a run in (only these can be recovered), and those a
# judge watches: those, and the requests awaiting approval.
DRIVEN = (RunStatus.RUNNING, RunStatus.APPROVED)
WATCHED = (*DRIVEN, RunStatus.PENDING_APPROVAL)


class JudgedBy(StrEnum):
    PROCESS = "process"  # its process, seen in this PID namespace
    LEASE = "lease"  # its heartbeat, watched on this process's monotonic clock
    DATABASE = "database"  # its lease, by the database's clock (replicas, issue 21)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a run's driver may still be driving it, and on what evidence."""

    alive: bool
    by: JudgedBy
    # By the lease: how long this machine has seen the heartbeat unchanged (a first
    # sighting counts as a change: nothing says it stopped before).
    unchanged_s: float = 0.0
    lease_s: float = LEASE_S
    # By the database: its lease ran out, but this process has not yet reached the
    # database without a break for a lease (``Judge.settling``), so it is not judged.
    settling: bool = False

    @property
    def retry_in_s(self) -> int:
        """Whole seconds until, with nothing changing, it would count as dead."""
        return max(0, math.ceil(self.lease_s - self.unchanged_s))

    def note(self, run_id: int) -> str:
        """Why a run judged by its lease still holds its locks, and what to do."""
        if self.settling:
            return (
                f"the owner of run #{run_id} may be alive (its lease ran out while the "
                "database server was restarting, or while this process could not reach "
                "the database or had not started; a driver gets a lease to renew after "
                f"that); try again in {self.retry_in_s} s or "
                f"`python -m bot recover {run_id} --force`"
            )
        if self.by is JudgedBy.DATABASE:
            return (
                f"the owner of run #{run_id} may be alive (its lease runs "
                f"{self.retry_in_s} s more by the database's clock); try again in "
                f"{self.retry_in_s} s or `python -m bot recover {run_id} --force`"
            )
        return (
            f"the owner of run #{run_id} may be alive (last heartbeat change seen "
            f"{self.unchanged_s:.0f} s ago, by this machine's clock); try again in "
            f"{self.retry_in_s} s or `python -m bot recover {run_id} --force`"
        )


def token(run: RunRecord) -> str:
    """What changes while a run is alive: a driven run's owner, lease and renewals (and
    status); a pending request's deadline."""
    if run.status == RunStatus.PENDING_APPROVAL:
        return f"{run.status}|{run.expires_at}"
    return f"{run.status}|{run.owner}|{run.lease_until}|{run.lease_renewals}"


class Judge:
    """One process's judge: ``look`` first (it records what it sees, on this clock),
    then ``verdict`` and ``window_closed`` judge runs as they are then."""

    def __init__(
        self,
        *,
        wall: Clock,
        monotonic: Monotonic,
        wall_id: str | None,
        ttl_s: float,
        lease_s: float = LEASE_S,
        proc: Path = PROC,
        here: Namespace | None = None,
        by_database: bool = False,
    ) -> None:
        self.wall = wall
        self.monotonic = monotonic
        self.wall_id = wall_id
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self.proc = proc
        self.here = this_namespace(proc) if here is None else here
        self.by_database = by_database
        # By the database: seconds until this process will have reached the database
        # without a break for a lease (None: judge at once). A lease that ran out while
        # the database was away (a restart, a fail-over, this replica cut off or just
        # started) is no death until its driver has had a lease to renew after it (the
        # Slack bot sets its leader's, ``bot.engine.leader.Leader.unsteady_s``).
        self.settling: Callable[[], float] | None = None
        self._seen: dict[int, Sighting] = {}

    async def look(self, audit: AuditLog, run_ids: Collection[int] | None = None) -> None:
        """See every watched run (or only ``run_ids``) now, and remember it."""
        if run_ids is None:
            runs = await audit.list_runs(statuses=WATCHED, limit=1_000_000)
        else:
            runs = [await audit.get_run(run_id) for run_id in run_ids]
        tokens = {run.id: token(run) for run in runs if run.status in WATCHED}
        self._seen.update(await audit.sight(self.monotonic.id, self.monotonic(), tokens))

    def _unchanged_s(self, run: RunRecord) -> float | None:
        """How long this clock has seen the run as it is now; None when it has not
        seen it so (never looked, or it changed since)."""
        seen = self._seen.get(run.id)
        if seen is None or seen.token != token(run):
            return None
        return max(0.0, self.monotonic() - seen.seen)

    def verdict(self, run: RunRecord) -> Verdict:
        said = judge_process(run.owner, self.here, proc=self.proc)
        if said is ProcessSays.DEAD:
            return Verdict(False, JudgedBy.PROCESS, lease_s=self.lease_s)
        if self.by_database and run.lease_left_s is not None:
            # Replicas (issue 21): the lease decides, by the database's clock, even for
            # a process this one can see: one stopped (SIGSTOP, a frozen VM) is alive
            # to /proc but has lost its run once its lease ran out (and is fenced off).
            left = run.lease_left_s
            if left <= 0 and self.settling is not None and (wait := self.settling()) > 0:
                steady_s = max(0.0, self.lease_s - wait)
                return Verdict(True, JudgedBy.DATABASE, steady_s, self.lease_s, settling=True)
            return Verdict(left > 0, JudgedBy.DATABASE, max(0.0, self.lease_s - left), self.lease_s)
        if said is ProcessSays.ALIVE:
            return Verdict(True, JudgedBy.PROCESS, lease_s=self.lease_s)
        unchanged = self._unchanged_s(run)
        if unchanged is None:
            return Verdict(True, JudgedBy.LEASE, 0.0, self.lease_s)
        return Verdict(unchanged < self.lease_s, JudgedBy.LEASE, unchanged, self.lease_s)

    def alive(self, run: RunRecord) -> bool:
        return self.verdict(run).alive

    def same_wall_clock(self, run: RunRecord) -> bool:
        """Whether ``expires_at`` was written with the wall clock this process reads."""
        return self.wall_id is not None and run.expires_clock == self.wall_id

    def window_closed(self, run: RunRecord) -> bool:
        """Whether a request awaiting approval is past its window, by this process's
        evidence (see the module doc); False for anything else."""
        if run.status != RunStatus.PENDING_APPROVAL or run.expires_at is None:
            return False
        if self.by_database and run.expires_left_s is not None:
            # Replicas (issue 21): the window ends by the clock they share.
            return run.expires_left_s <= 0
        if self.same_wall_clock(run):
            return parse_ts(run.expires_at) <= self.wall()
        unchanged = self._unchanged_s(run)
        return unchanged is not None and unchanged >= self.ttl_s

    def window_left_s(self, run: RunRecord) -> int | None:
        """For another clock's card: whole seconds of watching left before this process
        expires it (None for a card of this clock, or one it has not seen)."""
        if self.by_database and run.expires_left_s is not None:
            return max(0, math.ceil(run.expires_left_s))
        if self.same_wall_clock(run):
            return None
        unchanged = self._unchanged_s(run)
        return None if unchanged is None else max(0, math.ceil(self.ttl_s - unchanged))


async def settling_after_restart(
    audit: AuditLog, lease_s: float, monotonic: Callable[[], float] = time.monotonic
) -> Callable[[], float] | None:
    """A ``Judge.settling`` for a process that does not watch the database itself (the
    command line): seconds until the database server will have run for one lease. A
    lease that ran out across a server restart is no death until its driver, which
    could not renew while the server was down, has had a lease to renew after it. None
    on SQLite (no server; the process's clocks judge there)."""
    try:
        up_s = await audit.server_up_s()
    except AuditError:
        up_s = 0.0  # cannot tell: as if it had just started
    if up_s is None:
        return None
    # Negative when the server's wall clock was set back since it started (a VM's clock
    # corrected by NTP): it cannot tell how long it has run, so as if it had just
    # started; unclamped, a clock set back an hour refused every recover for an hour
    # while each refusal said to try again in one lease.
    up_s = max(0.0, up_s)
    read_at = monotonic()
    return lambda: max(0.0, lease_s - (up_s + monotonic() - read_at))
