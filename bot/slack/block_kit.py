"""Block Kit primitives: Slack's limits, text made safe for mrkdwn, and the basic blocks.

Every builder stays within Slack's limits whatever the input: a section's text is cut
to 3,000 characters, a header to 150, the fallback text to 4,000 (``chat.update``'s
limit, the stricter of the two calls), and a message to 50 blocks.  Text that came from
a host or a person is escaped for mrkdwn (``&``, ``<``, ``>``), so output can never
ping ``@channel`` or forge a link; code blocks also lose any triple backtick that would
close them early.  A cut never ends mid-token (``cut``): it backs off to a word
boundary, and never leaves a backtick, a code fence, an ``&entity;`` or a ``<link>`` open.

Action ids of the buttons are module constants: the handlers register on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
# The complete plan (or a long answer) goes in the thread as one message of this many
# code blocks at most; a longer one goes as a file.
MAX_PLAN_SECTIONS = 12


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
        if (
            kept
            and end < len(text)
            and not text[end].isspace()
            and not kept[-1].isspace()
            and space >= max(end - _WORD_BACKOFF, 1)
        ):
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
    kept = text[: _safe_end(text, room)].rstrip()
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


def policy_mention(entry: str) -> str:
    """A policy entry as Slack shows it: ``<!subteam^S123>`` for a user group (its
    handle, kept current by Slack), ``<@U123>`` for a user."""
    if entry[:1] == "S" and entry.isalnum():
        return f"<!subteam^{entry}>"
    return mention(entry)


def who_may_approve(approvers: Iterable[str]) -> str:
    """Who a service's policy lets approve: its entries, or anyone when it lists none."""
    return ", ".join(policy_mention(a) for a in approvers) or "anyone"


def code_safe(text: str) -> str:
    # A ``` inside the output would end the code block and let the rest render as mrkdwn.
    return escape(text.replace(FENCE, "'''"))


def code_tail(text: str, limit: int = MAX_SECTION_TEXT) -> tuple[str, bool]:
    """A code block (fences included) with as much of the end of ``text`` as fits in
    ``limit`` characters, cut at a line start; and whether anything was left out."""
    body = code_safe(text.rstrip("\n")) or " "
    room = limit - 2 * len(FENCE) - 2
    if len(body) <= room:
        return f"{FENCE}\n{body}\n{FENCE}", False
    marker = f"{ELLIPSIS} (earlier output cut)\n"
    kept = body[len(body) - (room - len(marker)) :]
    newline = kept.find("\n")
    if 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1 :]
    return f"{FENCE}\n{marker}{kept}\n{FENCE}", True


def code_head(text: str, limit: int = MAX_SECTION_TEXT) -> tuple[str, bool]:
    """Like ``code_tail`` but keeps the start (tables, lists read top-down)."""
    body = code_safe(text.rstrip("\n")) or " "
    room = limit - 2 * len(FENCE) - 2
    if len(body) <= room:
        return f"{FENCE}\n{body}\n{FENCE}", False
    marker = f"\n{ELLIPSIS} (cut; the full text is attached)"
    kept = body[: room - len(marker)]
    newline = kept.rfind("\n")
    if newline > 0:
        kept = kept[:newline]
    return f"{FENCE}\n{kept}{marker}\n{FENCE}", True


def pack(lines: Sequence[str], limit: int, max_sections: int) -> list[str]:
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
        dropped = sum(c.count("\n") + 1 for c in chunks[max_sections - 1 :])
        chunks = [*chunks[: max_sections - 1], f"{ELLIPSIS} {dropped} more lines not shown"]
    return chunks


# ---- block helpers -----------------------------------------------------------------------


def section(text: str) -> Block:
    return {
        "type": "section",
        "text": {"type": "mrkdwn", "text": cut(text or " ", MAX_SECTION_TEXT)},
    }


def header(text: str) -> Block:
    return {
        "type": "header",
        "text": {"type": "plain_text", "text": cut(text or " ", MAX_HEADER_TEXT)},
    }


def context(*texts: str) -> Block:
    elements = [{"type": "mrkdwn", "text": cut(t, MAX_SECTION_TEXT)} for t in texts if t]
    return {
        "type": "context",
        "elements": elements[:MAX_CONTEXT_ELEMENTS] or [{"type": "mrkdwn", "text": " "}],
    }


def fields(pairs: Sequence[tuple[str, str]]) -> Block:
    return {
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": cut(f"*{label}*\n{value}", MAX_FIELD_TEXT)}
            for label, value in pairs[:MAX_FIELDS]
        ],
    }


def button(
    text: str,
    action_id: str,
    value: str,
    *,
    style: str | None = None,
    confirm: dict[str, Any] | None = None,
) -> Block:
    b: Block = {
        "type": "button",
        "action_id": action_id,
        "value": value,
        "text": {"type": "plain_text", "text": cut(text, MAX_BUTTON_TEXT)},
    }
    if style is not None:
        b["style"] = style
    if confirm is not None:
        b["confirm"] = confirm
    return b


def confirm_dialog(title: str, text: str, yes: str, no: str = "Back") -> dict[str, Any]:
    return {
        "title": {"type": "plain_text", "text": cut(title, 100)},
        "text": {"type": "mrkdwn", "text": cut(text, 300)},
        "confirm": {"type": "plain_text", "text": cut(yes, 30)},
        "deny": {"type": "plain_text", "text": cut(no, 30)},
        "style": "danger",
    }


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
