"""The simulated host's reboot, persistence mode and GPU reset (issue 23, item 3): the
commands bot.core.host_ops runs, answered as a real host answers them. Where the dropped
connection matters, through the real OpenSSH sshd (and the embedded server); the rest
run the tools directly."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

import asyncssh
import pytest

from bot.core.health import XID_JOURNAL_ARGV
from bot.core.host_ops import (
    BOOT_ID_ARGV,
    BOOT_ID_PATH,
    PERSISTENCE_QUERY_ARGV,
    ResetEnd,
    parse_boot_id,
    parse_persistence,
    reset_verdict,
)
from bot.core.results import CommandResult
from bot.sim import power
from bot.sim import tools as sim_tools
from bot.sim.kit import SimKit, fast_config
from bot.sim.tools import cat as sim_cat
from tests.polling import eventually
from tests.sim.test_tools import Ran, health_status, run
from tests.support.nonroot import (
    NonRootKit,
    accounts,
    copy_sim,
    require_root_and_sudo,
    sudoers_installed,
    usable_python,
    workspace,
)
from tests.support.sim import MakeSimHost

UNIT = "vllm-kimi-k25"
REBOOT = ("systemctl", "reboot")
# What a connection to a host that went away raises (the sshd was killed: no exit status).
DROPPED = (asyncssh.Error, OSError)
GPU3 = "00000000:61:00.0"  # the sim's bus id of GPU 3 (its stuck_gpu)
SAMPLES = Path(__file__).parent / "samples" / "host"


def sample(name: str) -> str:
    """A capture of tests/samples/host/ (see its README), with the bus id of the sim's GPU 3
    in place of the one it was captured on."""
    text = (SAMPLES / name).read_text()
    return text.replace("00000000:1A:00.0", GPU3).replace("00000000:C1:00.0", GPU3)


def verdict(argv: tuple[str, ...], r: Ran) -> ResetEnd:
    return reset_verdict(CommandResult(argv, r.status, r.stdout, r.stderr, 0.0)).end


async def over_ssh(kit: SimKit, command: str) -> asyncssh.SSHCompletedProcess:
    """One command on a new connection, as the engine runs one."""
    conn = await kit.connect()
    try:
        return await conn.run(command, check=False)
    finally:
        conn.close()
        await conn.wait_closed()


async def dropped(run_it: Awaitable[asyncssh.SSHCompletedProcess]) -> bool:
    """The connection went away under the command: no exit status (or signal) came back.
    asyncssh's ``run`` says so with ``exit_status`` None, or raises while connecting."""
    try:
        r = await run_it
    except DROPPED:
        return True
    return r.exit_status is None and r.exit_signal is None and r.stdout == ""


def q_values(report: str, key: str) -> list[str]:
    """The values of ``key`` in an ``nvidia-smi -q`` report, in order."""
    pairs = [line.split(":", 1) for line in report.splitlines() if ":" in line]
    return [v.strip() for k, v in pairs if k.strip() == key]


async def wait_stopped(kit: SimKit) -> None:
    await run(kit, "systemctl", "stop", UNIT)
    await eventually(lambda: not [p for p in kit.processes() if p.gpu is not None], "workers gone")


def test_the_names_shared_without_an_import_agree() -> None:
    # bot.sim.tools checks for a reboot without importing bot.sim.power (each tool call
    # would pay for it), and the cat tool answers the path host_ops reads.
    assert (sim_tools._REBOOTING, sim_tools._GATE) == (power.MARKER, power.GATE_TOOL)
    assert sim_tools._BOOT_ID == sim_cat.BOOT_ID_PATH == BOOT_ID_PATH


async def test_the_boot_id_is_a_stable_uuid_and_other_files_are_real_cat(
    sim_host: SimKit, tmp_path: object
) -> None:
    first = await run(sim_host, *BOOT_ID_ARGV)
    again = await run(sim_host, *BOOT_ID_ARGV)
    assert first.status == 0 and first.stdout == again.stdout == sim_host.boot_id() + "\n"
    assert parse_boot_id(first.stdout) == sim_host.boot_id()
    other = await run(sim_host, "cat", "/proc/sys/kernel/ostype")
    assert (other.status, other.stdout) == (0, "Linux\n")
    assert [c.argv for c in sim_host.calls("cat")] == [BOOT_ID_ARGV, BOOT_ID_ARGV]


