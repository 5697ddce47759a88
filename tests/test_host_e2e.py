"""Host maintenance end to end (issue 23): ``/vllm host reboot|gpu-reset`` through the real
bolt app (signed requests, Slack faked at its HTTP boundary) and ``python -m bot host`` as
a subprocess, against the simulated host behind a real OpenSSH sshd: the reboot drops the
SSH connection under ``systemctl reboot``, logins fail until the simulated boot is over,
and the host comes back with a new boot id and its enabled units started.

The boot lasts ``reboot_delay_s`` of the simulator's clock (0.5 s in the fast config);
the bot polls the boot id every 0.2 s. A test that must act while the host is down
(another host key) holds it down with ``reboot_hangs`` and waits on what it observes
(``kit.reboots()``), never on a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.audit.store import RunRecord
from bot.core.status import RunStatus
from bot.sim.kit import SERVICE, SimKit
from tests.fakes import FakeSlack, SlackSigner
from tests.polling import eventually
from tests.slack_harness import ALICE, BOB, SlackBot, blocks_text, slack_bot
from tests.support.cli import cli, write_toml
from tests.test_reliability_zombie import (
    APPROVERS_GROUP,
    CAROL,
    CHANNEL,
    SIGNING_SECRET,
    BotClient,
    bot_env,
    db_row,
    free_port,
    run_status,
    serving,
)

MAINTENANCE: dict[str, Any] = {"reboot_timeout_s": 30, "reboot_poll_s": 0.2}
FINAL = ("succeeded", "failed", "aborted", "refused", "cancelled", "interrupted")


async def approved(bot: SlackBot, text: str) -> int:
    await bot.command(text, user=ALICE)
    record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
    await bot.click("approve", record.id, user=BOB)
    return record.id


async def ended(bot: SlackBot, run_id: int) -> RunRecord:
    """The run once it is over and its driver done: the service state is a record of its
    own written after the status (bot.audit.resilient), so it is read after the driver."""
    await bot.wait_status(run_id, *FINAL, timeout_s=60)
    await bot.front_end.idle()
    return await bot.run(run_id)


async def told(bot: SlackBot, run_id: int) -> str:
    await bot.front_end.idle()
    return "\n".join(blocks_text(m) for m in await bot.thread(run_id))


@pytest.fixture
async def host(make_sim_host: Any) -> SimKit:
    kit: SimKit = await make_sim_host(access="sshd")
    return kit


async def test_reboot_drains_stops_reboots_checks_and_starts_the_service_again(
    tmp_path: Path, host: SimKit
) -> None:
    boot = host.boot_id()
    async with slack_bot(tmp_path, host, maintenance=MAINTENANCE) as bot:
        run_id = await approved(bot, f"host reboot {host.hostname}")
        done = await ended(bot, run_id)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        assert host.reboots() == 1 and host.boot_id() != boot
        assert host.unit_state() == "active"
        steps = [(s.step, s.status) for s in await bot.runtime.audit.steps(run_id)]
        names = [name for name, _ in steps]
        assert names.index("stop") < names.index("reboot") < names.index("deep_check")
        assert names.index("deep_check") < names.index("start")
        assert ("reboot", "ok") in steps and ("deep_check", "ok") in steps
        # The host went down under `systemctl reboot`: its result never came back (the
        # sim kills the session's sshd), and the bot waited and reconnected.
        (reboot,) = [s for s in await bot.runtime.audit.steps(run_id) if s.step == "reboot"]
        assert "connection lost while running `systemctl`" in reboot.output_tail, reboot
        thread = await told(bot, run_id)
        assert f"boot id {boot[:8]} → {host.boot_id()[:8]}" in thread
        await bot.fake.wait_for(
            lambda: (
                f"{SERVICE}: started, healthy"
                in blocks_text(bot.fake.message("C0OPS", done.message_ts or ""))
            ),
            what="the final card",
        )
        assert done.service_state == "up"


async def test_a_refused_gpu_reset_says_the_host_needs_a_reboot_and_keeps_it_out(
    tmp_path: Path, host: SimKit
) -> None:
    host.set_faults(reset_refused=True)
    async with slack_bot(tmp_path, host, maintenance=MAINTENANCE) as bot:
        run_id = await approved(bot, f"host gpu-reset {host.hostname} 3")
        done = await ended(bot, run_id)
        assert done.status == RunStatus.FAILED
        assert done.summary is not None
        assert "In use by another client" in done.summary
        assert f"needs a reboot (/vllm host reboot {host.hostname})" in done.summary
        assert host.resets() == []  # tried once, refused, never retried
        assert host.persistence(3)  # turned back on after the refusal
        assert host.unit_state() == "inactive"  # stays out: on_failed_check = "stop"
        assert host.reboots() == 0
        assert done.service_state == "stopped"
        # The step's audit row says the reset failed (begun, and ended as it did).
        steps = [(s.step, s.status) for s in await bot.runtime.audit.steps(run_id)]
        assert ("gpu_reset", "failed") in steps, steps


async def test_a_gpu_reset_with_persistence_on_resets_and_restores_it(
    tmp_path: Path, host: SimKit
) -> None:
    async with slack_bot(tmp_path, host, maintenance=MAINTENANCE) as bot:
        run_id = await approved(bot, f"host gpu-reset {host.hostname} 0 3")
        done = await ended(bot, run_id)
        assert done.status == RunStatus.SUCCEEDED, done.summary
        assert host.resets() == [0, 3]
        assert host.persistence(0) and host.persistence(3)
        assert host.unit_state() == "active"
        assert host.reboots() == 0
        steps = [(s.step, s.status) for s in await bot.runtime.audit.steps(run_id)]
        names = [name for name, _ in steps]
        assert names.index("drain") < names.index("gpu_reset") < names.index("deep_check")
        assert ("gpu_reset", "ok") in steps and ("deep_check", "ok") in steps, steps


async def test_a_host_back_with_another_key_is_refused_as_a_different_machine(
    tmp_path: Path, host: SimKit
) -> None:
    host.set_faults(reboot_hangs=True)
    async with slack_bot(tmp_path, host, maintenance=MAINTENANCE) as bot:
        run_id = await approved(bot, f"host reboot {host.hostname}")
        await eventually(lambda: host.reboots() == 1, "the reboot", timeout_s=30)
        # While it is down, known_hosts learns another key for its address: whatever
        # answers there next is not the machine approved.
        known = Path(host.host_settings()["known_hosts"])
        other = tmp_path / "other_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True
        )
        pub = (other.with_suffix(".pub")).read_text().split()
        line = known.read_text().splitlines()[0].split()[0]
        known.write_text(f"{line} {pub[0]} {pub[1]}\n")
        host.clear_faults()
        done = await ended(bot, run_id)
        assert done.status == RunStatus.FAILED
        assert done.summary is not None and "refused as a different machine" in done.summary
        assert "state now is UNKNOWN" in done.summary
        assert done.service_state == "unknown"
        starts = [s for s in await bot.runtime.audit.steps(run_id) if s.step == "start"]
        assert starts == []


async def test_the_terminal_reboots_a_host_and_exits_0(tmp_path: Path, host: SimKit) -> None:
    config = write_toml(tmp_path / "chatops.toml", host.settings_fragment())
    maintenance = "".join(f"{k} = {v}\n" for k, v in MAINTENANCE.items())
    config.write_text(config.read_text() + f"[maintenance]\n{maintenance}")
    env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}
    boot = host.boot_id()
    code, out, err = await cli("host", "reboot", host.hostname, "-y", cwd=tmp_path, env=env)
    assert code == 0, out + err
    assert "succeeded" in out
    assert host.boot_id() != boot and host.unit_state() == "active"
    code, out, _ = await cli(
        "audit", "--service", f"host:{host.hostname}", "--json", cwd=tmp_path, env=env
    )
    (run,) = json.loads(out)
    assert run["action"] == "reboot" and run["status"] == "succeeded"
    assert run["service_state"] == "up"


async def test_a_host_that_fails_its_deep_check_after_the_reboot_stays_out(
    tmp_path: Path, host: SimKit
) -> None:
    # A riser that trains at x8 after the reboot: the deep check FAILs, the unit the boot
    # started by itself is stopped again, and the card says why with NVIDIA's action.
    host.set_faults(pcie_degraded=True)
    async with slack_bot(tmp_path, host, maintenance=MAINTENANCE) as bot:
        run_id = await approved(bot, f"host reboot {host.hostname}")
        done = await ended(bot, run_id)
        assert done.status == RunStatus.FAILED
        assert done.summary is not None
        assert f"{host.hostname} stays out: deep GPU check FAIL" in done.summary
        assert "reseat" in done.summary
        assert host.reboots() == 1
        assert host.unit_state() == "inactive"
        assert done.service_state == "stopped"
        await bot.front_end.idle()
        await bot.fake.wait_for(
            lambda: "stays out" in blocks_text(bot.fake.message("C0OPS", done.message_ts or "")),
            what="the final card",
        )


async def test_a_reboot_whose_fabric_never_registers_keeps_the_host_out_with_the_reason(
    tmp_path: Path, host: SimKit
) -> None:
    # Fabric Manager dead at boot (NVSentinel#883): the GPUs stay "In Progress", every
    # NVLink down. The deep check waits fabric_wait_s for it (polled every 0.2 s here),
    # then fails: the units the boot started are stopped again, and the card says why.
    host.set_faults(fabric_stuck=True)
    maintenance = {**MAINTENANCE, "fabric_wait_s": 1.0}
    async with slack_bot(tmp_path, host, maintenance=maintenance) as bot:
        run_id = await approved(bot, f"host reboot {host.hostname}")
        done = await ended(bot, run_id)
        assert done.status == RunStatus.FAILED, done.summary
        assert done.summary is not None
        assert f"{host.hostname} stays out: deep GPU check FAIL" in done.summary
        assert "fabric In Progress, still after waiting" in done.summary
        assert "systemctl status nvidia-fabricmanager" in done.summary
        assert "every NVLink link inactive on every GPU of an NVSwitch system" in done.summary
        assert host.reboots() == 1
        assert host.unit_state() == "inactive"
        assert done.service_state == "stopped"
        steps = [(s.step, s.status) for s in await bot.runtime.audit.steps(run_id)]
        assert ("reboot", "ok") in steps and ("deep_check", "failed") in steps, steps
        await bot.front_end.idle()
        await bot.fake.wait_for(
            lambda: (
                "fabric In Progress"
                in blocks_text(bot.fake.message("C0OPS", done.message_ts or ""))
            ),
            what="the final card",
        )


async def test_a_bot_killed_while_the_host_reboots_recovers_the_run_and_tells_its_thread(
    tmp_path: Path, host: SimKit
) -> None:
    # The bot itself, as a process (HTTP mode over the fake Slack), killed with SIGKILL
    # while it waits for the host to come back; restarted on the same database, it
    # finds the run, marks it interrupted, tells the thread what the host may be in and
    # what to check, and frees its locks (a new request gets its card). The DB-made
    # version of this, without a reboot, is tests/test_host_slack.py's.
    host.set_faults(reboot_hangs=True)  # down until the test lets it boot
    async with FakeSlack(
        channels=[CHANNEL], usergroups={APPROVERS_GROUP: [BOB]}, post_rate_per_s=20
    ) as fake:
        port = free_port()
        env = bot_env(tmp_path, host, fake, port)
        with Path(env["CHATOPS_CONFIG"]).open("a") as f:
            f.write("[maintenance]\n" + "".join(f"{k} = {v}\n" for k, v in MAINTENANCE.items()))
        db = tmp_path / "audit.db"
        client = BotClient(
            fake, f"http://127.0.0.1:{port}/slack/events", db, SlackSigner(SIGNING_SECRET)
        )
        argv = [sys.executable, "-m", "bot"]

        async def start(log: Path) -> asyncio.subprocess.Process:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tmp_path,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            await serving(log, lambda: proc.returncode is None)
            return proc

        first = await start(tmp_path / "bot-1.log")
        try:
            await client.command(f"host reboot {host.hostname}", ALICE)
            card = await eventually(lambda: client.card_of(1), "the card", 15)
            await client.click("approve", 1, card, BOB)
            await eventually(lambda: host.reboots() == 1, "the reboot", 30)
            step = "SELECT status FROM steps WHERE run_id = 1 AND step = 'reboot'"
            await eventually(lambda: db_row(db, step) == ("running",), "the wait for the host", 30)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            await first.wait()
        assert run_status(db, 1) == "running"  # what the killed bot left behind
        host.clear_faults()  # the host boots while the bot is away

        second = await start(tmp_path / "bot-2.log")
        try:
            await eventually(lambda: run_status(db, 1) == "interrupted", "the recovery", 30)
            told = await eventually(
                lambda: "was interrupted" in client.thread_text(card) and client.thread_text(card),
                "the thread to be told",
                30,
            )
            assert f"(reboot of host {host.hostname})" in told and "during step `reboot`" in told
            assert "down, booting or back" in told
            assert f"`/vllm status {SERVICE}`" in told
            assert f"`/vllm gpus --deep {host.hostname}`" in told
            assert db_row(db, "SELECT COUNT(*) FROM locks") == (0,)
            await client.command(f"restart {SERVICE}", CAROL)
            await eventually(lambda: client.card_of(2), "a card for a new request", 15)
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
