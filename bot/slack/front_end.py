"""The Slack front end (``SlackFrontEnd``): request, approval, expiry, cancel, execution.

Every change a person asks of a run goes to the operations service
(``bot.engine.operations``), which judges it (the pure policy, through the run life
cycle), records it or the refusal, and returns a typed result this front end renders;
the front end resolves user-group membership
(``bot.slack.membership``), arms the expiry timers (``bot.slack.expiry``), keeps the
cards (``bot.slack.cards``) in step with the audit log and runs approved runs.

State lives in SQLite only (the run row and its decisions), so pending cards
survive a restart: ``resume()`` expires the overdue ones and re-arms a timer for
the rest.  Approved runs execute in tasks this object keeps a reference to, each
with a ``SlackReporter`` that turns the card into the live status card.

Choices:

* A dry run needs no approval.  It still passes the requester policy, and is
  moved to 'approved' with a decision recorded for the user ``system:dry-run``,
  so the audit row shows why it ran without a human approval.
* A status or rotation read is no run: nothing is recorded (``bot.engine.status_query``).
* Every refused command or click gets an ephemeral answer and a refusals row (the
  service's ``refuse``, or its own judgement); a second click by the same person is not
  a refusal, just a note.
* A click decides only the run whose card it was on (``off_card``): the run id in the
  button's value, and the channel and message ts of the click, must be the run's
  recorded card, in an allowed channel. Anyone can sign a request naming any run, so
  the value alone proves nothing.
* Who may approve, deny or cancel is judged on user-group members read from Slack at
  the click (``MembershipCache.fresh``), never on the cache: someone removed from the
  approvers' group loses the right at once. When Slack cannot say, the click is
  refused (fails closed). The cache still serves what only shows (a card's progress).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

from bot.audit.backend import Dialect
from bot.audit.store import parse_ts
from bot.core.plan import Plan
from bot.core.policy import groups_to_resolve
from bot.core.status import Decision, RunStatus
from bot.engine.leader import Leader
from bot.engine.operations import Busy, ChatUser, Requested
from bot.engine.owner import process_owner
from bot.engine.preview import CARD_LIMIT, preview_lines, record_previews
from bot.engine.recovery import SWEEP_EVERY_S
from bot.engine.request_reads import read_at_request
from bot.engine.run_results import (
    AlreadyCounted,
    Approved,
    Cancelled,
    CancelRequested,
    Counted,
    Denied,
    NotCancellable,
    Refusal,
    Refused,
    Scheduled,
    TooLate,
)
from bot.engine.runtime import Runtime
from bot.engine.schedule import AT_ONCE, Timing
from bot.errors import ChatOpsError, FencedError, LockHeldError, RunNotFoundError
from bot.slack.blocks import CardView, card_hides_plan, run_card
from bot.slack.card_updates import CardUpdates
from bot.slack.cards import card_view
from bot.slack.expiry import ExpiryTimers, Sleep
from bot.slack.leftovers import LeftoverDesk
from bot.slack.membership import Membership, MembershipCache
from bot.slack.poster import SLACK_ERRORS, Poster
from bot.slack.recovery_sweep import RecoverySweep
from bot.slack.reporter import SlackReporter
from bot.slack.scheduled_starts import TICK_S as SCHEDULE_TICK_S
from bot.slack.scheduled_starts import ScheduledStarts
from bot.slack.tasks import BackgroundTasks

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_FLUSH_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class CardRef:
    """Where a button was clicked, from the click's own payload: the channel and the ts
    of the message the button was on (``container.message_ts``/``message.ts``)."""

    channel: str | None
    message_ts: str | None


async def read_for_card(
    runtime: Runtime, cards: CardUpdates, plan: Plan, view: CardView
) -> CardView:
    """What a request's card shows beyond its record, read on the hosts now (read-only),
    kept for the card's later renders (``cards``) and, the package change, with the run:
    the load (what the stop would wait for, or --force would interrupt), what the
    redeploy changes besides vLLM (torch, CUDA wheels..., issue 10), which release a
    rollback by hand goes to on each host and why, and the service's GPUs' health as the
    run's GPU check reads it (issue 12), before anyone approves."""
    run_id = view.run_id
    reads = await read_at_request(
        runtime.settings, runtime.pool, runtime.audit, plan, load=not plan.dry_run
    )
    # Where a rollback by hand would go on each host, and why (read now; its preflight
    # decides again, the same way, before anything stops).
    shown = (*(f"Rollback {t}" for t in reads.targets), *filter(None, (reads.load,)))
    if shown:
        cards.notes[run_id] = shown
        view = dataclasses.replace(view, notes=(*view.notes, *shown))
    await record_previews(runtime.audit, run_id, reads.previews)
    cards.gpu_health[run_id] = reads.health
    return dataclasses.replace(
        view,
        packages=tuple(preview_lines(reads.previews, limit=CARD_LIMIT)),
        gpu_health=reads.health,
    )


