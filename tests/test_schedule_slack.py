"""Maintenance windows and scheduled runs through the real Slack front end (issue 22,
item 3): signed slash commands and clicks into the bolt app (Slack faked at its HTTP
boundary), the simulated host behind a real sshd, and one manual clock that the life
cycle, the expiry timers and the scheduler's tick all read, so no test waits for real
time. The window is 01:00-05:00 UTC every day; the bots start at Thursday 12:00."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.core.status import RunStatus
from bot.sim.kit import SERVICE, SimKit
from tests.polling import eventually
from tests.slack_harness import (
    ALICE,
    APPROVERS_GROUP,
    BOB,
    CAROL,
    CHANNEL,
    SlackBot,
    blocks_text,
    buttons,
    default_policy,
    new_fake,
    slack_bot,
)
from tests.support.sim import touched
from tests.support.wall_clock import ManualWallClock

NOON = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)  # a Thursday
NIGHTLY = {"timezone": "UTC", "open": ["daily 01:00-05:00"]}
HOUR = 3600


def windowed(**windows: Any) -> dict[str, Any]:
    return default_policy(windows={**NIGHTLY, **windows})


async def scheduled_card(bot: SlackBot, text: str) -> int:
    """Ask for ``text`` (with --at) as ALICE; BOB approves; returns the run, 'scheduled'."""
    await bot.command(text, user=ALICE)
    record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
    assert record.status == RunStatus.PENDING_APPROVAL and record.scheduled_at is not None
    await bot.click("approve", record.id, user=BOB)
    await bot.wait_status(record.id, "scheduled")
    return record.id


async def test_a_change_outside_the_window_is_refused_with_when_the_next_one_opens(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with slack_bot(tmp_path, sim_host, policy=windowed(), clock=clock) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        said = (await bot.ephemerals_for(ALICE))[-1]["text"]
        assert f"{SERVICE} may restart only inside its maintenance windows" in said
        assert "daily 01:00-05:00 (UTC)" in said
        assert "The next opens Fri 2026-12-04 01:00 UTC (in 13 h 00 min)" in said
        assert "`--at HH:MM`" in said and "`--now` (it needs 2 approvals)" in said
        rows = await bot.refusals(1)
        assert rows[0].user == ALICE and "outside" not in rows[0].command
        assert "maintenance windows" in rows[0].reason
        # Nothing was recorded as a run, nothing posted, nothing on the host touched.
        await bot.front_end.idle()
        assert await bot.runtime.audit.list_runs() == []
        assert touched(sim_host) == []
        # A status query is never held back by a window (a read: answered, no run).
        await bot.command(f"status {SERVICE}", user=ALICE)
        answer = await bot.fake.wait_for_message(CHANNEL, lambda m: "Status" in m.get("text", ""))
        assert f"== {SERVICE}" in blocks_text(answer) and "active" in blocks_text(answer)


async def test_at_is_approved_now_counts_down_and_starts_at_its_time(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with slack_bot(tmp_path, sim_host, policy=windowed(), clock=clock) as bot:
        bot.front_end.start_scheduler(every_s=30, sleep=clock.sleep)
        await bot.command(f"restart {SERVICE} --at 02:00", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        pending = blocks_text(await bot.card(record.id))
        assert "Once approved, starts" in pending and "(in 14 h 00 min)" in pending
        assert "Thu" not in pending.split("Once approved, starts", 1)[1][:60]
        # Asked for later, it holds no lock while it waits: the service stays free.
        assert await bot.runtime.audit.locks_held() == {}

        await bot.click("approve", record.id, user=BOB)
        await bot.wait_status(record.id, "scheduled")
        ts = record.message_ts or ""
        await bot.fake.wait_for(
            lambda: "Starts <!date^" in blocks_text(bot.fake.message("C0OPS", ts)),
            what="the scheduled card",
        )
        card = await bot.card(record.id)
        assert "Cancel" in buttons(card) and "Approve" not in buttons(card)
        assert touched(sim_host) == []

        # 01:30: the tick moves the countdown on and starts nothing.
        await eventually(lambda: clock.sleepers, "the scheduler to wait", timeout_s=5)
        clock.advance(13.5 * HOUR)
        await bot.fake.wait_for(
            lambda: "(in 30 min)" in blocks_text(bot.fake.message("C0OPS", ts)),
            what="the countdown at 01:30",
        )
        assert (await bot.run(record.id)).status == RunStatus.SCHEDULED
        assert touched(sim_host) == []

        # 02:00: due, so the next tick starts it.
        await eventually(lambda: clock.sleepers, "the scheduler to wait again", timeout_s=5)
        clock.advance(0.5 * HOUR)
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted", "refused")
        assert done.status == "succeeded", done.summary
        assert done.approved_by == [BOB] and not done.override
        assert touched(sim_host) != []


async def test_a_scheduled_run_can_be_cancelled_before_it_starts(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with slack_bot(tmp_path, sim_host, policy=windowed(), clock=clock) as bot:
        run_id = await scheduled_card(bot, f"restart {SERVICE} --at 02:00")
        await bot.click("cancel", run_id, user=ALICE)
        done = await bot.wait_status(run_id, "cancelled")
        assert done.summary == f"cancelled by {ALICE} before its scheduled start"
        await bot.fake.wait_for(
            lambda: buttons(bot.fake.message("C0OPS", done.message_ts or "")) == [],
            what="the card's buttons to go",
        )
        clock.advance(14 * HOUR)
        await bot.front_end.scheduled.once()
        assert (await bot.run(run_id)).status == RunStatus.CANCELLED
        assert touched(sim_host) == []


async def test_a_scheduled_run_survives_a_bot_restart_and_starts_once(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with new_fake() as fake:
        async with slack_bot(tmp_path, sim_host, fake, policy=windowed(), clock=clock) as bot:
            run_id = await scheduled_card(bot, f"restart {SERVICE} --at 02:00")
        # The bot is gone at 02:00 (a deploy, a VM reboot); a new one starts at 02:05.
        clock.advance(14 * HOUR + 300)
        async with slack_bot(tmp_path, sim_host, fake, policy=windowed(), clock=clock) as bot:
            # Its first tick is at once: the run is a record, not a timer the old bot had.
            bot.front_end.start_scheduler(every_s=30, sleep=clock.sleep)
            done = await bot.wait_status(run_id, "succeeded", "failed", "aborted", "refused")
            assert done.status == "succeeded", done.summary
            # Later ticks find nothing to start: it ran once.
            await bot.front_end.scheduled.once()
            await bot.front_end.idle()
            starts = [s for s in await bot.runtime.audit.steps(run_id) if s.step == "start"]
            assert len(starts) == 1


async def test_a_window_that_closes_before_the_scheduled_start_refuses_it_there(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with new_fake() as fake:
        async with slack_bot(tmp_path, sim_host, fake, policy=windowed(), clock=clock) as bot:
            run_id = await scheduled_card(bot, f"restart {SERVICE} --at 02:00")
        # A change freeze is declared for Friday after the approval: the config changes.
        clock.advance(14 * HOUR)
        frozen = windowed(blackout=["2026-12-04"])
        async with slack_bot(tmp_path, sim_host, fake, policy=frozen, clock=clock) as bot:
            await bot.front_end.scheduled.once()
            done = await bot.run(run_id)
            assert done.status == RunStatus.REFUSED
            assert done.summary is not None
            assert "its maintenance window is closed at its start" in done.summary
            assert "the next opens Sat 2026-12-05 01:00 UTC" in done.summary
            told = await eventually(
                lambda: [
                    m
                    for m in fake.thread("C0OPS", done.message_ts or "")[1:]
                    if "did not start at its scheduled time" in m.get("text", "")
                ],
                "the thread to be told",
                5,
            )
            assert "The service was not touched" in told[0]["text"]
            rows = await bot.refusals(1)
            assert "maintenance window is closed" in rows[-1].reason
            assert "refused" in blocks_text(await bot.card(run_id))
            assert buttons(await bot.card(run_id)) == []
        assert touched(sim_host) == []


async def _told_not_started(bot: SlackBot, fake: Any, run_id: int) -> str:
    """The run ended refused at its start: its card says why and its thread was told."""
    done = await bot.run(run_id)
    assert done.status == RunStatus.REFUSED and done.summary is not None
    told = await eventually(
        lambda: [
            m
            for m in fake.thread("C0OPS", done.message_ts or "")[1:]
            if "did not start at its scheduled time" in m.get("text", "")
        ],
        "the thread to be told",
        5,
    )
    card = blocks_text(await bot.card(run_id))
    assert "refused" in card and buttons(await bot.card(run_id)) == []
    rows = await bot.refusals(1)
    assert rows[-1].reason in done.summary and rows[-1].reason in told[0]["text"]
    return card


async def test_an_approver_who_left_the_group_before_the_start_leaves_the_run_unstarted(
    tmp_path: Path, sim_host: SimKit
) -> None:
    """BOB approves at noon for 02:00 as a member of the approvers' group, and leaves it
    in the afternoon. At 02:00 the group is read again: his approval no longer counts, so
    the run does not start; the card and thread say why, the refusal is recorded."""
    clock = ManualWallClock(NOON)
    async with new_fake() as fake:
        async with slack_bot(tmp_path, sim_host, fake, policy=windowed(), clock=clock) as bot:
            bot.front_end.start_scheduler(every_s=30, sleep=clock.sleep)
            run_id = await scheduled_card(bot, f"restart {SERVICE} --at 02:00")
            fake.usergroups[APPROVERS_GROUP] = [CAROL]
            await eventually(lambda: clock.sleepers, "the scheduler to wait", timeout_s=5)
            clock.advance(14 * HOUR)
            await bot.wait_status(run_id, "refused", "succeeded", "failed")
            card = await _told_not_started(bot, fake, run_id)
            assert "its approvals no longer suffice under the current policy" in card
            assert f"{BOB} no longer counts as an approver" in card
        assert touched(sim_host) == []


async def test_min_approvals_raised_before_the_start_leaves_the_run_unstarted(
    tmp_path: Path, sim_host: SimKit
) -> None:
    """Approved by one at noon; by 02:00 the config asks two (the bot restarted with it)."""
    clock = ManualWallClock(NOON)
    async with new_fake() as fake:
        async with slack_bot(tmp_path, sim_host, fake, policy=windowed(), clock=clock) as bot:
            run_id = await scheduled_card(bot, f"restart {SERVICE} --at 02:00")
        clock.advance(14 * HOUR)
        stricter = windowed() | {"min_approvals": 2}
        async with slack_bot(tmp_path, sim_host, fake, policy=stricter, clock=clock) as bot:
            await bot.front_end.scheduled.once()
            card = await _told_not_started(bot, fake, run_id)
            assert "1 of the 2 approvals it needs count now" in card
        assert touched(sim_host) == []


async def test_now_outside_the_window_is_an_override_that_needs_one_more_approval(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with slack_bot(tmp_path, sim_host, policy=windowed(), clock=clock) as bot:
        await bot.command(f"restart {SERVICE} --now", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert record.override
        card = blocks_text(await bot.card(record.id))
        assert "Emergency override" in card and "needs 2 approvals" in card
        assert "Needs 2 approver(s)" in card
        await bot.click("approve", record.id, user=BOB)
        await bot.front_end.idle()
        assert (await bot.run(record.id)).status == RunStatus.PENDING_APPROVAL
        assert "1 of 2 approvals" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=CAROL)
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        assert done.approved_by == [BOB, CAROL] and done.override
        # Recorded as such: the audit's JSON says so.
        assert done.to_json()["override"] is True


async def test_at_that_is_outside_the_window_or_garbled_is_refused(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock(NOON)
    async with slack_bot(tmp_path, sim_host, policy=windowed(), clock=clock) as bot:
        await bot.command(f"restart {SERVICE} --at 13:00", user=ALICE)
        said = (await bot.ephemerals_for(ALICE))[-1]["text"]
        assert "is outside kimi-k25's maintenance windows" in said
        assert "the next window opens Fri 2026-12-04 01:00 UTC" in said
        # Quoted as the help shows it, in a client's curly quotes: the quotes go.
        await bot.command(f"restart {SERVICE} --at \u201c02:00\u201d", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert record.scheduled_at == "2026-12-04T02:00:00Z"
        # A word that is no time is refused by the grammar, in the command's own answer.
        answer = await bot.command(f"redeploy {SERVICE} --at 2am", user=ALICE)
        assert "--at '2am' is not a time" in answer.text
        assert len(await bot.runtime.audit.list_runs()) == 1
