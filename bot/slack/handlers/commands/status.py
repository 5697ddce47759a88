"""``/vllm status [service]``: the engine's read-only status action for one service
(or every service), the answer posted in the channel.

A read, not a run: nothing is recorded in the audit log, nobody is asked, and
anyone in the channel may ask (it changes nothing).
"""

from __future__ import annotations

import asyncio

from bot.core.startup import history_line
from bot.core.status import Action
from bot.engine.status_query import query
from bot.slack.grammar import Status
from bot.slack.handlers.common import CommandRequest, post_code


async def _one(req: CommandRequest, service: str) -> str:
    # A read, not a run: nothing is recorded, nobody is asked (bot.engine.status_query).
    answer = await query(req.engine, req.plan(Action.STATUS, service))
    history = history_line(await req.audit.start_history(service))
    return f"== {service}\n{answer.text}\n{history}"


async def handle(req: CommandRequest, cmd: Status) -> None:
    services = [cmd.service] if cmd.service else sorted(req.settings.services)
    await req.ack()

    async def work() -> None:
        if not services:
            await req.tell("No services are configured.")
            return
        parts = await asyncio.gather(*(_one(req, s) for s in services))
        title = f"Status: {cmd.service}" if cmd.service else "Status: all services"
        await post_code(req, title, "\n\n".join(parts), filename="status.txt")

    req.later(work(), "status")
