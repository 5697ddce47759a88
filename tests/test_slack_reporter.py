"""SlackReporter and Poster against the fake Slack: coalescing, call counts that do not
depend on output size, catching up after an outage, redaction, pacing."""

from __future__ import annotations

import asyncio
from collections import Counter

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.core import events as ev
from bot.core.gpu import Gpu, GpuSnapshot
from bot.core.plan import Plan, PlannedStep, Step
from bot.core.redact import Redactor
from bot.core.service_state import ServiceState
from bot.core.status import Action, RunStatus, StepStatus
from bot.retry import Backoff
from bot.slack.blocks import CardView, Message, initial_steps, section
from bot.slack.poster import Poster
from bot.slack.reporter import BACKOFF, SlackReporter
from tests.fakes import FakeSlack
from tests.polling import eventually
from tests.slack_harness import blocks_text
from tests.support.clock import ManualClock

CHANNEL = "C0OPS"
SECRET = "hunter2-super-secret"
PLAN = Plan(
    action=Action.REDEPLOY,
    service="svc",
    hosts=("gpu-1",),
    unit="vllm.service",
    package="vllm",
    version="0.16.0",
    spec="vllm==0.16.0",
    index_name=None,
    index_url=None,
    steps=tuple(PlannedStep(s, f"cmd {s}") for s in (Step.PREFLIGHT, Step.STOP, Step.REINSTALL)),
)
SNAPSHOT = GpuSnapshot(
    "gpu-1", tuple(Gpu(i, f"GPU-{i}", "NVIDIA H200", 10, 143771, 0) for i in range(8))
)


