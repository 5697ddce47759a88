"""Block Kit builders: pure functions from plain data to Slack messages.

Every builder returns a ``Message`` (fallback ``text`` plus ``blocks``) that is
within Slack's limits whatever the input: a section's text is cut to 3,000
characters, a header to 150, the fallback text to 4,000 (``chat.update``'s
limit, the stricter of the two calls), and a message to 50 blocks.  Text that
came from a host or a person is escaped for mrkdwn (``&``, ``<``, ``>``), so
output can never ping ``@channel`` or forge a link; code blocks also lose any
triple backtick that would close them early.

A cut never ends mid-token (``cut``): it backs off to a word boundary, and never
leaves a backtick, a code fence, an ``&entity;`` or a ``<link>`` open.  What an
approver approves is never cut at all: a host list or a command that does not fit
the card is summarised truthfully ("64 hosts: `a` … `z`, 1 at a time, full list in
the thread"), and ``card_hides_plan`` tells the front end to post the complete plan
(``full_plan``) in the card's thread before the card can be approved.

Action ids of the buttons are module constants: the handlers register on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.core import remote
from bot.core.health import HealthNote, Level
from bot.core.plan import (
    LOCAL_HOST_KEY,
    STEP_TITLES,
    SYSTEM_PREFIX,
    UNKNOWN_HOST_KEY,
    HostTarget,
    Plan,
    Step,
)
from bot.core.status import Action, HostStatus, RunStatus, StepStatus

Block = dict[str, Any]

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3_000
MAX_FIELD_TEXT = 2_000
MAX_FIELDS = 10
MAX_HEADER_TEXT = 150
MAX_CONTEXT_ELEMENTS = 10
MAX_BUTTON_TEXT = 75
MAX_MESSAGE_TEXT = 4_000
ELLIPSIS = "…"
FENCE = "```"

ACTION_APPROVE = "approve"
ACTION_DENY = "deny"
ACTION_CANCEL = "cancel"
# Issue 12: let a running run terminate the processes that outlived its service's stop.
ACTION_TERMINATE = "terminate_leftovers"

# A step summary comes from the engine and may quote host output: keep one line short.
_SUMMARY_CHARS = 300
# The plan's commands and the checklist may take this many sections each; the
# rest of the 50 blocks hold the header, facts, outcome and buttons.
_MAX_COMMAND_SECTIONS = 8
_MAX_CHECKLIST_SECTIONS = 30
# The complete plan goes in the thread as one message of this many code blocks at
# most; a longer one goes as a file.
_MAX_PLAN_SECTIONS = 12
# A version the host reported (not part of what is approved) is shown up to this long.
_VERSION_CHARS = 100
IN_THREAD = "full list in the thread"

_STEP_ICONS: dict[StepStatus, str] = {
    StepStatus.PENDING: ":white_circle:",
    StepStatus.RUNNING: ":hourglass_flowing_sand:",
    StepStatus.OK: ":white_check_mark:",
    StepStatus.FAILED: ":x:",
    StepStatus.SKIPPED: ":heavy_minus_sign:",
    StepStatus.INTERRUPTED: ":warning:",
}
_STATUS_ICONS: dict[RunStatus, str] = {
    RunStatus.PENDING_APPROVAL: ":raised_hand:",
    RunStatus.APPROVED: ":white_check_mark:",
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
_STATUS_WORDS: dict[RunStatus, str] = {
    RunStatus.PENDING_APPROVAL: "awaiting approval",
    RunStatus.APPROVED: "approved, starting",
    RunStatus.FAILED: "FAILED",
    RunStatus.ROLLED_BACK: "rolled back",
    RunStatus.ABORTED: "aborted (nothing changed)",
}  # the others read as their own word


@dataclass(frozen=True, slots=True)
class Message:
    text: str
    blocks: list[Block]


# ---- text helpers ------------------------------------------------------------------------


def escape(text: str) -> str:
    """Escape the three characters Slack's mrkdwn gives meaning to."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# How far back a cut may go to end at a word boundary; a longer token (a base64 blob,
# a run of one character) is cut inside, and the ellipsis shows it.
_WORD_BACKOFF = 200


