"""``/vllm gpus [host|service] [--health]``: GPU memory and health across hosts, one
concurrent fan-out.

The answer always fits one message: a fleet too big for the per-GPU tables gets a
summary line and a line per host, with the full tables as a file in the thread; past
``SUMMARY_OVER_HOSTS`` hosts, the counts per state with the hosts that need a look named
(``bot.slack.fleet_blocks``), and the whole table as the file.
``--health``: each GPU's verdict, findings and NVIDIA's action, and the Xid lines.
``--deep``: the deep GPU check (``bot.engine.deep_check``), the same as the terminal's.
"""

from __future__ import annotations

from bot.engine.deep_check import deep_check, deep_summary, deep_text
from bot.hosts.fleet import fleet_gpus, fleet_message, health_details, resolve_targets
from bot.hosts.fleet_states import fleet_file, is_big
from bot.slack.blocks import code_answer, code_head
from bot.slack.fleet_blocks import fleet_summary_message
from bot.slack.grammar import Gpus
from bot.slack.handlers.common import CommandRequest

FILENAME = "gpus.txt"


async def handle(req: CommandRequest, cmd: Gpus) -> None:
    hosts = resolve_targets(req.settings, cmd.target)
    await req.ack()

    async def work() -> None:
        if cmd.deep:
            await _deep(req, hosts, cmd.target)
            return
        results = await fleet_gpus(req.settings, req.pool, hosts)
        title = f"GPUs: {cmd.kind} {cmd.target}" if cmd.target else "GPUs: all hosts"
        poster = req.poster
        if cmd.health:
            text = health_details(results)
            attach = code_head(text)[1]
            ts = await poster.post(
                req.channel,
                code_answer(f"GPU health: {cmd.target or 'all'}", text, attached=attach),
            )
            if attach:
                await poster.upload(
                    req.channel,
                    filename="gpu-health.txt",
                    content=text,
                    title="GPU health",
                    thread_ts=ts,
                )
            return
        if is_big(results):
            ts = await poster.post(req.channel, fleet_summary_message(title, results, FILENAME))
            await poster.upload(
                req.channel,
                filename=FILENAME,
                content=fleet_file(results),
                title=title,
                thread_ts=ts,
            )
            return
        answer = fleet_message(results)
        ts = await poster.post(
            req.channel, code_answer(title, answer.text, attached=answer.attachment is not None)
        )
        if answer.attachment is not None:
            await poster.upload(
                req.channel, filename=FILENAME, content=answer.attachment, title=title, thread_ts=ts
            )

    req.later(work(), "gpus")


async def _deep(req: CommandRequest, hosts: list[str], target: str | None) -> None:
    reports = await deep_check(req.settings, req.pool, req.audit, hosts)
    text = deep_text(reports)
    # Every line when it fits; else each host's verdict and what needs a look, failing
    # hosts first (cut, a later host's failure would be in the file only), and the file.
    attach = code_head(text)[1]
    body = deep_summary(reports) if attach else text
    title = f"Deep GPU check: {target or 'all hosts'}"
    ts = await req.poster.post(req.channel, code_answer(title, body, attached=attach))
    if attach:
        await req.poster.upload(
            req.channel, filename="gpu-deep.txt", content=text, title=title, thread_ts=ts
        )
