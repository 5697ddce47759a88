"""The runs this process drives: each one's cancel token, its heartbeat and the task that
records who cancelled it (one of the run life cycle's jobs, ``bot.engine.lifecycle``).

One instance per process, inside its one ``RunLifecycle``: a second one would hold other
tokens, and a cancel sent to it would stop nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from bot.audit.store import AuditLog
from bot.core.status import Decision
from bot.engine.executor import CancelToken
from bot.engine.heartbeat import LEASE_S, RENEW_EVERY_S, Heartbeat
from bot.engine.recovery import RECOVERY_ACTOR


class RunDriver:
    """Tokens, heartbeats and cancel recorders of the runs started here. ``sleep`` is
    what a heartbeat waits with between beats (tests pass their clock's)."""

    def __init__(
        self,
        audit: AuditLog,
        *,
        owner: Callable[[], str],
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]],
        margin_s: float,
        lease_s: float = LEASE_S,
        every_s: float = RENEW_EVERY_S,
        wait_for_database: bool = False,
    ) -> None:
        self.audit = audit
        # Replicas on PostgreSQL: a lease that ran out waits for the database to confirm
        # it before any action on a host (``Heartbeat.holds``).
        self._wait_for_database = wait_for_database
        self._owner = owner
        self._clock = clock
        self._sleep = sleep
        self._lease_s = lease_s
        # How much sooner than the database a driver counts its lease as over
        # (``Settings.lease_margin_s``).
        self._margin_s = margin_s
        self._every_s = every_s
        self._cancels: dict[int, CancelToken] = {}
        self._recorders: dict[int, asyncio.Task[None]] = {}
        self._heartbeats: dict[int, Heartbeat] = {}

    def drive(self, run_id: int, epoch: int | None = None) -> CancelToken:
        """The run has just moved to 'running' under this process, at ``epoch`` (its
        fencing token, issue 21): its token, with its heartbeat beating (a cancel asked
        on another replica arrives through it) and who cancels it recorded."""
        token = self._cancels[run_id] = CancelToken(epoch=epoch)
        # Renewed while this process drives the run: how another machine tells it is alive.
        heartbeat = Heartbeat(
            self.audit,
            run_id,
            self._owner(),
            clock=self._clock,
            sleep=self._sleep,
            margin_s=self._margin_s,
            lease_s=self._lease_s,
            every_s=self._every_s,
            lost=lambda: token.request(RECOVERY_ACTOR),
            epoch=epoch,
            on_cancel=token.request,
            wait_for_database=self._wait_for_database,
        )
        token.lease = heartbeat
        self._heartbeats[run_id] = heartbeat.start()
        self._recorders[run_id] = asyncio.create_task(
            self._record_cancel(run_id, token), name=f"cancel-recorder-{run_id}"
        )
        return token

    async def _record_cancel(self, run_id: int, token: CancelToken) -> None:
        """Record who asked to cancel, when they asked (the CLI's Ctrl-C included)."""
        await token.event.wait()
        assert token.requested_by is not None
        await self.audit.record_decision(run_id, token.requested_by, Decision.CANCEL)

    def request_cancel(self, run_id: int, user: str) -> bool:
        """Ask a run this process drives to stop at its next safe point (synchronous, so
        a signal handler can call it). False when no run here has that id."""
        token = self._cancels.get(run_id)
        if token is None:
            return False
        token.request(user)
        return True

    async def released(self, run_id: int) -> None:
        """The driver is done with the run (whatever its end): no more cancels, and who
        cancelled it is on disk before this returns."""
        heartbeat = self._heartbeats.pop(run_id, None)
        if heartbeat is not None:
            await heartbeat.stop()
        token = self._cancels.pop(run_id, None)
        recorder = self._recorders.pop(run_id, None)
        if recorder is None:
            return
        if token is not None and token.requested:
            await recorder
        else:
            recorder.cancel()
