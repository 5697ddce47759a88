"""``/vllm help``: every subcommand with its usage, in ``grammar.COMMANDS`` order."""

from __future__ import annotations

from bot.slack.blocks import escape
from bot.slack.grammar import COMMANDS, Help, usage
from bot.slack.handlers.common import CommandRequest

DESCRIPTIONS: dict[str, str] = {
    "help": "this list",
    "redeploy": "stop, drain, reinstall, start and health-check, after approval "
                "(--dry-run: preflight only, no approval needed)",
    "restart": "stop, drain, start and health-check, after approval",
    "status": "unit state, installed version and GPU memory (read-only)",
    "gpus": "GPU memory on every host, one host, or a service's hosts",
    "logs": "the service's journal tail",
    "audit": "recent runs: who asked, who approved, what happened",
    "cancel": "cancel a pending or running run (requester or approvers)",
    "doctor": "check hosts and services end to end: SSH, host key, sudo rules, uv, GPUs, "
              "unit, venv, health URL, disk (read-only; requesters)",
}


def help_text() -> str:
    lines = ["*vllm-chatops commands*"]
    lines += [f"• `{escape(usage(name))}` — {DESCRIPTIONS[name]}" for name in COMMANDS]
    return "\n".join(lines)


async def handle(req: CommandRequest, cmd: Help) -> None:
    await req.reply_now(help_text())