def _safe_end(text: str, end: int) -> int:
    """Where to cut ``text`` at or before ``end`` so that the kept part ends at a word
    boundary and leaves no entity, link or backtick open. Each rule may move the cut into
    a word, so they apply again until none moves it."""
    while True:
        kept = text[:end]
        amp, lt = kept.rfind("&"), kept.rfind("<")
        space = max(kept.rfind(" "), kept.rfind("\n"))
        if (kept and end < len(text) and not text[end].isspace() and not kept[-1].isspace()
                and space >= max(end - _WORD_BACKOFF, 1)):
            new = space
        elif amp >= 0 and ";" not in kept[amp:]:
            new = amp  # never half of "&amp;"
        elif lt > kept.rfind(">"):
            new = lt  # never half of "<@U1>" or "<!date^…|…>"
        elif kept.replace(FENCE, "").count("`") % 2:
            # An open inline code span: drop it whole rather than let the rest render as code.
            new = kept.replace(FENCE, "\0\0\0").rfind("`")
        else:
            return end
        end = new


def cut(text: str, limit: int) -> str:
    """The start of ``text``, at most ``limit`` characters, ending in an ellipsis when cut.

    Cut where no token is split (see ``_safe_end``); a cut inside a code block
    closes the block."""
    if len(text) <= limit:
        return text
    room = max(limit - 1, 0)
    if text[:room].count(FENCE) % 2:
        # Inside a code block: keep room to close it after the ellipsis.
        room = max(room - len(FENCE) - 1, 0)
    kept = text[:_safe_end(text, room)].rstrip()
    if kept.count(FENCE) % 2:
        return f"{kept}{ELLIPSIS}\n{FENCE}"
    return kept + ELLIPSIS


def one_line(text: str, limit: int = _SUMMARY_CHARS) -> str:
    return cut(" ".join(text.split()), limit)


def mention(user: str) -> str:
    """``<@U123>`` for a Slack user id; other requesters (``cli:...``) as plain text."""
    if user[:1] in ("U", "W") and user.isalnum():
        return f"<@{user}>"
    return escape(user)


def mentions(users: Iterable[str]) -> str:
    return ", ".join(mention(u) for u in users) or "nobody yet"


def _code_safe(text: str) -> str:
    # A ``` inside the output would end the code block and let the rest render as mrkdwn.
    return escape(text.replace(FENCE, "'''"))


def code_tail(text: str, limit: int = MAX_SECTION_TEXT) -> tuple[str, bool]:
    """A code block (fences included) with as much of the end of ``text`` as fits in
    ``limit`` characters, cut at a line start; and whether anything was left out."""
    body = _code_safe(text.rstrip("\n")) or " "
    room = limit - 2 * len(FENCE) - 2
    if len(body) <= room:
        return f"{FENCE}\n{body}\n{FENCE}", False
    marker = f"{ELLIPSIS} (earlier output cut)\n"
    kept = body[len(body) - (room - len(marker)):]
    newline = kept.find("\n")
    if 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1:]
    return f"{FENCE}\n{marker}{kept}\n{FENCE}", True


def code_head(text: str, limit: int = MAX_SECTION_TEXT) -> tuple[str, bool]:
    """Like ``code_tail`` but keeps the start (tables, lists read top-down)."""
    body = _code_safe(text.rstrip("\n")) or " "
    room = limit - 2 * len(FENCE) - 2
    if len(body) <= room:
        return f"{FENCE}\n{body}\n{FENCE}", False
    marker = f"\n{ELLIPSIS} (cut; the full text is attached)"
    kept = body[: room - len(marker)]
    newline = kept.rfind("\n")
    if newline > 0:
        kept = kept[:newline]
    return f"{FENCE}\n{kept}{marker}\n{FENCE}", True


def _pack(lines: Sequence[str], limit: int, max_sections: int) -> list[str]:
    """Join lines into at most ``max_sections`` texts of at most ``limit`` characters."""
    chunks: list[str] = []
    current = ""
    for raw in lines:
        line = cut(raw, limit)
        if current and len(current) + 1 + len(line) > limit:
            chunks.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    if current:
        chunks.append(current)
    if len(chunks) > max_sections:
        dropped = sum(c.count("\n") + 1 for c in chunks[max_sections - 1:])
        chunks = [*chunks[: max_sections - 1], f"{ELLIPSIS} {dropped} more lines not shown"]
    return chunks


