"""The real bolt app over the real engine, with Slack faked at its HTTP boundary and
the GPU host simulated over SSH: what the Slack front-end tests drive.

    async with slack_bot(tmp_path, kit) as bot:
        status, body = await bot.command("redeploy kimi-k25")
        record = await bot.wait_for_run(lambda r: r.status == "pending_approval")
        await bot.click("approve", record.id, user=BOB)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.audit.store import RunRecord
from bot.engine.lifecycle import utc_now
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import Settings
from bot.sim.kit import SimKit
from bot.slack.app import EVENTS_PATH, create_app, make_front_end, start_http
from bot.slack.front_end import SlackFrontEnd
from tests.fakes import FakeSlack, PostResult, SlackSigner
from tests.polling import eventually
from tests.support.wall_clock import ManualWallClock

SIGNING_SECRET = "test-signing-secret-0123456789"
CHANNEL = "C0OPS"
OTHER_CHANNEL = "C0RANDOM"
ALICE, BOB, CAROL, MALLORY = "U0ALICE", "U0BOB", "U0CAROL", "U0MALLORY"
APPROVERS_GROUP = "S0APPROVERS"
SERVICE = "kimi-k25"
# The fake paces chat.postMessage at this rate; the bot is configured a little under it,
# so a test fails if our pacing ever lets a post hit the fake's limit.
FAKE_POST_RATE = 20.0
BOT_POST_INTERVAL_S = 0.06


def default_policy(**overrides: Any) -> dict[str, Any]:
    return {
        "requesters": [ALICE, BOB, CAROL],
        "approvers": [APPROVERS_GROUP, ALICE],
        "min_approvals": 1,
        "approval_ttl_s": 600,
        **overrides,
    }


def make_settings(
    tmp_path: Path,
    kit: SimKit,
    fake: FakeSlack,
    *,
    policy: dict[str, Any] | None = None,
    app_token: bool = False,
    **extra: Any,
) -> Settings:
    values: dict[str, Any] = {
        **kit.settings_fragment(),
        "policy": policy if policy is not None else default_policy(),
        "slack": {
            "channels": [CHANNEL],
            "post_interval_s": BOT_POST_INTERVAL_S,
            "update_interval_s": 0.2,
        },
        "CHATOPS_DB": str(tmp_path / "audit.db"),
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": fake.base_url,
        **extra,
    }
    if app_token:
        values["SLACK_APP_TOKEN"] = fake.app_token
    return Settings(**values)


def new_fake(**kwargs: Any) -> FakeSlack:
    kwargs.setdefault("usergroups", {APPROVERS_GROUP: [BOB, CAROL]})
    kwargs.setdefault("post_rate_per_s", FAKE_POST_RATE)
    return FakeSlack(**kwargs)


@dataclass
class SlackBot:
    fake: FakeSlack
    kit: SimKit
    runtime: Runtime
    front_end: SlackFrontEnd
    url: str
    signer: SlackSigner

    async def command(self, text: str, *, user: str = ALICE, channel: str = CHANNEL) -> PostResult:
        payload = self.fake.slash_command(text, user_id=user, channel_id=channel)
        return await self.signer.slash_command(payload).post(self.url)

    async def click(
        self,
        action_id: str,
        run_id: int,
        *,
        user: str,
        channel: str = CHANNEL,
        value: str | None = None,
        block_id: str | None = None,
    ) -> PostResult:
        """A click on a button of run ``run_id``'s card; ``value`` defaults to the run id
        (what Approve, Deny and Cancel carry)."""
        record = await self.runtime.audit.get_run(run_id)
        assert record.message_ts is not None, f"run #{run_id} has no card"
        extra = {} if block_id is None else {"block_id": block_id}
        payload = self.fake.block_action(
            action_id,
            str(run_id) if value is None else value,
            channel_id=channel,
            message_ts=record.message_ts,
            user_id=user,
            **extra,
        )
        return await self.signer.interactive(payload).post(self.url)

    async def press_terminate(self, run_id: int, host: str, *, user: str) -> PostResult:
        """The Terminate leftover processes button beside ``host``'s list on the card,
        as it is there now (its value names the run, the host and the question)."""
        button = terminate_buttons(await self.card(run_id))[host]
        return await self.click(
            "terminate_leftovers",
            run_id,
            user=user,
            value=button["value"],
            block_id=button["block_id"],
        )

    async def run(self, run_id: int) -> RunRecord:
        return await self.runtime.audit.get_run(run_id)

    async def wait_for_run(
        self, predicate: Callable[[RunRecord], bool], what: str = "a run", timeout_s: float = 15.0
    ) -> RunRecord:
        async def find() -> RunRecord | None:
            runs = await self.runtime.audit.list_runs(limit=50)
            return next((r for r in runs if predicate(r)), None)

        result: RunRecord = await eventually(find, what, timeout_s)
        return result

    async def wait_status(self, run_id: int, *statuses: str, timeout_s: float = 15.0) -> RunRecord:
        return await self.wait_for_run(
            lambda r: r.id == run_id and r.status in statuses,
            f"run #{run_id} to be {'/'.join(statuses)}",
            timeout_s,
        )

    async def card(self, run_id: int) -> dict[str, Any]:
        record = await self.run(run_id)
        assert record.message_ts is not None
        return self.fake.message(CHANNEL, record.message_ts)

    async def thread(self, run_id: int) -> list[dict[str, Any]]:
        record = await self.run(run_id)
        assert record.message_ts is not None
        return self.fake.thread(CHANNEL, record.message_ts)[1:]

    async def ephemerals_for(self, user: str, count: int = 1) -> list[dict[str, Any]]:
        await self.fake.wait_for(
            lambda: len(self.fake.ephemerals(user=user)) >= count,
            what=f"{count} ephemeral(s) for {user}",
        )
        return self.fake.ephemerals(user=user)

    async def refusals(self, count: int) -> list[Any]:
        result: list[Any] = await eventually(
            lambda: self._refusals_if(count), f"{count} refusal row(s)"
        )
        return result

    async def _refusals_if(self, count: int) -> list[Any] | None:
        rows = await self.runtime.audit.refusals()
        return rows if len(rows) >= count else None


def blocks_text(message: dict[str, Any]) -> str:
    """All the text a person sees in a message's blocks (and its fallback text)."""
    out = [message.get("text", "")]

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("text"), str):
                out.append(value["text"])
            for v in value.values():
                if isinstance(v, dict | list):
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(message.get("blocks") or [])
    return "\n".join(out)


