"""The run's card: the approval card while pending, the live status card after, the
outcome at the end (``run_card``), with its GPU health, package changes, checklist
and each host's leftover processes to terminate."""

from __future__ import annotations

from collections.abc import Sequence
from zoneinfo import ZoneInfo

from bot.core.health import HealthNote, Level
from bot.core.packages import BUILD_PREFIX
from bot.core.plan import (
    STEP_TITLES,
    SYSTEM_PREFIX,
)
from bot.core.status import HostStatus, RunStatus, StepStatus
from bot.core.windows import countdown, when
from bot.slack.block_kit import (
    ACTION_APPROVE,
    ACTION_CANCEL,
    ACTION_DENY,
    ACTION_TERMINATE,
    MAX_SECTION_TEXT,
    Block,
    Message,
    button,
    code_head,
    confirm_dialog,
    context,
    cut,
    escape,
    fields,
    header,
    mention,
    mentions,
    message,
    one_line,
    pack,
    section,
    who_may_approve,
)
from bot.slack.card_view import CardView, LeftoverAsk, StepLine, terminate_value
from bot.slack.plan_blocks import command_blocks, plan_fields, what_of

_MAX_CHECKLIST_SECTIONS = 30

_STEP_ICONS: dict[StepStatus, str] = {
    StepStatus.PENDING: ":white_circle:",
    StepStatus.RUNNING: ":hourglass_flowing_sand:",
    StepStatus.OK: ":white_check_mark:",
    StepStatus.FAILED: ":x:",
    StepStatus.SKIPPED: ":heavy_minus_sign:",
    StepStatus.INTERRUPTED: ":warning:",
}
STATUS_ICONS: dict[RunStatus, str] = {
    RunStatus.PENDING_APPROVAL: ":raised_hand:",
    RunStatus.APPROVED: ":white_check_mark:",
    RunStatus.SCHEDULED: ":calendar:",
    RunStatus.RUNNING: ":arrows_counterclockwise:",
    RunStatus.SUCCEEDED: ":large_green_circle:",
    RunStatus.FAILED: ":red_circle:",
    RunStatus.ROLLED_BACK: ":leftwards_arrow_with_hook:",
    RunStatus.ABORTED: ":no_entry:",
    RunStatus.CANCELLED: ":no_entry_sign:",
    RunStatus.INTERRUPTED: ":warning:",
    RunStatus.DENIED: ":no_entry_sign:",
    RunStatus.EXPIRED: ":hourglass:",
    RunStatus.REFUSED: ":no_entry:",
}
STATUS_WORDS: dict[RunStatus, str] = {
    RunStatus.PENDING_APPROVAL: "awaiting approval",
    RunStatus.APPROVED: "approved, starting",
    RunStatus.SCHEDULED: "scheduled",
    RunStatus.FAILED: "FAILED",
    RunStatus.ROLLED_BACK: "rolled back",
    RunStatus.ABORTED: "aborted (nothing changed)",
}  # the others read as their own word

_HEALTH_ICONS: dict[Level | None, str] = {
    Level.CRITICAL: ":no_entry:",
    Level.WARN: ":warning:",
    None: ":grey_question:",
}
# A host's line is shown up to this long; the GPU check's step has every finding.
_HEALTH_LINE_CHARS = 1_500
_MAX_HEALTH_SECTIONS = 3


def gpu_health_blocks(notes: Sequence[HealthNote]) -> list[Block]:
    """A line per host whose GPUs are not all ok at the request (critical first), so
    approvers see a warning, a refusal to come, or a host nobody could read, before they
    approve: ``:warning: GPU health: gpu-node-1: GPU 3 warn: what (action)``."""
    lines = [
        f"{_HEALTH_ICONS.get(n.level, ':grey_question:')} GPU health: "
        f"{escape(one_line(n.text, _HEALTH_LINE_CHARS))}"
        for n in notes
    ]
    return [section(c) for c in pack(lines, MAX_SECTION_TEXT, _MAX_HEALTH_SECTIONS)]


def _packages(view: CardView) -> list[Block]:
    """The package change, so approvers see torch and the CUDA wheels move before they
    approve: the highlighted changes in a sentence, the CUDA build the index resolved
    (a CUDA 13 default or a cu129 build), then every change in a code block."""
    if not view.packages:
        return []
    marked = [line[2:] for line in view.packages if line.startswith("! ")]
    builds = list(
        dict.fromkeys(
            line.strip()[len(BUILD_PREFIX) :]
            for line in view.packages
            if line.strip().startswith(BUILD_PREFIX)
        )
    )
    head = "*Package changes (dry run at request)*"
    if marked:
        head += "\n:warning: Also changes " + ", ".join(f"*{escape(m)}*" for m in marked[:6])
        head += f" and {len(marked) - 6} more highlighted" if len(marked) > 6 else ""
    if builds:
        head += f"\n{BUILD_PREFIX}" + "; ".join(f"*{escape(b)}*" for b in builds[:3])
    code, _ = code_head("\n".join(view.packages))
    return [section(head), section(code)]