# ---- block helpers -----------------------------------------------------------------------


def section(text: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text or " ",
                                                                       MAX_SECTION_TEXT)}}


def header(text: str) -> Block:
    return {"type": "header",
            "text": {"type": "plain_text", "text": cut(text or " ", MAX_HEADER_TEXT)}}


def context(*texts: str) -> Block:
    elements = [{"type": "mrkdwn", "text": cut(t, MAX_SECTION_TEXT)} for t in texts if t]
    return {"type": "context", "elements": elements[:MAX_CONTEXT_ELEMENTS] or
            [{"type": "mrkdwn", "text": " "}]}


def fields(pairs: Sequence[tuple[str, str]]) -> Block:
    return {"type": "section", "fields": [
        {"type": "mrkdwn", "text": cut(f"*{label}*\n{value}", MAX_FIELD_TEXT)}
        for label, value in pairs[:MAX_FIELDS]]}


def button(text: str, action_id: str, value: str, *, style: str | None = None,
           confirm: dict[str, Any] | None = None) -> Block:
    b: Block = {"type": "button", "action_id": action_id, "value": value,
                "text": {"type": "plain_text", "text": cut(text, MAX_BUTTON_TEXT)}}
    if style is not None:
        b["style"] = style
    if confirm is not None:
        b["confirm"] = confirm
    return b


def confirm_dialog(title: str, text: str, yes: str, no: str = "Back") -> dict[str, Any]:
    return {"title": {"type": "plain_text", "text": cut(title, 100)},
            "text": {"type": "mrkdwn", "text": cut(text, 300)},
            "confirm": {"type": "plain_text", "text": cut(yes, 30)},
            "deny": {"type": "plain_text", "text": cut(no, 30)},
            "style": "danger"}


def message(text: str, blocks: Sequence[Block]) -> Message:
    """Cap the fallback text and the block count; the last kept block says what was cut."""
    out = list(blocks)
    if len(out) > MAX_BLOCKS:
        # Buttons matter more than the middle of a long checklist: every block with one
        # (the last actions block, each host's Terminate list) is kept, in its place.
        room = MAX_BLOCKS - 1 - sum(map(_has_button, out))  # plain blocks before the note
        kept: list[Block] = []
        note, dropped = 0, 0
        for block in out:
            if _has_button(block) or room > 0:
                room -= not _has_button(block)
                kept.append(block)
                continue
            if not dropped:
                note = len(kept)
                kept.append(block)  # its place, for the note below
            dropped += 1
        kept[note] = context(f"{ELLIPSIS} {dropped} more blocks not shown")
        out = kept
    return Message(cut(text or " ", MAX_MESSAGE_TEXT), out)


def _has_button(block: Block) -> bool:
    return block.get("type") == "actions" or "accessory" in block


# ---- the run card --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepLine:
    """One row of the status card's checklist."""

    host: str
    step: Step
    state: StepStatus = StepStatus.PENDING
    duration_s: float | None = None
    summary: str = ""
    # While it runs: what it does now ("loading weights 60 % · 4m10s elapsed").
    progress: str = ""


@dataclass(frozen=True, slots=True)
class LeftoverAsk:
    """One host's question while its run waits to terminate the processes that outlived
    its service's stop (issue 17 F5): its own list and its own button, whose value names
    the run, the host and this question (``question``, a nonce made per question), so a
    press answers exactly the list shown beside it and no other host's."""

    host: str
    question: str
    text: str  # the list the approvers see: PIDs, names, memory, why they are the service's
    pids: tuple[int, ...]
    needed: int = 1  # the run's rule: min_approvals distinct approvers
    approvals: tuple[str, ...] = ()  # who pressed so far and still counts


def terminate_value(run_id: int, host: str, question: str) -> str:
    """The value of a host's Terminate button: ``<run>:<host>:<question>`` (host names
    hold no colon; a question id is URL-safe base64)."""
    return f"{run_id}:{host}:{question}"


