"""A run's live Slack thread: the status card updated in place, one reply per step.

``SlackReporter`` is one more ``EventSink`` of the engine.  ``handle`` only
changes in-memory state and wakes a background task; it never awaits Slack, so
a Slack outage or a 429 storm cannot slow down or break a run.  The background
task drains the work in order:

* the card is re-rendered from the latest state, at most once per
  ``update_interval_s`` (changes in between are coalesced into one
  ``chat.update``);
* each finished step becomes one thread reply with the end of its output in a
  code block, plus the whole output as a file when it does not fit; output
  lines are only collected, never posted one by one, so the number of Slack
  calls per run does not depend on how much a command prints;
* GPU tables (after drain, after restart) become replies too.

A failed call is retried (after the back-off of ``bot.retry``, with jitter, so the
threads of several runs do not come back in step after an outage) until it succeeds or
the error is one that retrying cannot fix; nothing is dropped for a transient error, so the
thread catches up after an outage.  ``flush`` waits, with a bound, until
everything is delivered.

``Poster`` is the one way text leaves for Slack: it redacts every string
(text and blocks) and paces ``chat.postMessage`` per channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, assert_never

from bot.core import events as ev
from bot.core.gpu import render_table
from bot.core.packages import change_report
from bot.core.plan import Step
from bot.core.status import RunStatus, StepStatus
from bot.engine.executor import TAIL_LINES
from bot.hosts.base import LINE_OVERHEAD, cut_line
from bot.retry import Backoff
from bot.slack.blocks import (
    CardView,
    LeftoverAsk,
    Message,
    StepLine,
    attachment_refused,
    cancel_reply,
    code_answer,
    code_tail,
    fits_code_block,
    leftovers_reply,
    notice_reply,
    outcome_reply,
    rotation_reply,
    run_card,
    step_reply,
)
from bot.slack.poster import Poster, is_transient, redact_large, too_large

log = logging.getLogger(__name__)


# A step's output kept for the attached file (characters, and LINE_OVERHEAD per line);
# beyond it the oldest lines go.
MAX_LOG_CHARS = 16 * 1024 * 1024
# Between failed Slack calls: 1 s, doubling, at most 30 s, each up to 1 s later at random.
BACKOFF = Backoff(initial_s=1.0, max_s=30.0, jitter_s=1.0)


class _Log:
    """The lines one step printed, bounded in memory."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque()
        self.chars = 0
        self.dropped = 0

    def add(self, line: str) -> None:
        # Lines come cut by the engine; cutting again keeps this bound whoever sends them,
        # since the loop below always keeps the newest line, however long.
        line = cut_line(line)
        self.lines.append(line)
        self.chars += len(line) + LINE_OVERHEAD
        while self.chars > MAX_LOG_CHARS and len(self.lines) > 1:
            self.chars -= len(self.lines.popleft()) + LINE_OVERHEAD
            self.dropped += 1

    def full_output(self, event_output: str) -> str:
        """Everything the step printed: the collected lines, plus any detail the engine
        appended after its own tail (the last ``TAIL_LINES`` lines)."""
        if not self.lines:
            return event_output
        own_tail = "\n".join(list(self.lines)[-TAIL_LINES:])
        extra = (
            event_output[len(own_tail) :]
            if event_output.startswith(own_tail)
            else "\n" + event_output
        )
        head = f"[{self.dropped} earlier lines not kept]\n" if self.dropped else ""
        return head + "\n".join(self.lines) + extra


@dataclass
class _Reply:
    """One queued thread reply; ``posted`` lets a failed file upload retry alone."""

    line: StepLine | None = None
    output: str = ""
    title: str = ""
    table: str = ""
    msg: Message | None = None
    file: tuple[str, str, str] | None = None  # filename, content, title
    posted: bool = False


