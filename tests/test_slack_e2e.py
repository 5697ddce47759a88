"""The Slack front end end to end: signed requests into the real bolt app, the fake
Slack at its HTTP boundary, real SQLite, and the GPU host simulated over SSH."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from bot.audit.records import RunRecord
from bot.audit.store import parse_ts
from bot.core.status import Action, RunStatus
from bot.sim.kit import SimKit, fast_config, fleet_fragment
from tests.fakes import FakeSlack, SlackSigner
from tests.polling import eventually
from tests.slack_harness import (
    ALICE,
    BOB,
    CAROL,
    CHANNEL,
    MALLORY,
    SERVICE,
    SlackBot,
    blocks_text,
    buttons,
    default_policy,
    new_fake,
    slack_bot,
)
from tests.support.runs import left_running_by_a_dead_bot
from tests.support.sim import MakeSimHost, touched
from tests.support.wall_clock import ManualWallClock


def ack_text(body: str) -> str:
    return str(json.loads(body)["text"]) if body.startswith("{") else body


async def test_request_self_approval_refused_then_approved_runs_to_the_end(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        res = await bot.command(f"redeploy {SERVICE} --version 0.31.0", user=ALICE)
        assert res.status == 200
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert record.status == "pending_approval"
        assert record.requested_by == ALICE
        card = await bot.card(record.id)
        text = blocks_text(card)
        for expected in (
            "gpu-node-1",
            "vllm-kimi-k25",
            "vllm==0.31.0",
            "<@U0ALICE>",
            "systemctl stop --no-pager -- vllm-kimi-k25",
            "--force-reinstall",
        ):
            assert expected in text, expected
        assert buttons(card) == ["Approve", "Deny"]
        # Nothing but the card's read of the load touches the host before approval.
        assert touched(sim_host) == []

        # ALICE is an approver, but not of her own run.
        await bot.click("approve", record.id, user=ALICE)
        notes = await bot.ephemerals_for(ALICE)
        assert "cannot approve your own request" in notes[-1]["text"]
        refusals = await bot.refusals(1)
        assert refusals[0].user == ALICE and f"#{record.id}" in refusals[0].command
        assert (await bot.run(record.id)).status == "pending_approval"

        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(record.id, "succeeded", "failed", "rolled_back", "aborted")
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()

        final = await bot.run(record.id)
        assert final.requested_by == ALICE and final.approved_by == [BOB]
        assert final.version_after == "0.31.0"
        card = await bot.card(record.id)
        assert buttons(card) == []
        card_text = blocks_text(card)
        assert "succeeded" in card_text and "<@U0BOB>" in card_text
        assert ":white_check_mark: Reinstall package" in card_text

        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        assert "GPU memory after drain" in thread
        assert "GPU memory after restart" in thread
        assert "Reinstall package" in thread
        assert f"Run #{record.id} succeeded" in thread
        # Every message the bot sent was accepted by the (limit-enforcing) fake.
        assert all(c.ok for c in bot.fake.calls()), [c for c in bot.fake.calls() if not c.ok]


async def test_unauthorized_click_is_refused_and_recorded(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=MALLORY)
        notes = await bot.ephemerals_for(MALLORY)
        assert "not on the approvers list" in notes[-1]["text"]
        rows = await bot.refusals(1)
        assert rows[0].user == MALLORY
        assert (await bot.run(record.id)).status == "pending_approval"
        assert touched(sim_host) == []
        await bot.click("deny", record.id, user=CAROL)
        await bot.wait_status(record.id, "denied")


async def test_n_of_m_needs_distinct_approvers_and_double_clicks_count_once(
    tmp_path: Path, sim_host: SimKit
) -> None:
    policy = default_policy(min_approvals=2)
    async with slack_bot(tmp_path, sim_host, policy=policy) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        first = await bot.click("approve", record.id, user=BOB)
        second = await bot.click("approve", record.id, user=BOB)
        assert first.status == second.status == 200
        await bot.front_end.idle()
        assert (await bot.run(record.id)).approved_by == [BOB]
        assert (await bot.run(record.id)).status == "pending_approval"
        assert "1 of 2" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=CAROL)
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        assert done.approved_by == [BOB, CAROL]


async def test_a_card_nobody_approves_expires_and_loses_its_buttons(
    tmp_path: Path, sim_host: SimKit
) -> None:
    clock = ManualWallClock()
    async with slack_bot(
        tmp_path, sim_host, policy=default_policy(approval_ttl_s=600), clock=clock
    ) as bot:
        await bot.command(f"redeploy {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await eventually(lambda: bot.front_end.timers.armed(record.id), "the expiry timer")
        clock.advance(599)
        assert (await bot.run(record.id)).status == RunStatus.PENDING_APPROVAL
        clock.advance(1)  # the deadline itself is late
        expired = await bot.wait_status(record.id, RunStatus.EXPIRED, timeout_s=10)
        assert expired.summary == "approval window expired"
        await bot.fake.wait_for(
            lambda: not buttons(bot.fake.message(CHANNEL, expired.message_ts or "")),
            what="no buttons",
        )
        assert "expired" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=BOB)
        notes = await bot.ephemerals_for(BOB)
        assert "already expired" in notes[-1]["text"]
        await bot.refusals(1)
        assert touched(sim_host) == []


async def test_a_replica_that_does_not_lead_leaves_an_overdue_card_to_the_leader(
    tmp_path: Path, sim_host: SimKit
) -> None:
    """Issue 21: every replica arms a timer for each pending card it knows, and only the
    leader expires it (at once, or at its next sweep): here another replica holds the
    leader lease, so this one's timer fires and closes nothing."""
    from bot.engine.leader import LEADER

    clock = ManualWallClock()
    async with slack_bot(
        tmp_path, sim_host, policy=default_policy(approval_ttl_s=600), clock=clock
    ) as bot:
        await bot.front_end.leader.aclose()  # lets go of the lease, if it held it
        assert await bot.runtime.audit.hold_lease(LEADER, "replica-b", 3600) is not None
        await bot.command(f"redeploy {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await eventually(lambda: bot.front_end.timers.armed(record.id), "the expiry timer")
        clock.advance(600)
        await eventually(lambda: not bot.front_end.timers.armed(record.id), "the timer to fire")
        await bot.front_end.idle()
        assert (await bot.run(record.id)).status == RunStatus.PENDING_APPROVAL


async def test_deny_closes_the_request_without_touching_the_host(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"redeploy {SERVICE} --version 0.31.0")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("deny", record.id, user=CAROL)
        denied = await bot.wait_status(record.id, "denied")
        assert denied.denied_by == [CAROL]
        await bot.front_end.idle()
        card = await bot.card(record.id)
        assert buttons(card) == [] and "denied" in blocks_text(card)
        # Deny has a confirm dialog on the card.
        await bot.click("approve", record.id, user=BOB)
        assert "already denied" in (await bot.ephemerals_for(BOB))[-1]["text"]
        assert touched(sim_host) == []


def test_deny_button_asks_for_confirmation() -> None:
    from bot.core.plan import Plan
    from bot.slack.blocks import CardView, run_card

    plan = Plan(
        action=Action.RESTART,
        service="s",
        hosts=("h",),
        unit="u",
        package="vllm",
        version=None,
        spec="vllm",
        index_name=None,
        index_url=None,
        steps=(),
    )
    card = run_card(
        CardView(run_id=1, plan=plan, requested_by=ALICE, status=RunStatus.PENDING_APPROVAL)
    )
    actions = next(b for b in card.blocks if b["type"] == "actions")
    deny = next(e for e in actions["elements"] if e["text"]["text"] == "Deny")
    assert deny["confirm"]["confirm"]["text"] == "Deny"


async def test_dry_run_shows_plan_and_preflight_without_approval(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"redeploy {SERVICE} --version 0.31.0 --dry-run")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        assert done.dry_run and done.approved_by == ["system:dry-run"]
        await bot.front_end.idle()
        card_text = blocks_text(await bot.card(record.id))
        assert "dry run" in card_text and "Preflight" in card_text
        assert "system:" not in card_text
        assert ":heavy_minus_sign: Stop service" in card_text
        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        assert "Preflight" in thread
        changing = [
            c
            for c in sim_host.calls()
            if c.argv[:2] in (("systemctl", "stop"), ("systemctl", "start"))
            or ("install" in c.argv and "--dry-run" not in c.argv)
        ]
        assert changing == []


async def test_cancel_a_pending_request_by_command(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.command(f"cancel {record.id}", user=MALLORY)
        assert (
            "Only the requester or an approver" in (await bot.ephemerals_for(MALLORY))[-1]["text"]
        )
        await bot.command(f"cancel #{record.id}", user=ALICE)
        cancelled = await bot.wait_status(record.id, "cancelled")
        assert "cancelled by U0ALICE" in (cancelled.summary or "")
        decisions = await bot.runtime.audit.decisions(record.id)
        assert [(d.user, d.decision) for d in decisions] == [(ALICE, "cancel")]
        await bot.front_end.idle()
        assert buttons(await bot.card(record.id)) == []
        assert touched(sim_host) == []


async def test_pending_cards_and_approvals_survive_a_restart(
    tmp_path: Path, sim_host: SimKit
) -> None:
    policy = default_policy(min_approvals=2)
    async with new_fake() as fake:
        async with slack_bot(tmp_path, sim_host, fake, policy=policy) as bot:
            await bot.command(f"restart {SERVICE}")
            record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
            await bot.click("approve", record.id, user=BOB)
            await bot.wait_for_run(lambda r: r.approved_by == [BOB], "BOB's approval")
        async with slack_bot(tmp_path, sim_host, fake, policy=policy) as bot:
            assert (await bot.run(record.id)).status == "pending_approval"
            await bot.click("approve", record.id, user=CAROL)
            done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
            assert done.status == "succeeded", done.summary
            assert done.approved_by == [BOB, CAROL]


async def test_restart_expires_overdue_cards_and_rearms_the_others(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    # Two services on two hosts, so two requests can be pending at once (a pending
    # request holds its service's and hosts' locks).
    kit_a = await make_sim_host()
    kit_b = await make_sim_host(config=fast_config(hostname="gpu-node-2"))
    fleet: dict[str, Any] = {
        "hosts": {**kit_a.settings_fragment()["hosts"], **kit_b.settings_fragment()["hosts"]},
        "services": {SERVICE: kit_a.service_settings(), "other": kit_b.service_settings()},
    }
    clock = ManualWallClock()  # every bot in this test lives on the same manual time
    async with new_fake() as fake:
        async with slack_bot(
            tmp_path, kit_a, fake, **fleet, clock=clock, policy=default_policy(approval_ttl_s=2)
        ) as bot:
            await bot.command(f"restart {SERVICE}")
            soon = await bot.wait_for_run(lambda r: r.message_ts is not None, "card A")
        async with slack_bot(
            tmp_path, kit_a, fake, **fleet, clock=clock, policy=default_policy(approval_ttl_s=3)
        ) as bot:
            await bot.command("redeploy other")
            later = await bot.wait_for_run(
                lambda r: r.id != soon.id and r.message_ts is not None, "card B"
            )
        # Both bots are gone; A's window passes while no bot runs, B's not yet.
        assert soon.expires_at is not None and later.expires_at is not None
        clock.advance(2)
        assert parse_ts(soon.expires_at) <= clock() < parse_ts(later.expires_at)
        async with slack_bot(
            tmp_path, kit_a, fake, **fleet, clock=clock, policy=default_policy(approval_ttl_s=3)
        ) as bot:
            # slack_bot ran resume(): the overdue card expired at start.
            assert (await bot.run(soon.id)).status == "expired"
            assert buttons(await bot.card(soon.id)) == []
            assert (await bot.run(later.id)).status == "pending_approval"
            await eventually(lambda: bot.front_end.timers.armed(later.id), "B's timer re-armed")
            clock.advance(1)
            await bot.wait_status(later.id, "expired", timeout_s=10)
            await bot.fake.wait_for(
                lambda: "expired" in blocks_text(fake.message(CHANNEL, later.message_ts or "")),
                what="card B expired",
            )
            # An expired request no longer holds its service: it can be asked for again.
            assert await bot.runtime.audit.lock_holder("service:other") is None
        assert touched(kit_a) == [] and touched(kit_b) == []


async def test_bad_signatures_are_rejected(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        payload = bot.fake.slash_command(f"redeploy {SERVICE}")
        body = bot.signer.slash_command_body(payload)
        bad = await bot.signer.sign(body).with_bad_signature().post(bot.url)
        stale = await bot.signer.sign_stale(body).post(bot.url)
        forged = await SlackSigner("not-the-secret").sign(body).post(bot.url)
        assert (bad.status, stale.status, forged.status) == (401, 401, 401)
        good = await bot.signer.sign(body).post(bot.url)
        assert good.status == 200
        await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert len(await bot.runtime.audit.list_runs()) == 1


async def approved_redeploy(bot: SlackBot, text: str = f"redeploy {SERVICE}") -> int:
    await bot.command(text, user=ALICE)
    record = await bot.wait_for_run(
        lambda r: r.message_ts is not None and r.status == "pending_approval", "a new card"
    )
    await bot.click("approve", record.id, user=BOB)
    return record.id


async def test_a_429_storm_during_a_run_neither_stops_nor_corrupts_it(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        run_id = await approved_redeploy(bot, f"redeploy {SERVICE} --version 0.31.0")
        await bot.wait_status(run_id, "running")
        bot.fake.rate_limit_all(2.0)
        done = await bot.wait_status(run_id, "succeeded", "failed", "rolled_back", timeout_s=30)
        assert done.status == "succeeded", done.summary
        steps = await bot.runtime.audit.steps(run_id)
        assert [(s.step, s.status) for s in steps] == [
            (s, "ok")
            for s in (
                "preflight",
                "gpu_check",
                "prefetch",
                "requests",
                "stop",
                "drain",
                "reinstall",
                "gate",
                "start",
                "health",
                "readiness",
                "postcheck",
                "gpu_recheck",
            )
        ]
        assert await bot.runtime.audit.snapshots(run_id)
        await bot.front_end.idle()  # the thread catches up after the storm
        assert any(c.status == 429 for c in bot.fake.calls())
        thread = "\n".join(blocks_text(m) for m in await bot.thread(run_id))
        for part in (
            "GPU memory after drain",
            "GPU memory after restart",
            "Reinstall package",
            f"Run #{run_id} succeeded",
        ):
            assert part in thread, part
        card = blocks_text(await bot.card(run_id))
        assert "succeeded" in card and ":white_check_mark: Post-check" in card


async def test_slack_calls_per_redeploy_do_not_grow_with_output(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    # The same redeploy on two fresh hosts (the same packages to fetch and install), one
    # printing a thousand times more: a second redeploy on one host would fetch nothing
    # and post one file fewer, whatever the output.
    counts: list[Counter[str]] = []
    longest = ""
    for lines in (100, 100_000):
        kit = await make_sim_host(config=fast_config(install_output_lines=lines))
        (own := tmp_path / str(lines)).mkdir()
        async with slack_bot(own, kit) as bot:
            run_id = await approved_redeploy(bot)
            done = await bot.wait_status(run_id, "succeeded", "failed", "rolled_back", timeout_s=60)
            assert done.status == "succeeded", done.summary
            await bot.front_end.idle()
            counts.append(Counter(c.method for c in bot.fake.calls()))
            assert all(c.ok for c in bot.fake.calls())
            longest = max(bot.fake.files, key=lambda f: f.length).text
    small, large = counts
    for method in (
        "chat.postMessage",
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ):
        assert small[method] == large[method], method
    # One update per state change at most (11 steps, each started and finished, and a
    # start's phases), coalesced when they come fast.
    assert small["chat.update"] <= 30 and large["chat.update"] <= 30
    assert "[99999/99999]" in longest


async def test_cancel_button_stops_a_running_run_at_a_safe_point(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kit = await make_sim_host(config=fast_config(release_delay_s=3.0))
    async with slack_bot(tmp_path, kit) as bot:
        run_id = await approved_redeploy(bot)
        await bot.wait_for_run(lambda r: r.id == run_id and r.current_step == "drain", "drain")
        assert "Cancel" in buttons(await bot.card(run_id))
        # While it runs, the service is locked: a second request is refused and recorded.
        await bot.command(f"restart {SERVICE}", user=CAROL)
        busy = (await bot.ephemerals_for(CAROL))[-1]["text"]
        assert f"is busy: run #{run_id}" in busy and "requested by U0ALICE" in busy
        assert "Its thread: https://" in busy  # a link to the run in progress
        assert (await bot.refusals(1))[0].user == CAROL
        await bot.click("cancel", run_id, user=MALLORY)
        assert (
            "Only the requester or an approver" in (await bot.ephemerals_for(MALLORY))[-1]["text"]
        )
        await bot.click("cancel", run_id, user=ALICE)
        done = await bot.wait_status(run_id, "cancelled", "failed", "succeeded", timeout_s=30)
        assert done.status == "cancelled", done.summary
        assert [
            (d.user, d.decision)
            for d in await bot.runtime.audit.decisions(run_id)
            if d.decision == "cancel"
        ] == [(ALICE, "cancel")]
        await bot.front_end.idle()
        thread = "\n".join(blocks_text(m) for m in await bot.thread(run_id))
        assert "Cancel requested by <@U0ALICE>" in thread
        # Nothing was installed into the venv (the prefetch fills only uv's cache).
        assert not [
            c
            for c in kit.calls()
            if "install" in c.argv and "--dry-run" not in c.argv and str(kit.python) in c.argv
        ]


async def test_concurrent_clicks_start_the_run_exactly_once(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        results = await asyncio.gather(
            *(bot.click("approve", record.id, user=u) for u in (BOB, BOB, CAROL, BOB, CAROL))
        )
        assert {r.status for r in results} == {200}
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()
        assert sorted(done.approved_by) in ([BOB], [CAROL], [BOB, CAROL])
        assert len([c for c in sim_host.calls("systemctl") if "stop" in c.argv]) == 1


async def a_run_its_bot_died_in(tmp_path: Path, sim_host: SimKit, fake: FakeSlack) -> RunRecord:
    """The previous bot: it posted the card, was approved, started the run (preflight
    done, in its stop), and died."""
    async with slack_bot(tmp_path, sim_host, fake) as bot:
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await left_running_by_a_dead_bot(
            bot.runtime.audit, record.id, "gpu-node-1", ("preflight",), "stop"
        )
    return record


async def test_a_run_left_running_by_a_dead_bot_is_shown_interrupted_at_start(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with new_fake() as fake:
        record = await a_run_its_bot_died_in(tmp_path, sim_host, fake)
        async with slack_bot(tmp_path, sim_host, fake) as bot:
            final = await bot.run(record.id)
            assert final.status == "interrupted"
            card = await bot.card(record.id)
            text = blocks_text(card)
            assert "interrupted" in text and buttons(card) == []
            assert ":white_check_mark: Preflight" in text
            assert ":warning: Stop service" in text
            assert ":heavy_minus_sign: Start service" in text
            # The thread is told what state the service may be in and what to run next.
            await bot.front_end.idle()
            told = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
            assert f"Run #{record.id} (restart {SERVICE}) was interrupted" in told
            assert "during step `stop`" in told and "may be running, stopping or stopped" in told
            assert f"/vllm status {SERVICE}" in told


async def test_a_recovery_slack_failed_to_post_is_told_at_the_next_sweep(
    tmp_path: Path, sim_host: SimKit
) -> None:
    """The thread of a recovered run must hear what state the service may be in (it may
    be stopped): a post Slack refused once (an internal error) is not the telling; the
    sweep tells it again (in its pass over untold threads, or the next sweep's), once."""
    async with new_fake() as fake:
        record = await a_run_its_bot_died_in(tmp_path, sim_host, fake)
        fake.fail_next("chat.postMessage", "internal_error")
        async with slack_bot(tmp_path, sim_host, fake) as bot:
            assert (await bot.run(record.id)).status == "interrupted"
            await bot.front_end.idle()  # the sweep at start tried to tell it, and failed
            await bot.front_end.sweep.once()
            await bot.front_end.idle()
            told = [m for m in await bot.thread(record.id) if "was interrupted" in blocks_text(m)]
            assert len(told) == 1
            assert "may be running, stopping or stopped" in blocks_text(told[0])


async def test_a_recovery_slack_refuses_for_good_is_not_tried_at_every_sweep(
    tmp_path: Path, sim_host: SimKit
) -> None:
    """A refusal a retry would repeat (the bot was removed from the channel) is logged
    once, not posted again and again at every sweep."""
    async with new_fake() as fake:
        record = await a_run_its_bot_died_in(tmp_path, sim_host, fake)
        fake.fail_next("chat.postMessage", "not_in_channel")
        async with slack_bot(tmp_path, sim_host, fake) as bot:
            assert (await bot.run(record.id)).status == "interrupted"
            await bot.front_end.idle()
            await bot.front_end.sweep.once()
            await bot.front_end.idle()
            posts = [
                c
                for c in fake.calls("chat.postMessage")
                if (c.json or c.params).get("thread_ts") == record.message_ts
            ]
            assert [c.response.get("error") for c in posts] == ["not_in_channel"]


async def test_a_rollout_card_lists_every_host_and_shows_per_host_state(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    venv = tmp_path / "opt-venv"
    kits = [
        await make_sim_host(
            config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
        )
        for i in (1, 2, 3)
    ]
    kits[1].set_faults(uv_fails=True)  # the second batch rolls back: the rollout stops
    fleet = fleet_fragment(kits)
    async with slack_bot(tmp_path, kits[0], **fleet) as bot:
        await bot.command(f"redeploy {SERVICE} --version 0.31.0")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        card = blocks_text(await bot.card(record.id))
        for k in kits:  # one approval covers the rollout, and the plan names every host
            assert k.hostname in card
        assert "1 at a time" in card
        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(record.id, "succeeded", "failed", "rolled_back", timeout_s=60)
        assert done.status == "rolled_back", done.summary
        await bot.front_end.idle()
        card = blocks_text(await bot.card(record.id))
        assert "*gpu-node-1* — succeeded" in card
        assert "*gpu-node-2* — rolled_back" in card
        assert "*gpu-node-3* — not started" in card
    assert touched(kits[2]) == []  # the host after the failure was never touched
