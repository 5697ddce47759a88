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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from bot.audit.store import AuditLog

log = logging.getLogger(__name__)

LEASE_S = 30.0
RENEW_EVERY_S = 5.0


class Heartbeat:
    """Renews one run's lease until ``stop``; ``lost`` is called (once) if the run is no
    longer 'running' under ``owner`` (someone recovered it by force), and then it stops."""

    def __init__(
        self,
        audit: AuditLog,
        run_id: int,
        owner: str,
        *,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        lease_s: float = LEASE_S,
        every_s: float = RENEW_EVERY_S,
        lost: Callable[[], None] | None = None,
    ) -> None:
        self.audit = audit
        self.run_id = run_id
        self.owner = owner
        self.clock = clock
        self.sleep = sleep
        self.lease_s = lease_s
        self.every_s = every_s
        self.lost = lost
        self.renewals = 0
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

    async def _beat(self) -> None:
        while True:
            await self.sleep(self.every_s)
            try:
                still_ours = await self.audit.renew_lease(self.run_id, self.owner, self.lease_end())
            except Exception as exc:
                # The next beat tries again; the lease outlasts several missed ones.
                log.warning("cannot renew the lease of run #%d: %s", self.run_id, exc)
                continue
            if still_ours:
                self.renewals += 1
                continue
            log.error(
                "run #%d is no longer running under this process (recovered by "
                "someone else?); asking it to stop at its next safe point",
                self.run_id,
            )
            if self.lost is not None:
                self.lost()
            return
