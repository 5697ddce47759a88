"""``/vllm cancel <run-id>``: by the requester or an approver."""

from __future__ import annotations

from bot.slack.grammar import Cancel
from bot.slack.handlers.common import CommandRequest


async def handle(req: CommandRequest, cmd: Cancel) -> None:
    await req.ack()

    async def work() -> None:
        await req.tell(await req.front_end.cancel(cmd.run_id, user=req.user, channel=req.channel))

    req.later(work(), "cancel")