def buttons(message: dict[str, Any]) -> list[str]:
    """The text of every button of a message: in actions blocks and beside sections."""
    found: list[str] = []
    for block in message.get("blocks") or []:
        if block.get("type") == "actions":
            found += [e["text"]["text"] for e in block["elements"]]
        elif (block.get("accessory") or {}).get("type") == "button":
            found.append(block["accessory"]["text"]["text"])
    return found


def terminate_buttons(message: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each host's Terminate button on a run card: {host: {value, block_id, text}}, the
    host read from the section the button is beside (its bold first word)."""
    found: dict[str, dict[str, str]] = {}
    for block in message.get("blocks") or []:
        accessory = block.get("accessory") or {}
        if accessory.get("action_id") == "terminate_leftovers":
            host = block["text"]["text"].split("*")[1]
            found[host] = {
                "value": accessory["value"],
                "block_id": block["block_id"],
                "text": block["text"]["text"],
            }
    return found


@asynccontextmanager
async def slack_bot(
    tmp_path: Path,
    kit: SimKit,
    fake: FakeSlack | None = None,
    *,
    policy: dict[str, Any] | None = None,
    clock: ManualWallClock | None = None,
    rate_clock: Callable[[], float] = time.monotonic,
    **settings_extra: Any,
) -> AsyncIterator[SlackBot]:
    """The bot in HTTP mode on 127.0.0.1 (a free port), over a fresh or given fake.

    With ``clock`` the approval window passes only when the test moves that clock (the
    life cycle decides by it and the expiry timers sleep on it), never in real seconds;
    with ``rate_clock`` the per-user limit on read-only commands refills only when the
    test moves it."""
    own_fake = fake is None
    fake = fake if fake is not None else new_fake()
    if own_fake:
        await fake.start()
    try:
        settings = make_settings(tmp_path, kit, fake, policy=policy, **settings_extra)
        async with open_runtime(settings, clock=clock or utc_now) as runtime:
            front_end = make_front_end(
                runtime, sleep=clock.sleep if clock is not None else asyncio.sleep
            )
            app = create_app(front_end, rate_clock=rate_clock)
            await front_end.resume()
            runner = await start_http(app, port=0, host="127.0.0.1", signing_secret=SIGNING_SECRET)
            port = runner.addresses[0][1]
            try:
                yield SlackBot(
                    fake,
                    kit,
                    runtime,
                    front_end,
                    f"http://127.0.0.1:{port}{EVENTS_PATH}",
                    SlackSigner(SIGNING_SECRET),
                )
                await front_end.idle()
            finally:
                await runner.cleanup()
                await front_end.aclose()
    finally:
        if own_fake:
            await fake.stop()
