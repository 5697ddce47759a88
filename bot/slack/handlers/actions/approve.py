"""The Approve button: counts once per approver; the N-th distinct approval starts the run."""

from __future__ import annotations

from typing import Any

from bot.core.status import Decision
from bot.slack.blocks import ACTION_APPROVE
from bot.slack.handlers.common import Ack, Click, Respond


def register(app: Any) -> None:
    app.action(ACTION_APPROVE)(on_approve)


async def on_approve(ack: Ack, body: dict[str, Any], context: Any, respond: Respond) -> None:
    await ack()
    click = Click.of(body, context, respond)
    click.later(lambda run_id: click.front_end.decide(
        run_id, user=click.user, action=Decision.APPROVE, channel=click.channel), "approve")
