"""``/vllm logs <service> [-n N]``: the unit's journal tail from each of its hosts."""

from __future__ import annotations

import asyncio

from bot.core import remote
from bot.core.become import become_for
from bot.core.privilege import run_as_of
from bot.engine.executor import run_command
from bot.errors import HostError
from bot.slack.grammar import Logs
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Logs) -> None:
    svc = req.settings.services[cmd.service]
    argv = remote.journal_tail(svc, cmd.lines)
    await req.ack()

    async def one(host: str) -> str:
        try:
            # As root under sudo on a non-root host: the same rule as the health gate's tail.
            result = await run_command(
                req.pool.get(host),
                become_for(req.settings, host, cmd.service),
                argv,
                run_as_of(argv),
                timeout_s=svc.command_timeout_s,
            )
        except HostError as exc:
            return f"== {host}: unreachable: {exc.reason}"
        status = (
            ""
            if result.ok
            else f" ({result.refused})"
            if result.refused
            else f" (exit {result.exit_status})"
        )
        return f"== {host}{status}\n{result.output.rstrip()}"

    async def work() -> None:
        parts = await asyncio.gather(*(one(h) for h in svc.hosts))
        await post_code(
            req,
            f"journalctl -u {svc.unit} -n {cmd.lines}: {cmd.service}",
            "\n\n".join(parts),
            filename=f"{cmd.service}-journal.log",
            tail=True,
        )

    req.later(work(), "logs")
