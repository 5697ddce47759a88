"""Slack listeners: thin (parse, authorize, ack, hand the work to a task).

``register(app)`` wires every ``/vllm`` subcommand and every card button.
"""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.slack.handlers import actions, commands


def register(app: AsyncApp) -> None:
    commands.register(app)
    actions.register(app)
