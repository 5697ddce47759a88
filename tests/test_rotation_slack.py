"""`/vllm drain`, `/vllm rotation` and `/vllm undrain` from Slack (issue 19, item 4): the
bot in HTTP mode driven with signed requests through the fake Slack (tests/slack_harness),
a real HAProxy in front of two simulated replicas reached through SSH from a third host.
The card lists the exact Runtime API command; a team member other than the requester
approves; the router, the audit log and the channel show each change."""

from __future__ import annotations

from pathlib import Path

from bot.core.routers.haproxy import parse_show_stat
from bot.sim.kit import SERVICE
from tests.slack_harness import ALICE, BOB, CHANNEL, blocks_text, buttons, slack_bot
from tests.support import routers
from tests.support.sim import MakeSimHost
from tests.test_rotation_e2e import fleet, fragment, haproxy_router, haproxy_servers


async def test_drain_and_undrain_with_approval_and_rotation_read_only(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        frag = fragment(kits, lb, haproxy_router(h), servers)

        async def states() -> dict[str, str]:
            views = parse_show_stat(await h.say("show stat"), h.backend)
            return {n: v.detail.split(" ")[0] for n, v in views.items()}

        async with slack_bot(tmp_path, kits[0], **frag) as bot:
            await bot.command(f"drain {SERVICE} gpu-node-1", user=ALICE)
            record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
            assert record.status == "pending_approval" and record.hosts == ["gpu-node-1"]
            card = blocks_text(await bot.card(record.id))
            assert f"set server {h.backend}/node1 state drain" in card
            assert buttons(await bot.card(record.id)) == ["Approve", "Deny"]
            assert await states() == {"node1": "UP", "node2": "UP"}  # nothing before approval

            await bot.click("approve", record.id, user=ALICE)  # never the requester alone
            assert (await bot.run(record.id)).status == "pending_approval"
            await bot.click("approve", record.id, user=BOB)
            done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
            assert done.status == "succeeded", done.summary
            assert done.approved_by == [BOB]
            assert await states() == {"node1": "MAINT", "node2": "UP"}
            moved = (await bot.runtime.audit.rotations([record.id]))[record.id]
            assert [(r.server, r.change, r.ok) for r in moved] == [("node1", "out", True)]

            # read-only: no card, no approval, an answer in the channel
            before = len(bot.fake.messages(CHANNEL))
            await bot.command(f"rotation {SERVICE}", user=ALICE)
            await bot.fake.wait_for(
                lambda: any(
                    "Rotation: kimi-k25" in str(m) for m in bot.fake.messages(CHANNEL)[before:]
                ),
                what="the rotation answer",
            )
            answer = next(
                str(m)
                for m in bot.fake.messages(CHANNEL)[before:]
                if "Rotation: kimi-k25" in str(m)
            )
            assert "gpu-node-1: OUT of rotation (MAINT" in answer
            assert "gpu-node-2: in rotation (UP" in answer

            await bot.command(f"undrain {SERVICE} gpu-node-1", user=ALICE)
            back = await bot.wait_for_run(
                lambda r: r.action == "undrain" and r.message_ts is not None, "the undrain card"
            )
            assert f"set server {h.backend}/node1 state ready" in blocks_text(
                await bot.card(back.id)
            )
            await bot.click("approve", back.id, user=BOB)
            done = await bot.wait_status(back.id, "succeeded", "failed", "aborted")
            assert done.status == "succeeded", done.summary
            assert await states() == {"node1": "UP", "node2": "UP"}
        for kit in kits:
            assert "stop" not in kit.changes()
