"""A flood of read-only commands cannot hold back an approval card: cards and run updates
take a channel's posting slot before read-only answers, and each person may send only
so many read-only commands a minute (``bot.slack.limits``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from bot.core.redact import Redactor
from bot.sim.kit import SimKit
from bot.slack.blocks import Message, section
from bot.slack.limits import READ_ONLY_PER_MINUTE, UserRateLimit
from bot.slack.poster import Poster
from tests.fakes import FakeSlack
from tests.polling import eventually
from tests.slack_harness import ALICE, CHANNEL, MALLORY, SERVICE, buttons, slack_bot
from tests.support.clock import ManualClock
from tests.test_slack_reporter import client

FLOOD = 10


def ack_text(body: str) -> str:
    return str(json.loads(body).get("text", "")) if body.startswith("{") else body


async def test_a_gpus_flood_neither_delays_a_card_nor_goes_unlimited(
    tmp_path: Path, sim_host: SimKit
) -> None:
    rate_clock = ManualClock()  # no token comes back during the test
    # Half a second between posts, so the flood's answers visibly queue.
    slack = {"channels": [CHANNEL], "post_interval_s": 0.5, "update_interval_s": 0.2}
    async with slack_bot(tmp_path, sim_host, slack=slack, rate_clock=rate_clock) as bot:
        acks = [await bot.command("gpus", user=MALLORY) for _ in range(FLOOD)]
        limited = [ack_text(a.text) for a in acks if "Slow down" in ack_text(a.text)]
        assert len(limited) == FLOOD - READ_ONLY_PER_MINUTE
        assert all("Try again in 10 s" in text for text in limited), limited
        rows = await bot.refusals(FLOOD - READ_ONLY_PER_MINUTE)
        assert {(r.user, r.command) for r in rows} == {(MALLORY, "/vllm gpus")}
        assert all(r.reason.startswith("Slow down") for r in rows)

        # The answers that were let through now wait for the channel's slots...
        await eventually(
            lambda: bot.front_end.poster.waiting(CHANNEL) >= 4, "the flood's answers to queue"
        )
        # ... and a redeploy's card, asked for after them, goes first.
        await bot.command(f"redeploy {SERVICE}", user=ALICE)
        await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.front_end.idle()
        posted = bot.fake.top_level(CHANNEL)
        kinds = [
            "card" if buttons(m) else "gpus" if "GPUs" in m.get("text", "") else "?" for m in posted
        ]
        assert kinds.count("gpus") == READ_ONLY_PER_MINUTE and kinds.count("card") == 1, kinds
        assert kinds[kinds.index("card") + 1 :].count("gpus") >= 2, kinds


class SteppedClock(ManualClock):
    """A monotonic clock whose ``sleep`` returns once the test has moved it far enough."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = asyncio.Event()

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        self.moved.set()
        self.moved = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        deadline = self.now + seconds
        while self.now < deadline:
            await self.moved.wait()


def posted(fake: FakeSlack, n: int) -> Callable[[], bool]:
    return lambda: len(fake.messages(CHANNEL)) == n


def note(text: str) -> Message:
    return Message(text, [section(text)])


async def test_the_poster_gives_each_slot_to_the_most_urgent_post(fake: FakeSlack) -> None:
    clock = SteppedClock()
    poster = Poster(client(fake), Redactor(), post_interval_s=1.0, clock=clock, sleep=clock.sleep)
    answers = poster.answers()
    flood = [asyncio.create_task(answers.post(CHANNEL, note(f"answer {i}"))) for i in range(4)]
    await eventually(lambda: poster.waiting(CHANNEL) == 3, "three answers waiting")
    card = asyncio.create_task(poster.post(CHANNEL, note("card")))
    await eventually(lambda: poster.waiting(CHANNEL) == 4, "the card waiting too")
    # A waiter that gives up (its task cancelled) leaves the queue.
    flood[3].cancel()
    await eventually(lambda: poster.waiting(CHANNEL) == 3, "the cancelled one gone")
    for n in range(2, 5):
        assert len(fake.messages(CHANNEL)) == n - 1  # nothing before its slot
        clock.advance(1.0)
        await eventually(posted(fake, n), f"post {n}")
    await asyncio.gather(card, *flood[:3])
    assert [m["text"] for m in fake.messages(CHANNEL)] == [
        "answer 0",
        "card",
        "answer 1",
        "answer 2",
    ]
    assert poster.waiting(CHANNEL) == 0


def test_the_read_only_limit_is_a_token_bucket_per_person() -> None:
    clock = ManualClock()
    limit = UserRateLimit(6, clock=clock)
    assert [limit.take("U0MALLORY") for _ in range(7)] == [None] * 6 + [10]
    assert limit.take("U0ALICE") is None  # someone else's allowance is their own
    clock.advance(4)
    assert limit.take("U0MALLORY") == 6
    clock.advance(6)
    assert limit.take("U0MALLORY") is None
    assert limit.take("U0MALLORY") == 10
    clock.advance(3600)  # refills to the burst, never beyond
    assert [limit.take("U0MALLORY") for _ in range(7)] == [None] * 6 + [10]
