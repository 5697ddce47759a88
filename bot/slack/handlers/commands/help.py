"""``/vllm help``: every subcommand with its usage, in ``grammar.COMMANDS`` order."""

from __future__ import annotations

from bot.core.commands import Front, commands_of
from bot.slack.blocks import escape
from bot.slack.grammar import COMMANDS, Help, usage
from bot.slack.handlers.common import CommandRequest

# The /vllm help lines, from the one command table (bot.core.commands).
DESCRIPTIONS: dict[str, str] = {c.name: c.chat_help for c in commands_of(Front.CHAT)}


def help_text() -> str:
    lines = ["*vllm-chatops commands*"]
    lines += [f"• `{escape(usage(name))}` — {DESCRIPTIONS[name]}" for name in COMMANDS]
    return "\n".join(lines)


async def handle(req: CommandRequest, cmd: Help) -> None:
    await req.reply_now(help_text())