@dataclass(frozen=True, slots=True)
class CardView:
    """Everything the run's card shows; the card is a pure function of it."""

    run_id: int
    plan: Plan
    requested_by: str
    status: RunStatus
    needed: int = 1
    approvals: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    version_now: str | None = None
    version_after: str | None = None
    expires_at: datetime | None = None
    steps: tuple[StepLine, ...] = ()
    summary: str | None = None
    cancel_requested_by: str | None = None
    notes: tuple[str, ...] = field(default=())
    # (host, state) once a host is done: its outcome, or NOT_STARTED for a host a
    # stopped rollout never reached.
    host_states: tuple[tuple[str, HostStatus], ...] = ()
    # While a run waits for approvers to let it terminate leftover processes: each
    # host's question (its list, its button, its approvals so far), in the order asked.
    leftovers: tuple[LeftoverAsk, ...] = ()
    # What the redeploy changes besides vLLM, from the dry run at request time
    # (bot.engine.preview.preview_lines): "! torch 2.9.1 → 2.10.0" lines (! = highlighted).
    packages: tuple[str, ...] = ()
    # The service's GPUs on hosts where they are not all ok, read at the request
    # (bot.engine.gpu_health): critical ones, the preflight will refuse.
    gpu_health: tuple[HealthNote, ...] = ()


_HEALTH_ICONS: dict[Level | None, str] = {Level.CRITICAL: ":no_entry:", Level.WARN: ":warning:",
                                          None: ":grey_question:"}
# A host's line is shown up to this long; the GPU check's step has every finding.
_HEALTH_LINE_CHARS = 1_500
_MAX_HEALTH_SECTIONS = 3


def gpu_health_blocks(notes: Sequence[HealthNote]) -> list[Block]:
    """A line per host whose GPUs are not all ok at the request (critical first), so
    approvers see a warning, a refusal to come, or a host nobody could read, before they
    approve: ``:warning: GPU health: gpu-node-1: GPU 3 warn: what (action)``."""
    lines = [f"{_HEALTH_ICONS.get(n.level, ':grey_question:')} GPU health: "
             f"{escape(one_line(n.text, _HEALTH_LINE_CHARS))}" for n in notes]
    return [section(c) for c in _pack(lines, MAX_SECTION_TEXT, _MAX_HEALTH_SECTIONS)]


def _packages(view: CardView) -> list[Block]:
    """The package change, so approvers see torch and the CUDA wheels move before they
    approve: the highlighted changes in a sentence, then every change in a code block."""
    if not view.packages:
        return []
    marked = [line[2:] for line in view.packages if line.startswith("! ")]
    head = "*Package changes (dry run at request)*"
    if marked:
        head += "\n:warning: Also changes " + ", ".join(f"*{escape(m)}*" for m in marked[:6])
        head += f" and {len(marked) - 6} more highlighted" if len(marked) > 6 else ""
    code, _ = code_head("\n".join(view.packages))
    return [section(head), section(code)]


def initial_steps(plan: Plan) -> tuple[StepLine, ...]:
    return tuple(StepLine(host, s.step) for host in plan.hosts for s in plan.steps)


def _what(plan: Plan) -> str:
    what = f"{plan.action} {plan.service}"
    return what + (" (dry run)" if plan.dry_run else "")


def _plan_value(label: str, value: str) -> tuple[str, bool]:
    """A field's value from the plan, whole, or (when it cannot fit) a note saying where
    it is whole; and whether it was replaced. Never a cut: half a URL or spec could be
    read as the whole."""
    if len(f"*{label}*\n{value}") <= MAX_FIELD_TEXT:
        return value, False
    return f"{len(value):,} characters: too long for the card, in full in the thread", True


def _package(view: CardView) -> str:
    plan = view.plan
    now = one_line(view.version_now, _VERSION_CHARS) if view.version_now else (
        "unknown until preflight")
    if plan.action == Action.REDEPLOY:
        target = plan.version or "latest"
        line = f"`{escape(plan.package)}` {escape(now)} → {escape(target)}"
        if view.version_after:
            line += f" (now {escape(one_line(view.version_after, _VERSION_CHARS))})"
        return line
    return f"`{escape(plan.package)}` {escape(now)} (unchanged)"


def _key_text(host_key: str) -> str:
    if host_key == UNKNOWN_HOST_KEY:
        return "host key unknown"
    if host_key == LOCAL_HOST_KEY:
        return ""
    return " ".join(f"`{escape(k)}`" for k in host_key.split(","))


