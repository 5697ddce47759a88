"""``/vllm rotation <service>``: each replica in or out of its router's rotation, its
sessions and its own health, posted in the channel. A read, not a run, as ``/vllm
status`` is: nothing is recorded and nobody is asked (``bot.engine.status_query``)."""

from __future__ import annotations

from bot.core.status import Action
from bot.engine.status_query import query, router_line
from bot.slack.grammar import Rotation
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Rotation) -> None:
    plan = req.plan(Action.ROTATION, cmd.service)
    await req.ack()

    async def work() -> None:
        answer = await query(req.engine, plan, tables=False, with_status=False)
        await post_code(
            req,
            f"Rotation: {cmd.service}",
            "\n".join([router_line(plan), *sorted(answer.lines)]),
            filename="rotation.txt",
        )

    req.later(work(), "rotation")
