"""The run card's buttons: Approve, Deny (with a confirm dialog), Cancel, and Terminate
leftover processes (while a run waits for it)."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.slack.handlers.actions import approve, cancel, deny, terminate


def register(app: AsyncApp) -> None:
    approve.register(app)
    deny.register(app)
    cancel.register(app)
    terminate.register(app)
