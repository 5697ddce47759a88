"""``/vllm gpus --deep`` through the real bolt app (signed requests), the fake Slack and
the simulated GPU host (issue 23): a host with a deep fault gets the finding and NVIDIA's
action in the posted answer, a healthy one says ok."""

from __future__ import annotations

import html
from pathlib import Path

from bot.core.deep_check import RESEAT
from bot.sim.kit import SimKit, fast_config
from tests.slack_harness import CHANNEL, SERVICE, blocks_text, slack_bot
from tests.support.sim import MakeSimHost

TITLE = "Deep GPU check"


async def test_gpus_deep_names_a_degraded_link_and_a_failing_diag_with_nvidias_action(
    tmp_path: Path, sim_host: SimKit
) -> None:
    sim_host.set_faults(pcie_degraded=True, dcgmi_fails=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        res = await bot.command("gpus gpu-node-1 --deep")
        assert res.status == 200
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: TITLE in m.get("text", ""))
        text = html.unescape(blocks_text(msg))  # Slack's escaping of < > &
        assert "gpu-node-1: deep GPU check FAIL" in text, text
        assert f"GPU 3: PCIe link x8 of x16 -> {RESEAT}" in text, text
        assert "Persistence Mode: fail" in text, text
        assert "rerun with -r 2 once the cause is fixed" in text, text
        await bot.front_end.idle()
        # Only reads reached the host: no unit change, no GPU reset or persistence change.
        assert not [c for c in sim_host.calls("systemctl") if {"stop", "start"} & set(c.argv)]
        assert not [c for c in sim_host.calls("nvidia-smi") if {"-r", "-pm"} & set(c.argv)]


async def test_gpus_deep_says_ok_for_a_healthy_host(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command("gpus --deep")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: TITLE in m.get("text", ""))
        text = blocks_text(msg)
        assert "gpu-node-1: deep GPU check ok" in text, text
        assert "FAIL" not in text and "warn" not in text, text


async def test_gpus_deep_over_hosts_too_many_for_one_message_leads_with_the_failing_one(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    # Three 8-GPU hosts: every line would not fit one message, and cut, the third host's
    # failure would be in the attached file only. The message says each host's verdict
    # with what needs a look, failing hosts first; the file holds every line.
    kits = [await make_sim_host(config=fast_config(hostname=f"gpu-node-{i}")) for i in (1, 2, 3)]
    kits[2].set_faults(pcie_degraded=True)
    hosts = {k.hostname: k.host_settings() for k in kits}
    services = {SERVICE: kits[0].service_settings()}
    async with slack_bot(tmp_path, kits[0], hosts=hosts, services=services) as bot:
        await bot.command("gpus --deep")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: TITLE in m.get("text", ""))
        text = html.unescape(blocks_text(msg))
        lines = text.split("```")[1].strip().splitlines()
        assert lines[0].startswith("gpu-node-3: deep GPU check FAIL ("), text
        assert lines[1].strip() == f"FAIL pcie        GPU 3: PCIe link x8 of x16 -> {RESEAT}"
        for ok in ("gpu-node-1", "gpu-node-2"):
            assert any(line.startswith(f"{ok}: deep GPU check ok (") for line in lines), text
        assert "cut" not in text
        await bot.front_end.idle()
        [full] = [f for f in bot.fake.files if f.text and "gpu-node-3" in f.text]
        assert "ok   persistence GPU 7: persistence mode on" in full.text
        assert full.text.count("deep GPU check") == 3
