"""``/vllm redeploy <service> [--version V] [--index NAME] [--dry-run] [--force]``: post
the plan for approval (a dry run starts its preflight at once)."""

from __future__ import annotations

from bot.core.status import Action
from bot.slack.grammar import Redeploy
from bot.slack.handlers.common import CommandRequest, ask_for_approval


async def handle(req: CommandRequest, cmd: Redeploy) -> None:
    plan = req.plan(
        Action.REDEPLOY,
        cmd.service,
        version=cmd.version,
        index=cmd.index,
        dry_run=cmd.dry_run,
        force=cmd.force,
    )
    await ask_for_approval(req, plan, Action.REDEPLOY, cmd.when)
