"""``/vllm help``: every subcommand with its usage, in ``grammar.COMMANDS`` order, then
who may approve each service (its own ``[services.NAME.policy]`` or ``[policy]``)."""

from __future__ import annotations

from bot.core.commands import Front, commands_of
from bot.settings import Settings
from bot.slack.block_kit import who_may_approve
from bot.slack.blocks import escape
from bot.slack.grammar import COMMANDS, Help, usage
from bot.slack.handlers.common import CommandRequest

# The /vllm help lines, from the one command table (bot.core.commands).
DESCRIPTIONS: dict[str, str] = {c.name: c.chat_help for c in commands_of(Front.CHAT)}


def approvers_text(settings: Settings) -> list[str]:
    """One line per service: who may approve its runs and how many must (issue 22)."""
    if not settings.services:
        return []
    lines = ["*Who may approve*"]
    for name in sorted(settings.services):
        policy = settings.policy_for(name)
        noun = "approval" if policy.min_approvals == 1 else "approvals"
        lines.append(
            f"`{escape(name)}`: {who_may_approve(policy.approvers)} "
            f"({policy.min_approvals} {noun} needed)"
        )
    return lines


def help_text(settings: Settings) -> str:
    lines = ["*vllm-chatops commands*"]
    lines += [f"• `{escape(usage(name))}` — {DESCRIPTIONS[name]}" for name in COMMANDS]
    lines += approvers_text(settings)
    return "\n".join(lines)


async def handle(req: CommandRequest, cmd: Help) -> None:
    await req.reply_now(help_text(req.settings))
