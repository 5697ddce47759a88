"""``/vllm logs <service> [-n N]``: the unit's journal tail from each of its hosts."""

from __future__ import annotations

import asyncio

from bot.core import remote
from bot.errors import HostError
from bot.slack.grammar import Logs
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Logs) -> None:
    svc = req.settings.services[cmd.service]
    argv = remote.journal_tail(svc, cmd.lines)
    await req.ack()

    async def one(host: str) -> str:
        try:
            result = await req.pool.get(host).run(argv, timeout_s=svc.command_timeout_s)
        except HostError as exc:
            return f"== {host}: unreachable: {exc.reason}"
        status = "" if result.ok else f" (exit {result.exit_status})"
        return f"== {host}{status}\n{result.output.rstrip()}"

    async def work() -> None:
        parts = await asyncio.gather(*(one(h) for h in svc.hosts))
        await post_code(req, f"journalctl -u {svc.unit} -n {cmd.lines}: {cmd.service}",
                        "\n\n".join(parts), filename=f"{cmd.service}-journal.log", tail=True)

    req.later(work(), "logs")
