"""``/vllm restart <service>``: post the plan for approval."""

from __future__ import annotations

from bot.grammar import Restart
from handlers.common import CommandRequest


async def handle(req: CommandRequest, cmd: Restart) -> None:
    plan = req.ops.runtime.engine.plan("restart", cmd.service)
    await req.ack()

    async def work() -> None:
        answer = await req.ops.request(plan, user=req.user, channel=req.channel,
                                       command=req.typed)
        if answer:
            await req.tell(answer)

    req.later(work(), "restart")
