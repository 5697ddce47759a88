"""Leftover workers through Slack (issue 12): the card's Terminate leftover processes
button, pressed by whom it may be; one list and one button per host of a batch, each
press answering its own host's question only (issue 17 F5), and the run's approval rule
for it (F10). Signed requests into the real bolt app, the fake Slack, real SQLite, the
simulated hosts over SSH."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.audit.store import AuditLog
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.leftover_gate import LeftoverRequest
from bot.engine.lifecycle import RunLifecycle
from bot.engine.operations import Operations
from bot.settings import PolicySettings, Settings
from bot.sim.kit import SimKit, fast_config, fleet_fragment
from bot.slack.leftovers import LeftoverDesk
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
    slack_bot,
    terminate_buttons,
)
from tests.support.sim import MakeSimHost

TERMINATE = "Terminate leftover processes"
WORKERS = [48253, *range(48301, 48309)]  # EngineCore and Worker_TP0..7 of the boot's unit


async def test_only_an_approver_can_let_the_run_terminate_its_leftovers(
    tmp_path: Path, sim_host: SimKit
) -> None:
    sim_host.set_faults(orphan_workers=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=BOB)
        await bot.fake.wait_for(
            lambda: TERMINATE in buttons(bot.fake.message(CHANNEL, record.message_ts or "")),
            what="the Terminate button",
            timeout=30,
        )
        card = blocks_text(await bot.card(record.id))
        assert "PID 48304 (VLLM::Worker_TP3): GPU 3" in card and "vllm-kimi-k25.service" in card

        # Not an approver: refused, recorded, nothing signalled; the requester neither.
        await bot.press_terminate(record.id, "gpu-node-1", user=MALLORY)
        assert "Only an approver" in (await bot.ephemerals_for(MALLORY))[-1]["text"]
        await bot.press_terminate(record.id, "gpu-node-1", user=ALICE)
        assert "Only an approver" in (await bot.ephemerals_for(ALICE))[-1]["text"]
        refusals = await bot.refusals(2)
        assert {(r.user, r.command) for r in refusals} == {
            (u, f"terminate leftovers of run #{record.id}") for u in (MALLORY, ALICE)
        }
        assert sim_host.signalled() == []
        assert (await bot.run(record.id)).status == RunStatus.RUNNING

        await bot.press_terminate(record.id, "gpu-node-1", user=BOB)
        done = await bot.wait_status(record.id, "succeeded", "failed", timeout_s=60)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        assert sorted(sim_host.signalled()) == sorted(("TERM", p) for p in WORKERS)
        decisions = [(d.user, d.decision) for d in await bot.runtime.audit.decisions(record.id)]
        assert (BOB, Decision.TERMINATE) in decisions
        # The decision names the host and exactly the PIDs its list showed.
        [go] = await bot.runtime.audit.leftover_approvals(record.id)
        assert (go.host, go.user, sorted(go.pids)) == ("gpu-node-1", BOB, WORKERS)
        await bot.front_end.idle()
        assert TERMINATE not in buttons(await bot.card(record.id))
        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        assert "Waiting for an approver" in thread and "approved by U0BOB" in thread
        assert "Terminate leftover processes (approved)" in thread


async def test_gpus_shows_a_health_column_and_health_gives_the_details(
    tmp_path: Path, sim_host: SimKit
) -> None:
    sim_host.set_faults(pending_remap=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command("gpus")
        await bot.fake.wait_for(
            lambda: any("GPUs: all hosts" in blocks_text(m) for m in bot.fake.messages(CHANNEL)),
            what="the gpus answer",
            timeout=30,
        )
        await bot.command("gpus gpu-node-1 --health")
        await bot.fake.wait_for(
            lambda: any("GPU health" in blocks_text(m) for m in bot.fake.messages(CHANNEL)),
            what="the health answer",
            timeout=30,
        )
        texts = [blocks_text(m) for m in bot.fake.messages(CHANNEL)]
        table = next(t for t in texts if "GPUs: all hosts" in t)
        assert "3 CRIT" in table and "health: CRITICAL: GPU 3: a row remap is pending" in table
        details = next(t for t in texts if "GPU health" in t)
        assert "gpu-node-1: critical" in details
        assert "critical: a row remap is pending" in details
        assert "action: reset the GPU (nvidia-smi -r) while it is idle to apply it" in details
        assert "NVRM: Xid (PCI:0000:61:00): 63" in details


# ---- issue 17 F5 and F10: per host, per question, by the run's rule -----------------------


async def two_hosts_with_leftovers(make_sim_host: MakeSimHost, tmp_path: Path) -> list[SimKit]:
    """gpu-node-1 and gpu-node-2 serving one service, the unit's workers on both
    outliving the stop (``orphan_workers``), as a redeploy of two hosts at once
    (max_unavailable 2) finds them."""
    venv = tmp_path / "opt-venv"
    kits = [
        await make_sim_host(
            config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
        )
        for i in (1, 2)
    ]
    for kit in kits:
        kit.set_faults(orphan_workers=True)
    return kits


async def approved_and_waiting(bot: SlackBot, *approvers: str, hosts: int = 2) -> int:
    """Request a restart, approve it, and wait until ``hosts`` hosts' lists, each with
    its button, are on the card. Returns the run id."""
    await bot.command(f"restart {SERVICE}", user=ALICE)
    record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
    for user in approvers:
        await bot.click("approve", record.id, user=user)
    await bot.fake.wait_for(
        lambda: len(terminate_buttons(bot.fake.message(CHANNEL, record.message_ts or ""))) == hosts,
        what=f"{hosts} Terminate buttons",
        timeout=30,
    )
    return record.id


async def test_each_host_of_a_batch_is_released_by_its_own_button_only(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kits = await two_hosts_with_leftovers(make_sim_host, tmp_path)
    async with slack_bot(tmp_path, kits[0], **fleet_fragment(kits, max_unavailable=2)) as bot:
        run_id = await approved_and_waiting(bot, BOB)
        card_ts = (await bot.run(run_id)).message_ts or ""
        shown = terminate_buttons(await bot.card(run_id))
        # Each list beside its own button, naming its own host's processes.
        for host, button in shown.items():
            assert button["text"].startswith(f"*{host}*: 9 processes · 0 of 1 approval")
            assert (
                f"{host}: 9 processes of vllm-kimi-k25.service outlived its stop" in button["text"]
            )
            assert "PID 48304 (VLLM::Worker_TP3): GPU 3" in button["text"]
        one, two = shown["gpu-node-1"]["value"], shown["gpu-node-2"]["value"]
        assert one.startswith(f"{run_id}:gpu-node-1:") and two.startswith(f"{run_id}:gpu-node-2:")

        # A made-up question, another host's question under this host's name, the old
        # form of the value: refused, recorded, nothing signalled anywhere.
        forged = [
            f"{run_id}:gpu-node-1:not-a-question",
            f"{run_id}:gpu-node-1:" + two.rsplit(":", 1)[1],
            str(run_id),
        ]
        for value in forged:
            await bot.click("terminate_leftovers", run_id, user=BOB, value=value)
        refusals = await bot.refusals(3)
        assert all("does not match a question" in r.reason for r in refusals)
        assert (
            "It waits now for gpu-node-1, gpu-node-2" in refusals[0].reason
            or "It waits now for gpu-node-2, gpu-node-1" in refusals[0].reason
        )
        assert kits[0].signalled() == [] and kits[1].signalled() == []

        # gpu-node-1's button releases gpu-node-1 alone.
        await bot.press_terminate(run_id, "gpu-node-1", user=BOB)
        await eventually(
            lambda: len(kits[0].signalled()) == len(WORKERS) or None,
            "gpu-node-1's workers signalled",
            30,
        )
        await bot.fake.wait_for(
            lambda: list(terminate_buttons(bot.fake.message(CHANNEL, card_ts))) == ["gpu-node-2"],
            what="gpu-node-2's button alone",
            timeout=30,
        )
        assert kits[1].signalled() == []
        assert (await bot.run(run_id)).status == RunStatus.RUNNING
        # Pressed again, gpu-node-1's question is closed: refused, nothing more signalled.
        told = len(bot.fake.ephemerals(user=CAROL))
        await bot.click("terminate_leftovers", run_id, user=CAROL, value=one)
        answer = (await bot.ephemerals_for(CAROL, told + 1))[-1]["text"]
        assert "does not match a question" in answer and "It waits now for gpu-node-2" in answer

        # gpu-node-2's button releases gpu-node-2.
        await bot.press_terminate(run_id, "gpu-node-2", user=CAROL)
        done = await bot.wait_status(run_id, "succeeded", "failed", timeout_s=60)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        for kit in kits:
            assert sorted(kit.signalled()) == sorted(("TERM", p) for p in WORKERS)
        # Each go names its host and the exact PIDs its list showed.
        goes = await bot.runtime.audit.leftover_approvals(run_id)
        assert [(g.host, g.user, sorted(g.pids)) for g in goes] == [
            ("gpu-node-1", BOB, WORKERS),
            ("gpu-node-2", CAROL, WORKERS),
        ]
        assert [g.question for g in goes] == [one.rsplit(":", 1)[1], two.rsplit(":", 1)[1]]
        await bot.front_end.idle()
        thread = "\n".join(blocks_text(m) for m in await bot.thread(run_id))
        assert "gpu-node-1: leftover processes 48301, 48302" in thread
        assert "termination approved by U0BOB" in thread
        assert "gpu-node-2: leftover processes 48301, 48302" in thread
        assert "termination approved by U0CAROL" in thread


async def test_terminate_needs_as_many_approvers_as_the_run(
    tmp_path: Path, sim_host: SimKit
) -> None:
    sim_host.set_faults(orphan_workers=True)
    policy = default_policy(min_approvals=2)
    async with slack_bot(tmp_path, sim_host, policy=policy) as bot:
        run_id = await approved_and_waiting(bot, BOB, CAROL, hosts=1)
        # One press is one approval: the card counts it, nothing is signalled.
        told = len(bot.fake.ephemerals(user=BOB))
        await bot.press_terminate(run_id, "gpu-node-1", user=BOB)
        assert "Approval recorded: 1 of 2" in (await bot.ephemerals_for(BOB, told + 1))[-1]["text"]
        card_ts = (await bot.run(run_id)).message_ts or ""
        await bot.fake.wait_for(
            lambda: (
                "1 of 2 approvals (<@U0BOB>)"
                in terminate_buttons(bot.fake.message(CHANNEL, card_ts))["gpu-node-1"]["text"]
            ),
            what="the card's 1 of 2",
            timeout=30,
        )
        # The same approver again counts once; the requester (an approver, but no self
        # approval) does not count at all.
        await bot.press_terminate(run_id, "gpu-node-1", user=BOB)
        assert "already approved" in (await bot.ephemerals_for(BOB, told + 2))[-1]["text"]
        await bot.press_terminate(run_id, "gpu-node-1", user=ALICE)
        assert "Only an approver" in (await bot.ephemerals_for(ALICE))[-1]["text"]
        assert sim_host.signalled() == []
        assert (await bot.run(run_id)).status == RunStatus.RUNNING

        await bot.press_terminate(run_id, "gpu-node-1", user=CAROL)
        done = await bot.wait_status(run_id, "succeeded", "failed", timeout_s=60)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        assert sorted(sim_host.signalled()) == sorted(("TERM", p) for p in WORKERS)
        goes = await bot.runtime.audit.leftover_approvals(run_id)
        assert [(g.host, g.user) for g in goes] == [("gpu-node-1", BOB), ("gpu-node-1", CAROL)]
        await bot.front_end.idle()
        thread = "\n".join(blocks_text(m) for m in await bot.thread(run_id))
        assert "termination approved by U0BOB, U0CAROL" in thread


@pytest.mark.parametrize("self_approval", [True, False])
async def test_the_requester_counts_only_where_self_approval_is_allowed(
    tmp_path: Path, self_approval: bool
) -> None:
    # Good but unusual: a requester who is an approver, where the policy lets them
    # approve their own run, releases it; without it, their press does not count.
    policy = PolicySettings(approvers=[ALICE, BOB], allow_self_approval=self_approval)
    async with AuditLog.open(tmp_path / "audit.db") as audit:
        run_id = await audit.create_run(
            service=SERVICE,
            action=Action.RESTART,
            hosts=["gpu-node-1"],
            requested_by=ALICE,
            source=Source.SLACK,
            plan={},
            package_spec=None,
        )
        desk = LeftoverDesk(Operations(RunLifecycle(Settings(policy=policy), audit)))
        request = LeftoverRequest(run_id, "gpu-node-1", "gpu-node-1: 1 process", (48304,))
        waiting = asyncio.ensure_future(desk.wait(request, "q-1", lambda approvals: None))
        await eventually(lambda: desk.waiting(run_id) or None, "the question open")
        said = await desk.press(
            run_id,
            f"{run_id}:gpu-node-1:q-1",
            user=ALICE,
            membership={},
            channel=CHANNEL,
            command="terminate",
        )
        if self_approval:
            assert (await waiting).approved_by == ALICE and said.startswith("Terminating")
            assert [g.user for g in await audit.leftover_approvals(run_id)] == [ALICE]
        else:
            assert "Only an approver" in said and not waiting.done()
            assert await audit.leftover_approvals(run_id) == []
            assert [r.user for r in await audit.refusals()] == [ALICE]
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
