"""The Slack side of a run's life: request, approval, expiry, cancel, execution.

Every change of a run's status is the run life cycle's (``bot.engine.lifecycle``),
which applies the pure policy to clicks; this module resolves user-group membership
through ``usergroups.users.list`` (cached for ``usergroup_cache_ttl_s``), arms the
expiry timers, keeps the cards in step with the audit log and runs approved runs.

State lives in SQLite only (the run row and its decisions), so pending cards
survive a restart: ``resume()`` expires the overdue ones and re-arms a timer for
the rest.  Approved runs execute in tasks this object keeps a reference to, each
with a ``SlackReporter`` that turns the card into the live status card.

Choices:

* A dry run needs no approval.  It still passes the requester policy, and is
  moved to 'approved' with a decision recorded for the user ``system:dry-run``,
  so the audit row shows why it ran without a human approval.
* Read-only status runs are recorded the same way, for ``system:read-only``.
* Every refused command or click gets an ephemeral answer and a refusals row
  (``refuse``); a second click by the same person is not a refusal, just a note.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime
from typing import Any, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from bot.audit.store import RunRecord, StepRecord, parse_ts
from bot.core.plan import DRY_RUN_APPROVER, Plan, PlannedStep, Step
from bot.core.policy import counted_approvals, groups_to_resolve, is_requester
from bot.core.status import FINAL_STATUSES, Action, Decision, RunStatus, Source, StepStatus
from bot.engine.lifecycle import Approved, Cancelled, CancelRequested, Counted, Denied, Refused
from bot.engine.runtime import Runtime
from bot.errors import ChatOpsError, LockHeldError
from bot.slack.blocks import (
    CardView,
    StepLine,
    initial_steps,
    message,
    run_card,
    section,
)
from bot.slack.poster import SLACK_ERRORS, Poster
from bot.slack.reporter import SlackReporter

log = logging.getLogger(__name__)

T = TypeVar("T")
Membership = dict[str, frozenset[str]]

DEFAULT_FLUSH_TIMEOUT_S = 600.0


class MembershipCache:
    """User-group members, fetched with ``usergroups.users.list`` and kept ``ttl_s``.

    A group whose lookup fails is left out of the answer (and not cached), so it
    grants nothing: the policy fails closed.
    """

    def __init__(self, client: AsyncWebClient, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def resolve(self, groups: Iterable[str]) -> Membership:
        out: Membership = {}
        for group in sorted(set(groups)):
            members = await self._members(group)
            if members is not None:
                out[group] = members
        return out

    async def _members(self, group: str) -> frozenset[str] | None:
        # One lookup per group at a time: a burst of clicks shares the answer.
        async with self._locks.setdefault(group, asyncio.Lock()):
            hit = self._cache.get(group)
            if hit is not None and self._clock() < hit[0]:
                return hit[1]
            try:
                resp = await self.client.usergroups_users_list(usergroup=group)
            except SLACK_ERRORS as exc:
                log.warning("cannot list members of user group %s (it grants nothing): %s",
                            group, exc)
                return None
            members = frozenset(str(u) for u in resp.get("users") or ())
            self._cache[group] = (self._clock() + self.ttl_s, members)
            return members


def with_recorded_steps(view: CardView, steps: Iterable[StepRecord]) -> CardView:
    """The checklist as the audit log recorded it; planned steps that never ran are
    shown as skipped once the run is over."""
    lines = list(view.steps)
    for rec in steps:
        # A status this bot does not know (a newer bot wrote it) shows as a failure.
        state = rec.status if rec.status in StepStatus else StepStatus.FAILED
        line = StepLine(rec.host, Step(rec.step), state, rec.duration_s)
        index = next((i for i, s in enumerate(lines)
                      if (s.host, s.step) == (line.host, line.step)), None)
        if index is None:
            lines.append(line)
        else:
            lines[index] = line
    if view.status in FINAL_STATUSES:
        lines = [dataclasses.replace(s, state=StepStatus.SKIPPED)
                 if s.state == StepStatus.PENDING else s
                 for s in lines]
    return dataclasses.replace(view, steps=tuple(lines))


def plan_from_record(record: RunRecord) -> Plan:
    """The plan as it was requested and shown on the card (stored with the run)."""
    p = record.plan
    return Plan(
        action=Action(p["action"]), service=p["service"], hosts=tuple(p["hosts"]), unit=p["unit"],
        package=p["package"], version=p.get("version"), spec=p["spec"],
        index_name=p.get("index_name"), index_url=p.get("index_url"),
        steps=tuple(PlannedStep(Step(s["step"]), s["command"]) for s in p["steps"]),
        dry_run=bool(p.get("dry_run")), batch_size=int(p.get("batch_size") or 1),
    )


class Approvals:
    """Requests, clicks, cancels and run tasks for the Slack front end."""

    def __init__(self, runtime: Runtime, poster: Poster, members: MembershipCache, *,
                 flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S) -> None:
        self.runtime = runtime
        self.poster = poster
        self.members = members
        self.flush_timeout_s = flush_timeout_s
        self.policy = runtime.settings.policy
        self.lifecycle = runtime.lifecycle
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: dict[int, asyncio.Task[None]] = {}
        self._reporters: dict[int, SlackReporter] = {}
        self._card_locks: dict[int, asyncio.Lock] = {}

    # ---- tasks ----------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run ``coro`` after the ack; the reference kept here stops it being collected."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def idle(self) -> None:
        """Wait until every background task (not the expiry timers) has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in [*self._timers.values(), *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._timers.values(), *self._tasks, return_exceptions=True)
        self._timers.clear()

    # ---- start-up ---------------------------------------------------------------------------

    async def resume(self) -> None:
        """After a restart: close runs the last process left behind, expire overdue
        requests and re-arm the expiry timer of every pending one."""
        for item in await self.lifecycle.recover():
            await self._refresh_card(item.run.id)
            await self._tell_thread(item.run, item.message)
        for record in await self.lifecycle.expire_overdue():
            await self._refresh_card(record.id)
        for record in await self.lifecycle.pending():
            if record.expires_at is not None and record.message_ts is not None:
                self.arm(record.id, parse_ts(record.expires_at))

    # ---- refusals ---------------------------------------------------------------------------

    async def refuse(self, *, user: str, channel: str | None, command: str, reason: str) -> str:
        """Record the refusal in the audit log; returns the sentence for the person."""
        await self.runtime.audit.record_refusal(user=user, channel=channel, command=command,
                                                reason=reason)
        return reason

    async def _thread_link(self, run_id: int) -> str:
        """' Its thread: <link>' for the run holding a lock, when Slack can give one."""
        holder = await self.runtime.audit.get_run(run_id)
        if holder.channel is None or holder.message_ts is None:
            return ""
        link = await self.poster.permalink(holder.channel, holder.message_ts)
        return f" Its thread: {link}" if link else ""

    async def membership(self) -> Membership:
        return await self.members.resolve(groups_to_resolve(self.policy))

    # ---- requests ---------------------------------------------------------------------------

    async def request(self, plan: Plan, *, user: str, channel: str, command: str) -> str | None:
        """Record the request and post its approval card (a dry run starts at once).
        Returns an ephemeral sentence for the requester when refused or failed."""
        if not is_requester(user, self.policy, await self.membership()):
            return await self.refuse(
                user=user, channel=channel, command=command,
                reason="You are not on the requesters list, so you cannot ask for a "
                       f"{plan.action}. Ask someone who is, or an admin to add you.")
        try:
            record = await self.lifecycle.request(plan, requested_by=user, source=Source.SLACK,
                                                  channel=channel)
        except LockHeldError as exc:
            # The engine has already recorded the request as refused, with its refusal row.
            return f"Refused: {exc}.{await self._thread_link(exc.run_id)}"
        if plan.dry_run:
            # Nothing changes on the host, so it needs nobody's approval (see module doc).
            await self.lifecycle.confirm(record.id, DRY_RUN_APPROVER)
            record = await self.runtime.audit.get_run(record.id)
        try:
            ts = await self.poster.post(channel, run_card(self._view(record)))
        except SLACK_ERRORS as exc:
            # Without a card nobody can approve it: close it rather than leave it pending.
            await self.lifecycle.withdraw(record.id,
                                          f"could not post the card to Slack: {exc}")
            return f"Could not post the approval card for run #{record.id}; nothing was run."
        await self.runtime.audit.set_message(record.id, channel, ts)
        if plan.dry_run:
            self.start_run(record.id)
        elif record.expires_at is not None:
            self.arm(record.id, parse_ts(record.expires_at))
        return None

    def _view(self, record: RunRecord, membership: Membership | None = None) -> CardView:
        plan = plan_from_record(record)
        approvals = tuple(record.approved_by)
        if membership is not None:
            approvals = counted_approvals(approvals, requester=record.requested_by,
                                          policy=self.policy, membership=membership)
        notes: tuple[str, ...] = ()
        if plan.dry_run:
            notes = ("Dry run: preflight only, nothing on the host changes; "
                     "no approval needed.",)
        return CardView(
            run_id=record.id, plan=plan, requested_by=record.requested_by,
            status=record.status, needed=self.policy.min_approvals, approvals=approvals,
            denied_by=tuple(record.denied_by), version_now=record.version_before,
            version_after=record.version_after,
            expires_at=parse_ts(record.expires_at) if record.expires_at else None,
            steps=initial_steps(plan), summary=record.summary if record.is_final else None,
            notes=notes)

    # ---- the card outside a run -----------------------------------------------------------

    async def _tell_thread(self, record: RunRecord, text: str) -> None:
        """A reply in the run's thread; the audit log already holds the truth."""
        if record.channel is None or record.message_ts is None:
            return
        try:
            await self.poster.post(record.channel, message(text, [section(text)]),
                                   thread_ts=record.message_ts)
        except SLACK_ERRORS as exc:
            log.warning("cannot post to the thread of run #%d: %s", record.id, exc)

    async def _refresh_card(self, run_id: int, membership: Membership | None = None) -> None:
        """Re-render a card from the audit log (pending progress, denied, expired, and
        runs a restart found interrupted: their checklist comes from the steps table)."""
        audit = self.runtime.audit
        async with self._card_locks.setdefault(run_id, asyncio.Lock()):
            record = await audit.get_run(run_id)
            if record.channel is None or record.message_ts is None:
                return
            view = self._view(record, membership)
            if record.started_at is not None:
                view = with_recorded_steps(view, await audit.steps(run_id))
            try:
                await self.poster.update(record.channel, record.message_ts, run_card(view))
            except SLACK_ERRORS as exc:
                # The audit log has the truth; the card is only a view of it.
                log.warning("cannot update the card of run #%d: %s", run_id, exc)

    # ---- expiry -----------------------------------------------------------------------------

    def arm(self, run_id: int, expires_at: datetime) -> None:
        old = self._timers.pop(run_id, None)
        if old is not None:
            old.cancel()
        self._timers[run_id] = asyncio.create_task(self._expire_at(run_id, expires_at),
                                                   name=f"expiry-{run_id}")

    def _disarm(self, run_id: int) -> None:
        timer = self._timers.pop(run_id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _expire_at(self, run_id: int, expires_at: datetime) -> None:
        await asyncio.sleep(max((expires_at - self.lifecycle.clock()).total_seconds(), 0.0))
        await self.expire(run_id)

    async def expire(self, run_id: int) -> bool:
        """Close a request nobody approved in time; False if it was decided first."""
        self._disarm(run_id)
        if not await self.lifecycle.expire(run_id):
            return False
        await self._refresh_card(run_id)
        return True

    # ---- clicks -----------------------------------------------------------------------------

    async def decide(self, run_id: int, *, user: str, action: Decision,
                     channel: str | None) -> str | None:
        """One Approve or Deny click. Returns an ephemeral sentence for the clicker."""
        membership = await self.membership()
        if action == Decision.DENY:
            denied = await self.lifecycle.deny(run_id, user=user, membership=membership,
                                               channel=channel)
            if isinstance(denied, Denied):
                self._disarm(run_id)
                await self._refresh_card(run_id)
            elif isinstance(denied, Refused) and denied.expired:
                await self._closed(run_id)
            return denied.text
        approved = await self.lifecycle.approve(run_id, user=user, membership=membership,
                                                channel=channel)
        if isinstance(approved, Approved) and approved.start:
            self._disarm(run_id)
            self.start_run(run_id)
        elif isinstance(approved, Counted):
            await self._refresh_card(run_id, membership)
        elif isinstance(approved, Refused) and approved.expired:
            await self._closed(run_id)
        return approved.text

    async def _closed(self, run_id: int) -> None:
        """The life cycle closed a pending request: its timer and buttons go."""
        self._disarm(run_id)
        await self._refresh_card(run_id)

    # ---- cancel -----------------------------------------------------------------------------

    async def cancel(self, run_id: int, *, user: str, channel: str | None) -> str:
        """Cancel by the requester or an approver: a pending request closes at once,
        a running one stops at its next safe point."""
        result = await self.lifecycle.cancel(run_id, user=user, membership=await self.membership(),
                                             channel=channel)
        if isinstance(result, Cancelled) and result.was == RunStatus.PENDING_APPROVAL:
            await self._closed(run_id)
        elif isinstance(result, CancelRequested):
            reporter = self._reporters.get(run_id)
            if reporter is not None:
                reporter.request_cancel(user)
        return result.text

    # ---- execution --------------------------------------------------------------------------

    def start_run(self, run_id: int) -> asyncio.Task[None]:
        return self.spawn(self._drive(run_id), name=f"run-{run_id}")

    async def _drive(self, run_id: int) -> None:
        audit = self.runtime.audit
        record = await audit.get_run(run_id)
        assert record.channel is not None and record.message_ts is not None
        settings = self.runtime.settings
        reporter = SlackReporter(self.poster, channel=record.channel, ts=record.message_ts,
                                 view=self._view(record),
                                 update_interval_s=settings.slack.update_interval_s)
        self._reporters[run_id] = reporter
        reporter.start()
        reporter.refresh()
        try:
            result = await self.runtime.engine.execute(run_id, reporter)
            reporter.conclude(result.status, result.summary)
        except LockHeldError as exc:
            await self._close(run_id, reporter, RunStatus.REFUSED, f"not started: {exc}")
        except ChatOpsError as exc:
            # A run that had started is already 'interrupted' with what that means.
            await self._close(run_id, reporter, RunStatus.FAILED, f"stopped: {exc}")
        except Exception as exc:
            log.exception("run #%d crashed", run_id)
            await self._close(run_id, reporter, RunStatus.FAILED, f"internal error: {exc!r}")
        finally:
            self._reporters.pop(run_id, None)
            await reporter.flush(self.flush_timeout_s)

    async def _close(self, run_id: int, reporter: SlackReporter, status: RunStatus,
                     summary: str) -> None:
        await self.lifecycle.abandon(run_id, status, summary)
        record = await self.runtime.audit.get_run(run_id)
        reporter.conclude(record.status, record.summary or summary)
