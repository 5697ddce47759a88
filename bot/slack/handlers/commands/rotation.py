"""``/vllm rotation <service>``: each replica in or out of its router's rotation, its
sessions and its own health, posted in the channel. Read-only: a run in the audit log
(action ``rotation``) approved by ``system:read-only``, as ``/vllm status`` is."""

from __future__ import annotations

from bot.core.status import Action
from bot.engine.operations import ChatUser, Requested
from bot.slack.grammar import Rotation
from bot.slack.handlers.commands.status import Collect
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Rotation) -> None:
    plan = req.plan(Action.ROTATION, cmd.service)
    await req.ack()

    async def work() -> None:
        asked = await req.operations.request(
            plan, by=ChatUser(req.user, req.channel, req.typed, req.front_end.membership)
        )
        if not isinstance(asked, Requested):
            await req.tell(asked.text)
            return
        sink = Collect(tables=False, with_status=False)
        result = await req.engine.execute(asked.record.id, sink)
        assert plan.router is not None  # the grammar takes only services with a router
        r = plan.router
        head = f"router {r.name} ({r.kind}) on {r.host}, min_serving {r.min_serving}"
        body = "\n".join([head, *sorted(sink.lines)]) if sink.lines else result.summary
        await post_code(
            req,
            f"Rotation: {cmd.service} (run #{asked.record.id}, {result.status})",
            body,
            filename="rotation.txt",
        )

    req.later(work(), "rotation")
