"""A click decides only the run whose card it was on, and is judged on user-group members
read from Slack at the click (issue 9's review: a signed Approve whose value named another
run, from a channel outside ``[slack].channels``, approved that run; a member removed from
the approvers' group could still approve for the cache's TTL).

Through the real bolt app with signed requests and the fake Slack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.core.status import Action, Source
from bot.sim.kit import SimKit
from tests.fakes.slack_requests import block_actions_payload
from tests.slack_harness import (
    ALICE,
    APPROVERS_GROUP,
    BOB,
    CAROL,
    CHANNEL,
    OTHER_CHANNEL,
    SERVICE,
    SlackBot,
    buttons,
    default_policy,
    slack_bot,
)


async def _pending(bot: SlackBot, text: str = f"restart {SERVICE}") -> int:
    await bot.command(text, user=ALICE)
    record = await bot.wait_for_run(
        lambda r: r.message_ts is not None and r.status == "pending_approval", "the card"
    )
    return record.id


async def _send(bot: SlackBot, payload: dict[str, Any]) -> None:
    assert (await bot.signer.interactive(payload).post(bot.url)).status == 200


def _forged(
    bot: SlackBot, action: str, value: str, *, channel: str, ts: str, user: str = BOB
) -> dict[str, Any]:
    """A signed click built by hand: any value, any channel, any message ts."""
    return block_actions_payload(
        action_id=action,
        value=value,
        message_ts=ts,
        channel_id=channel,
        user_id=user,
        response_url=bot.fake.new_response_url(channel, user),
    )


async def test_a_click_naming_another_run_or_from_another_channel_decides_nothing(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        victim = await _pending(bot)
        card_ts = (await bot.run(victim)).message_ts
        assert card_ts is not None
        # Another card in the allowed channel: a dry run's (it takes no locks), whose
        # Cancel button an approver may click; its value is rewritten to the victim.
        await bot.command(f"redeploy {SERVICE} --dry-run", user=ALICE)
        dry = await bot.wait_for_run(
            lambda r: r.dry_run and r.message_ts is not None, "the dry run's card"
        )
        assert dry.message_ts is not None
        elsewhere = bot.fake.add_message(OTHER_CHANNEL, "a message with a copied button")
        forged = [
            # Issue 9's click: the victim's id, from a channel not in [slack].channels.
            _forged(bot, "approve", str(victim), channel=OTHER_CHANNEL, ts=elsewhere),
            # The victim's own card ts, claimed from the other channel.
            _forged(bot, "approve", str(victim), channel=OTHER_CHANNEL, ts=card_ts),
            # The allowed channel, but another message: the dry run's card, and a chat line.
            _forged(bot, "approve", str(victim), channel=CHANNEL, ts=dry.message_ts),
            _forged(
                bot,
                "deny",
                str(victim),
                channel=CHANNEL,
                ts=bot.fake.add_message(CHANNEL, "just a message"),
            ),
            _forged(bot, "cancel", str(victim), channel=CHANNEL, ts=dry.message_ts),
        ]
        # A payload whose two places for the channel disagree (Slack's never do).
        split = bot.fake.block_action(
            "approve", str(victim), channel_id=CHANNEL, message_ts=card_ts, user_id=BOB
        )
        split["container"]["channel_id"] = OTHER_CHANNEL
        forged.append(split)
        for payload in forged:
            await _send(bot, payload)
        notes = [n["text"] for n in await bot.ephemerals_for(BOB, len(forged))]
        assert sum("only work on its cards in <#C0OPS>" in t for t in notes) == 3, notes
        assert sum(f"That button is not on run #{victim}'s card" in t for t in notes) == 3, notes
        rows = await bot.refusals(len(forged))
        assert {r.user for r in rows} == {BOB}
        assert sorted(r.command.split(" run ")[0] for r in rows) == sorted(
            ["approve"] * 4 + ["deny", "cancel"]
        )
        assert all(f"run #{victim}" in r.command for r in rows)
        run = await bot.run(victim)
        assert run.status == "pending_approval" and run.approved_by == [] == run.denied_by
        assert [d for d in await bot.runtime.audit.decisions(victim)] == []
        assert not any(c.argv[:2] == ("systemctl", "stop") for c in sim_host.calls())

        # The same person, on the run's own card, is heard.
        await bot.click("approve", victim, user=BOB)
        done = await bot.wait_status(victim, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary


async def test_a_click_on_a_run_whose_card_is_not_recorded_yet_is_refused(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # A request's card is recorded only once its full plan is in the thread; until then
    # (here: never) no click decides it, whatever message it claims to be on.
    async with slack_bot(tmp_path, sim_host) as bot:
        plan = bot.runtime.engine.plan(Action.RESTART, SERVICE)
        record = await bot.runtime.lifecycle.request(
            plan, requested_by=ALICE, source=Source.SLACK, channel=CHANNEL
        )
        ts = bot.fake.add_message(CHANNEL, "looks like a card")
        await _send(bot, _forged(bot, "approve", str(record.id), channel=CHANNEL, ts=ts))
        note = (await bot.ephemerals_for(BOB))[-1]["text"]
        assert f"Run #{record.id}'s card is not complete yet" in note
        assert len(await bot.refusals(1)) == 1
        assert (await bot.run(record.id)).status == "pending_approval"


async def test_approvers_are_read_fresh_at_each_click(tmp_path: Path, sim_host: SimKit) -> None:
    # The cache would keep BOB for usergroup_cache_ttl_s (default 300 s): the request
    # itself filled it (who may ask is judged on the cache), with BOB in the group.
    async with slack_bot(tmp_path, sim_host) as bot:
        run_id = await _pending(bot)
        lookups = len(bot.fake.calls("usergroups.users.list"))
        assert lookups >= 1

        bot.fake.usergroups[APPROVERS_GROUP] = [CAROL]  # BOB leaves the approvers' group
        await bot.click("approve", run_id, user=BOB)
        assert "not on the approvers list" in (await bot.ephemerals_for(BOB))[-1]["text"]
        assert (await bot.refusals(1))[0].user == BOB
        assert (await bot.run(run_id)).status == "pending_approval"
        assert len(bot.fake.calls("usergroups.users.list")) == lookups + 1

        bot.fake.usergroups[APPROVERS_GROUP] = [BOB, CAROL]  # and is back
        await bot.click("approve", run_id, user=BOB)
        done = await bot.wait_status(run_id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        assert done.approved_by == [BOB]


async def test_an_earlier_approval_stops_counting_when_its_approver_leaves_the_group(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host, policy=default_policy(min_approvals=2)) as bot:
        run_id = await _pending(bot)
        await bot.click("approve", run_id, user=BOB)
        await bot.wait_for_run(lambda r: r.approved_by == [BOB], "BOB's approval")
        bot.fake.usergroups[APPROVERS_GROUP] = [CAROL]
        await bot.click("approve", run_id, user=CAROL)
        assert "1 of 2" in (await bot.ephemerals_for(CAROL))[-1]["text"]
        run = await bot.run(run_id)
        assert run.status == "pending_approval" and run.approved_by == [BOB, CAROL]
        assert not any(c.argv[:2] == ("systemctl", "stop") for c in sim_host.calls())


async def test_a_click_slack_cannot_judge_is_refused_not_guessed(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        run_id = await _pending(bot)  # the cache now holds BOB as an approver
        bot.fake.fail_next("usergroups.users.list", "internal_error")
        await bot.click("approve", run_id, user=BOB)
        note = (await bot.ephemerals_for(BOB))[-1]["text"]
        assert "Slack did not answer who is in the user group(s) S0APPROVERS" in note
        assert "Try again" in note
        rows = await bot.refusals(1)
        assert rows[0].user == BOB and f"run #{run_id}" in rows[0].command
        run = await bot.run(run_id)
        assert run.status == "pending_approval" and run.approved_by == []
        assert buttons(await bot.card(run_id)) == ["Approve", "Deny"]
        # A cancel is judged the same way: ALICE may cancel as the requester, but the
        # answer that says so cannot be read, so nothing happens.
        bot.fake.fail_next("usergroups.users.list", "internal_error")
        await bot.command(f"cancel {run_id}", user=ALICE)
        assert "Slack did not answer" in (await bot.ephemerals_for(ALICE))[-1]["text"]
        assert (await bot.run(run_id)).status == "pending_approval"
