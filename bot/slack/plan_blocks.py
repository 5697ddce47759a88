"""What an approver approves, as the card shows it and as the thread holds it whole.

What is approved is never cut: a host list or a command that does not fit the card is
summarised truthfully ("64 hosts: `a` … `z`, 1 at a time, full list in the thread"),
and ``card_hides_plan`` tells the front end to post the complete plan (``full_plan``) in
the card's thread before the card can be approved.
"""

from __future__ import annotations

from bot.core import remote
from bot.core.plan import (
    LOCAL_HOST_KEY,
    STEP_TITLES,
    UNKNOWN_HOST_KEY,
    HostTarget,
    Plan,
)
from bot.core.status import Action
from bot.slack.block_kit import (
    ELLIPSIS,
    FENCE,
    MAX_FIELD_TEXT,
    MAX_PLAN_SECTIONS,
    MAX_SECTION_TEXT,
    Block,
    Message,
    code_head,
    code_safe,
    context,
    escape,
    message,
    one_line,
    section,
)
from bot.slack.card_view import CardView

# The plan's commands and the checklist may take this many sections each; the
# rest of the 50 blocks hold the header, facts, outcome and buttons.
_MAX_COMMAND_SECTIONS = 8
# A version the host reported (not part of what is approved) is shown up to this long.
_VERSION_CHARS = 100
IN_THREAD = "full list in the thread"


def what_of(plan: Plan) -> str:
    if plan.action.host_wide:
        return f"host {'reboot' if plan.action == Action.REBOOT else 'gpu-reset'} {plan.hosts[0]}"
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
    now = (
        one_line(view.version_now, _VERSION_CHARS)
        if view.version_now
        else ("unknown until preflight")
    )
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
    return " ".join(
        p for p in (f"`{escape(name)}`", escape(target.endpoint), _key_text(target.host_key)) if p
    )


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


def plan_fields(view: CardView) -> tuple[list[tuple[str, str]], bool]:
    """The fields that describe what is approved, and whether any was summarised."""
    plan = view.plan
    # By name and host: the URL may hold credentials (bot.core.remote.index_host).
    index = (
        f"`{escape(plan.index_name)}` ({escape(remote.index_host(plan.index_url or ''))})"
        if plan.index_name
        else "default"
    )
    hosts, hidden = _hosts(plan)
    pairs = [("Host(s)", hosts)]
    fields = (
        _host_run_fields(plan)
        if plan.action.host_wide
        else (
            ("Unit", f"`{escape(plan.unit)}`"),
            ("Package", _package(view)),
            ("Spec", f"`{escape(plan.spec)}`"),
            ("Index", index),
        )
    )
    for label, value in fields:
        shown, replaced = _plan_value(label, value)
        pairs.append((label, shown))
        hidden = hidden or replaced
    return pairs, hidden


def host_run_lines(plan: Plan) -> list[tuple[str, str]]:
    """A host run's own fields, plain: each service it stops (and starts again), with its
    unit and router, and the GPUs a reset names (issue 23)."""
    services = "\n".join(
        f"{p.service} (unit {p.unit}"
        + (f", out of router {p.router.name} first" if p.router is not None else "")
        + ")"
        for p in plan.parts
    )
    out = [("Services stopped, then started again if they ran", services)]
    if plan.action == Action.GPU_RESET:
        gpus = ", ".join(map(str, plan.gpus)) if plan.gpus else "every GPU the host lists"
        out.append(("GPUs reset", gpus))
    return out


def _host_run_fields(plan: Plan) -> tuple[tuple[str, str], ...]:
    return tuple((label, escape(value)) for label, value in host_run_lines(plan))


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
    for i, (line, step) in enumerate(
        zip(lines[:_MAX_COMMAND_SECTIONS], plan.steps, strict=False), 1
    ):
        code, too_long = code_head(line)
        if too_long:
            hidden = True
            out.append(
                section(
                    f"{i}. {escape(STEP_TITLES[step.step])}: a command of "
                    f"{len(step.command):,} characters, too long for the card: "
                    "in full in the thread"
                )
            )
        else:
            out.append(section(code))
    if len(lines) > _MAX_COMMAND_SECTIONS:
        hidden = True
        out.append(
            context(
                f"{ELLIPSIS} {len(lines) - _MAX_COMMAND_SECTIONS} more steps, in full in the thread"
            )
        )
    return out, hidden


def command_blocks(plan: Plan) -> list[Block]:
    return _commands_and_hidden(plan)[0]


def card_hides_plan(view: CardView) -> bool:
    """Whether the card summarises any part of the plan (hosts, a field, a command): then
    the complete plan (``full_plan``) must be in its thread before anyone may approve."""
    return plan_fields(view)[1] or _commands_and_hidden(view.plan)[1]


def full_plan(run_id: int, plan: Plan) -> str:
    """The complete plan as plain text, every host and command whole: what the card's
    thread holds when the card had to summarise."""
    targets = _targets(plan)
    n = len(plan.hosts)
    lines = [f"Run #{run_id}: {what_of(plan)}: the complete plan", ""]
    lines.append(f"Hosts: {n}, {plan.batch_size} at a time, in this order:" if n > 1 else "Host:")
    width = len(str(n))
    for i, name in enumerate(plan.hosts, 1):
        t = targets.get(name)
        where = (
            ""
            if t is None
            else (
                f"  {t.endpoint}  host key {t.host_key}"
                + (f"  key file {t.key_file}" if t.key_file else "")
            )
        )
        lines.append(f"  {i:>{width}}. {name}{where}")
    target = f" → {plan.version or 'latest'}" if plan.action == Action.REDEPLOY else ""
    index = (
        f"{plan.index_name} ({remote.index_host(plan.index_url or '')})"
        if plan.index_name
        else "default"
    )
    own = (
        [f"{label}:\n{value}" for label, value in host_run_lines(plan)]
        if plan.action.host_wide
        else [
            f"Unit: {plan.unit}",
            f"Package: {plan.package}{target}",
            f"Spec: {plan.spec}",
            f"Index: {index}",
        ]
    )
    lines += [
        "",
        *own,
        "",
        "Commands, on each host in order:",
        *(f"  {line}" for line in _command_lines(plan)),
    ]
    return "\n".join(lines)


def full_plan_message(run_id: int, plan: Plan) -> Message | None:
    """``full_plan`` as a thread reply of code blocks, each within a section's limit and
    split between lines; None when it does not fit one message (a line longer than a
    block, or too many blocks): then it goes as a file."""
    room = MAX_SECTION_TEXT - 2 * len(FENCE) - 2
    chunks: list[str] = []
    for line in code_safe(full_plan(run_id, plan)).split("\n"):
        if len(line) > room:
            return None
        if chunks and len(chunks[-1]) + 1 + len(line) <= room:
            chunks[-1] += f"\n{line}"
        else:
            chunks.append(line or " ")
    if len(chunks) > MAX_PLAN_SECTIONS:
        return None
    head = section(
        f"*The complete plan of run #{run_id}*: the card shows a summary; "
        "an approval approves all of this."
    )
    return message(
        f"Run #{run_id}: the complete plan ({len(plan.hosts)} hosts, {len(plan.steps)} steps)",
        [head, *(section(f"{FENCE}\n{c}\n{FENCE}") for c in chunks)],
    )


def full_plan_note(run_id: int) -> Message:
    """Follows the file with the complete plan (too long for one message)."""
    text = (
        f"*The complete plan of run #{run_id}* is in the file above: the card shows a "
        "summary; an approval approves all of it."
    )
    return message(f"Run #{run_id}: the complete plan is attached", [section(text)])
