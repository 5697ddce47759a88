"""A run's card and thread kept in step with the audit log, outside a run (a run's own
card is its ``SlackReporter``'s): re-rendering a card, the full plan and replies in its
thread (telling a recovered run's thread once), and the link to a run's thread.

The audit log holds the truth; the card is a view of it, so a Slack error here is
logged and never undoes a decision."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from bot.audit.store import AuditLog, RunRecord
from bot.core.health import HealthNote
from bot.core.status import RunStatus
from bot.engine.preview import CARD_LIMIT, preview_lines, previews_of
from bot.engine.recovery import Interrupted, interrupted_message
from bot.settings import Settings
from bot.slack.blocks import (
    CardView,
    full_plan,
    full_plan_message,
    full_plan_note,
    message,
    run_card,
    section,
)
from bot.slack.cards import card_view, with_recorded_steps
from bot.slack.membership import Membership
from bot.slack.poster import SLACK_ERRORS, Poster, is_transient

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class CardUpdates:
    def __init__(
        self,
        poster: Poster,
        audit: AuditLog,
        settings: Settings,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.poster = poster
        # What a scheduled run's countdown counts from (the life cycle's clock).
        self.clock = clock
        self.audit = audit
        # Each card is judged and shown by its own service's policy (issue 22).
        self.settings = settings
        self._locks: dict[int, asyncio.Lock] = {}
        # What a pending card shows beyond its record (the load read at the request).
        self.notes: dict[int, tuple[str, ...]] = {}
        # The GPU health read at the request (hosts not all ok), kept like the load.
        self.gpu_health: dict[int, tuple[HealthNote, ...]] = {}

    def forget(self, run_id: int) -> None:
        """Drop what only the pending card shows (its load and GPU health lines)."""
        self.notes.pop(run_id, None)
        self.gpu_health.pop(run_id, None)

    async def refresh(self, run_id: int, membership: Membership | None = None) -> None:
        """Re-render a card from the audit log (pending progress, denied, expired, and
        runs a restart found interrupted: their checklist comes from the steps table)."""
        async with self._locks.setdefault(run_id, asyncio.Lock()):
            record = await self.audit.get_run(run_id)
            if record.channel is None or record.message_ts is None:
                return
            view = card_view(
                record, self.settings.policy_for(record.service), membership, now=self.clock()
            )
            if record.status == RunStatus.PENDING_APPROVAL:
                # The package change shown at the request, as recorded with the run.
                previews = previews_of(await self.audit.environments(run_id))
                view = dataclasses.replace(
                    view,
                    notes=(*view.notes, *self.notes.get(run_id, ())),
                    packages=tuple(preview_lines(previews, limit=CARD_LIMIT)),
                    gpu_health=self.gpu_health.get(run_id, ()),
                )
            else:
                self.forget(run_id)
            if record.started_at is not None:
                view = with_recorded_steps(view, await self.audit.steps(run_id))
            try:
                await self.poster.update(record.channel, record.message_ts, run_card(view))
            except SLACK_ERRORS as exc:
                log.warning("cannot update the card of run #%d: %s", run_id, exc)

    async def tell_thread(self, record: RunRecord, text: str) -> None:
        """A reply in the run's thread."""
        await self._reply(record, text)

    async def _reply(self, record: RunRecord, text: str) -> BaseException | None:
        """A reply in the run's thread; why Slack refused it, if it did (logged)."""
        if record.channel is None or record.message_ts is None:
            return None
        try:
            await self.poster.post(
                record.channel, message(text, [section(text)]), thread_ts=record.message_ts
            )
        except SLACK_ERRORS as exc:
            log.warning("cannot post to the thread of run #%d: %s", record.id, exc)
            return exc
        return None

    async def post_full_plan(self, view: CardView, channel: str, ts: str) -> None:
        """Every host and command of the plan, whole, in the card's thread: one message
        of code blocks, or a file (with a note) when that does not fit. Slack errors are
        the caller's: a pending card whose plan is not in its thread must be closed."""
        msg = full_plan_message(view.run_id, view.plan)
        if msg is not None:
            await self.poster.post(channel, msg, thread_ts=ts)
            return
        await self.poster.upload(
            channel,
            filename=f"run-{view.run_id}-plan.txt",
            content=full_plan(view.run_id, view.plan),
            title=f"Run #{view.run_id}: the complete plan",
            thread_ts=ts,
        )
        await self.poster.post(channel, full_plan_note(view.run_id), thread_ts=ts)

    async def tell_recovered(self, item: Interrupted) -> None:
        """A run whose driver died was marked interrupted: its card and thread say so,
        once (claimed in the audit log, so two bots on one database do not both post)."""
        if item.run.message_ts is None:
            return  # no card: a CLI run, told on its terminal
        if not await self.audit.claim_telling(item.run.id):
            return
        await self.refresh(item.run.id)
        refused = await self._reply(item.run, item.message)
        if refused is not None and is_transient(refused):
            # Not told: the service may be stopped and nobody knows. The claim goes
            # back, so the next sweep (this replica's or the next leader's) tells it; a
            # refusal a retry would repeat (the bot removed from the channel) stays told.
            await self.audit.unclaim_telling(item.run.id)

    async def tell_untold(self) -> None:
        """Threads of runs recovered where nobody could post (by a CLI, or by a bot that
        died before it did) are told now."""
        for run in await self.audit.untold_recoveries():
            await self.tell_recovered(Interrupted(run, interrupted_message(run)))

    async def thread_link(self, run_id: int) -> str:
        """' Its thread: <link>' for the run holding a lock, when Slack can give one."""
        holder = await self.audit.get_run(run_id)
        if holder.channel is None or holder.message_ts is None:
            return ""
        link = await self.poster.permalink(holder.channel, holder.message_ts)
        return f" Its thread: {link}" if link else ""
