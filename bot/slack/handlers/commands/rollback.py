"""``/vllm rollback <service>``: post the plan (switch a side-by-side service back to its
previous release, then restart it) for approval."""

from __future__ import annotations

from bot.core.status import Action
from bot.slack.grammar import Rollback
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Rollback) -> None:
    await ask_for_approval(req, req.plan(Action.ROLLBACK, cmd.service), Action.ROLLBACK, cmd.when)
