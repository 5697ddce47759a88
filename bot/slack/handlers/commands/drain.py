"""``/vllm drain <service> <host>``: post the plan (take that replica out of its router's
rotation) for approval."""

from __future__ import annotations

from bot.core.status import Action
from bot.slack.grammar import Drain
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Drain) -> None:
    await ask_for_approval(req, req.plan(Action.DRAIN, cmd.service, host=cmd.host), Action.DRAIN)
