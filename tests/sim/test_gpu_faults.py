"""The simulated host's GPU faults and tools of issue 12, run directly (no SSH):
``nvidia-smi -q``, the kernel's Xid lines (``journalctl -k``), ``ps``, ``kill``, and a
second service on its own GPUs. Each fault is read back with the bot's own parsers."""

from __future__ import annotations

import re
import shlex

from bot.core.gpu import APPS_QUERY_ARGV, GPU_QUERY_ARGV, parse_apps_csv, parse_gpu_csv
from bot.core.health import (
    HEALTH_QUERY_ARGV,
    XID_JOURNAL_ARGV,
    Level,
    judge,
    parse_health_query,
    parse_xid_lines,
)
from bot.core.leftovers import facts_query, parse_facts, parse_signalled, signal_command
from bot.sim.kit import BIN_DIR, SimKit, fast_config
from bot.sim.state import NEIGHBOUR_PID
from tests.polling import eventually
from tests.sim.test_tools import run
from tests.support.sim import MakeSimHost

# The leftover script runs ps and kill by absolute path: the simulated host's.
TOOLS = {"ps": str(BIN_DIR / "ps"), "kill": str(BIN_DIR / "kill")}

STUCK = 48304  # Worker_TP3 of the running unit (main PID 48213 + 88 + 3)


async def health(kit: SimKit) -> tuple[int, Level, str]:
    gpus = await run(kit, *GPU_QUERY_ARGV)
    q = await run(kit, *HEALTH_QUERY_ARGV)
    x = await run(kit, *XID_JOURNAL_ARGV)
    listed = parse_gpu_csv(kit.hostname, gpus.stdout.split("Unable")[0])
    h = judge(
        kit.hostname, listed, parse_health_query(kit.hostname, q.stdout), parse_xid_lines(x.stdout)
    )
    return gpus.status, h.level(), h.summary()


async def test_a_healthy_host_reads_as_healthy(sim_host: SimKit) -> None:
    assert await health(sim_host) == (0, Level.OK, "8 GPUs healthy")
    assert (await run(sim_host, *XID_JOURNAL_ARGV)).stdout == "-- No entries --\n"


async def test_each_hardware_fault_reads_as_critical_with_its_xid(sim_host: SimKit) -> None:
    sim_host.set_faults(pending_remap=True)
    status, level, said = await health(sim_host)
    assert (status, level) == (0, Level.CRITICAL) and "GPU 3: a row remap is pending" in said
    assert "Xid 63" in said
    sim_host.set_faults(pending_remap=False, ecc_uncorrected=True)
    status, level, said = await health(sim_host)
    assert level == Level.CRITICAL and "1 uncorrectable ECC error(s) since the last reset" in said
    assert "Xid 48" in said
    sim_host.set_faults(ecc_uncorrected=False, xid_79=True)
    status, level, said = await health(sim_host)
    assert status == 15 and level == Level.CRITICAL
    assert "PCI 0000:61:00 (no GPU answers there now): Xid 79 (GPU has fallen off the bus)" in said
    listed = await run(sim_host, *GPU_QUERY_ARGV)
    assert "Unable to determine the device handle for GPU" in listed.stdout
    assert [g.index for g in parse_gpu_csv("h", listed.stdout.split("Unable")[0])] == [
        0,
        1,
        2,
        4,
        5,
        6,
        7,
    ]


async def test_unified_memory_and_no_gpus(sim_host: SimKit) -> None:
    sim_host.set_faults(unified_memory=True)
    gpus = parse_gpu_csv("h", (await run(sim_host, *GPU_QUERY_ARGV)).stdout)
    assert {(g.memory_used_mib, g.memory_total_mib, g.memory_note) for g in gpus} == {
        (None, None, "[N/A]")
    }
    apps = parse_apps_csv("h", (await run(sim_host, *APPS_QUERY_ARGV)).stdout)
    assert apps and {p.used_mib for p in apps} == {None}
    sim_host.set_faults(unified_memory=False, no_gpus=True)
    r = await run(sim_host, *GPU_QUERY_ARGV)
    assert (r.status, r.stdout) == (0, "")


async def test_ps_and_kill_see_the_simulated_processes_only(sim_host: SimKit) -> None:
    r = await run(sim_host, *facts_query([STUCK, 48213, 2]))
    facts = parse_facts(r.stdout)
    assert r.status == 0 and set(facts) == {STUCK, 48213}
    assert facts[STUCK].units() == ("vllm-kimi-k25.service",) and facts[STUCK].user == "vllm"
    r = await run(sim_host, "kill", "-s", "TERM", "1")
    assert r.status == 1 and "No such process" in r.stderr  # never a real PID
    assert (
        await run(sim_host, "systemctl", "show", "-p", "User", "--value", "--", "vllm-kimi-k25")
    ).stdout == "vllm\n"