class _CardDelivery:
    """How one run's card and thread reach Slack: the replies and card updates, sent in
    order and retried with the one back-off, never blocking the run that feeds them."""

    def __init__(
        self,
        poster: Poster,
        *,
        channel: str,
        ts: str,
        view: CardView,
        update_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff = BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.poster = poster
        self.channel = channel
        self.ts = ts
        self.view = view
        self.update_interval_s = update_interval_s
        self._clock = clock
        self._backoff = backoff
        self._sleep = sleep
        self._logs: dict[tuple[str, Step], _Log] = {}
        self._replies: deque[_Reply] = deque()
        self._dirty = False
        self._next_update = 0.0
        self._wake = asyncio.Event()
        self._closing = False
        self._concluded = False
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    # ---- delivery ------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=f"slack-thread-{self.ts}")

    @property
    def pending(self) -> bool:
        return self._dirty or bool(self._replies)

    async def flush(self, timeout_s: float) -> bool:
        """Deliver what is queued, waiting at most ``timeout_s``; True when all went out."""
        self._closing = True
        self._wake.set()
        if self._task is None:
            self.start()
        assert self._task is not None
        try:
            await asyncio.wait_for(self._task, timeout_s)
        except TimeoutError:
            log.warning(
                "Slack thread %s/%s: gave up after %.0fs with updates still queued",
                self.channel,
                self.ts,
                timeout_s,
            )
            return False
        return not self.pending

    async def _drain(self) -> None:
        # Failed calls in a row: one back-off for the queue, whichever call failed (the
        # next try may be another one: the card, when it fell due meanwhile).
        failed = 0
        while True:
            if not self.pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            card = self._dirty and self._clock() >= self._next_update
            if not card and not self._replies:
                await self._idle(self._next_update - self._clock())
                continue
            try:
                if card:
                    await self._update_card()
                else:
                    await self._send(self._replies[0])
                    self._replies.popleft()
                failed = 0
            except Exception as exc:
                self.failures += 1
                if not is_transient(exc):
                    log.error(
                        "Slack thread %s/%s: dropping an update Slack refused: %s",
                        self.channel,
                        self.ts,
                        exc,
                    )
                    if card:
                        self._dirty = False
                    else:
                        refused = self._replies.popleft()
                        if refused.posted and refused.file is not None:
                            # The reply already out says a file follows: correct it.
                            self._replies.appendleft(
                                _Reply(
                                    msg=attachment_refused(
                                        refused.file[2],
                                        len(refused.file[1]),
                                        too_large=too_large(exc),
                                    )
                                )
                            )
                    continue
                failed += 1
                delay = self._backoff.delay(failed)
                log.warning(
                    "Slack thread %s/%s: %s; retrying in %.1fs", self.channel, self.ts, exc, delay
                )
                await self._sleep(delay)

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), max(seconds, 0.0))
        except TimeoutError:
            pass

    async def _update_card(self) -> None:
        self._dirty = False
        self._next_update = self._clock() + self.update_interval_s
        try:
            await self.poster.update(self.channel, self.ts, run_card(self.view))
        except BaseException:
            self._dirty = True
            raise

    async def _render(self, reply: _Reply) -> None:
        redact = self.poster.redact
        if reply.line is not None:
            output = await redact_large(redact, reply.output)
            _, cut = code_tail(output)
            if cut:
                name = f"run{self.view.run_id}-{reply.line.host}-{reply.line.step}.log"
                reply.file = (name, output, f"{reply.line.host} {reply.line.step} output")
            reply.msg = step_reply(reply.line, output, full_log_attached=cut)
        else:
            attach = not fits_code_block(reply.table)
            reply.msg = code_answer(reply.title, reply.table, attached=attach)
            if attach:
                reply.file = (f"run{self.view.run_id}-gpus.txt", reply.table, reply.title)

    async def _send(self, reply: _Reply) -> None:
        if reply.msg is None:
            await self._render(reply)
        assert reply.msg is not None
        if not reply.posted:
            await self.poster.post(self.channel, reply.msg, thread_ts=self.ts)
            reply.posted = True
        if reply.file is not None:
            name, content, title = reply.file
            await self.poster.upload(
                self.channel, filename=name, content=content, title=title, thread_ts=self.ts
            )