def host_line(name: str, target: HostTarget | None) -> str:
    """One host as the card shows it: name, ``user@address:port`` and the host key's
    fingerprint, whole (a shortened fingerprint could not be checked against
    ``ssh-keygen -lf``)."""
    if target is None:
        return f"`{escape(name)}`"
    return " ".join(p for p in (f"`{escape(name)}`", escape(target.endpoint),
                                _key_text(target.host_key)) if p)


def _targets(plan: Plan) -> dict[str, HostTarget]:
    return {t.host: t for t in plan.targets}


def _hosts(plan: Plan) -> tuple[str, bool]:
    """The Host(s) field: every host with where it points and its key, or, when that
    does not fit, a true summary (count, first and last, batch size) pointing to the
    thread; and whether it was summarised."""
    targets = _targets(plan)
    n = len(plan.hosts)
    batch = f" ({plan.batch_size} at a time)" if n > 1 else ""
    whole = "\n".join(host_line(h, targets.get(h)) for h in plan.hosts) + batch
    if len(f"*Host(s)*\n{whole}") <= MAX_FIELD_TEXT:
        return whole, False
    first, last = (f"`{escape(h)}`" for h in (plan.hosts[0], plan.hosts[-1]))
    names = first if n == 1 else f"{first}, {last}" if n == 2 else f"{first} {ELLIPSIS} {last}"
    at_a_time = f", {plan.batch_size} at a time" if n > 1 else ""
    noun = "host" if n == 1 else "hosts"
    return f"{n} {noun}: {names}{at_a_time}, {IN_THREAD}", True


def _plan_fields(view: CardView) -> tuple[list[tuple[str, str]], bool]:
    """The fields that describe what is approved, and whether any was summarised."""
    plan = view.plan
    # By name and host: the URL may hold credentials (bot.core.remote.index_host).
    index = (f"`{escape(plan.index_name)}` ({escape(remote.index_host(plan.index_url or ''))})"
             if plan.index_name else "default")
    hosts, hidden = _hosts(plan)
    pairs = [("Host(s)", hosts)]
    for label, value in (("Unit", f"`{escape(plan.unit)}`"), ("Package", _package(view)),
                         ("Spec", f"`{escape(plan.spec)}`"), ("Index", index)):
        shown, replaced = _plan_value(label, value)
        pairs.append((label, shown))
        hidden = hidden or replaced
    return pairs, hidden


def _facts(view: CardView) -> Block:
    pairs, _ = _plan_fields(view)
    pairs.append(("Requested by", mention(view.requested_by)))
    # System decisions (a dry run's, a status query's) are in the audit log, not here.
    people = tuple(a for a in view.approvals if not a.startswith(SYSTEM_PREFIX))
    if view.status == RunStatus.PENDING_APPROVAL or people:
        noun = "approval" if view.needed == 1 else "approvals"
        pairs.append(("Approved by", f"{mentions(people)} "
                      f"({len(people)} of {view.needed} {noun})"))
    if view.denied_by:
        pairs.append(("Denied by", mentions(view.denied_by)))
    return fields(pairs)


def _command_lines(plan: Plan) -> list[str]:
    return [f"{i}. {STEP_TITLES[s.step]}: {s.command}" for i, s in enumerate(plan.steps, 1)]


def _commands_and_hidden(plan: Plan) -> tuple[list[Block], bool]:
    title = "*Commands, on each host in order*"
    lines = _command_lines(plan)
    text, cut_short = code_head("\n".join(lines))
    if not cut_short and len(text) < MAX_SECTION_TEXT - 100:
        return [section(f"{title}\n{text}")], False
    # Long commands: one code block per step; a command that does not fit one is named,
    # never cut (half a command reads as a different command).
    out = [section(title)]
    hidden = False
    for i, (line, step) in enumerate(zip(lines[:_MAX_COMMAND_SECTIONS], plan.steps,
                                         strict=False), 1):
        code, too_long = code_head(line)
        if too_long:
            hidden = True
            out.append(section(f"{i}. {escape(STEP_TITLES[step.step])}: a command of "
                               f"{len(step.command):,} characters, too long for the card: "
                               "in full in the thread"))
        else:
            out.append(section(code))
    if len(lines) > _MAX_COMMAND_SECTIONS:
        hidden = True
        out.append(context(f"{ELLIPSIS} {len(lines) - _MAX_COMMAND_SECTIONS} more steps, "
                           "in full in the thread"))
    return out, hidden


