"""The simulated tools run directly (no SSH): output formats, exit codes, timing and faults."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import pytest

from bot.core import remote
from bot.core.gpu import APPS_QUERY_ARGV, GPU_QUERY_ARGV, parse_apps_csv, parse_gpu_csv
from bot.core.startup import Phase, phase_of
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, HostConfig, HostState
from bot.sim.tools import unit as unit_tool
from tests.polling import eventually
from tests.support.sim import MakeSimHost

UNIT = "vllm-kimi-k25"
SHOW = ("systemctl", "show", UNIT, "-p", "LoadState,ActiveState,SubState,MainPID")
PGREP = ("pgrep", "-a", "-f", "^VLLM::")
JOURNAL_LINE = re.compile(
    r"^[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d gpu-node-1 (systemd|python3)\[\d+\]: "
)


@dataclass
class Ran:
    status: int
    stdout: str
    stderr: str


async def run(kit: SimKit, *argv: str) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=kit.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def uv(kit: SimKit, *args: str) -> tuple[str, ...]:
    return ("uv", "pip", *args[:1], "--python", str(kit.python), *args[1:])


async def health_status(kit: SimKit) -> int | None:
    """The /health status, None when the connection is refused."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", kit.health_port)
    except ConnectionRefusedError:
        return None
    writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    head = await reader.readline()
    writer.close()
    return int(head.split()[1])


async def test_systemctl_show_running_unit_in_systemd_order(sim_host: SimKit) -> None:
    r = await run(sim_host, *SHOW)
    assert r.status == 0 and r.stderr == ""
    assert r.stdout == ("MainPID=48213\nLoadState=loaded\nActiveState=active\nSubState=running\n")


async def test_systemctl_unknown_unit(sim_host: SimKit) -> None:
    r = await run(sim_host, "systemctl", "show", "nope", "-p", SHOW[-1])
    assert (r.status, r.stdout) == (
        0,
        "MainPID=0\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n",
    )
    r = await run(sim_host, "systemctl", "stop", "nope")
    assert (r.status, r.stderr) == (
        5,
        "Failed to stop nope.service: Unit nope.service not loaded.\n",
    )
    r = await run(sim_host, "systemctl", "is-active", "nope")
    assert (r.status, r.stdout) == (3, "inactive\n")


async def test_running_service_holds_every_gpu(sim_host: SimKit) -> None:
    r = await run(sim_host, *GPU_QUERY_ARGV)
    assert r.status == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 8
    assert re.fullmatch(
        r"0, GPU-[0-9a-f-]{36}, NVIDIA RTX PRO 6000 Blackwell Server Edition, "
        r"97000, 97871, \d+",
        lines[0],
    )
    gpus = parse_gpu_csv("gpu-node-1", r.stdout)
    apps = await run(sim_host, *APPS_QUERY_ARGV)
    procs = parse_apps_csv("gpu-node-1", apps.stdout)
    assert [p.name for p in procs] == [f"VLLM::Worker_TP{i}" for i in range(8)]
    assert [p.gpu_uuid for p in procs] == [g.uuid for g in gpus]
    assert re.fullmatch(
        r"48301, VLLM::Worker_TP0, 96986 MiB, GPU-[0-9a-f-]{36}", apps.stdout.splitlines()[0]
    )
    r = await run(sim_host, *PGREP)
    assert r.status == 0
    assert "48304 VLLM::Worker_TP3\n" in r.stdout


