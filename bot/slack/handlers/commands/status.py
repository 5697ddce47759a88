"""``/vllm status [service]``: the engine's read-only status action for one service
(or every service), the answer posted in the channel.

Each service's query is a run in the audit log (action ``status``), moved to
'approved' with a decision by ``system:read-only``: it changes nothing, so it
needs no approval.
"""

from __future__ import annotations

import asyncio
from typing import assert_never

from bot.core import events as ev
from bot.core.gpu import render_table
from bot.core.startup import history_line
from bot.core.status import Action
from bot.engine.operations import ChatUser, Requested
from bot.slack.grammar import Status
from bot.slack.handlers.common import CommandRequest, post_code


class Collect:
    """Keeps what a read-only run reports, for one answer at the end: each host's end
    (``with_status``: "host: succeeded: ..."), and its GPU table (``tables``)."""

    def __init__(self, *, tables: bool = True, with_status: bool = True) -> None:
        self.lines: list[str] = []
        self.tables = tables
        self.with_status = with_status

    async def handle(self, event: ev.Event) -> None:
        match event:
            case ev.HostFinished():
                status = f"{event.status}: " if self.with_status else ""
                self.lines.append(f"{event.host}: {status}{event.summary}")
            case ev.GpuTable():
                if self.tables:
                    self.lines.append(render_table(event.snapshot))
            # The answer is each host's end (and its GPU table); the rest is a run's live
            # news, which a one-shot answer does not show.
            case (
                ev.RunStarted()
                | ev.StepStarted()
                | ev.StepProgress()
                | ev.OutputLine()
                | ev.StepFinished()
                | ev.VersionsKnown()
                | ev.PackagesKnown()
                | ev.GpuHealthKnown()
                | ev.RunFinished()
                | ev.Notice()
                | ev.RotationChanged()
                | ev.ReleaseSwitched()
            ):
                pass
            case _:
                assert_never(event)


async def _one(req: CommandRequest, service: str) -> str:
    plan = req.plan(Action.STATUS, service)
    # The service has it approved by system:read-only: it asks nobody and takes no lock.
    asked = await req.operations.request(
        plan, by=ChatUser(req.user, req.channel, req.typed, req.front_end.membership)
    )
    if not isinstance(asked, Requested):
        return f"== {service}\n{asked.text}"
    record = asked.record
    sink = Collect()
    result = await req.engine.execute(record.id, sink)
    body = "\n".join(sink.lines) or result.summary
    history = history_line(await req.audit.start_history(service))
    return f"== {service} (run #{record.id}, {result.status})\n{body}\n{history}"


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