def _commands(plan: Plan) -> list[Block]:
    return _commands_and_hidden(plan)[0]


def card_hides_plan(view: CardView) -> bool:
    """Whether the card summarises any part of the plan (hosts, a field, a command): then
    the complete plan (``full_plan``) must be in its thread before anyone may approve."""
    return _plan_fields(view)[1] or _commands_and_hidden(view.plan)[1]


def full_plan(run_id: int, plan: Plan) -> str:
    """The complete plan as plain text, every host and command whole: what the card's
    thread holds when the card had to summarise."""
    targets = _targets(plan)
    n = len(plan.hosts)
    lines = [f"Run #{run_id}: {_what(plan)}: the complete plan", ""]
    lines.append(f"Hosts: {n}, {plan.batch_size} at a time, in this order:" if n > 1
                 else "Host:")
    width = len(str(n))
    for i, name in enumerate(plan.hosts, 1):
        t = targets.get(name)
        where = "" if t is None else (
            f"  {t.endpoint}  host key {t.host_key}"
            + (f"  key file {t.key_file}" if t.key_file else ""))
        lines.append(f"  {i:>{width}}. {name}{where}")
    target = f" → {plan.version or 'latest'}" if plan.action == Action.REDEPLOY else ""
    index = (f"{plan.index_name} ({remote.index_host(plan.index_url or '')})"
             if plan.index_name else "default")
    lines += ["", f"Unit: {plan.unit}", f"Package: {plan.package}{target}",
              f"Spec: {plan.spec}", f"Index: {index}", "", "Commands, on each host in order:",
              *(f"  {line}" for line in _command_lines(plan))]
    return "\n".join(lines)


def full_plan_message(run_id: int, plan: Plan) -> Message | None:
    """``full_plan`` as a thread reply of code blocks, each within a section's limit and
    split between lines; None when it does not fit one message (a line longer than a
    block, or too many blocks): then it goes as a file."""
    room = MAX_SECTION_TEXT - 2 * len(FENCE) - 2
    chunks: list[str] = []
    for line in _code_safe(full_plan(run_id, plan)).split("\n"):
        if len(line) > room:
            return None
        if chunks and len(chunks[-1]) + 1 + len(line) <= room:
            chunks[-1] += f"\n{line}"
        else:
            chunks.append(line or " ")
    if len(chunks) > _MAX_PLAN_SECTIONS:
        return None
    head = section(f"*The complete plan of run #{run_id}*: the card shows a summary; "
                   "an approval approves all of this.")
    return message(f"Run #{run_id}: the complete plan ({len(plan.hosts)} hosts, "
                   f"{len(plan.steps)} steps)",
                   [head, *(section(f"{FENCE}\n{c}\n{FENCE}") for c in chunks)])


def full_plan_note(run_id: int) -> Message:
    """Follows the file with the complete plan (too long for one message)."""
    text = (f"*The complete plan of run #{run_id}* is in the file above: the card shows a "
            "summary; an approval approves all of it.")
    return message(f"Run #{run_id}: the complete plan is attached", [section(text)])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f" ({seconds:.1f}s)"
    minutes, secs = divmod(int(seconds), 60)
    return f" ({minutes}m{secs:02d}s)"


def _step_line(line: StepLine) -> str:
    title = escape(STEP_TITLES.get(line.step, str(line.step)))
    if line.state == StepStatus.RUNNING:
        title = f"*{title}*"
    text = f"{_STEP_ICONS.get(line.state, '')} {title}{_duration(line.duration_s)}"
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
        lines.extend(_step_line(s) for s in view.steps if s.host == host)
    return [section(chunk) for chunk in _pack(lines, MAX_SECTION_TEXT, _MAX_CHECKLIST_SECTIONS)]


def _expiry(view: CardView) -> str:
    if view.expires_at is None:
        return ""
    stamp = int(view.expires_at.timestamp())
    fallback = view.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"Expires <!date^{stamp}^{{date_short_pretty}} {{time}}|{fallback}>"


