"""``/vllm audit [service|run-id] [--limit N]``: the audit table, or one run with its
steps and what it did to the environment, in the channel."""

from __future__ import annotations

from bot.audit.view import run_view, runs_table
from bot.errors import RunNotFoundError
from bot.slack.grammar import Audit
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Audit) -> None:
    await req.ack()

    async def work() -> None:
        if cmd.run_id is not None:
            try:
                record = await req.audit.get_run(cmd.run_id)
            except RunNotFoundError:
                await req.tell(f"There is no run #{cmd.run_id} in the audit log.")
                return
            text = run_view(
                record,
                await req.audit.steps(record.id),
                await req.audit.environments(record.id),
                (await req.audit.release_switches([record.id])).get(record.id, []),
            )
            await post_code(req, f"Run #{record.id}", text, filename=f"run-{record.id}.txt")
            return
        records = await req.audit.list_runs(service=cmd.service, limit=cmd.limit)
        scope = cmd.service or "all services"
        await post_code(
            req,
            f"Audit log: {scope}, last {cmd.limit} runs",
            runs_table(records),
            filename="audit.txt",
        )

    req.later(work(), "audit")
