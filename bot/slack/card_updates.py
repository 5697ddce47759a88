"""A run's card and thread kept in step with the audit log, outside a run (a run's own
card is its ``SlackReporter``'s): re-rendering a card, a reply in its thread, and the
link to a run's thread.

The audit log holds the truth; the card is a view of it, so a Slack error here is
logged and never undoes a decision."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from bot.audit.store import AuditLog, RunRecord
from bot.core.status import RunStatus
from bot.engine.preview import CARD_LIMIT, preview_lines, previews_of
from bot.settings import PolicySettings
from bot.slack.blocks import message, run_card, section
from bot.slack.cards import card_view, with_recorded_steps
from bot.slack.membership import Membership
from bot.slack.poster import SLACK_ERRORS, Poster

log = logging.getLogger(__name__)


class CardUpdates:
    def __init__(self, poster: Poster, audit: AuditLog, policy: PolicySettings) -> None:
        self.poster = poster
        self.audit = audit
        self.policy = policy
        self._locks: dict[int, asyncio.Lock] = {}
        # What a pending card shows beyond its record (the load read at the request).
        self.notes: dict[int, tuple[str, ...]] = {}

    async def refresh(self, run_id: int, membership: Membership | None = None) -> None:
        """Re-render a card from the audit log (pending progress, denied, expired, and
        runs a restart found interrupted: their checklist comes from the steps table)."""
        async with self._locks.setdefault(run_id, asyncio.Lock()):
            record = await self.audit.get_run(run_id)
            if record.channel is None or record.message_ts is None:
                return
            view = card_view(record, self.policy, membership)
            if record.status == RunStatus.PENDING_APPROVAL:
                # The package change shown at the request, as recorded with the run.
                previews = previews_of(await self.audit.environments(run_id))
                view = dataclasses.replace(view, notes=(*view.notes,
                                                        *self.notes.get(run_id, ())),
                                           packages=tuple(preview_lines(previews,
                                                                        limit=CARD_LIMIT)))
            else:
                self.notes.pop(run_id, None)
            if record.started_at is not None:
                view = with_recorded_steps(view, await self.audit.steps(run_id))
            try:
                await self.poster.update(record.channel, record.message_ts, run_card(view))
            except SLACK_ERRORS as exc:
                log.warning("cannot update the card of run #%d: %s", run_id, exc)

    async def tell_thread(self, record: RunRecord, text: str) -> None:
        """A reply in the run's thread."""
        if record.channel is None or record.message_ts is None:
            return
        try:
            await self.poster.post(record.channel, message(text, [section(text)]),
                                   thread_ts=record.message_ts)
        except SLACK_ERRORS as exc:
            log.warning("cannot post to the thread of run #%d: %s", record.id, exc)

    async def thread_link(self, run_id: int) -> str:
        """' Its thread: <link>' for the run holding a lock, when Slack can give one."""
        holder = await self.audit.get_run(run_id)
        if holder.channel is None or holder.message_ts is None:
            return ""
        link = await self.poster.permalink(holder.channel, holder.message_ts)
        return f" Its thread: {link}" if link else ""
