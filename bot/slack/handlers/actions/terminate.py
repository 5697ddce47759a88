"""A host's Terminate leftover processes button: only an approver may press it, and a
press answers that host's question only (its value: ``<run>:<host>:<question>``)."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond

from bot.slack.blocks import ACTION_TERMINATE
from bot.slack.grammar import run_id_of
from bot.slack.handlers.common import Click


def register(app: AsyncApp) -> None:
    app.action(ACTION_TERMINATE)(on_terminate)


def run_of_terminate(value: str) -> int | None:
    """The run a Terminate button names: its value's first field (a value of the old
    form, the run alone, still names it; the desk then finds no open question)."""
    return run_id_of(value.partition(":")[0])


async def on_terminate(
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    await ack()
    click = Click.of(body, context, respond, run_of=run_of_terminate)
    click.later(
        lambda run_id: click.front_end.terminate(
            run_id, click.value, user=click.user, channel=click.channel
        ),
        "terminate",
    )
