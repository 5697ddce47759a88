"""The heartbeat of a running run: its driving process renews the run's lease.

A process that cannot see our PIDs (another machine, another PID namespace) cannot
look into our /proc, so the heartbeat is how it tells a live driver from a dead one
(``bot.engine.owner``, ``bot.engine.liveness``): while a process drives a run it moves
``runs.lease_until`` to ``now + LEASE_S`` and adds one to ``runs.lease_renewals`` every
``RENEW_EVERY_S``. ``lease_until`` is written with this machine's wall clock, so it is
for people (``runs``); a judge elsewhere watches the renewals change on its own
monotonic clock instead, and calls the owner dead once it has seen no change for
``LEASE_S``: the next request that meets the run's locks after that, or the bot's
sweep, recovers it.

The lease is long against the period (30 s against 5 s), so a few slow or failed
writes (a busy database) never let a live run look dead.

Replicas on PostgreSQL (issue 21) judge a driver by its lease alone, by the database's
clock: one cut off from the database (a network split, its connection pool unable to
reconnect) while the others reach it loses its run once the lease runs out, whether
its process is alive or not. So there a driver whose lease has run out by its own clock
and that cannot reach the database to renew it acts on no host until the database
answers (``holds``): then it goes on if the run is still its own (the database was away
for everyone, and no replica judges a lease for one after it), or stops for good if
another replica recovered it meanwhile. On SQLite a live driver is never recovered
behind its back (its process is seen, or its heartbeat is watched on a judge's own clock
while the database can be written), so there it goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from bot.audit.resilient import unavailable
from bot.audit.store import AuditLog
from bot.errors import AuditError

log = logging.getLogger(__name__)

LEASE_S = 30.0
RENEW_EVERY_S = 5.0


def boottime() -> float:
    """Seconds on a clock that keeps counting while this process or its machine is
    stopped (``SIGSTOP``, a suspended or frozen VM): CLOCK_BOOTTIME, where it exists."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _BOOTTIME else time.monotonic()


_BOOTTIME = hasattr(time, "CLOCK_BOOTTIME")


class Heartbeat:
    """Renews one run's lease until ``stop``; ``lost`` is called (once) if the run is no
    longer 'running' under ``owner`` (someone recovered it by force), and then it stops.

    Issue 21: ``epoch`` is the fencing token its owner took (a renewal for another
    epoch fails: the run was recovered and taken on since); ``on_cancel`` hears a
    cancel asked on another replica (``runs.cancel_requested_by``), once. ``holds``
    tells the executor, before each action on a host, whether the run is still this
    process's: at once while the lease it last renewed is running by ``boottime``,
    else by renewing it now (``bot.engine.executor``). Fencing ends at the bot: the
    command it then sends reaches the host an SSH connect and a command's start later, so
    it counts its lease as over ``margin_s`` sooner than the database does
    (``Settings.lease_margin_s``: the longest SSH connect timeout plus a command's start)."""

    def __init__(
        self,
        audit: AuditLog,
        run_id: int,
        owner: str,
        *,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        margin_s: float,
        lease_s: float = LEASE_S,
        every_s: float = RENEW_EVERY_S,
        lost: Callable[[], None] | None = None,
        epoch: int | None = None,
        on_cancel: Callable[[str], None] | None = None,
        boot_clock: Callable[[], float] = boottime,
        wait_for_database: bool = False,
    ) -> None:
        self.audit = audit
        self.run_id = run_id
        self.owner = owner
        self.clock = clock
        self.sleep = sleep
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.every_s = every_s
        self.lost = lost
        self.epoch = epoch
        self.on_cancel = on_cancel
        # Judged by its lease alone (replicas on PostgreSQL): see the module doc.
        self.wait_for_database = wait_for_database
        self.renewals = 0
        self._boot = boot_clock
        # The run was just taken with a lease of ``lease_s``.
        self._valid_until = boot_clock() + lease_s - margin_s
        self._gone = False
        self._cancel_told = False
        self._task: asyncio.Task[None] | None = None

    def lease_end(self) -> datetime:
        return self.clock() + timedelta(seconds=self.lease_s)

    def start(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat-{self.run_id}")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def holds(self) -> bool:
        """Whether the run is still this process's to act on: at once while its lease
        runs by this process's own clock, else by renewing it now. A database that
        cannot be asked then is no evidence either way: on SQLite the run goes on (the
        audit sink's own fall-back brings the service back rather than leave it stopped,
        its records wait in the journal); replicas on PostgreSQL wait for the database
        to answer, retrying every ``every_s``, since another replica may be recovering
        the run by now (the module doc)."""
        if self._gone:
            return False
        if self._boot() < self._valid_until:
            return True
        waiting = False
        while True:
            try:
                ours = await self._renew()
            except AuditError as exc:
                if not unavailable(exc):
                    raise
                if not self.wait_for_database:
                    log.warning("run #%d: cannot confirm its lease now: %s", self.run_id, exc)
                    return True
                if not waiting:
                    waiting = True
                    log.warning(
                        "run #%d: its lease ran out and the database cannot renew it now "
                        "(%s); no action on a host until the database answers (another "
                        "replica may be recovering the run)",
                        self.run_id,
                        exc,
                    )
                await self.sleep(self.every_s)
                continue
            if waiting:
                log.warning(
                    "run #%d: the database answers again; the run is %s",
                    self.run_id,
                    "still this process's" if ours else "no longer this process's",
                )
            return ours

    async def _renew(self) -> bool:
        asked = self._boot()
        renewed = await self.audit.renew_lease(
            self.run_id, self.owner, self.lease_end(), lease_s=self.lease_s, epoch=self.epoch
        )
        if renewed is None:
            self._gone = True
            return False
        self.renewals += 1
        self._valid_until = asked + self.lease_s - self.margin_s
        if renewed.cancel_by is not None and not self._cancel_told:
            self._cancel_told = True
            if self.on_cancel is not None:
                self.on_cancel(renewed.cancel_by)
        return True

    async def _beat(self) -> None:
        while True:
            await self.sleep(self.every_s)
            try:
                still_ours = await self._renew()
            except Exception as exc:
                # The next beat tries again; the lease outlasts several missed ones.
                log.warning("cannot renew the lease of run #%d: %s", self.run_id, exc)
                continue
            if still_ours:
                continue
            log.error(
                "run #%d is no longer running under this process (recovered by "
                "another process or replica while this one could not renew its lease); "
                "it stops driving the run and acts on no host for it any more",
                self.run_id,
            )
            if self.lost is not None:
                self.lost()
            return