class _FrontDesk:
    """The front end's own housekeeping: its tasks, start-up, expiry, refusals, whose
    judgement a click gets and which card it was on."""

    def __init__(
        self,
        runtime: Runtime,
        poster: Poster,
        members: MembershipCache,
        *,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.runtime = runtime
        self.poster = poster
        self.members = members
        self.flush_timeout_s = flush_timeout_s
        self.settings = runtime.settings
        self.lifecycle = runtime.lifecycle
        self.operations = runtime.operations
        self.timers = ExpiryTimers(self.expire, clock=runtime.lifecycle.clock, sleep=sleep)
        self.tasks = BackgroundTasks()
        self.cards = CardUpdates(
            poster, runtime.audit, runtime.settings, clock=runtime.lifecycle.clock
        )
        self._reporters: dict[int, SlackReporter] = {}
        # Runs waiting for an approver to let them terminate leftover processes.
        self.leftovers = LeftoverDesk(runtime.operations)
        # The housekeeping below runs on one replica at a time: the leader (issue 21).
        replicas = runtime.settings.replicas
        self.leader = Leader(
            runtime.audit,
            process_owner(),
            ttl_s=replicas.leader_ttl_s,
            # On SQLite a driver is judged by its process and its heartbeat as this
            # machine saw it (bot.engine.liveness), which an outage does not fool.
            lease_s=replicas.lease_s if runtime.audit.dialect is Dialect.POSTGRES else 0.0,
        )
        # No driver is judged dead by its lease until this replica has reached the database
        # without a break for one (after an outage, or at start): not by the sweep, nor by
        # a request meeting a run's locks, nor by the sweep at start.
        self.lifecycle.judge.settling = self.leader.unsteady_s
        self.sweep = RecoverySweep(self.lifecycle, self.cards, self.leader.may_recover)
        # Runs approved for later, started at their time (issue 22).
        self.scheduled = ScheduledStarts(
            self.operations, self.cards, self.start_run, self.leader.lead, self.members.fresh
        )
        # A run recovered because a request met its lock is told in its thread too.
        self.lifecycle.recovered.append(self.cards.tell_recovered)
        # An overdue request expired because a request met its lock loses its buttons.
        self.lifecycle.expired.append(lambda run: self._closed(run.id))

    # ---- tasks ----------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run ``coro`` after the ack, as a kept background task."""
        return self.tasks.spawn(coro, name=name)

    async def idle(self) -> None:
        """Wait until every background task (not the expiry timers) has finished."""
        await self.tasks.idle()

    def start_run(self, run_id: int) -> asyncio.Task[None]:
        raise NotImplementedError  # SlackFrontEnd drives runs

    async def aclose(self) -> None:
        await self.scheduled.aclose()
        await self.sweep.aclose()
        await self.leader.aclose()
        await self.timers.aclose()
        await self.tasks.aclose()

    # ---- start-up ---------------------------------------------------------------------------

    async def resume(self) -> None:
        """After a restart: close runs the last process left behind, expire overdue
        requests and re-arm the expiry timer of every pending one."""
        await self.sweep.once()
        for record in await self.operations.expire_overdue():
            await self.cards.refresh(record.id)
        for record in await self.lifecycle.pending():
            # Also a request whose card was posted but not yet recorded (the bot died
            # while its full plan went to the thread): nobody can approve it, and its
            # locks must not outlive its window.
            if record.expires_at is not None:
                self.timers.arm(record.id, parse_ts(record.expires_at))

    def start_sweep(
        self,
        *,
        every_s: float = SWEEP_EVERY_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Every ``every_s``, recover the runs whose driver died while nobody asked (a
        CLI killed, another replica gone), and tell their threads; only while this
        replica leads (``start_leader``)."""
        self.sweep.start(every_s=every_s, sleep=sleep)

    async def start_leader(self) -> None:
        """Bid for the leader lease now (a lone bot leads at once), then keep bidding."""
        await self.leader.bid()
        self.leader.start()

    def start_scheduler(
        self,
        *,
        every_s: float = SCHEDULE_TICK_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Every ``every_s`` (and at once), start the runs scheduled for now (``--at``)."""
        self.scheduled.start(every_s=every_s, sleep=sleep)

    # ---- refusals ---------------------------------------------------------------------------

    async def refuse(
        self, *, user: str, channel: str | None, command: str, reason: str, code: Refusal
    ) -> str:
        """A refusal this front end judged, recorded by the service; returns the sentence
        for the person."""
        refused = await self.operations.refuse(
            user=user, channel=channel, command=command, reason=reason, code=code
        )
        return refused.text

    async def membership(self) -> Membership:
        """User-group members as cached: for what only shows, or who may ask (the groups
        of ``[policy]`` and of every service's own policy)."""
        return await self.members.resolve(groups_to_resolve(*self.settings.policies()))

    async def _judging(
        self, user: str, channel: str | None, command: str, run_id: int
    ) -> Membership | str:
        """Members read from Slack now, for a decision on run ``run_id``; or, when Slack
        cannot say, the refusal's sentence (recorded): judging on a stale or partial
        answer could let in someone just removed from the approvers' group. Only the
        groups of that run's service's policy are read: a group that only another
        service names neither decides nor blocks this click."""
        try:
            service = (await self.runtime.audit.get_run(run_id)).service
            policy = self.settings.policy_for(service)
        except RunNotFoundError:
            policy = self.settings.policy  # the life cycle says it does not exist
        groups = groups_to_resolve(policy)
        fresh = await self.members.fresh(groups)
        if fresh is not None:
            return fresh
        return await self.refuse(
            user=user,
            channel=channel,
            command=command,
            code=Refusal.MEMBERSHIP_UNKNOWN,
            reason="Slack did not answer who is in the user group(s) "
            f"{', '.join(sorted(groups))} just now, so this click cannot be judged "
            "and nothing was recorded. Try again in a moment.",
        )

    # ---- which card a click was on ------------------------------------------------------

    async def off_card(self, run_id: int, *, user: str, card: CardRef, command: str) -> str | None:
        """Why a click cannot decide run ``run_id`` (recorded as a refusal), or None when
        it was on that run's own card in an allowed channel.

        A run that does not exist is left to the life cycle (which says so)."""
        allowed = self.runtime.settings.slack.channels
        if allowed and card.channel not in allowed:
            where = ", ".join(f"<#{c}>" for c in allowed)
            return await self.refuse(
                user=user,
                channel=card.channel,
                command=command,
                code=Refusal.WRONG_CHANNEL,
                reason=f"Buttons of this bot only work on its cards in {where}; nothing "
                f"was recorded for run #{run_id}.",
            )
        try:
            record = await self.runtime.audit.get_run(run_id)
        except RunNotFoundError:
            return None
        if record.message_ts is None:
            # The card is recorded only once its full plan is in its thread (request()).
            reason = (
                f"Run #{run_id}'s card is not complete yet (its full plan is still "
                "being posted in its thread), so it cannot be decided yet. Try again "
                "in a moment."
            )
        elif (record.channel, record.message_ts) != (card.channel, card.message_ts):
            reason = (
                f"That button is not on run #{run_id}'s card, so it cannot decide "
                f"run #{run_id}; nothing was recorded. Use the buttons on the run's "
                "own card."
            )
        else:
            return None
        return await self.refuse(
            user=user, channel=card.channel, command=command, reason=reason, code=Refusal.OFF_CARD
        )

    # ---- expiry -----------------------------------------------------------------------------

    async def expire(self, run_id: int) -> bool:
        """Its timer is due: close a request nobody approved in time; False if it was
        decided first. Only the leader expires (issue 21): with several replicas each arms
        a timer for every pending card it knows, and one closes it, at once or at the
        leader's next sweep."""
        self.timers.disarm(run_id)
        if not await self.leader.lead():
            return False
        if not await self.operations.expire(run_id):
            if (await self.runtime.audit.get_run(run_id)).status == RunStatus.EXPIRED:
                # Another process (a CLI meeting its lock) expired it: the card says so.
                await self.cards.refresh(run_id)
            return False
        await self.cards.refresh(run_id)
        return True

    async def _closed(self, run_id: int) -> None:
        """The life cycle closed a pending request: its timer and buttons go."""
        self.timers.disarm(run_id)
        await self.cards.refresh(run_id)


class SlackFrontEnd(_FrontDesk):
    """Requests, clicks, cancels and run tasks: what the Slack listeners hand work to.

    ``sleep`` is what the expiry timers wait with (tests pass their manual clock's)."""

    # ---- requests ---------------------------------------------------------------------------

    async def request(
        self, plan: Plan, *, user: str, channel: str, command: str, timing: Timing = AT_ONCE
    ) -> str | None:
        """Record the request and post its approval card (a dry run starts at once).
        Returns an ephemeral sentence for the requester when refused or failed.
        ``timing``: its ``--at``/``--now`` (issue 22)."""
        # A dry run changes nothing on the host, so the service has it approved by the
        # system (see module doc).
        result = await self.operations.request(
            plan, by=ChatUser(user, channel, command, self.membership), timing=timing
        )
        match result:
            case Requested(record=record):
                pass
            case Busy():
                return f"{result.text}{await self.cards.thread_link(result.holder)}"
            case Refused():
                return result.text
            case _:
                assert_never(result)
        policy = self.settings.policy_for(record.service)
        view = await read_for_card(
            self.runtime, self.cards, plan, card_view(record, policy, now=self.lifecycle.clock())
        )
        try:
            ts = await self.poster.post(channel, run_card(view))
        except SLACK_ERRORS as exc:
            # Without a card nobody can approve it: close it rather than leave it pending.
            await self.operations.withdraw(record.id, f"could not post the card to Slack: {exc}")
            return f"Could not post the approval card for run #{record.id}; nothing was run."
        if card_hides_plan(view):
            # The card summarises the plan, so the whole of it goes in the thread first.
            # Its buttons are on the card already, but a click counts only on the card
            # recorded below (off_card), so none can approve before the plan is there.
            # (Rendering the card without buttons and adding them after would cost a
            # chat.update per card, and a failed update would leave a card nobody can
            # approve with no word why.)
            try:
                await self.cards.post_full_plan(view, channel, ts)
            except SLACK_ERRORS as exc:
                await self.operations.withdraw(
                    record.id, f"could not post the complete plan in the card's thread: {exc}"
                )
                await self.runtime.audit.set_message(record.id, channel, ts)
                await self.cards.refresh(record.id)  # closed: its buttons go
                return (
                    f"Could not post the complete plan of run #{record.id} in its card's "
                    "thread, so nobody could see what they would approve; it was closed "
                    "and nothing was run."
                )
        await self.runtime.audit.set_message(record.id, channel, ts)
        if plan.dry_run:
            self.start_run(record.id)
        elif record.expires_at is not None:
            self.timers.arm(record.id, parse_ts(record.expires_at))
        return None

    # ---- clicks -----------------------------------------------------------------------------

    async def decide(
        self, run_id: int, *, user: str, action: Decision, channel: str | None
    ) -> str | None:
        """One Approve or Deny click. Returns an ephemeral sentence for the clicker."""
        membership = await self._judging(user, channel, f"{action} run #{run_id}", run_id)
        if isinstance(membership, str):
            return membership
        result = await self.operations.decide(
            run_id, action, user=user, membership=membership, channel=channel
        )
        match result:
            case Approved(start=True):
                self.timers.disarm(run_id)
                self.start_run(run_id)
            case Counted():
                await self.cards.refresh(run_id, membership)
            case Scheduled():
                # Approved for later: the scheduler starts it (bot.slack.scheduled_starts).
                self.timers.disarm(run_id)
                await self.cards.refresh(run_id, membership)
            case Denied() | Refused(expired=True):
                await self._closed(run_id)
            case Approved() | Refused() | AlreadyCounted() | TooLate():
                pass
            case _:
                assert_never(result)
        return result.text

    # ---- cancel -----------------------------------------------------------------------------

    async def cancel(self, run_id: int, *, user: str, channel: str | None) -> str:
        """Cancel by the requester or an approver: a pending request closes at once,
        a running one stops at its next safe point."""
        membership = await self._judging(user, channel, f"{Decision.CANCEL} run #{run_id}", run_id)
        if isinstance(membership, str):
            return membership
        result = await self.operations.cancel(
            run_id, user=user, membership=membership, channel=channel
        )
        match result:
            case Cancelled(was=RunStatus.PENDING_APPROVAL | RunStatus.SCHEDULED):
                await self._closed(run_id)
            case CancelRequested() if (reporter := self._reporters.get(run_id)) is not None:
                reporter.request_cancel(user)
            case Cancelled() | CancelRequested() | NotCancellable() | Refused():
                pass
            case _:
                assert_never(result)
        return result.text

    # ---- leftover processes (issue 12) ------------------------------------------------------

    async def terminate(self, run_id: int, value: str, *, user: str, channel: str | None) -> str:
        """A host's Terminate leftover processes button (``value`` names the run, the
        host and the question): who is an approver is read from Slack now, and the desk
        decides on the press (``LeftoverDesk.press``)."""
        command = f"{Decision.TERMINATE} leftovers of run #{run_id}"
        membership = await self._judging(user, channel, command, run_id)
        if isinstance(membership, str):
            return membership
        return await self.leftovers.press(
            run_id, value, user=user, membership=membership, channel=channel, command=command
        )

    # ---- execution --------------------------------------------------------------------------

    def start_run(self, run_id: int) -> asyncio.Task[None]:
        return self.spawn(self._drive(run_id), name=f"run-{run_id}")

    async def _drive(self, run_id: int) -> None:
        audit = self.runtime.audit
        record = await audit.get_run(run_id)
        assert record.channel is not None and record.message_ts is not None
        # The request-time notes are the pending card's only: drop them, or every run a
        # long-lived bot approved would keep its lines in memory.
        self.cards.forget(run_id)
        settings = self.runtime.settings
        reporter = SlackReporter(
            self.poster,
            channel=record.channel,
            ts=record.message_ts,
            view=card_view(record, settings.policy_for(record.service)),
            update_interval_s=settings.slack.update_interval_s,
        )
        self._reporters[run_id] = reporter
        reporter.start()
        reporter.refresh()
        try:
            result = await self.runtime.engine.execute(
                run_id, reporter, gate=self.leftovers.gate(reporter)
            )
            reporter.conclude(result.status, result.summary)
        except FencedError as exc:
            # Another replica recovered the run while this one could not renew its lease
            # (paused, cut off): that replica tells the thread and owns the card now.
            log.error("run #%d: %s", run_id, exc)
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

    async def _close(
        self, run_id: int, reporter: SlackReporter, status: RunStatus, summary: str
    ) -> None:
        await self.operations.abandon(run_id, status, summary)
        record = await self.runtime.audit.get_run(run_id)
        reporter.conclude(record.status, record.summary or summary)
