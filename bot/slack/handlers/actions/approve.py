"""The Approve button: counts once per approver; the N-th distinct approval starts the run."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond

from bot.core.status import Decision
from bot.slack.blocks import ACTION_APPROVE
from bot.slack.handlers.common import Click


def register(app: AsyncApp) -> None:
    app.action(ACTION_APPROVE)(on_approve)


async def on_approve(
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    await ack()
    click = Click.of(body, context, respond)
    click.later(
        lambda run_id: click.front_end.decide(
            run_id, user=click.user, action=Decision.APPROVE, channel=click.channel
        ),
        "approve",
    )