class SlackReporter(_CardDelivery):
    """Drives one run's card and thread. ``start()``, feed events, ``await flush()``."""

    # ---- state changes: synchronous, never touch Slack ----------------------------------

    async def handle(self, event: ev.Event) -> None:
        self.apply(event)

    def apply(self, event: ev.Event) -> None:
        match event:
            case ev.OutputLine():
                self._logs.setdefault((event.host, event.step), _Log()).add(event.line)
                return  # output alone never changes the card
            case ev.RunStarted():
                self._set(
                    status=RunStatus.RUNNING,
                    approvals=tuple(event.approved_by) or self.view.approvals,
                )
            case ev.StepStarted():
                self._logs[(event.host, event.step)] = _Log()
                self._step(
                    event.host,
                    event.step,
                    state=StepStatus.RUNNING,
                    duration_s=None,
                    summary="",
                    progress="",
                )
            case ev.StepProgress():
                # In place on the card, coalesced with every other change
                # (update_interval_s).
                self._step(event.host, event.step, progress=event.shown())
            case ev.StepFinished():
                self._finished(event)
            case ev.GpuTable() | ev.PackagesKnown():
                self._table(event)
            case ev.VersionsKnown():
                self._versions(event)
            case ev.HostFinished():
                self._set(host_states=(*self.view.host_states, (event.host, event.status)))
            case ev.RunFinished():
                self.conclude(event.status, event.summary, version_after=event.version_after)
                return
            case ev.Notice() | ev.RotationChanged():
                # No step of the run: a reply of its own in the thread.
                self._replies.append(
                    _Reply(
                        msg=notice_reply(event.text)
                        if isinstance(event, ev.Notice)
                        else rotation_reply(event)
                    )
                )
            case ev.GpuHealthKnown() | ev.ReleaseSwitched():
                # Read at the request, for the approval card the front end renders itself
                # (bot.engine.gpu_health); a run's own GPU check is its step. A release
                # switch is its step's line on the card.
                return
            case _:
                assert_never(event)
        self._touch()

    def _versions(self, event: ev.VersionsKnown) -> None:
        if event.before is not None and self.view.status == RunStatus.RUNNING:
            self._set(version_now=self.view.version_now or event.before)

    def _table(self, event: ev.GpuTable | ev.PackagesKnown) -> None:
        """A GPU table, or a package change (planned, made, or how the restored
        environment compares with the snapshot), as a code block in the thread."""
        match event:
            case ev.GpuTable():
                self._replies.append(
                    _Reply(
                        title=f"{event.host}: GPU memory {event.label}",
                        table=render_table(event.snapshot),
                    )
                )
            case ev.PackagesKnown():
                report = change_report(event.kind, event.diff, event.note)
                if report is not None:
                    title, _, body = report.partition("\n")
                    self._replies.append(
                        _Reply(title=f"{event.host}: {title.rstrip(':')}", table=body or title)
                    )
            case _:
                assert_never(event)

    def _finished(self, event: ev.StepFinished) -> None:
        line = self._step(
            event.host,
            event.step,
            state=event.status,
            duration_s=event.duration_s,
            summary=event.summary,
            progress="",
        )
        collected = self._logs.pop((event.host, event.step), _Log())
        output = collected.full_output(event.output)
        if output.strip() or event.status != StepStatus.OK:
            self._replies.append(_Reply(line=line, output=output))

    def _set(self, **changes: Any) -> None:
        self.view = dataclasses.replace(self.view, **changes)

    def _step(self, host: str, step: Step, **changes: Any) -> StepLine:
        steps = list(self.view.steps)
        same = [i for i, line in enumerate(steps) if line.host == host and line.step == step]
        # A step a run takes more than once (a host's maintenance stops each of its
        # services): a start takes the first line not begun, anything else the running one.
        want = StepStatus.PENDING if changes.get("state") == StepStatus.RUNNING else None
        want = want or StepStatus.RUNNING
        i = next((i for i in same if steps[i].state == want), same[0] if same else -1)
        if i >= 0:
            steps[i] = dataclasses.replace(steps[i], **changes)
        else:  # a step not in the plan (rollback) joins the list when it starts
            steps.append(StepLine(host, step, **changes))
            i = len(steps) - 1
        self._set(steps=tuple(steps))
        return steps[i]

    def _touch(self) -> None:
        self._dirty = True
        self._wake.set()

    def refresh(self) -> None:
        """Re-render the card soon (e.g. it still shows the approval buttons)."""
        self._touch()

    def offer_leftovers(self, ask: LeftoverAsk) -> None:
        """A host of the run waits for approvers to let it terminate leftover processes:
        its list and its own button on the card (beside any other host's), the list in the
        thread."""
        self._set(leftovers=(*self.view.leftovers, ask))
        self._replies.append(_Reply(msg=leftovers_reply(ask.text)))
        self._touch()

    def leftovers_progress(self, question: str, approvals: tuple[str, ...]) -> None:
        """An approval counted for one host's question, more are needed: the card says
        how many ("1 of 2 approvals")."""
        self._set(
            leftovers=tuple(
                dataclasses.replace(a, approvals=approvals) if a.question == question else a
                for a in self.view.leftovers
            )
        )
        self._touch()

    def close_leftovers(self, question: str, note: str) -> None:
        """One host's wait is over (pressed, timed out, cancelled): its button goes, the
        other hosts' stay; ``note`` says how it ended."""
        if not any(a.question == question for a in self.view.leftovers):
            return
        self._set(leftovers=tuple(a for a in self.view.leftovers if a.question != question))
        self._replies.append(_Reply(msg=notice_reply(note)))
        self._touch()

    def request_cancel(self, user: str) -> None:
        """Show a cancel request on the card and in the thread."""
        if self.view.cancel_requested_by is not None:
            return
        self._set(cancel_requested_by=user)
        self._replies.append(_Reply(msg=cancel_reply(user)))
        self._touch()

    def conclude(
        self, status: RunStatus, summary: str, *, version_after: str | None = None
    ) -> None:
        """The run's final state; steps that never ran are shown as skipped."""
        if self._concluded:
            return
        self._concluded = True
        steps = tuple(
            dataclasses.replace(s, state=StepStatus.SKIPPED)
            if s.state == StepStatus.PENDING
            else dataclasses.replace(s, state=StepStatus.INTERRUPTED)
            if s.state == StepStatus.RUNNING
            else s
            for s in self.view.steps
        )
        self._set(
            status=status,
            summary=summary,
            steps=steps,
            version_after=version_after or self.view.version_after,
        )
        self._replies.append(_Reply(msg=outcome_reply(self.view)))
        self._touch()
