"""Replies in a run's thread (a finished step, the outcome, a notice) and answers to
commands (code blocks of tables, lists and logs)."""

from __future__ import annotations

from bot.core.events import RotationChanged
from bot.core.plan import (
    STEP_TITLES,
)
from bot.core.status import StepStatus
from bot.slack.block_kit import (
    ELLIPSIS,
    FENCE,
    MAX_MESSAGE_TEXT,
    MAX_PLAN_SECTIONS,
    MAX_SECTION_TEXT,
    Message,
    code_head,
    code_safe,
    code_tail,
    context,
    cut,
    escape,
    mention,
    message,
    one_line,
    section,
)
from bot.slack.card_blocks import STATUS_ICONS, STATUS_WORDS, duration_text, step_text
from bot.slack.card_view import CardView, StepLine
from bot.slack.plan_blocks import what_of


def step_reply(line: StepLine, output: str, *, full_log_attached: bool) -> Message:
    """A thread reply for one finished step: its line, then the end of its output."""
    title = STEP_TITLES.get(line.step, str(line.step))
    head = f"`{escape(line.host)}` {step_text(line)}"
    blocks = [section(head)]
    if output.strip():
        code, truncated = code_tail(output)
        blocks.append(section(code))
        if truncated or full_log_attached:
            blocks.append(
                context(
                    "The full output is attached below."
                    if full_log_attached
                    else "Earlier output was cut."
                )
            )
    state = line.state if line.state == StepStatus.OK else line.state.upper()
    return message(f"{line.host}: {title} {state}{duration_text(line.duration_s)}", blocks)


def code_answer(title: str, body: str, *, attached: bool = False) -> Message:
    """A title and a code block with the start of ``body`` (tables, lists)."""
    code, truncated = code_head(body)
    blocks = [section(f"*{escape(title)}*"), section(code)]
    if truncated and not attached:
        blocks.append(context("Cut to fit one message."))
    return message(title, blocks)


def tail_answer(title: str, body: str) -> Message:
    """A title and a code block with the end of ``body`` (logs)."""
    code, _ = code_tail(body)
    return message(title, [section(f"*{escape(title)}*"), section(code)])


def code_pages_answer(title: str, body: str, *, rest: str) -> Message:
    """A title and ``body`` in as many code blocks as one message holds (split between
    lines), for an answer that cannot attach a file (an ephemeral one); when more is
    left, ``rest`` says where the whole of it is."""
    room = MAX_SECTION_TEXT - 2 * len(FENCE) - 2
    chunks: list[str] = []
    lines = code_safe(body.rstrip("\n")).split("\n")
    for i, raw in enumerate(lines):
        line = cut(raw, room) or " "
        if chunks and len(chunks[-1]) + 1 + len(line) <= room:
            chunks[-1] += f"\n{line}"
        elif len(chunks) < MAX_PLAN_SECTIONS:
            chunks.append(line)
        else:
            left = len(lines) - i
            chunks.append(f"{ELLIPSIS} {left} more line{'s' if left != 1 else ''}")
            break
    blocks = [
        section(f"*{escape(title)}*"),
        *(section(f"{FENCE}\n{c}\n{FENCE}") for c in chunks[:MAX_PLAN_SECTIONS]),
    ]
    if len(chunks) > MAX_PLAN_SECTIONS:
        blocks.append(context(f"{escape(chunks[-1])} not shown: {rest}"))
    return message(title, blocks)


def fits_code_block(body: str) -> bool:
    return not code_head(body)[1]


def outcome_reply(view: CardView) -> Message:
    """The thread's last word on a run: status and summary."""
    word = STATUS_WORDS.get(view.status, view.status)
    text = f"{STATUS_ICONS.get(view.status, '')} Run #{view.run_id} {what_of(view.plan)}: {word}"
    body = f"{STATUS_ICONS.get(view.status, '')} *Run #{view.run_id} {escape(word)}*"
    if view.summary:
        body += f": {escape(cut(view.summary, MAX_SECTION_TEXT - 200))}"
        text += f" — {escape(view.summary)}"
    if view.version_now or view.version_after:
        body += (
            f"\n`{escape(view.plan.package)}` {escape(view.version_now or '?')} → "
            f"{escape(view.version_after or '?')}"
        )
    return message(text, [section(body)])


def leftovers_reply(text: str) -> Message:
    """The thread's copy of what an approver is asked to terminate."""
    code, _ = code_head(text)
    # The fallback text is what notifications show, and mrkdwn there too: the host's
    # text is escaped like everywhere else, or a process name could ping the channel.
    return message(
        one_line(escape(text), MAX_MESSAGE_TEXT),
        [
            section(
                ":warning: *Waiting for an approver:* press *Terminate leftover "
                "processes* on the card to end these, or Cancel."
            ),
            section(code),
        ],
    )


def notice_reply(text: str) -> Message:
    """Something about the run that is no step of it (``events.Notice``)."""
    return message(one_line(escape(text), MAX_MESSAGE_TEXT), [section(f":warning: {escape(text)}")])


def rotation_reply(event: RotationChanged) -> Message:
    """A replica taken out of its router's rotation or put back, or a change that failed."""
    where = f"(router {event.router}, server {event.server})"
    if event.held:
        said, icon = f"{event.host}: {event.detail} {where}", ":no_entry_sign:"
    elif not event.ok:
        way = "out of" if event.change == "out" else "back into"
        said = f"{event.host}: taking it {way} rotation {where} failed: {event.detail}"
        icon = ":warning:"
    elif event.change == "out":
        said, icon = f"{event.host} out of rotation {where}", ":arrow_right_hook:"
    else:
        said, icon = f"{event.host} back in rotation {where}", ":leftwards_arrow_with_hook:"
    return message(one_line(escape(said), MAX_MESSAGE_TEXT), [section(f"{icon} {escape(said)}")])


def cancel_reply(user: str) -> Message:
    return message(
        f"Cancel requested by {user}",
        [
            section(
                f":no_entry_sign: Cancel requested by {mention(user)}: the run stops "
                "at its next safe point."
            )
        ],
    )


def attachment_refused(title: str, chars: int, *, too_large: bool) -> Message:
    """Follows a reply that promised an attached file Slack then refused: only the end of
    the output, already in that reply, is in the thread."""
    why = "as too large" if too_large else "for good"
    text = (
        f":warning: The full {escape(title)} ({chars:,} characters) could not be "
        f"attached: Slack refused the file {why}. Only its end, above, is in the thread."
    )
    return message(f"{title}: not attached", [section(text)])
