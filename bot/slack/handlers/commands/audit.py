"""``/vllm audit [service] [--limit N]``: the audit table, in the channel."""

from __future__ import annotations

from bot.audit.view import runs_table
from bot.slack.grammar import Audit
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Audit) -> None:
    await req.ack()

    async def work() -> None:
        records = await req.audit.list_runs(service=cmd.service, limit=cmd.limit)
        scope = cmd.service or "all services"
        await post_code(req, f"Audit log: {scope}, last {cmd.limit} runs",
                        runs_table(records), filename="audit.txt")

    req.later(work(), "audit")