async def test_orphan_workers_outlive_the_stop_and_end_on_sigterm(sim_host: SimKit) -> None:
    sim_host.set_faults(orphan_workers=True)
    await run(sim_host, "systemctl", "stop", "vllm-kimi-k25")
    await eventually(lambda: sim_host.unit_state() == "inactive", "the unit stops")
    workers = [p for p in sim_host.processes() if p.cmdline.startswith("VLLM::")]
    assert len(workers) == 9  # EngineCore and the 8 workers, holding their memory
    assert all(g.used_mib > 90000 for g in sim_host.gpus())
    facts = parse_facts((await run(sim_host, *facts_query(p.pid for p in workers))).stdout)
    term = signal_command("TERM", [*facts.values()], "vllm-kimi-k25", **TOOLS)
    out = await run(sim_host, "sh", "-c", shlex.join(term))
    assert set(parse_signalled(out.stdout).values()) == {"sent"}
    # kill(1) returns once the signals are sent; the workers end as they handle them.
    await eventually(
        lambda: sim_host.processes() == [] and all(g.used_mib == 0 for g in sim_host.gpus()),
        "the workers to end on SIGTERM and free their memory",
    )
    assert sorted(p for _, p in sim_host.signalled()) == sorted(p.pid for p in workers)


async def test_a_d_state_worker_survives_sigkill(sim_host: SimKit) -> None:
    sim_host.set_faults(d_state_worker=True)
    await run(sim_host, "systemctl", "stop", "vllm-kimi-k25")
    await eventually(lambda: [p.pid for p in sim_host.processes()] == [STUCK], "only TP3 left")
    (f,) = parse_facts((await run(sim_host, *facts_query([STUCK]))).stdout).values()
    assert f.uninterruptible
    kill = signal_command("KILL", [f], "vllm-kimi-k25", **TOOLS)
    await run(sim_host, "sh", "-c", shlex.join(kill))
    assert [p.pid for p in sim_host.processes()] == [STUCK]


async def test_a_neighbour_service_runs_on_its_own_gpus(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(
        config=fast_config(neighbour_unit="vllm-other", neighbour_gpus=(4, 5, 6, 7))
    )
    await run(kit, "systemctl", "stop", "vllm-kimi-k25")
    await eventually(
        lambda: [g.used_mib > 0 for g in kit.gpus()] == [False] * 4 + [True] * 4,
        "the unit's GPUs free, the neighbour's held",
    )
    workers = (await run(kit, "pgrep", "-a", "-f", "^VLLM::")).stdout
    assert f"{NEIGHBOUR_PID + 88} VLLM::Worker_TP0" in workers
    (f,) = parse_facts((await run(kit, *facts_query([NEIGHBOUR_PID + 88]))).stdout).values()
    assert f.units() == ("vllm-other.service",)
    # Named to the signal script of vllm-kimi-k25 (as a caller of its sudo rule could):
    # the host's own check sees another unit's cgroup and refuses.
    kill = signal_command("KILL", [f], "vllm-kimi-k25", **TOOLS)
    out = await run(kit, "sh", "-c", shlex.join(kill))
    assert parse_signalled(out.stdout) == {f.pid: "refused"}
    assert f.pid in [p.pid for p in kit.processes()] and kit.signalled() == []


async def test_reset_required_and_a_mig_xid(sim_host: SimKit) -> None:
    """Issue 17: the GPU Reset Status of a 535-560 driver, and an Xid of a MIG instance."""
    q = (await run(sim_host, *HEALTH_QUERY_ARGV)).stdout
    assert len(re.findall(r"\n {8}Reset Required +: No\n", q)) == 8
    assert q.count("GPU Recovery Action") == 8
    sim_host.set_faults(reset_required=True)
    q = (await run(sim_host, *HEALTH_QUERY_ARGV)).stdout
    assert len(re.findall(r"\n {8}Reset Required +: Yes\n", q)) == 1
    assert len(re.findall(r"\n {8}Drain and Reset Recommended +: Yes\n", q)) == 1
    assert "GPU Recovery Action" not in q  # a 535-560 driver has no such line
    status, level, said = await health(sim_host)
    assert (status, level) == (0, Level.CRITICAL)
    assert said.startswith("CRITICAL: GPU 3: the driver recommends a drain and reset")
    assert "Xid" not in said  # nvidia-smi -q alone tells
    sim_host.set_faults(reset_required=False, mig_xid=True)
    x = (await run(sim_host, *XID_JOURNAL_ARGV)).stdout
    assert "kernel: NVRM: Xid (PCI:0000:61:00 GPU-I:05): 94, " in x
    status, level, said = await health(sim_host)
    assert (status, level) == (0, Level.WARN)
    assert said.startswith(
        "warning: GPU 3: Xid 94 (contained ECC error) on MIG instance GPU-I:05, last at "
    )