def _facts(view: CardView) -> Block:
    pairs, _ = plan_fields(view)
    pairs.append(("Requested by", mention(view.requested_by)))
    # System decisions (a dry run's, a status query's) are in the audit log, not here.
    people = tuple(a for a in view.approvals if not a.startswith(SYSTEM_PREFIX))
    if view.status == RunStatus.PENDING_APPROVAL or people:
        noun = "approval" if view.needed == 1 else "approvals"
        pairs.append(("Approved by", f"{mentions(people)} ({len(people)} of {view.needed} {noun})"))
    if view.denied_by:
        pairs.append(("Denied by", mentions(view.denied_by)))
    return fields(pairs)


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f" ({seconds:.1f}s)"
    minutes, secs = divmod(int(seconds), 60)
    return f" ({minutes}m{secs:02d}s)"


def step_text(line: StepLine) -> str:
    title = escape(STEP_TITLES.get(line.step, str(line.step)))
    if line.state == StepStatus.RUNNING:
        title = f"*{title}*"
    text = f"{_STEP_ICONS.get(line.state, '')} {title}{duration_text(line.duration_s)}"
    if line.summary and line.state != StepStatus.PENDING:
        text += f" — {escape(one_line(line.summary))}"
    elif line.progress and line.state == StepStatus.RUNNING:
        text += f" — {escape(one_line(line.progress))}"
    return text


def _checklist(view: CardView) -> list[Block]:
    hosts = list(dict.fromkeys(s.host for s in view.steps))
    states = dict(view.host_states)
    lines: list[str] = []
    for host in hosts:
        if len(hosts) > 1:
            state = states.get(host)
            shown = "not started" if state == HostStatus.NOT_STARTED else state
            lines.append(f"*{escape(host)}*" + (f" — {escape(shown)}" if shown else ""))
        lines.extend(step_text(s) for s in view.steps if s.host == host)
    return [section(chunk) for chunk in pack(lines, MAX_SECTION_TEXT, _MAX_CHECKLIST_SECTIONS)]


def _expiry(view: CardView) -> str:
    if view.expires_at is None:
        return ""
    stamp = int(view.expires_at.timestamp())
    fallback = view.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"Expires <!date^{stamp}^{{date_short_pretty}} {{time}}|{fallback}>"


def _schedule(view: CardView) -> str:
    """``Starts Fri 2026-12-04 02:00 CET (in 3 h 05 min)``: Slack shows the date token in
    each reader's own zone; the fallback and the countdown are the bot's."""
    if view.scheduled_at is None:
        return ""
    zone = ZoneInfo(view.schedule_zone)
    verb = "Starts" if view.status == RunStatus.SCHEDULED else "Would start"
    if view.status == RunStatus.PENDING_APPROVAL:
        verb = "Once approved, starts"
    stamp = int(view.scheduled_at.timestamp())
    text = f"{verb} <!date^{stamp}^{{date_short_pretty}} {{time}}|{when(view.scheduled_at, zone)}>"
    if view.now is not None and view.status in (RunStatus.PENDING_APPROVAL, RunStatus.SCHEDULED):
        left = (view.scheduled_at - view.now).total_seconds()
        text += f" (in {countdown(left)})" if left > 0 else " (due now)"
    return text + ", if its maintenance window is still open then."


def _override(view: CardView) -> str:
    if not view.override:
        return ""
    return (
        f":rotating_light: Emergency override: asked for outside {escape(view.plan.service)}'s "
        f"maintenance window; it needs {view.needed} approvals."
    )


def _approval_card(view: CardView, blocks: list[Block]) -> Message:
    """The card while the run waits for approvers: what it will do, then the buttons."""
    blocks.extend(gpu_health_blocks(view.gpu_health))
    blocks.extend(_packages(view))
    blocks.extend(command_blocks(view.plan))
    blocks.append(
        context(
            f"Needs {view.needed} approver(s) of {escape(view.plan.service)}: "
            f"{who_may_approve(view.approvers)}; the requester cannot approve "
            "their own run unless the policy allows it.",
            _override(view),
            _schedule(view),
            _expiry(view),
            *(escape(n) for n in view.notes),
        )
    )
    blocks.append(
        {
            "type": "actions",
            "block_id": f"run-{view.run_id}",
            "elements": [
                button("Approve", ACTION_APPROVE, str(view.run_id), style="primary"),
                button(
                    "Deny",
                    ACTION_DENY,
                    str(view.run_id),
                    style="danger",
                    confirm=confirm_dialog(
                        f"Deny run #{view.run_id}?",
                        f"This closes the request to {escape(what_of(view.plan))}.",
                        "Deny",
                    ),
                ),
            ],
        }
    )
    text = (
        f"Approval needed: run #{view.run_id} {what_of(view.plan)}"
        + (f" ({view.plan.spec})" if view.plan.spec else "")
        + " "
        f"requested by {mention(view.requested_by)}"
    )
    return message(text, blocks)


