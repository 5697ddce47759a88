"""``/vllm restart <service> [--force]``: post the plan for approval."""

from __future__ import annotations

from bot.core.status import Action
from bot.slack.grammar import Restart
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Restart) -> None:
    await ask_for_approval(
        req, req.plan(Action.RESTART, cmd.service, force=cmd.force), Action.RESTART, cmd.when
    )
