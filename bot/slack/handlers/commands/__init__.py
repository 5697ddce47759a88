"""``/vllm``: one listener that checks the channel, parses the text and dispatches
to the subcommand's module (one per file).

Whatever the outcome, the ack goes out first: an error or a refusal is the
ack's ephemeral text (and a refusals row, written after the ack); accepted
work continues in a task the ``SlackFrontEnd`` keeps.  Nothing here opens an SSH
connection: bad input never gets past ``parse_command``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond

from bot.engine.run_results import Refusal
from bot.errors import InputError
from bot.slack import grammar
from bot.slack.grammar import PREFIX, parse_command
from bot.slack.handlers.commands import (
    audit,
    cancel,
    doctor,
    drain,
    gpus,
    host,
    logs,
    redeploy,
    releases,
    restart,
    rollback,
    rotation,
    status,
    undrain,
)
from bot.slack.handlers.commands import help as help_command
from bot.slack.handlers.common import CommandRequest, front_end_of
from bot.slack.limits import LIMIT_KEY, UserRateLimit

Handler = Callable[[CommandRequest, Any], Awaitable[None]]

HANDLERS: dict[type, Handler] = {
    grammar.Help: help_command.handle,
    grammar.Redeploy: redeploy.handle,
    grammar.Restart: restart.handle,
    grammar.Rollback: rollback.handle,
    grammar.Status: status.handle,
    grammar.Rotation: rotation.handle,
    grammar.Drain: drain.handle,
    grammar.Undrain: undrain.handle,
    grammar.Gpus: gpus.handle,
    grammar.Logs: logs.handle,
    grammar.Releases: releases.handle,
    grammar.Audit: audit.handle,
    grammar.Cancel: cancel.handle,
    grammar.Doctor: doctor.handle,
    grammar.Host: host.handle,
}


# They need no approval and each posts an answer in the channel: a person may send only
# so many a minute (``bot.slack.limits``), so nobody can keep the channel's queue full.
READ_ONLY = (
    grammar.Status,
    grammar.Rotation,
    grammar.Gpus,
    grammar.Logs,
    grammar.Releases,
    grammar.Audit,
    grammar.Doctor,
)


def register(app: AsyncApp) -> None:
    app.command(PREFIX)(on_command)


def _channels(ids: list[str]) -> str:
    return ", ".join(f"<#{c}>" for c in ids)


async def on_command(
    ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext, respond: AsyncRespond
) -> None:
    text = str(command.get("text") or "")
    req = CommandRequest(
        front_end=front_end_of(context),
        user=str(command["user_id"]),
        channel=str(command["channel_id"]),
        typed=f"{PREFIX} {text}".strip(),
        ack=ack,
        respond=respond,
    )
    allowed = req.settings.slack.channels
    if allowed and req.channel not in allowed:
        await _refuse(
            req, f"`{PREFIX}` is only taken in {_channels(allowed)}.", Refusal.WRONG_CHANNEL
        )
        return
    try:
        parsed = parse_command(text, req.settings)
    except InputError as exc:
        await _refuse(req, str(exc), Refusal.BAD_INPUT)
        return
    if isinstance(parsed, READ_ONLY):
        limit = cast(UserRateLimit, context[LIMIT_KEY])
        wait_s = limit.take(req.user)
        if wait_s is not None:
            await _refuse(
                req,
                f"Slow down: each person may send {limit.per_minute} "
                f"read-only commands (`{PREFIX} status`, `gpus`, `logs`, "
                f"`releases`, `audit`, `doctor`) a minute. Try again in {wait_s} s.",
                Refusal.RATE_LIMITED,
            )
            return
    await HANDLERS[type(parsed)](req, parsed)


async def _refuse(req: CommandRequest, reason: str, code: Refusal) -> None:
    await req.reply_now(reason)
    req.front_end.spawn(
        req.front_end.refuse(
            user=req.user, channel=req.channel, command=req.typed, reason=reason, code=code
        ),
        name="refusal",
    )
