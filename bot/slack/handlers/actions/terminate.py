"""The status card's Terminate leftover processes button: only an approver may press it."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond

from bot.slack.blocks import ACTION_TERMINATE
from bot.slack.handlers.common import Click


def register(app: AsyncApp) -> None:
    app.action(ACTION_TERMINATE)(on_terminate)


async def on_terminate(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext,
                       respond: AsyncRespond) -> None:
    await ack()
    click = Click.of(body, context, respond)
    click.later(lambda run_id: click.front_end.terminate(run_id, user=click.user,
                                                         channel=click.channel), "terminate")
