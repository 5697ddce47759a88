"""The recovery sweep: runs whose driver died (a CLI killed, another bot gone) are marked
interrupted and their threads told, at start-up and then every ``every_s`` seconds, so
such a run is closed even when no request ever meets its lock (``bot.engine.recovery``
judges who is dead; ``CardUpdates`` tells each thread once)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bot.engine.lifecycle import RunLifecycle
from bot.engine.recovery import SWEEP_EVERY_S
from bot.slack.card_updates import CardUpdates

log = logging.getLogger(__name__)


class RecoverySweep:
    """``leading``: whether this replica holds the leader lease (issue 21): only the
    leader sweeps, so two replicas never recover or tell the same run twice."""

    def __init__(
        self,
        lifecycle: RunLifecycle,
        cards: CardUpdates,
        leading: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.cards = cards
        self.leading = leading
        self._task: asyncio.Task[None] | None = None

    async def once(self) -> None:
        """Recover the runs of dead drivers now, and tell every thread not yet told."""
        for item in await self.lifecycle.recover():
            await self.cards.tell_recovered(item)
        await self.cards.tell_untold()

    def start(
        self,
        *,
        every_s: float = SWEEP_EVERY_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Sweep every ``every_s`` from now on (once started, a second call does nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._every(every_s, sleep), name="recovery-sweep")

    async def _every(self, every_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        while True:
            await sleep(every_s)
            try:
                if self.leading is None or await self.leading():
                    await self.once()
            except Exception:
                # A locked database now is no reason to stop looking next time.
                log.exception("the recovery sweep failed; trying again in %.0f s", every_s)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
