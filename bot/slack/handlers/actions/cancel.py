"""The status card's Cancel button: same rules as ``/vllm cancel``."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond

from bot.slack.blocks import ACTION_CANCEL
from bot.slack.handlers.common import Click


def register(app: AsyncApp) -> None:
    app.action(ACTION_CANCEL)(on_cancel)


async def on_cancel(
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    await ack()
    click = Click.of(body, context, respond)
    click.later(
        lambda run_id: click.front_end.cancel(run_id, user=click.user, channel=click.channel),
        "cancel",
    )
