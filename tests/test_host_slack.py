"""``/vllm host reboot|gpu-reset`` through the real Slack front end (issue 23): signed slash
commands and clicks into the bolt app (Slack faked at its HTTP boundary), the simulated
host behind SSH. This file holds what needs no reboot of the simulator: the card, the
approval rules, the refusals and the locks; tests/test_host_e2e.py drives the reboot and
the reset themselves."""

from __future__ import annotations

from pathlib import Path

from bot.core.status import RunStatus
from bot.sim.kit import SERVICE, SimKit
from tests.handlers.test_slack_commands import ack_text
from tests.slack_harness import ALICE, BOB, CAROL, blocks_text, buttons, new_fake, slack_bot
from tests.support.runs import left_running_by_a_dead_bot
from tests.support.sim import touched


async def test_the_card_lists_every_service_it_stops_and_the_exact_commands(
    tmp_path: Path, sim_host: SimKit
) -> None:
    host = sim_host.hostname
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"host reboot {host}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert record.status == RunStatus.PENDING_APPROVAL
        assert record.service == f"host:{host}" and record.action == "reboot"
        card = blocks_text(await bot.card(record.id))
        assert f"host reboot {host}" in card
        assert f"{SERVICE} (unit {sim_host.service_settings()['unit']})" in card
        assert "systemctl reboot" in card and "cat /proc/sys/kernel/random/boot_id" in card
        assert "Deep GPU check" in card
        assert "Approve" in buttons(await bot.card(record.id))
        # It holds the service's lock and the host's: a restart meanwhile is refused.
        held = await bot.runtime.audit.locks_held()
        assert set(held[record.id]) == {f"service:{SERVICE}", f"host:{host}"}
        await bot.command(f"restart {SERVICE}", user=BOB)
        said = (await bot.ephemerals_for(BOB))[-1]["text"]
        assert f"run #{record.id} (reboot, pending_approval)" in said
        # The requester alone never approves; a deny ends it and the host is untouched.
        await bot.click("approve", record.id, user=ALICE)
        assert (await bot.run(record.id)).status == RunStatus.PENDING_APPROVAL
        await bot.click("deny", record.id, user=BOB)
        await bot.wait_status(record.id, "denied")
        assert touched(sim_host) == []
        assert await bot.runtime.audit.locks_held() == {}


async def test_an_unknown_host_or_bad_gpu_is_refused_before_anything(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        said = ack_text((await bot.command("host reboot gpu-99", user=ALICE)).text)
        assert "Unknown host 'gpu-99'" in said
        said = ack_text((await bot.command(f"host gpu-reset {sim_host.hostname} 64")).text)
        assert "'64' is not a GPU index (0 to 63)" in said
        rows = await bot.refusals(2)
        assert {r.user for r in rows} == {ALICE}
        assert await bot.runtime.audit.list_runs() == []
        assert touched(sim_host) == []


async def test_a_reboot_its_bot_died_in_is_interrupted_and_the_thread_told_what_to_check(
    tmp_path: Path, sim_host: SimKit
) -> None:
    host = sim_host.hostname
    async with new_fake() as fake:
        # The previous bot: it posted the card, was approved, stopped the service, sent
        # the reboot, and died while waiting for the host to come back.
        async with slack_bot(tmp_path, sim_host, fake) as bot:
            await bot.command(f"host reboot {host}")
            record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
            await left_running_by_a_dead_bot(
                bot.runtime.audit, record.id, host, ("preflight", "stop"), "reboot"
            )
        async with slack_bot(tmp_path, sim_host, fake) as bot:
            final = await bot.run(record.id)
            assert final.status == "interrupted"
            await bot.front_end.idle()
            told = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
            assert f"Run #{record.id} (reboot of host {host}) was interrupted" in told
            assert "during step `reboot`" in told and "down, booting or back" in told
            assert f"`/vllm status {SERVICE}`" in told
            assert f"`/vllm gpus --deep {host}`" in told
            # Its locks went with it: the service can be worked on again.
            assert await bot.runtime.audit.locks_held() == {}


async def test_a_host_run_needs_the_approvers_of_the_services_it_stops(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # kimi-k25's own policy: only CAROL approves stopping it. BOB approves under [policy]
    # but not for this service, so his click on the host's reboot does not count either:
    # a reboot must not be a way around a service's approvers.
    services = {SERVICE: {**sim_host.service_settings(), "policy": {"approvers": [CAROL]}}}
    async with slack_bot(tmp_path, sim_host, services=services) as bot:
        await bot.command(f"host reboot {sim_host.hostname}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert f"<@{CAROL}>" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=BOB)
        assert (await bot.run(record.id)).status == RunStatus.PENDING_APPROVAL
        await bot.click("deny", record.id, user=CAROL)
        await bot.wait_status(record.id, "denied")
        assert touched(sim_host) == []
