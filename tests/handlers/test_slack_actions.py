"""The card buttons' handlers: clicks that name no run, or a run that does not exist."""

from __future__ import annotations

from pathlib import Path

from bot.sim.kit import SimKit
from tests.slack_harness import BOB, CHANNEL, slack_bot


async def test_clicks_on_nothing_are_refused_and_recorded(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        ts = bot.fake.add_message(CHANNEL, "some message")
        for action, value in (("approve", "not-a-number"), ("deny", "4242"), ("cancel", "4242")):
            payload = bot.fake.block_action(
                action, value, channel_id=CHANNEL, message_ts=ts, user_id=BOB
            )
            assert (await bot.signer.interactive(payload).post(bot.url)).status == 200
        notes = await bot.ephemerals_for(BOB, 3)
        texts = sorted(n["text"] for n in notes)
        assert "That button does not name a run." in texts
        assert sum("no run #4242" in t for t in texts) == 2
        rows = await bot.refusals(3)
        assert {r.user for r in rows} == {BOB}
        assert sim_host.calls() == []


async def test_clicks_with_an_oversize_or_non_ascii_run_id_get_an_answer(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # Issue 9: a 30-digit value raised OverflowError (no reply at all), and Unicode
    # digits ("١٢", U+0661 U+0662) passed str.isdigit().
    async with slack_bot(tmp_path, sim_host) as bot:
        ts = bot.fake.add_message(CHANNEL, "some message")
        for action, value in (("approve", "1" * 30), ("cancel", "\u0661\u0662")):
            payload = bot.fake.block_action(
                action, value, channel_id=CHANNEL, message_ts=ts, user_id=BOB
            )
            assert (await bot.signer.interactive(payload).post(bot.url)).status == 200
        notes = await bot.ephemerals_for(BOB, 2)
        assert [n["text"] for n in notes] == ["That button does not name a run."] * 2
        assert len(await bot.refusals(2)) == 2
        assert sim_host.calls() == []