def client(fake: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(
        token=fake.bot_token,
        base_url=fake.base_url,
        retry_handlers=[
            AsyncRateLimitErrorRetryHandler(max_retry_count=1),
            AsyncConnectionErrorRetryHandler(max_retry_count=1),
        ],
    )


class Waits:
    """The reporter's back-off sleeps, counted instead of slept."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)
        await asyncio.sleep(0)


async def reporter_for(
    fake: FakeSlack,
    *,
    interval: float = 0.0,
    waits: Waits | None = None,
    backoff: Backoff = BACKOFF,
) -> SlackReporter:
    poster = Poster(client(fake), Redactor([SECRET]), post_interval_s=0.03)
    view = CardView(
        run_id=1,
        plan=PLAN,
        requested_by="U0ALICE",
        status=RunStatus.APPROVED,
        steps=initial_steps(PLAN),
    )
    ts = await poster.post(CHANNEL, Message("card", [section("card")]))
    if waits is None:
        return SlackReporter(poster, channel=CHANNEL, ts=ts, view=view, update_interval_s=interval)
    return SlackReporter(
        poster,
        channel=CHANNEL,
        ts=ts,
        view=view,
        update_interval_s=interval,
        backoff=backoff,
        sleep=waits.sleep,
    )


def run_events(lines: int) -> list[ev.Event]:
    out: list[ev.Event] = [ev.RunStarted(1, PLAN, "U0ALICE", ("U0BOB",))]
    for step in (Step.PREFLIGHT, Step.STOP, Step.REINSTALL):
        out.append(ev.StepStarted(1, "gpu-1", step, f"cmd {step}"))
        n = lines if step == Step.REINSTALL else 3
        printed = [f"{step} line {i} building CUDA object paged_attention.cu.o" for i in range(n)]
        out += [ev.OutputLine(1, "gpu-1", step, "stderr", line) for line in printed]
        out.append(
            ev.StepFinished(
                1, "gpu-1", step, StepStatus.OK, 0, 1.25, f"{step} done", "\n".join(printed[-200:])
            )
        )
        if step == Step.STOP:
            out.append(ev.GpuTable(1, "gpu-1", "after drain", SNAPSHOT))
    out.append(
        ev.RunFinished(
            1,
            RunStatus.SUCCEEDED,
            "vllm 0.15.1 -> 0.16.0, healthy",
            "0.15.1",
            "0.16.0",
            ServiceState.UP,
        )
    )
    return out


async def deliver(fake: FakeSlack, lines: int) -> Counter[str]:
    reporter = await reporter_for(fake)
    before = len(fake.calls())
    for event in run_events(lines):
        await reporter.handle(event)
    # handle() only queues: not a single Slack call was made while the events arrived.
    assert len(fake.calls()) == before
    reporter.start()
    assert await reporter.flush(30)
    return Counter(c.method for c in fake.calls()[before:])


async def test_call_count_does_not_grow_with_output_size(fake: FakeSlack) -> None:
    small = await deliver(fake, 100)
    large = await deliver(fake, 100_000)
    assert small == large
    assert small["chat.update"] == 1  # every change before the drain ran: one update
    assert small["files.completeUploadExternal"] == 1  # only the long step gets a file
    big_file = max(fake.files, key=lambda f: f.length)
    assert "reinstall line 99999 " in big_file.text and "reinstall line 0 " in big_file.text
    assert all(c.ok for c in fake.calls())


async def test_thread_contents_and_final_card(fake: FakeSlack) -> None:
    reporter = await reporter_for(fake)
    reporter.start()
    for event in run_events(5):
        await reporter.handle(event)
    assert await reporter.flush(30)
    replies = fake.thread(CHANNEL, reporter.ts)[1:]
    texts = [blocks_text(m) for m in replies]
    assert "Preflight" in texts[0] and "preflight line 2" in texts[0]
    assert any("GPU memory after drain" in t and "H200" in t for t in texts)
    assert "Run #1 succeeded" in texts[-1]
    card = blocks_text(fake.message(CHANNEL, reporter.ts))
    assert "succeeded" in card and ":white_check_mark: Reinstall package" in card
    assert "<@U0BOB>" in card


async def test_updates_are_coalesced_to_the_interval(fake: FakeSlack) -> None:
    reporter = await reporter_for(fake, interval=3600)
    reporter.start()
    await reporter.handle(ev.RunStarted(1, PLAN, "U0ALICE", ("U0BOB",)))
    await fake.wait_for_call("chat.update")
    for step in (Step.PREFLIGHT, Step.STOP):
        await reporter.handle(ev.StepStarted(1, "gpu-1", step, "cmd"))
    # The first update went out at once; the next waits for the interval.
    assert len(fake.calls("chat.update")) == 1
    assert reporter.pending
    assert not await reporter.flush(0.2)


async def test_an_outage_delays_the_thread_but_loses_nothing(fake: FakeSlack) -> None:
    reporter = await reporter_for(fake)
    await fake.down()
    reporter.start()
    for event in run_events(5):
        await reporter.handle(event)
    await eventually(lambda: reporter.failures >= 1, "a failed call during the outage")
    await fake.up()
    fake.rate_limit_all(1.0)
    assert await reporter.flush(60)
    texts = [blocks_text(m) for m in fake.thread(CHANNEL, reporter.ts)[1:]]
    assert len(texts) == 5 and "Run #1 succeeded" in texts[-1]
    assert "succeeded" in blocks_text(fake.message(CHANNEL, reporter.ts))


async def test_each_failed_call_waits_its_back_off_and_nothing_is_lost(fake: FakeSlack) -> None:
    # Six transient failures in a row, whichever call they hit: one wait each (so the calls
    # are bounded by the waits), doubling to the cap; the first success resets it.
    waits = Waits()
    reporter = await reporter_for(fake, waits=waits, backoff=Backoff(initial_s=1.0, max_s=4.0))
    fake.fail_next("*", "internal_error", count=6)
    before = len(fake.calls())
    for event in run_events(5):
        await reporter.handle(event)
    reporter.start()
    assert await reporter.flush(30)
    assert waits.seconds == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert reporter.failures == 6
    assert sum(not c.ok for c in fake.calls()[before:]) == 6
    texts = [blocks_text(m) for m in fake.thread(CHANNEL, reporter.ts)[1:]]
    assert len(texts) == 5 and "Run #1 succeeded" in texts[-1]


async def test_the_default_back_off_has_jitter(fake: FakeSlack) -> None:
    waits = Waits()
    reporter = await reporter_for(fake, waits=waits)
    fake.fail_next("*", "internal_error", count=7)
    for event in run_events(5):
        await reporter.handle(event)
    reporter.start()
    assert await reporter.flush(30)
    lows = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert all(low <= w <= min(low + 1.0, 30.0) for low, w in zip(lows, waits.seconds, strict=True))
    assert waits.seconds[:5] != lows[:5]  # the uncapped waits moved by their jitter


async def test_a_reply_slack_refuses_is_dropped_and_the_rest_still_go(fake: FakeSlack) -> None:
    reporter = await reporter_for(fake)
    fake.fail_next("chat.postMessage", "invalid_blocks")
    reporter.start()
    for event in run_events(5):
        await reporter.handle(event)
    assert await reporter.flush(30)
    texts = [blocks_text(m) for m in fake.thread(CHANNEL, reporter.ts)[1:]]
    assert len(texts) == 4 and "Run #1 succeeded" in texts[-1]


async def test_secrets_never_reach_slack(fake: FakeSlack) -> None:
    reporter = await reporter_for(fake)
    reporter.start()
    lines = [
        f"HF_TOKEN={SECRET}",
        *(f"pad {i} " + "x" * 100 for i in range(100)),
        f"password: {SECRET}",
    ]
    await reporter.handle(ev.StepStarted(1, "gpu-1", Step.REINSTALL, "cmd"))
    for line in lines:
        await reporter.handle(ev.OutputLine(1, "gpu-1", Step.REINSTALL, "stdout", line))
    await reporter.handle(
        ev.StepFinished(
            1,
            "gpu-1",
            Step.REINSTALL,
            StepStatus.FAILED,
            1,
            2.0,
            f"failed near {SECRET}",
            "\n".join(lines),
        )
    )
    assert await reporter.flush(30)
    assert fake.files and all(SECRET not in f.text for f in fake.files)
    assert "HF_TOKEN=***" in fake.files[0].text
    for call in fake.calls():
        assert SECRET not in str(call.args)


async def test_poster_paces_posts_under_the_channel_limit() -> None:
    # One clock for the poster's pacing and the fake's limit, moved only by the poster's
    # waits: on wall time a loaded machine could deliver two posts closer than paced.
    clock = ManualClock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    async with FakeSlack(post_rate_per_s=10, post_burst=1, clock=clock) as fake:
        poster = Poster(client(fake), Redactor(), post_interval_s=0.11, clock=clock, sleep=sleep)
        started = clock()
        for i in range(6):
            await poster.post(CHANNEL, Message(f"m{i}", [section(f"m{i}")]))
        assert [c.status for c in fake.calls("chat.postMessage")] == [200] * 6
        assert clock() - started >= 5 * 0.11 - 1e-9  # it waited between posts
