"""The status card's Cancel button: same rules as ``/vllm cancel``."""

from __future__ import annotations

from typing import Any

from bot.slack.blocks import ACTION_CANCEL
from bot.slack.handlers.common import Ack, Click, Respond


def register(app: Any) -> None:
    app.action(ACTION_CANCEL)(on_cancel)


async def on_cancel(ack: Ack, body: dict[str, Any], context: Any, respond: Respond) -> None:
    await ack()
    click = Click.of(body, context, respond)
    click.later(lambda run_id: click.front_end.cancel(run_id, user=click.user,
                                                      channel=click.channel), "cancel")
