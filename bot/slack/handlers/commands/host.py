"""``/vllm host reboot|gpu-reset <host> [GPU ...]``: post the host's maintenance plan (every
service on it stopped, the reboot or reset, the deep GPU check, the services started)
for approval (issue 23)."""

from __future__ import annotations

from bot.engine.host_runs import plan_host
from bot.slack.grammar import Host
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Host) -> None:
    plan = plan_host(req.engine.settings, cmd.action, cmd.host, cmd.gpus, cmd.force)
    await ask_for_approval(req, plan, f"host {cmd.action}", cmd.when)