async def test_nvidia_smi_formats(sim_host: SimKit) -> None:
    r = await run(sim_host, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert r.stdout.splitlines()[0] == "0, 97000 MiB"
    r = await run(
        sim_host, "nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv"
    )
    assert r.stdout.splitlines()[0] == "index, memory.used [MiB], utilization.gpu [%]"
    r = await run(sim_host, "nvidia-smi", "--query-gpu=bogus", "--format=csv")
    assert (r.status, r.stdout) == (2, 'Field "bogus" is not a valid field to query.\n\n')
    r = await run(sim_host, "nvidia-smi")
    assert r.status == 0
    assert "NVIDIA-SMI" in r.stdout and "VLLM::Worker_TP7" in r.stdout


async def test_stop_then_memory_released_after_delay(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host()
    kit.update_config(release_delay_s=3600)  # frozen "just stopped" moment
    r = await run(kit, "systemctl", "stop", UNIT)
    assert (r.status, r.stdout, r.stderr) == (0, "", "")
    assert (await run(kit, "systemctl", "is-active", UNIT)).status == 3
    assert (await run(kit, *SHOW)).stdout.startswith("MainPID=0\n")
    assert await health_status(kit) is None
    # Stopped, but the driver has not let go yet.
    r = await run(kit, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert r.stdout.splitlines()[3] == "3, 97000 MiB"
    assert (await run(kit, *PGREP)).status == 0

    kit.update_config(release_delay_s=0)
    r = await run(kit, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert r.stdout == "".join(f"{i}, 0 MiB\n" for i in range(8))
    assert await run(kit, *APPS_QUERY_ARGV) == Ran(0, "", "")
    assert await run(kit, *PGREP) == Ran(1, "", "")
    journal = await run(kit, "journalctl", "-u", UNIT, "-n", "2", "--no-pager")
    assert journal.stdout.splitlines()[-1].endswith(
        "Stopped vllm-kimi-k25.service - vLLM Kimi-K2.5 (INT4)."
    )


async def test_stuck_worker_survives_stop(sim_host: SimKit) -> None:
    sim_host.set_faults(stuck_worker=True)
    sim_host.update_config(release_delay_s=0)
    await run(sim_host, "systemctl", "stop", UNIT)
    r = await run(sim_host, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert [line.split(", ")[1] for line in r.stdout.splitlines()] == ["0 MiB"] * 3 + [
        "96000 MiB"
    ] + ["0 MiB"] * 4
    apps = await run(sim_host, *APPS_QUERY_ARGV)
    assert re.fullmatch(r"48304, VLLM::Worker_TP3, 95986 MiB, GPU-[0-9a-f-]{36}\n", apps.stdout)
    assert await run(sim_host, *PGREP) == Ran(0, "48304 VLLM::Worker_TP3\n", "")
    assert any("remains running after unit stopped" in line for line in sim_host.journal())
    assert [(p.pid, p.gpu) for p in sim_host.processes()] == [(48304, 3)]
    assert [g.used_mib for g in sim_host.gpus()][3] == 96000
    sim_host.clear_faults()
    assert await run(sim_host, *PGREP) == Ran(1, "", "")


async def test_start_loads_then_serves(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(running=False)
    kit.update_config(load_delay_s=1.0)
    assert (await run(kit, "systemctl", "is-active", UNIT)) == Ran(3, "inactive\n", "")
    r = await run(kit, "systemctl", "start", UNIT)
    assert (r.status, r.stdout, r.stderr) == (0, "", "")
    # Type=simple: active at once, while nothing listens until the model is loaded.
    assert (await run(kit, "systemctl", "is-active", UNIT)) == Ran(0, "active\n", "")
    assert await health_status(kit) is None

    async def serving() -> bool:
        return await health_status(kit) == 200

    await eventually(serving, "the health check answers 200")
    lines = (await run(kit, "journalctl", "-u", UNIT, "-n", "50", "--no-pager")).stdout
    assert all(JOURNAL_LINE.match(line) for line in lines.splitlines())
    # Its version at the end of vLLM's banner (no "vLLM API server version" line since 0.11).
    assert "(APIServer pid=" in lines and f"█  version {DEFAULT_VERSION}" in lines
    assert lines.splitlines()[-1].endswith('"GET /health HTTP/1.1" 200 OK')


async def test_start_fails_with_traceback(sim_host: SimKit) -> None:
    await run(sim_host, "systemctl", "stop", UNIT)
    sim_host.set_faults(start_fails=True)
    assert (await run(sim_host, "systemctl", "start", UNIT)).status == 0

    async def failed() -> bool:
        return (await run(sim_host, "systemctl", "is-active", UNIT)).stdout == "failed\n"

    await eventually(failed, "the unit fails")
    show = await run(sim_host, *SHOW)
    assert "ActiveState=failed\nSubState=failed\n" in show.stdout
    assert await health_status(sim_host) is None
    journal = (await run(sim_host, "journalctl", "-u", UNIT, "-n", "20", "--no-pager")).stdout
    assert "Traceback (most recent call last):" in journal
    assert journal.splitlines()[-1].endswith("Failed with result 'exit-code'.")


async def test_health_503_fault(sim_host: SimKit) -> None:
    assert await health_status(sim_host) == 200
    sim_host.set_faults(health_503=True)
    assert await health_status(sim_host) == 503


async def test_uv_pip_show(sim_host: SimKit) -> None:
    r = await run(sim_host, *uv(sim_host, "show", "vllm"))
    assert r.status == 0
    lines = r.stdout.splitlines()
    assert lines[:3] == [
        "Name: vllm",
        f"Version: {DEFAULT_VERSION}",
        f"Location: {sim_host.venv_dir}/lib/python3.12/site-packages",
    ]
    assert lines[3].startswith("Requires: ") and lines[4] == "Required-by:"
    sim_host.set_installed_version(None)
    r = await run(sim_host, *uv(sim_host, "show", "vllm"))
    assert r == Ran(1, "", "warning: Package(s) not found for: vllm\n")


async def test_uv_dry_run(sim_host: SimKit) -> None:
    r = await run(
        sim_host,
        *uv(
            sim_host,
            "install",
            "--dry-run",
            "--force-reinstall",
            "vllm",
            "--extra-index-url",
            "https://wheels.vllm.ai/nightly",
        ),
    )
    assert r.status == 0 and r.stdout == ""
    # The shape of uv 0.13.9's dry run (tests/samples/uv_dry_run_torch_change.txt), over
    # the simulated release's packages: torch and the CUDA wheels move with vllm.
    lines = r.stderr.splitlines()
    assert re.fullmatch(r"Resolved 44 packages in \d+ms", lines[0])
    assert lines[1:4] == [
        "Would download 13 packages",
        "Would uninstall 38 packages",
        "Would install 44 packages",
    ]
    assert lines.index(" - torch==2.12.1+cu129") + 1 == lines.index(" + torch==2.13.0")
    assert lines.index(f" - vllm=={DEFAULT_VERSION}") + 1 == lines.index(" + vllm==0.31.0")
    assert " + nvidia-cudnn-cu13==9.20.0.48" in lines and " ~ numpy==2.3.5" in lines
    r = await run(
        sim_host, *uv(sim_host, "install", "--dry-run", "--force-reinstall", "vllm==9.9.9")
    )
    assert r.status == 1
    assert r.stderr == (
        "  × No solution found when resolving dependencies:\n"
        "  ╰─▶ Because there is no version of vllm==9.9.9 and you require vllm==9.9.9, we can "
        "conclude that your requirements are unsatisfiable.\n"
    )
    sim_host.set_faults(resolve_fails=True)
    r = await run(
        sim_host, *uv(sim_host, "install", "--dry-run", "--force-reinstall", "vllm==0.30.0")
    )
    assert r.status == 1 and "No solution found" in r.stderr


async def test_uv_install_streams_then_switches_version(sim_host: SimKit) -> None:
    sim_host.update_config(install_duration_s=1.0)
    proc = await asyncio.create_subprocess_exec(
        *uv(sim_host, "install", "--force-reinstall", "vllm==0.30.0"),
        env=sim_host.env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    first = await proc.stderr.readline()
    assert first.startswith(b"Resolved 43 packages in ")
    # The first line came while uv was still working: nothing is switched yet.
    assert sim_host.installed_version == DEFAULT_VERSION
    rest = (await proc.stderr.read()).decode()
    assert await proc.wait() == 0
    lines = rest.splitlines()
    # Only the wheel the cache lacks is downloaded; --force-reinstall puts back the rest.
    assert lines[:4] == [
        "Downloading transformers (11.5MiB)",
        "Downloading vllm (420.0MiB)",
        " Downloaded transformers",
        " Downloaded vllm",
    ]
    assert [line.split(" in ")[0] for line in lines[4:7]] == [
        "Prepared 43 packages",
        "Uninstalled 43 packages",
        "Installed 43 packages",
    ]
    changed = [line for line in lines[7:] if not line.startswith(" ~ ")]
    assert changed == [
        " - transformers==5.16.0",
        " + transformers==5.14.0",
        f" - vllm=={DEFAULT_VERSION}",
        " + vllm==0.30.0",
    ]
    assert sim_host.installed_version == "0.30.0"
    assert sim_host.environment()["transformers"] == "5.14.0"
    sim_host.update_config(install_duration_s=0.1)
    # Reinstalling the same version is a "~" line, as uv prints it.
    r = await run(sim_host, *uv(sim_host, "install", "--reinstall-package", "vllm", "vllm==0.30.0"))
    assert r.stderr.splitlines()[-1] == " ~ vllm==0.30.0"


async def test_uv_fails_once(sim_host: SimKit) -> None:
    sim_host.set_faults(uv_fails=True)
    r = await run(sim_host, *uv(sim_host, "install", "--force-reinstall", "vllm==0.31.0"))
    assert r.status == 2
    assert (
        "error: Failed to download `vllm==0.31.0`\n  Caused by: Request failed after 3 "
        "retries\n  Caused by: error sending request for url (" in r.stderr
    )
    assert sim_host.installed_version == DEFAULT_VERSION
    rollback = uv(sim_host, "install", "--reinstall-package", "vllm", f"vllm=={DEFAULT_VERSION}")
    assert (await run(sim_host, *rollback)).status == 0


async def test_uv_fails_always_breaks_rollback(sim_host: SimKit) -> None:
    sim_host.set_faults(uv_fails_always=True)
    for args in (
        ("install", "--force-reinstall", "vllm"),
        ("install", "--reinstall-package", "vllm", "vllm==0.30.0"),
    ):
        assert (await run(sim_host, *uv(sim_host, *args))).status == 2
    assert sim_host.installed_version == DEFAULT_VERSION


async def test_uv_long_output(sim_host: SimKit) -> None:
    sim_host.update_config(install_output_lines=1000)
    r = await run(sim_host, *uv(sim_host, "install", "--force-reinstall", "vllm==0.31.0"))
    assert r.status == 0
    assert sum(line.startswith("      [") for line in r.stderr.splitlines()) == 999
    assert "Downloading vllm (412.3MiB)" in r.stderr.splitlines()


async def test_no_driver_fault(sim_host: SimKit) -> None:
    sim_host.set_faults(no_driver=True)
    for argv in (GPU_QUERY_ARGV, APPS_QUERY_ARGV, ("nvidia-smi",)):
        r = await run(sim_host, *argv)
        assert r.status == 9
        assert r.stdout.startswith(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        )


async def test_journalctl(sim_host: SimKit) -> None:
    r = await run(sim_host, "journalctl", "-u", UNIT, "-n", "5", "--no-pager")
    lines = r.stdout.splitlines()
    assert r.status == 0 and len(lines) == 5
    assert all(JOURNAL_LINE.match(line) for line in lines)
    assert lines[-1].endswith(
        "python3[48213]: (APIServer pid=48213) INFO:     Application startup complete."
    )
    r = await run(sim_host, "journalctl", "-u", "other", "-n", "5", "--no-pager")
    assert r == Ran(0, "-- No entries --\n", "")


async def test_journalctl_after_a_cursor_shows_the_first_n_and_reads_on(sim_host: SimKit) -> None:
    # As real journalctl (systemd issue #14722): -n N with --after-cursor is the first N
    # entries after the cursor, and the cursor shown is that of the last one printed, so
    # reading on from it skips nothing.
    every = (
        await run(sim_host, "journalctl", "-u", UNIT, "-n", "100000", "-o", "cat", "--no-pager")
    ).stdout.splitlines()
    assert len(every) > 6
    cursor = "s=sim;i=0;t=0.0"  # before the first entry (the simulator's cursor format)
    got: list[str] = []
    while True:
        r = await run(
            sim_host,
            "journalctl",
            "-u",
            UNIT,
            f"--after-cursor={cursor}",
            "-n",
            "3",
            "--show-cursor",
            "-o",
            "cat",
            "-q",
            "--no-pager",
        )
        lines = r.stdout.splitlines()
        if not lines:
            break
        assert len(lines) <= 4 and lines[-1].startswith("-- cursor: ")
        got += lines[:-1]
        cursor = lines[-1].removeprefix("-- cursor: ")
    assert got == every
    # Without a cursor, -n N is still the last N.
    last = await run(sim_host, "journalctl", "-u", UNIT, "-n", "2", "-o", "cat", "--no-pager")
    assert last.stdout.splitlines() == every[-2:]


async def test_call_log_keeps_order(sim_host: SimKit) -> None:
    await run(sim_host, *SHOW)
    await run(sim_host, "systemctl", "stop", UNIT)
    await run(sim_host, *GPU_QUERY_ARGV)
    assert [c.argv for c in sim_host.calls()] == [SHOW, ("systemctl", "stop", UNIT), GPU_QUERY_ARGV]
    assert [c.tool for c in sim_host.calls("nvidia-smi")] == ["nvidia-smi"]


@pytest.mark.parametrize(
    "argv", [("systemctl", "frobnicate", UNIT), ("pgrep",), ("uv", "pip", "frob")]
)
async def test_usage_errors_exit_nonzero(sim_host: SimKit, argv: tuple[str, ...]) -> None:
    r = await run(sim_host, *argv)
    assert r.status in (1, 2) and r.stderr


async def test_systemctl_and_journalctl_accept_the_argv_the_bot_builds(sim_host: SimKit) -> None:
    # The builders put "--" before systemctl's operands, as systemd 252 accepts it.
    svc = Settings(**sim_host.settings_fragment()).services[SERVICE]
    show = await run(sim_host, *remote.unit_show(svc))
    assert (show.status, show.stderr) == (0, "")
    assert "LoadState=loaded\nActiveState=active\n" in show.stdout
    assert await run(sim_host, *remote.unit_is_active(svc)) == Ran(0, "active\n", "")
    assert (await run(sim_host, *remote.unit_stop(svc))).status == 0
    assert await run(sim_host, *remote.unit_is_active(svc)) == Ran(3, "inactive\n", "")
    assert (await run(sim_host, *remote.unit_start(svc))).status == 0
    journal = await run(sim_host, *remote.journal_tail(svc, 3))
    assert journal.status == 0 and len(journal.stdout.splitlines()) == 3
    assert sim_host.changes() == ["stop", "start"]


async def test_after_the_end_of_options_a_dash_is_a_unit_name(sim_host: SimKit) -> None:
    # Like systemd 252: an operand after "--" is a unit, never an option.
    r = await run(sim_host, "systemctl", "stop", "--", "--now.service")
    assert (r.status, r.stderr) == (
        5,
        "Failed to stop --now.service: Unit --now.service not loaded.\n",
    )
    r = await run(sim_host, "systemctl", "stop", "--now.service")
    assert (r.status, r.stderr) == (1, "systemctl: unrecognized option '--now.service'\n")
    assert sim_host.unit_state() == "active"
    # journalctl's operands after "--" are matches: "foo" is not one (systemd 252's words).
    r = await run(sim_host, "journalctl", "-u", UNIT, "--no-pager", "--", "foo")
    assert r == Ran(1, "", "Failed to add match 'foo': Invalid argument\n")
    r = await run(sim_host, "journalctl", "-u", UNIT, "-n", "1", "--no-pager", "--")
    assert r.status == 0 and len(r.stdout.splitlines()) == 1


def _phases_begin(cfg: HostConfig) -> tuple[dict[Phase, float], float]:
    """When each start-up phase first shows in a start's journal, and when the port
    answers, in seconds after `systemctl start`."""
    t0 = 1_000_000.0
    st = HostState(
        cfg,
        venv="/opt/v",
        health_port=1,
        service_port=8000,
        owner_pid=1,
        installed_version=DEFAULT_VERSION,
    )
    begun, plan = unit_tool._begin(st, t0, may_fail=False)
    first: dict[Phase, float] = {}
    for entry in sorted(plan, key=lambda e: e.ts):
        if (seen := phase_of(entry.msg)) is not None:
            first.setdefault(seen[0], entry.ts - t0)
    assert begun.run.ready_at is not None
    return first, begun.run.ready_at - t0


def test_startup_phase_min_s_stretches_only_the_phases_before_the_weights_load() -> None:
    # The card's start-up test must see three phases on a loaded machine: the first two
    # then last seconds each, without a long load; the rest keeps its length, later.
    plain, ready = _phases_begin(HostConfig(load_delay_s=8.0))
    assert [
        plain[p] for p in (Phase.STARTING, Phase.ENGINE, Phase.LOADING, Phase.LOADED)
    ] == pytest.approx([0.0, 0.8, 1.6, 6.8]) and ready == pytest.approx(8.0)
    slow, ready = _phases_begin(HostConfig(load_delay_s=8.0, startup_phase_min_s=4.0))
    assert [
        slow[p] for p in (Phase.STARTING, Phase.ENGINE, Phase.LOADING, Phase.LOADED)
    ] == pytest.approx([0.0, 4.0, 8.0, 13.2]) and ready == pytest.approx(14.4)
    # Shorter than the load's own phases: no change.
    short, ready = _phases_begin(HostConfig(load_delay_s=8.0, startup_phase_min_s=0.5))
    assert short == pytest.approx(plain) and ready == pytest.approx(8.0)
