"""``/vllm undrain <service> <host>``: post the plan (readiness, then that replica back
in its router's rotation) for approval."""

from __future__ import annotations

from bot.core.status import Action
from bot.slack.grammar import Undrain
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Undrain) -> None:
    await ask_for_approval(
        req, req.plan(Action.UNDRAIN, cmd.service, host=cmd.host), Action.UNDRAIN
    )
