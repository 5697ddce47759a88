"""The run card's buttons: Approve, Deny (with a confirm dialog) and Cancel."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.slack.handlers.actions import approve, cancel, deny


def register(app: AsyncApp) -> None:
    approve.register(app)
    deny.register(app)
    cancel.register(app)