@pytest.mark.parametrize("access", ["sshd", "embedded"])
async def test_a_reboot_drops_the_connection_and_logins_fail_until_it_is_up(
    make_sim_host: MakeSimHost, access: str
) -> None:
    kit = await make_sim_host(access=access, config=fast_config(reboot_delay_s=600.0))
    before = (await over_ssh(kit, "cat /proc/sys/kernel/random/boot_id")).stdout
    assert before == kit.boot_id() + "\n"
    idle = await kit.connect()  # another connection, open across the reboot
    async with await kit.connect() as conn:
        assert await dropped(conn.run("systemctl reboot; echo still here", check=False))
    assert kit.reboots() == 1 and not kit.is_up()
    assert kit.boot_id() + "\n" != before
    # Booting: a login gets no command run, only a dropped connection.
    assert await dropped(over_ssh(kit, "echo up"))
    assert kit.unit_state() == "inactive" and kit.processes() == []
    assert all(g.used_mib == 0 for g in kit.gpus())
    assert kit.end_boot()  # the boot is over (reboot_delay_s stays 600 s)
    r = await over_ssh(kit, "cat /proc/sys/kernel/random/boot_id")
    assert (r.exit_status, r.stdout) == (0, kit.boot_id() + "\n")
    assert r.stdout != before and kit.is_up()
    # A connection of the boot before is gone too, even now that the host is up.
    assert await dropped(idle.run("echo still here", check=False))
    idle.close()
    # The enabled unit came back with the host, and serves again once loaded.
    assert (await over_ssh(kit, f"systemctl is-active {UNIT}")).stdout == "active\n"
    await eventually(lambda: health_status(kit), "the unit serving after the reboot")


