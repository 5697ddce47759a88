"""Issue 12: the service's GPUs' health on the pending approval card, read when the run
is requested (before anyone approves), through the real bolt app over the fake Slack, the
real engine and audit DB, and the simulated host.

What reached the host before the approval is read from its own call log (``touched``:
everything but the card's read-only reads)."""

from __future__ import annotations

from pathlib import Path

from bot.audit.store import RunRecord
from bot.core.status import RunStatus
from bot.sim.kit import SimKit, fast_config, fleet_fragment
from tests.slack_harness import BOB, SERVICE, SlackBot, blocks_text, slack_bot
from tests.support.sim import MakeSimHost, touched

FINAL = ("succeeded", "failed", "rolled_back", "aborted", "cancelled")
# A warning by NVIDIA's catalogue (restart the application), on GPU 1 (PCI 0000:21:00).
XID_13 = "NVRM: Xid (PCI:0000:21:00): 13, pid=48302, name=python3, Graphics Exception"


async def pending_card(bot: SlackBot, command: str, *, after: int = 0) -> tuple[RunRecord, str]:
    """Ask, and the text of the run's card once it is posted and recorded (pending)."""
    await bot.command(command)
    record = await bot.wait_for_run(
        lambda r: (
            r.id > after and r.message_ts is not None and r.status == RunStatus.PENDING_APPROVAL
        ),
        "the card",
    )
    return record, blocks_text(await bot.card(record.id))


def health_lines(card: str) -> list[str]:
    return [line for line in card.splitlines() if "GPU health:" in line]


async def test_a_critical_gpu_is_on_the_card_before_approval_and_the_run_is_then_refused(
    tmp_path: Path, sim_host: SimKit
) -> None:
    kit = sim_host
    async with slack_bot(tmp_path, kit) as bot:
        healthy, card = await pending_card(bot, f"restart {SERVICE}")
        assert health_lines(card) == []  # every GPU ok: no line at all
        await bot.click("deny", healthy.id, user=BOB)
        await bot.wait_status(healthy.id, "denied")

        kit.set_faults(pending_remap=True)
        record, card = await pending_card(bot, f"restart {SERVICE}", after=healthy.id)
        (line,) = health_lines(card)
        assert line.startswith(
            ":no_entry: GPU health: gpu-node-1: GPU 3 critical: a row "
            "remap is pending (reset the GPU (nvidia-smi -r) while it is "
            "idle to apply it)"
        ), line
        assert (
            "The preflight will refuse the run on gpu-node-1 before anything changes "
            "(service untouched)" in line
        )
        # The GPU reads only read: nothing else reached the host before the approval.
        assert touched(kit) == []
        assert kit.changes() == []

        # What the card said is what the run does.
        assert record.id in bot.front_end.cards.gpu_health
        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(record.id, *FINAL, timeout_s=60)
        # The pending card's lines are dropped once it runs: a long-lived bot keeps none.
        assert record.id not in bot.front_end.cards.gpu_health
        assert record.id not in bot.front_end.cards.notes
    assert done.status == "aborted", done.summary
    assert "preflight refused; service untouched" in (done.summary or "")
    assert "stop" not in kit.changes() and kit.unit_state() == "active"


async def test_a_fleet_card_puts_critical_first_then_unknown_then_warnings(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    venv = tmp_path / "opt-venv"
    kits = [
        await make_sim_host(
            config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
        )
        for i in (1, 2, 3, 4)
    ]
    await kits[0].close()  # gpu-node-1 cannot be reached
    kits[1].kernel_message(XID_13)  # gpu-node-2: a warning
    kits[2].set_faults(ecc_uncorrected=True)  # gpu-node-3: critical
    # gpu-node-4: healthy, so no line.
    async with slack_bot(tmp_path, kits[1], **fleet_fragment(kits)) as bot:
        _, card = await pending_card(bot, f"restart {SERVICE}")
    lines = health_lines(card)
    critical, unknown, warn = lines
    assert critical.startswith(
        ":no_entry: GPU health: gpu-node-3: GPU 3 critical: 1 "
        "uncorrectable ECC error(s) since the last reset (reset the GPU"
    ), critical
    assert "The preflight will refuse the run on gpu-node-3" in critical
    assert unknown.startswith(
        ":grey_question: GPU health: gpu-node-1: unknown (cannot reach gpu-node-1"
    ), unknown
    assert "the preflight reads it again before anything changes" in unknown
    assert warn.startswith(
        ":warning: GPU health: gpu-node-2: GPU 1 warn: Xid 13 (graphics engine exception)"
    ), warn
    assert warn.endswith("(restart the application (a redeploy or restart does))"), warn
    assert "refuse" not in warn
    assert "gpu-node-4" not in "\n".join(lines)
    assert all(touched(k) == [] for k in kits[1:])