def run_card(view: CardView) -> Message:
    """The approval card while pending; the live status card after; the outcome at the end."""
    status = view.status
    icon = STATUS_ICONS.get(status, "")
    word = STATUS_WORDS.get(status, status)
    title = f"Run #{view.run_id}: {what_of(view.plan)} — {word}"
    blocks: list[Block] = [header(title), _facts(view)]
    if status == RunStatus.PENDING_APPROVAL:
        return _approval_card(view, blocks)
    if (
        view.steps
        and status not in (RunStatus.DENIED, RunStatus.EXPIRED)
        and not (
            status == RunStatus.CANCELLED and all(s.state == StepStatus.PENDING for s in view.steps)
        )
    ):
        blocks.extend(_checklist(view))
    else:
        blocks.extend(command_blocks(view.plan))
    outcome = f"{icon} *{escape(word)}*"
    if view.summary:
        outcome += f": {escape(cut(view.summary, MAX_SECTION_TEXT - 200))}"
    blocks.append(section(outcome))
    notes = [escape(n) for n in view.notes]
    if status == RunStatus.SCHEDULED:
        notes.append(_schedule(view))
    if view.override:
        notes.append(_override(view))
    if view.cancel_requested_by and status in (RunStatus.APPROVED, RunStatus.RUNNING):
        notes.append(
            f"Cancel requested by {mention(view.cancel_requested_by)}: the run stops "
            "at its next safe point."
        )
    if notes:
        blocks.append(context(*notes))
    live = (RunStatus.APPROVED, RunStatus.RUNNING, RunStatus.SCHEDULED)
    if status in live and view.cancel_requested_by is None:
        blocks.extend(_leftovers(view))
        blocks.append(
            {
                "type": "actions",
                "block_id": f"run-{view.run_id}",
                "elements": [
                    button(
                        "Cancel",
                        ACTION_CANCEL,
                        str(view.run_id),
                        style="danger",
                        confirm=confirm_dialog(
                            f"Cancel run #{view.run_id}?",
                            "The run stops at its next safe point; a reinstall "
                            "in progress is never cut in half.",
                            "Cancel the run",
                            "Keep running",
                        ),
                    ),
                ],
            }
        )
    text = f"{icon} Run #{view.run_id} {what_of(view.plan)}: {word}"
    if view.summary:
        text += f" — {escape(view.summary)}"
    return message(text, blocks)


# A host's list on the card keeps this much room for its heading and approvals line.
_ASK_HEAD_CHARS = 600
# Hosts whose lists the card shows at once (a batch of more waits its turn on the card).
_MAX_ASKS = 10


def _leftovers(view: CardView) -> list[Block]:
    """Each host's processes a running run asks to terminate, above its buttons: one
    section per host, its list with its own button beside it (a section's accessory, so
    a card cut to fit keeps every list with its button, see ``message``)."""
    if not view.leftovers or view.status != RunStatus.RUNNING:
        return []
    blocks = [
        section(
            ":warning: *Leftover processes hold the service's GPUs.* Approvers "
            "may terminate each host's list with the button beside it; that host "
            "then goes on. Nobody pressing in time ends that host's run with its "
            "service stopped."
        )
    ]
    shown = view.leftovers[:_MAX_ASKS]
    blocks += [_ask_block(view.run_id, ask) for ask in shown]
    if len(view.leftovers) > len(shown):
        more = len(view.leftovers) - len(shown)
        blocks.append(
            context(
                f"{more} more host(s) wait with leftover processes: each list "
                "shows here, with its button, once one above is answered (every "
                "list is in the thread now)."
            )
        )
    return blocks


def _ask_block(run_id: int, ask: LeftoverAsk) -> Block:
    code, _ = code_head(ask.text, MAX_SECTION_TEXT - _ASK_HEAD_CHARS)
    noun = "approval" if ask.needed == 1 else "approvals"
    progress = f"{len(ask.approvals)} of {ask.needed} {noun}"
    if ask.approvals:
        progress += f" ({mentions(ask.approvals)})"
    pids = ", ".join(map(str, ask.pids))
    block = section(
        f"*{escape(ask.host)}*: {len(ask.pids)} process"
        f"{'es' if len(ask.pids) != 1 else ''} · {progress}\n{code}"
    )
    block["block_id"] = f"leftovers-{ask.question}"
    block["accessory"] = button(
        "Terminate leftover processes",
        ACTION_TERMINATE,
        terminate_value(run_id, ask.host, ask.question),
        style="primary",
        confirm=confirm_dialog(
            f"Terminate on {ask.host}?",
            f"PIDs {escape(pids)} on {escape(ask.host)}: SIGTERM, then "
            "SIGKILL to those that remain, each only if it is still the "
            "same process.",
            "Terminate",
        ),
    )
    return block
