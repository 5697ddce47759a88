"""Fault-matrix rows that involve Slack: the run and its audit record must not care
what Slack does, and the thread must catch up and tell the truth afterwards."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.slack_harness import (
    ALICE,
    APPROVERS_GROUP,
    BOB,
    CAROL,
    CHANNEL,
    SERVICE,
    blocks_text,
    new_fake,
    slack_bot,
)
from tests.support.sim import touched

FINAL = ("succeeded", "failed", "rolled_back", "aborted", "cancelled")
ALL_STEPS = (
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


class FastClock:
    """Slack's clock in these tests runs `factor` times faster than ours, so a 30-second
    storm of 429s covers a whole (sub-second-step) run without the suite waiting 30 s."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.origin = time.monotonic()

    def __call__(self) -> float:
        return self.origin + (time.monotonic() - self.origin) * self.factor


async def test_slack_429_for_every_call_for_30s_during_a_run(
    tmp_path: Path, sim_host: SimKit
) -> None:
    fake = new_fake()
    fake.clock = FastClock(10.0)
    async with fake, slack_bot(tmp_path, sim_host, fake) as bot:
        await bot.command(f"redeploy {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=BOB)
        await bot.wait_status(record.id, "running")
        fake.rate_limit_all(30.0)
        storm_start = len(fake.calls())
        done = await bot.wait_status(record.id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        assert [(s.step, s.status) for s in await bot.runtime.audit.steps(record.id)] == [
            (s, "ok") for s in ALL_STEPS
        ]
        assert (done.version_before, done.version_after) == (DEFAULT_VERSION, "0.31.0")
        await bot.front_end.idle()
        storm = fake.calls()[storm_start:]
        assert any(c.status == 429 for c in storm)
        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        for part in (
            "GPU memory after drain",
            "GPU memory after restart",
            f"Run #{record.id} succeeded",
        ):
            assert part in thread, part
        assert "succeeded" in blocks_text(await bot.card(record.id))


async def test_slack_unreachable_during_a_run(tmp_path: Path, sim_host: SimKit) -> None:
    fake = new_fake()
    async with fake, slack_bot(tmp_path, sim_host, fake) as bot:
        await bot.command(f"redeploy {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=BOB)
        await bot.wait_status(record.id, "running")
        await fake.down()
        done = await bot.wait_status(record.id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        assert [(s.step, s.status) for s in await bot.runtime.audit.steps(record.id)] == [
            (s, "ok") for s in ALL_STEPS
        ]
        assert sim_host.installed_version == "0.31.0"
        await fake.up()
        await bot.front_end.idle()
        thread = "\n".join(blocks_text(m) for m in await bot.thread(record.id))
        assert f"Run #{record.id} succeeded" in thread and "Reinstall package" in thread
        assert "succeeded" in blocks_text(await bot.card(record.id))


async def test_approval_by_a_user_who_lost_approver_rights(
    tmp_path: Path, sim_host: SimKit
) -> None:
    fake = new_fake(usergroups={APPROVERS_GROUP: [BOB, CAROL]})
    policy = {
        "requesters": ["U0ALICE"],
        "approvers": [APPROVERS_GROUP],
        "min_approvals": 1,
        "approval_ttl_s": 600,
        "usergroup_cache_ttl_s": 0,
    }
    async with fake, slack_bot(tmp_path, sim_host, fake, policy=policy) as bot:
        await bot.command(f"redeploy {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        # Bob is removed from the approvers group after the card was posted.
        fake.usergroups[APPROVERS_GROUP] = [CAROL]
        await bot.click("approve", record.id, user=BOB)
        notes = await bot.ephemerals_for(BOB)
        assert "not on the approvers list" in notes[-1]["text"]
        refusal = (await bot.refusals(1))[-1]
        assert refusal.user == BOB and f"run #{record.id}" in refusal.command
        assert (await bot.run(record.id)).status == "pending_approval"
        assert touched(sim_host) == []  # only the card's read-only reads so far
        await bot.click("approve", record.id, user=CAROL)
        done = await bot.wait_status(record.id, *FINAL, timeout_s=60)
        assert done.status == "succeeded" and done.approved_by == [CAROL]


async def test_two_requests_in_the_same_second_through_slack(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await asyncio.gather(
            bot.command(f"redeploy {SERVICE}", user=ALICE),
            bot.command(f"redeploy {SERVICE}", user=CAROL),
        )
        await bot.front_end.idle()
        runs = await bot.runtime.audit.list_runs()
        assert sorted(r.status for r in runs) == ["pending_approval", "refused"]
        [pending] = [r for r in runs if r.status == "pending_approval"]
        [refused] = [r for r in runs if r.status == "refused"]
        answer = (await bot.ephemerals_for(refused.requested_by))[-1]["text"]
        assert f"is busy: run #{pending.id}" in answer and pending.requested_by in answer
        [row] = await bot.refusals(1)
        assert row.user == refused.requested_by
        # Exactly one approval card was posted, and nothing but its read-only reads (the
        # load and the package diff) reached the host.
        cards = [m for m in bot.fake.top_level(CHANNEL) if "Approve" in str(m.get("blocks"))]
        assert len(cards) == 1
        assert touched(sim_host) == []
