"""``/vllm releases <service>``: each host's side-by-side releases (issue 20, item 3),
newest first, with when each was built and which one is live."""

from __future__ import annotations

from bot.engine.releases import releases_text
from bot.slack.grammar import Releases
from bot.slack.handlers.common import CommandRequest, post_code


async def handle(req: CommandRequest, cmd: Releases) -> None:
    await req.ack()

    async def work() -> None:
        text, _ = await releases_text(req.settings, req.pool, cmd.service)
        await post_code(
            req, f"releases: {cmd.service}", text, filename=f"{cmd.service}-releases.txt"
        )

    req.later(work(), "releases")
