"""What every listener shares: the front end from bolt's context, the typed command's
context, ephemeral answers, and posting a code block (with the full text attached as a
file when it does not fit)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from slack_bolt.async_app import AsyncAck, AsyncBoltContext, AsyncRespond

from bot.audit.store import AuditLog
from bot.core.plan import Plan
from bot.core.status import Action
from bot.engine.engine import Engine
from bot.engine.operations import Operations
from bot.engine.run_results import Refusal
from bot.engine.schedule import Timing
from bot.errors import AuditError
from bot.hosts.pool import HostPool
from bot.settings import Settings
from bot.slack.blocks import Message, code_answer, code_head, escape, tail_answer
from bot.slack.front_end import CardRef, SlackFrontEnd
from bot.slack.grammar import AT_ONCE, When, run_id_of
from bot.slack.poster import Poster

log = logging.getLogger(__name__)

# The key under which create_app's middleware puts the SlackFrontEnd in bolt's context.
CONTEXT_KEY = "chatops"


def front_end_of(context: AsyncBoltContext) -> SlackFrontEnd:
    return cast(SlackFrontEnd, context[CONTEXT_KEY])


async def tell(front_end: SlackFrontEnd, respond: AsyncRespond, text: str) -> None:
    """An ephemeral answer to the person (through the response_url), redacted."""
    try:
        await respond(
            text=front_end.poster.redact(text), response_type="ephemeral", replace_original=False
        )
    except Exception:
        # A lost ephemeral note must not take the work it reports on down with it.
        log.exception("cannot send an ephemeral reply")


@dataclass(frozen=True)
class CommandRequest:
    """One ``/vllm`` command after the channel check and parsing, with what its
    listener needs at hand (settings, engine, operations, audit log, hosts, poster)."""

    front_end: SlackFrontEnd
    user: str
    channel: str
    typed: str
    ack: AsyncAck
    respond: AsyncRespond

    @property
    def settings(self) -> Settings:
        return self.front_end.runtime.settings

    @property
    def engine(self) -> Engine:
        return self.front_end.runtime.engine

    @property
    def operations(self) -> Operations:
        """Every change a command asks of a run goes through here."""
        return self.front_end.operations

    @property
    def audit(self) -> AuditLog:
        return self.front_end.runtime.audit

    @property
    def pool(self) -> HostPool:
        return self.front_end.runtime.pool

    @property
    def poster(self) -> Poster:
        # What a command posts itself is a read-only answer (cards go through the front
        # end): it waits behind any card or run update queued for the channel.
        return self.front_end.poster.answers()

    def plan(
        self,
        action: Action,
        service: str,
        *,
        version: str | None = None,
        index: str | None = None,
        dry_run: bool = False,
        force: bool = False,
        host: str | None = None,
    ) -> Plan:
        return self.engine.plan(
            action, service, version=version, index=index, dry_run=dry_run, force=force, host=host
        )

    async def reply_now(self, text: str) -> None:
        """The ack itself carries the ephemeral answer (help, errors)."""
        await self.ack(text=self.poster.redact(text))

    async def tell(self, text: str) -> None:
        await tell(self.front_end, self.respond, text)

    async def tell_message(self, msg: Message) -> None:
        """An ephemeral answer with blocks (a table), redacted: for the asker's eyes only."""
        text, blocks = self.front_end.poster.clean(msg)
        await self.respond(
            text=text, blocks=blocks, response_type="ephemeral", replace_original=False
        )

    def later(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Continue after the ack; whatever goes wrong, the person hears about it."""

        async def guarded() -> None:
            try:
                await coro
            except Exception as exc:
                log.exception("/vllm %s failed", name)
                await self.tell(f"`{escape(self.typed)}` failed: {escape(str(exc))}")

        self.front_end.spawn(guarded(), name=f"cmd-{name}")


async def ask_for_approval(
    req: CommandRequest, plan: Plan, name: str, when: When = AT_ONCE
) -> None:
    """Ack, then post the plan's approval card (or run a dry run) in the background;
    ``when``: its ``--at``/``--now``, judged against the service's windows."""
    await req.ack()

    async def work() -> None:
        answer = await req.front_end.request(
            plan,
            user=req.user,
            channel=req.channel,
            command=req.typed,
            timing=Timing(at=when.at, now=when.now),
        )
        if answer:
            await req.tell(answer)

    req.later(work(), name)


async def post_code(
    req: CommandRequest, title: str, body: str, *, filename: str, tail: bool = False
) -> str:
    """Post ``body`` in a code block in the request's channel; when it does not fit, the
    full text goes into the message's thread as a file. Returns the message ts."""
    poster = req.poster
    body = poster.redact(body)
    fits = not code_head(body)[1]
    msg = tail_answer(title, body) if tail else code_answer(title, body, attached=not fits)
    ts = await poster.post(req.channel, msg)
    if not fits:
        await poster.upload(req.channel, filename=filename, content=body, title=title, thread_ts=ts)
    return ts


def _agreed(*values: Any) -> str | None:
    """The one value the payload's places for it give, or None when it gives none or
    two different ones (a hand-made payload; Slack's own agree)."""
    given = {str(v) for v in values if v}
    return given.pop() if len(given) == 1 else None


@dataclass(frozen=True)
class Click:
    """One button click on a run card: who, where (the channel and the message the
    button was on), and which run its value names."""

    front_end: SlackFrontEnd
    user: str
    channel: str | None
    run_id: int | None
    respond: AsyncRespond
    message_ts: str | None = None
    value: str = ""  # the button's value as sent (a Terminate button's names more)

    @classmethod
    def of(
        cls,
        body: dict[str, Any],
        context: AsyncBoltContext,
        respond: AsyncRespond,
        *,
        run_of: Callable[[str], int | None] = run_id_of,
    ) -> Click:
        """``run_of`` reads the run id from the button's value (the whole value, but for
        a Terminate button's ``<run>:<host>:<question>``)."""
        actions = body.get("actions") or [{}]
        value = str(actions[0].get("value") or "")
        container = body.get("container") or {}
        channel = _agreed((body.get("channel") or {}).get("id"), container.get("channel_id"))
        message_ts = _agreed(container.get("message_ts"), (body.get("message") or {}).get("ts"))
        return cls(
            front_end=front_end_of(context),
            user=str(body["user"]["id"]),
            channel=channel,
            run_id=run_of(value),
            respond=respond,
            message_ts=message_ts,
            value=value,
        )

    def later(self, work: Callable[[int], Awaitable[str | None]], name: str) -> None:
        """Judge the click after the ack; the clicker gets any answer ephemerally."""

        async def go() -> None:
            if self.run_id is None:
                answer: str | None = await self.front_end.refuse(
                    user=self.user,
                    channel=self.channel,
                    command=name,
                    reason="That button does not name a run.",
                    code=Refusal.BAD_INPUT,
                )
            else:
                # The value names a run; only the card it was on may decide that run.
                answer = await self.front_end.off_card(
                    self.run_id,
                    user=self.user,
                    card=CardRef(self.channel, self.message_ts),
                    command=f"{name} run #{self.run_id}",
                )
                if answer is None:
                    answer = await work(self.run_id)
            if answer:
                await tell(self.front_end, self.respond, answer)

        self.front_end.spawn(self._answered(go()), name=f"click-{name}")

    async def _answered(self, work: Coroutine[Any, Any, None]) -> None:
        """A click the audit database cannot record still gets its clicker an answer."""
        try:
            await work
        except AuditError as exc:
            log.warning("click on run #%s not carried out: %s", self.run_id, exc)
            await tell(
                self.front_end,
                self.respond,
                f"The audit log cannot be written right now ({escape(str(exc))}), so "
                "this click did nothing: the run is as it was. Try again in a minute.",
            )
