"""Locks and recovery, one of the run life cycle's jobs (``bot.engine.lifecycle``): take
a run's locks, recovering a dead holder on the spot or expiring an overdue request, and
tell the front ends of what was recovered or expired (``recovered``, ``expired``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bot.audit.store import AuditLog, RunRecord
from bot.engine.liveness import Judge
from bot.engine.recovery import Closed, Interrupted, Tell, recover, take_locks

log = logging.getLogger(__name__)


class RunLocks:
    def __init__(self, audit: AuditLog, judge: Judge) -> None:
        self.audit = audit
        self.judge = judge
        # Told of each run this process recovers on meeting its lock (bot.engine.recovery):
        # the Slack front end posts in its thread, the CLI prints it.
        self.recovered: list[Tell] = []
        # Told of each overdue request this process expires on meeting its lock (a CLI, or
        # a bot that was down at its deadline): the Slack front end closes its card.
        self.expired: list[Closed] = []

    async def take_locks(self, run_id: int, scopes: Sequence[str]) -> None:
        """Take the locks; a holder whose driver is dead is recovered on the spot (and
        ``recovered`` told), an overdue request expired (and ``expired`` told), a live
        one raises ``LockHeldError``."""
        await take_locks(
            self.audit, run_id, scopes, judge=self.judge, tell=self._tell, closed=self.closed
        )

    async def recover(self) -> list[Interrupted]:
        """The runs of dead processes become 'interrupted' (at start, and the bot's sweep),
        and overdue requests 'expired' (``expired`` is told of them): this is the look
        that ends what an earlier look of this machine saw stop changing."""
        interrupted = await recover(self.audit, judge=self.judge)
        for run in await self.audit.expire_closed(self.judge.window_closed):
            await self.closed(run)
        return interrupted

    async def closed(self, run: RunRecord) -> None:
        for listener in list(self.expired):
            try:
                await listener(run)
            except Exception:
                log.exception("cannot report the expiry of run #%d", run.id)

    async def _tell(self, item: Interrupted) -> None:
        for listener in list(self.recovered):
            try:
                await listener(item)
            except Exception:
                # The audit log has the truth; a thread that cannot be told is no reason
                # to refuse the request that found the dead run.
                log.exception("cannot report the recovery of run #%d", item.run.id)
