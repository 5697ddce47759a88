"""Issue 10: the package change on the pending approval card (read by the install's dry
run when the redeploy is requested) and the change the install really made in the run's
thread, through the real bolt app over the fake Slack, the real engine and audit DB, and
the simulated host, whose own environment says what moved."""

from __future__ import annotations

from pathlib import Path

from bot.core.status import RunStatus
from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.slack_harness import BOB, SERVICE, blocks_text, slack_bot

TORCH = "torch 2.12.1+cu129 → 2.13.0"  # what the simulated 0.31.0 release pulls in


async def test_the_card_shows_the_torch_change_and_the_thread_the_change_made(
    tmp_path: Path, sim_host: SimKit
) -> None:
    kit = sim_host
    async with slack_bot(tmp_path, kit) as bot:
        await bot.command(f"redeploy {SERVICE} --version 0.31.0 --index nightly")
        record = await bot.wait_for_run(
            lambda r: r.message_ts is not None and r.status == RunStatus.PENDING_APPROVAL,
            "the card",
        )
        card = blocks_text(await bot.card(record.id))
        # Highlighted in the sentence approvers read, and listed in the code block.
        assert f"Also changes *{TORCH}*" in card, card
        assert f"! {TORCH}" in card and f"! vllm {DEFAULT_VERSION} → 0.31.0" in card
        # The dry run only read: torch is still the old one until someone approves.
        assert kit.changes() == ["dry-run"] and kit.environment()["torch"] == "2.12.1+cu129"

        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(
            record.id, "succeeded", "failed", "rolled_back", "aborted", timeout_s=60
        )
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()  # the thread is delivered
        replies = [blocks_text(m) for m in await bot.thread(record.id)]
    made = [r for r in replies if "Package changes the install made" in r]
    assert len(made) == 1, replies
    assert f"! {TORCH}" in made[0] and "! nvidia-cudnn-cu13 (new) 9.20.0.48" in made[0]
    assert kit.environment()["torch"] == "2.13.0"
