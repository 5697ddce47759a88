"""``python -m bot``: the one place that picks a front end. With no command (or
``serve``) it runs the Slack bot; every other command is the terminal front end."""

from __future__ import annotations

from collections.abc import Sequence

from bot.cli.main import main as cli_main
from bot.settings import Settings


async def _serve(settings: Settings) -> int:
    # Imported only when serving: slack_bolt and aiohttp take a while to import.
    from bot.slack.app import serve

    return await serve(settings)


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(argv, serve=_serve)


if __name__ == "__main__":
    raise SystemExit(main())
