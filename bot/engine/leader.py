"""Which replica runs the housekeeping (issue 21): the recovery sweep, the expiry of
overdue requests and the scheduled starts run on one replica at a time, the holder of
the ``leader`` lease (``bot.audit.leases``), never on two at once.

Every replica bids for the lease every third of its length; the holder renews it, any
other takes it once it has run out by the database's clock. A replica counts itself
the leader only while the lease it last renewed runs by its own boot clock (which keeps
counting through a pause: ``bot.engine.heartbeat.boottime``), less a safety margin, so a
leader frozen past its lease stops leading before the next one starts. A replica that
shuts down lets the lease go, so the next one leads at once rather than after it runs
out.

The recovery sweep waits for more than leading: this replica must have reached the
database without a break for one run lease (``may_recover``). A driver that could not
renew its lease because the database was away (a restart, a fail-over) is not dead;
once the database is back it renews within a lease, and only a lease that lapses after
that is a driver's death. The same wait holds for every judge of a lease on this replica
(``unsteady_s``, the Slack front end's ``Judge.settling``): a request meeting a run's
locks, and the sweep at start, before this replica has bid at all.

On SQLite (one bot, maybe CLIs beside it) the bot is the only bidder and always leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from bot.audit.resilient import unavailable
from bot.audit.store import AuditLog
from bot.engine.heartbeat import boottime
from bot.errors import AuditError

log = logging.getLogger(__name__)

LEADER = "leader"


class Leader:
    def __init__(
        self,
        audit: AuditLog,
        holder: str,
        *,
        ttl_s: float,
        lease_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        boot_clock: Callable[[], float] = boottime,
    ) -> None:
        self.audit = audit
        self.holder = holder
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        # Since when (by ``boot_clock``) every bid reached the database; None: the last
        # one could not.
        self._reachable_since: float | None = None
        self._sleep = sleep
        self._boot = boot_clock
        self._until = float("-inf")
        self.epoch: int | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def leading(self) -> bool:
        """Whether this replica may run the housekeeping now."""
        return self._boot() < self._until

    async def lead(self) -> bool:
        """Whether this replica may run its housekeeping now: the lease as last renewed
        by the bidding task, or, where none bids (``start`` not called), a bid now."""
        if self._task is None:
            return await self.bid()
        return self.leading

    async def may_recover(self) -> bool:
        """Whether this replica may judge other drivers dead now: it leads, and has
        reached the database without a break for one run lease (module doc)."""
        if not await self.lead():
            return False
        return self.unsteady_s() <= 0

    def unsteady_s(self) -> float:
        """Seconds until this replica will have reached the database without a break for
        one run lease (0: it has). Any judge of a driver by its lease here waits for it,
        the leader's sweep as much as a request meeting a run's locks or the sweep at
        start (``bot.engine.liveness.Judge.settling``)."""
        since = self._reachable_since
        if since is None:
            return self.lease_s
        return max(0.0, self.lease_s - (self._boot() - since))

    async def bid(self) -> bool:
        """One bid (or renewal); whether this replica leads after it."""
        asked = self._boot()
        try:
            epoch = await self.audit.hold_lease(LEADER, self.holder, self.ttl_s)
        except AuditError as exc:
            if not unavailable(exc):
                raise
            self._reachable_since = None
            log.warning("cannot renew the leader lease now: %s", exc)
            return self.leading
        if self._reachable_since is None:
            self._reachable_since = asked
        was = self.epoch
        if epoch is None:
            self._until = float("-inf")
            if was is not None:
                log.warning("this replica no longer leads (another took the leader lease)")
            self.epoch = None
            return False
        # A third of the lease as margin: the database's lease began after ``asked``.
        self._until = asked + self.ttl_s * 2 / 3
        if epoch != was:
            log.info("this replica leads now (leader lease, epoch %d)", epoch)
        self.epoch = epoch
        return True

    def start(self) -> Leader:
        if self._task is None:
            self._task = asyncio.create_task(self._every(), name="leader-lease")
        return self

    async def _every(self) -> None:
        while True:
            try:
                await self.bid()
            except Exception:
                log.exception("the leader lease bid failed; trying again")
            await self._sleep(self.ttl_s / 3)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.epoch is not None:
            self._until = float("-inf")
            with contextlib.suppress(AuditError):
                await self.audit.release_lease(LEADER, self.holder)
            self.epoch = None
