"""``/vllm gpus [host|service]``: GPU memory across hosts, one concurrent fan-out."""

from __future__ import annotations

from bot.fleet import fleet_gpus, render_fleet, resolve_targets
from bot.grammar import Gpus
from handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Gpus) -> None:
    hosts = resolve_targets(req.settings, cmd.target)
    await req.ack()

    async def work() -> None:
        results = await fleet_gpus(req.settings, req.ops.runtime.pool, hosts)
        title = f"GPUs: {cmd.kind} {cmd.target}" if cmd.target else "GPUs: all hosts"
        await post_code(req.ops, req.channel, title, render_fleet(results), filename="gpus.txt")

    req.later(work(), "gpus")
