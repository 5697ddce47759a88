"""Leftover workers through Slack (issue 12): the card's Terminate leftover processes
button, pressed by whom it may be. Signed requests into the real bolt app, the fake
Slack, real SQLite, the simulated host over SSH."""

from __future__ import annotations

from pathlib import Path

from bot.core.status import Decision, RunStatus
from bot.sim.kit import SimKit
from tests.slack_harness import (
    ALICE,
    BOB,
    CHANNEL,
    MALLORY,
    SERVICE,
    blocks_text,
    buttons,
    slack_bot,
)

TERMINATE = "Terminate leftover processes"
WORKERS = [48253, *range(48301, 48309)]  # EngineCore and Worker_TP0..7 of the boot's unit


async def test_only_an_approver_can_let_the_run_terminate_its_leftovers(
        tmp_path: Path, sim_host: SimKit) -> None:
    sim_host.set_faults(orphan_workers=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=BOB)
        await bot.fake.wait_for(lambda: TERMINATE in buttons(
            bot.fake.message(CHANNEL, record.message_ts or "")), what="the Terminate button",
            timeout=30)
        card = blocks_text(await bot.card(record.id))
        assert "PID 48304 (VLLM::Worker_TP3): GPU 3" in card and "vllm-kimi-k25.service" in card

        # Not an approver: refused, recorded, nothing signalled; the requester neither.
        await bot.click("terminate_leftovers", record.id, user=MALLORY)
        assert "Only an approver" in (await bot.ephemerals_for(MALLORY))[-1]["text"]
        await bot.click("terminate_leftovers", record.id, user=ALICE)
        assert "Only an approver" in (await bot.ephemerals_for(ALICE))[-1]["text"]
        refusals = await bot.refusals(2)
        assert {(r.user, r.command) for r in refusals} == {
            (u, f"terminate leftovers of run #{record.id}") for u in (MALLORY, ALICE)}
        assert sim_host.signalled() == []
        assert (await bot.run(record.id)).status == RunStatus.RUNNING

        await bot.click("terminate_leftovers", record.id, user=BOB)
        done = await bot.wait_status(record.id, "succeeded", "failed", timeout_s=60)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        assert sorted(sim_host.signalled()) == sorted(("TERM", p) for p in WORKERS)
        decisions = [(d.user, d.decision) for d in await bot.runtime.audit.decisions(record.id)]
        assert (BOB, Decision.TERMINATE) in decisions
        await bot.front_end.idle()
        assert TERMINATE not in buttons(await bot.card(record.id))
        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        assert "Waiting for an approver" in thread and "approved by U0BOB" in thread
        assert "Terminate leftover processes (approved)" in thread


async def test_gpus_shows_a_health_column_and_health_gives_the_details(
        tmp_path: Path, sim_host: SimKit) -> None:
    sim_host.set_faults(pending_remap=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command("gpus")
        await bot.fake.wait_for(lambda: any("GPUs: all hosts" in blocks_text(m)
                                            for m in bot.fake.messages(CHANNEL)),
                                what="the gpus answer", timeout=30)
        await bot.command("gpus gpu-node-1 --health")
        await bot.fake.wait_for(lambda: any("GPU health" in blocks_text(m)
                                            for m in bot.fake.messages(CHANNEL)),
                                what="the health answer", timeout=30)
        texts = [blocks_text(m) for m in bot.fake.messages(CHANNEL)]
        table = next(t for t in texts if "GPUs: all hosts" in t)
        assert "3 CRIT" in table and "health: CRITICAL: GPU 3: a row remap is pending" in table
        details = next(t for t in texts if "GPU health" in t)
        assert "gpu-node-1: critical" in details
        assert "critical: a row remap is pending" in details
        assert "action: reset the GPU (nvidia-smi -r) while it is idle to apply it" in details
        assert "NVRM: Xid (PCI:0000:61:00): 63" in details
