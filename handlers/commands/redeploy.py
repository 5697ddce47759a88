"""``/vllm redeploy <service> [--version V] [--index NAME] [--dry-run]``: post the plan
for approval (a dry run starts its preflight at once)."""

from __future__ import annotations

from bot.grammar import Redeploy
from handlers.common import CommandRequest


async def handle(req: CommandRequest, cmd: Redeploy) -> None:
    plan = req.ops.runtime.engine.plan("redeploy", cmd.service, version=cmd.version,
                                       index=cmd.index, dry_run=cmd.dry_run)
    await req.ack()

    async def work() -> None:
        answer = await req.ops.request(plan, user=req.user, channel=req.channel,
                                       command=req.typed)
        if answer:
            await req.tell(answer)

    req.later(work(), "redeploy")