def run_card(view: CardView) -> Message:
    """The approval card while pending; the live status card after; the outcome at the end."""
    status = view.status
    icon = _STATUS_ICONS.get(status, "")
    word = _STATUS_WORDS.get(status, status)
    title = f"Run #{view.run_id}: {_what(view.plan)} — {word}"
    blocks: list[Block] = [header(title), _facts(view)]
    if status == RunStatus.PENDING_APPROVAL:
        blocks.extend(gpu_health_blocks(view.gpu_health))
        blocks.extend(_packages(view))
        blocks.extend(_commands(view.plan))
        blocks.append(context(f"Needs {view.needed} approver(s); the requester cannot approve "
                              "their own run unless the policy allows it.", _expiry(view),
                              *(escape(n) for n in view.notes)))
        blocks.append({"type": "actions", "block_id": f"run-{view.run_id}", "elements": [
            button("Approve", ACTION_APPROVE, str(view.run_id), style="primary"),
            button("Deny", ACTION_DENY, str(view.run_id), style="danger",
                   confirm=confirm_dialog(f"Deny run #{view.run_id}?",
                                          f"This closes the request to {escape(_what(view.plan))}.",
                                          "Deny")),
        ]})
        text = (f"Approval needed: run #{view.run_id} {_what(view.plan)} ({view.plan.spec}) "
                f"requested by {mention(view.requested_by)}")
        return message(text, blocks)
    if view.steps and status not in (RunStatus.DENIED, RunStatus.EXPIRED) and not (
            status == RunStatus.CANCELLED
            and all(s.state == StepStatus.PENDING for s in view.steps)):
        blocks.extend(_checklist(view))
    else:
        blocks.extend(_commands(view.plan))
    outcome = f"{icon} *{escape(word)}*"
    if view.summary:
        outcome += f": {escape(cut(view.summary, MAX_SECTION_TEXT - 200))}"
    blocks.append(section(outcome))
    notes = [escape(n) for n in view.notes]
    if view.cancel_requested_by and status in (RunStatus.APPROVED, RunStatus.RUNNING):
        notes.append(f"Cancel requested by {mention(view.cancel_requested_by)}: the run stops "
                     "at its next safe point.")
    if notes:
        blocks.append(context(*notes))
    if status in (RunStatus.APPROVED, RunStatus.RUNNING) and view.cancel_requested_by is None:
        blocks.extend(_leftovers(view))
        blocks.append({"type": "actions", "block_id": f"run-{view.run_id}", "elements": [
            button("Cancel", ACTION_CANCEL, str(view.run_id), style="danger",
                   confirm=confirm_dialog(f"Cancel run #{view.run_id}?",
                                          "The run stops at its next safe point; a reinstall "
                                          "in progress is never cut in half.",
                                          "Cancel the run", "Keep running")),
        ]})
    text = f"{icon} Run #{view.run_id} {_what(view.plan)}: {word}"
    if view.summary:
        text += f" — {escape(view.summary)}"
    return message(text, blocks)


# ---- thread replies and answers --------------------------------------------------------------


def step_reply(line: StepLine, output: str, *, full_log_attached: bool) -> Message:
    """A thread reply for one finished step: its line, then the end of its output."""
    title = STEP_TITLES.get(line.step, str(line.step))
    head = f"`{escape(line.host)}` {_step_line(line)}"
    blocks = [section(head)]
    if output.strip():
        code, truncated = code_tail(output)
        blocks.append(section(code))
        if truncated or full_log_attached:
            blocks.append(context("The full output is attached below."
                                  if full_log_attached else "Earlier output was cut."))
    state = line.state if line.state == StepStatus.OK else line.state.upper()
    return message(f"{line.host}: {title} {state}{_duration(line.duration_s)}", blocks)


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
    lines = _code_safe(body.rstrip("\n")).split("\n")
    for i, raw in enumerate(lines):
        line = cut(raw, room) or " "
        if chunks and len(chunks[-1]) + 1 + len(line) <= room:
            chunks[-1] += f"\n{line}"
        elif len(chunks) < _MAX_PLAN_SECTIONS:
            chunks.append(line)
        else:
            left = len(lines) - i
            chunks.append(f"{ELLIPSIS} {left} more line{'s' if left != 1 else ''}")
            break
    blocks = [section(f"*{escape(title)}*"), *(section(f"{FENCE}\n{c}\n{FENCE}")
                                               for c in chunks[:_MAX_PLAN_SECTIONS])]
    if len(chunks) > _MAX_PLAN_SECTIONS:
        blocks.append(context(f"{escape(chunks[-1])} not shown: {rest}"))
    return message(title, blocks)


