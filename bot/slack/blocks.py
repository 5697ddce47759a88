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

The pieces: ``block_kit`` (limits, safe text, the basic blocks), ``card_view`` (what
a card shows), ``plan_blocks`` (what is approved, whole or summarised), ``card_blocks``
(the run card) and ``thread_blocks`` (thread replies and answers). This module names
them all, as callers import them.
"""

from __future__ import annotations

from bot.slack.block_kit import (
    ACTION_APPROVE,
    ACTION_CANCEL,
    ACTION_DENY,
    ACTION_TERMINATE,
    ELLIPSIS,
    FENCE,
    MAX_BLOCKS,
    MAX_BUTTON_TEXT,
    MAX_CONTEXT_ELEMENTS,
    MAX_FIELD_TEXT,
    MAX_FIELDS,
    MAX_HEADER_TEXT,
    MAX_MESSAGE_TEXT,
    MAX_SECTION_TEXT,
    Block,
    Message,
    button,
    code_head,
    code_tail,
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
    section,
)
from bot.slack.card_blocks import (
    gpu_health_blocks,
    run_card,
)
from bot.slack.card_view import (
    CardView,
    LeftoverAsk,
    StepLine,
    initial_steps,
    terminate_value,
)
from bot.slack.plan_blocks import (
    IN_THREAD,
    card_hides_plan,
    full_plan,
    full_plan_message,
    full_plan_note,
    host_line,
)
from bot.slack.thread_blocks import (
    attachment_refused,
    cancel_reply,
    code_answer,
    code_pages_answer,
    fits_code_block,
    leftovers_reply,
    notice_reply,
    outcome_reply,
    rotation_reply,
    step_reply,
    tail_answer,
)

__all__ = [
    "ACTION_APPROVE",
    "ACTION_CANCEL",
    "ACTION_DENY",
    "ACTION_TERMINATE",
    "ELLIPSIS",
    "FENCE",
    "IN_THREAD",
    "MAX_BLOCKS",
    "MAX_BUTTON_TEXT",
    "MAX_CONTEXT_ELEMENTS",
    "MAX_FIELDS",
    "MAX_FIELD_TEXT",
    "MAX_HEADER_TEXT",
    "MAX_MESSAGE_TEXT",
    "MAX_SECTION_TEXT",
    "Block",
    "CardView",
    "LeftoverAsk",
    "Message",
    "StepLine",
    "attachment_refused",
    "button",
    "cancel_reply",
    "card_hides_plan",
    "code_answer",
    "code_head",
    "code_pages_answer",
    "code_tail",
    "confirm_dialog",
    "context",
    "cut",
    "escape",
    "fields",
    "fits_code_block",
    "full_plan",
    "full_plan_message",
    "full_plan_note",
    "gpu_health_blocks",
    "header",
    "host_line",
    "initial_steps",
    "leftovers_reply",
    "mention",
    "mentions",
    "message",
    "notice_reply",
    "one_line",
    "outcome_reply",
    "rotation_reply",
    "run_card",
    "section",
    "step_reply",
    "tail_answer",
    "terminate_value",
]