async def test_a_reboot_that_hangs_never_comes_back(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(access="sshd")
    kit.set_faults(reboot_hangs=True)
    assert await dropped(over_ssh(kit, "systemctl reboot"))
    assert not kit.end_boot()
    for _ in range(2):
        assert await dropped(over_ssh(kit, "echo up"))
    assert not kit.is_up() and kit.unit_state() == "inactive"


async def test_a_slow_reboot_takes_reboot_slow_s(sim_host: SimKit) -> None:
    kit = sim_host
    kit.set_faults(reboot_slow=True)
    kit.update_config(reboot_delay_s=0.0, reboot_slow_s=600.0)
    assert (await run(kit, *REBOOT)).status == 0
    assert not kit.is_up() and kit.unit_state() == "inactive"
    kit.update_config(reboot_slow_s=0.0)
    assert kit.is_up() and kit.unit_state() == "active"


async def test_enabled_units_come_back_and_disabled_ones_stay_down(sim_host: SimKit) -> None:
    kit = sim_host
    assert (await run(kit, "systemctl", "is-enabled", UNIT)).stdout == "enabled\n"
    # Run directly (no SSH): it prints nothing and exits 0, as on a host.
    r = await run(kit, *REBOOT)
    assert (r.status, r.stdout, r.stderr) == (0, "", "")
    assert not kit.is_up()
    kit.update_config(reboot_delay_s=0.0)
    assert kit.is_up() and kit.unit_state() == "active"
    await eventually(lambda: health_status(kit), "the enabled unit serving again")
    d = await run(kit, "systemctl", "disable", UNIT)
    assert d.status == 0 and d.stderr.startswith('Removed "/etc/systemd/system/')
    assert not kit.unit_enabled()
    show = await run(kit, "systemctl", "show", UNIT, "-p", "UnitFileState")
    assert show.stdout == "UnitFileState=disabled\n"
    assert (await run(kit, *REBOOT)).status == 0
    assert kit.is_up() and kit.reboots() == 2
    assert kit.unit_state() == "inactive" and kit.processes() == []
    is_enabled = await run(kit, "systemctl", "is-enabled", UNIT)
    assert (is_enabled.status, is_enabled.stdout) == (1, "disabled\n")
    assert await health_status(kit) is None


async def test_a_reboot_clears_what_a_reboot_clears(sim_host: SimKit) -> None:
    kit = sim_host
    kit.set_faults(pending_remap=True, reset_required=True)
    assert (await run(kit, "nvidia-smi", "-i", "3", "-pm", "0")).status == 0
    assert any("Xid" in line for line in kit.kernel_log())
    kit.update_config(reboot_delay_s=0.0)
    assert (await run(kit, *REBOOT)).status == 0
    q = (await run(kit, "nvidia-smi", "-q", "-i", "3")).stdout
    assert q_values(q, "Reset Required") == ["No"] and q_values(q, "Pending")[-1] == "No"
    assert kit.kernel_log() == []  # this boot's kernel log
    assert (await run(kit, *XID_JOURNAL_ARGV)).stdout == "-- No entries --\n"
    assert kit.persistence(3)  # back on, as nvidia-persistenced sets it at boot


async def test_persistence_mode_is_per_gpu_and_set_with_pm(sim_host: SimKit) -> None:
    kit = sim_host
    q = await run(kit, *PERSISTENCE_QUERY_ARGV)
    assert [p.enabled for p in parse_persistence(q.stdout)] == [True] * 8
    assert q.stdout.splitlines()[3] == f"3, {GPU3}, Enabled"
    off = await run(kit, "nvidia-smi", "-i", "3", "-pm", "0")
    assert (off.status, off.stdout) == (
        0,
        f"Disabled persistence mode for GPU {GPU3}.\nAll done.\n",
    )
    rows = parse_persistence((await run(kit, *PERSISTENCE_QUERY_ARGV)).stdout)
    assert [p.index for p in rows if not p.enabled] == [3] and not kit.persistence(3)
    table = (await run(kit, "nvidia-smi")).stdout
    assert "|   3  NVIDIA RTX PRO 6000 B...     Off   |" in table
    on = await run(kit, "nvidia-smi", "-i", "3", "-pm", "1")
    assert on.stdout == f"Enabled persistence mode for GPU {GPU3}.\nAll done.\n"
    assert on.stdout.endswith(sample("nvidia_smi_pm_0.txt"))  # "All done.", as captured
    by_name = await run(kit, "nvidia-smi", "-i", "3", "-pm", "ENABLED")  # NVIDIA's guide
    assert by_name.stdout == on.stdout
    assert kit.persistence(3)
    bad = await run(kit, "nvidia-smi", "-i", "9", "-pm", "1")
    assert (bad.status, bad.stdout) == (6, "No devices were found\n")


async def test_a_reset_is_refused_under_a_process_and_persistence_then_succeeds(
    sim_host: SimKit,
) -> None:
    kit = sim_host
    reset = ("nvidia-smi", "-r", "-i", "3")
    busy = await run(kit, *reset)
    assert busy.status == 255 and verdict(reset, busy) == ResetEnd.IN_USE
    assert busy.stdout == sample("nvidia_smi_r_in_use_by_process.txt")
    await wait_stopped(kit)
    held = await run(kit, *reset)
    assert held.status == 255 and verdict(reset, held) == ResetEnd.IN_USE
    assert held.stdout == sample("nvidia_smi_r_in_use_by_client.txt")
    assert (await run(kit, "nvidia-smi", "-i", "3", "-pm", "0")).status == 0
    done = await run(kit, *reset)
    assert (done.status, done.stdout) == (0, sample("nvidia_smi_r_done.txt"))
    assert verdict(reset, done) == ResetEnd.DONE
    assert kit.resets() == [3] and not kit.persistence(3)  # left as it was set


async def test_reset_refused_holds_even_with_persistence_off(sim_host: SimKit) -> None:
    kit = sim_host
    await wait_stopped(kit)
    kit.set_faults(reset_refused=True)
    assert (await run(kit, "nvidia-smi", "-i", "3", "-pm", "0")).status == 0
    r = await run(kit, "nvidia-smi", "-r", "-i", "3")
    assert r.status == 255 and "GPU 00000000:61:00.0: In use by another client" in r.stdout
    assert kit.resets() == []


async def test_a_reset_clears_the_gpus_reset_required_state(sim_host: SimKit) -> None:
    kit = sim_host
    kit.set_faults(reset_required=True, pending_remap=True)
    q = (await run(kit, "nvidia-smi", "-q", "-i", "3")).stdout
    assert q_values(q, "Reset Required") == ["Yes"] and q_values(q, "Pending")[-1] == "Yes"
    await wait_stopped(kit)
    assert (await run(kit, "nvidia-smi", "-i", "3", "-pm", "0")).status == 0
    assert (await run(kit, "nvidia-smi", "-r", "-i", "3")).status == 0
    q = (await run(kit, "nvidia-smi", "-q", "-i", "3")).stdout
    assert q_values(q, "Reset Required") == ["No"] and q_values(q, "Pending")[-1] == "No"
    assert q_values(q, "Persistence Mode") == ["Disabled"]
    mib = [g.used_mib for g in kit.gpus()]
    assert mib[3] == 0


async def test_a_reboot_run_with_real_sudo_by_an_ordinary_account(tmp_path: Path) -> None:
    """As the flow runs it on a ``become = "sudo"`` host: ``sudo -n -- <systemctl> reboot``
    by the login, through the real sshd; the login's own logins are gated while booting."""
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        kit = NonRootKit(
            base / "host",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(reboot_delay_s=600.0),
        )
        try:
            await kit.start()
            systemctl = kit.tool("systemctl")
            before = (await over_ssh(kit, "cat /proc/sys/kernel/random/boot_id")).stdout
            assert before == kit.boot_id() + "\n"
            with sudoers_installed(f"{who.login} ALL=(root) NOPASSWD: {systemctl} reboot\n"):
                assert await dropped(over_ssh(kit, f"sudo -n -- {systemctl} reboot"))
            assert kit.reboots() == 1 and not kit.is_up()
            assert await dropped(over_ssh(kit, "cat /proc/sys/kernel/random/boot_id"))
            kit.update_config(reboot_delay_s=0.0)
            after = await over_ssh(kit, "cat /proc/sys/kernel/random/boot_id")
            assert (after.exit_status, after.stdout) == (0, kit.boot_id() + "\n")
            assert after.stdout != before and kit.unit_state() == "active"
        finally:
            await kit.close()