def fits_code_block(body: str) -> bool:
    return not code_head(body)[1]


def outcome_reply(view: CardView) -> Message:
    """The thread's last word on a run: status and summary."""
    word = _STATUS_WORDS.get(view.status, view.status)
    text = f"{_STATUS_ICONS.get(view.status, '')} Run #{view.run_id} {_what(view.plan)}: {word}"
    body = f"{_STATUS_ICONS.get(view.status, '')} *Run #{view.run_id} {escape(word)}*"
    if view.summary:
        body += f": {escape(cut(view.summary, MAX_SECTION_TEXT - 200))}"
        text += f" — {escape(view.summary)}"
    if view.version_now or view.version_after:
        body += (f"\n`{escape(view.plan.package)}` {escape(view.version_now or '?')} → "
                 f"{escape(view.version_after or '?')}")
    return message(text, [section(body)])


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
    blocks = [section(":warning: *Leftover processes hold the service's GPUs.* Approvers "
                      "may terminate each host's list with the button beside it; that host "
                      "then goes on. Nobody pressing in time ends that host's run with its "
                      "service stopped.")]
    shown = view.leftovers[:_MAX_ASKS]
    blocks += [_ask_block(view.run_id, ask) for ask in shown]
    if len(view.leftovers) > len(shown):
        more = len(view.leftovers) - len(shown)
        blocks.append(context(f"{more} more host(s) wait with leftover processes: each list "
                              "shows here, with its button, once one above is answered (every "
                              "list is in the thread now)."))
    return blocks


def _ask_block(run_id: int, ask: LeftoverAsk) -> Block:
    code, _ = code_head(ask.text, MAX_SECTION_TEXT - _ASK_HEAD_CHARS)
    noun = "approval" if ask.needed == 1 else "approvals"
    progress = f"{len(ask.approvals)} of {ask.needed} {noun}"
    if ask.approvals:
        progress += f" ({mentions(ask.approvals)})"
    pids = ", ".join(map(str, ask.pids))
    block = section(f"*{escape(ask.host)}*: {len(ask.pids)} process"
                    f"{'es' if len(ask.pids) != 1 else ''} · {progress}\n{code}")
    block["block_id"] = f"leftovers-{ask.question}"
    block["accessory"] = button(
        "Terminate leftover processes", ACTION_TERMINATE,
        terminate_value(run_id, ask.host, ask.question), style="primary",
        confirm=confirm_dialog(f"Terminate on {ask.host}?",
                               f"PIDs {escape(pids)} on {escape(ask.host)}: SIGTERM, then "
                               "SIGKILL to those that remain, each only if it is still the "
                               "same process.", "Terminate"))
    return block


def leftovers_reply(text: str) -> Message:
    """The thread's copy of what an approver is asked to terminate."""
    code, _ = code_head(text)
    # The fallback text is what notifications show, and mrkdwn there too: the host's
    # text is escaped like everywhere else, or a process name could ping the channel.
    return message(one_line(escape(text), MAX_MESSAGE_TEXT),
                   [section(":warning: *Waiting for an approver:* press *Terminate leftover "
                            "processes* on the card to end these, or Cancel."), section(code)])


def notice_reply(text: str) -> Message:
    """Something about the run that is no step of it (``events.Notice``)."""
    return message(one_line(escape(text), MAX_MESSAGE_TEXT),
                   [section(f":warning: {escape(text)}")])


def cancel_reply(user: str) -> Message:
    return message(f"Cancel requested by {user}",
                   [section(f":no_entry_sign: Cancel requested by {mention(user)}: the run stops "
                            "at its next safe point.")])


def attachment_refused(title: str, chars: int, *, too_large: bool) -> Message:
    """Follows a reply that promised an attached file Slack then refused: only the end of
    the output, already in that reply, is in the thread."""
    why = "as too large" if too_large else "for good"
    text = (f":warning: The full {escape(title)} ({chars:,} characters) could not be "
            f"attached: Slack refused the file {why}. Only its end, above, is in the thread.")
    return message(f"{title}: not attached", [section(text)])
