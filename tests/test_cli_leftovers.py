"""Leftover workers from the command line (issue 12): ``--kill-leftovers`` lets the run end
them; without it, off a terminal, nobody can be asked and the run ends with the service
stopped and the processes named; each host of a batch is asked on its own (issue 17 F5).
``python -m bot`` in a subprocess, a TOML file, a real DB."""

from __future__ import annotations

import re
from pathlib import Path

from bot.audit.store import AuditLog
from bot.sim.kit import SERVICE, SimKit, fast_config, fleet_fragment
from tests.support.cli import cli, cli_on_terminal, write_toml
from tests.support.sim import MakeSimHost

WORKERS = [48253, *range(48301, 48309)]


def setup(kit: SimKit, tmp_path: Path) -> dict[str, str]:
    config = write_toml(tmp_path / "chatops.toml", kit.settings_fragment(drain_timeout_s=1.0))
    return {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}


async def test_kill_leftovers_ends_them_and_the_run_goes_on(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(orphan_workers=True)
    env = setup(sim_host, tmp_path)
    code, out, err = await cli(
        "restart", SERVICE, "--yes", "--kill-leftovers", cwd=tmp_path, env=env
    )
    assert code == 0, err + out
    assert "9 processes of vllm-kimi-k25.service outlived its stop" in out
    assert sorted(sim_host.signalled()) == sorted(("TERM", p) for p in WORKERS)
    code, out, _ = await cli("gpus", "--health", cwd=tmp_path, env=env)
    assert code == 0 and "gpu-node-1: ok" in out and "GPU 3 " in out


async def test_off_a_terminal_without_the_flag_nothing_is_signalled(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(orphan_workers=True)
    env = setup(sim_host, tmp_path)
    code, out, _ = await cli("restart", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 1
    assert "not on a terminal, and --kill-leftovers was not given" in out
    assert "The service is STOPPED" in out and sim_host.signalled() == []


async def two_hosts(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> tuple[list[SimKit], dict[str, str]]:
    """gpu-node-1 and gpu-node-2, one service, both hosts stopped at once (batch of 2),
    the unit's workers outliving the stop on both."""
    venv = tmp_path / "opt-venv"
    kits = [
        await make_sim_host(
            config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
        )
        for i in (1, 2)
    ]
    for kit in kits:
        kit.set_faults(orphan_workers=True)
    config = write_toml(
        tmp_path / "chatops.toml", fleet_fragment(kits, drain_timeout_s=1.0, max_unavailable=2)
    )
    return kits, {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}


async def goes(tmp_path: Path) -> list[tuple[str, list[int]]]:
    async with AuditLog.open(tmp_path / "audit.db") as log:
        return [(g.host, sorted(g.pids)) for g in await log.leftover_approvals(1)]


async def test_kill_leftovers_approves_each_host_of_a_batch_on_its_own(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, env = await two_hosts(make_sim_host, tmp_path)
    code, out, err = await cli(
        "restart", SERVICE, "--yes", "--kill-leftovers", cwd=tmp_path, env=env
    )
    assert code == 0, err + out
    for kit in kits:
        assert f"{kit.hostname}: 9 processes of vllm-kimi-k25.service outlived its stop" in out
        assert sorted(kit.signalled()) == sorted(("TERM", p) for p in WORKERS)
    # One go per host, naming it and exactly its PIDs.
    assert sorted(await goes(tmp_path)) == [("gpu-node-1", WORKERS), ("gpu-node-2", WORKERS)]


async def test_on_a_terminal_each_host_is_asked_and_answered_on_its_own(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # Proceed? y, then the first host asked: y, the second: n.
    kits, env = await two_hosts(make_sim_host, tmp_path)
    code, out, err = await cli_on_terminal(
        "restart", SERVICE, answer="y\ny\nn\n", cwd=tmp_path, env=env
    )
    assert code == 1, err + out
    asked = re.findall(
        r"Terminate these 9 processes on (gpu-node-\d) \(PIDs ([0-9, ]+)\)\? "
        r"\[y/N\]",
        err,
    )
    assert sorted(h for h, _ in asked) == ["gpu-node-1", "gpu-node-2"], err
    assert all(sorted(map(int, p.split(", "))) == WORKERS for _, p in asked)
    # The host asked first (its list printed first) is the one that got the yes.
    first = min(("gpu-node-1", "gpu-node-2"), key=lambda h: out.index(f"{h}: 9 processes"))
    other = "gpu-node-2" if first == "gpu-node-1" else "gpu-node-1"
    signalled = {k.hostname: sorted(k.signalled()) for k in kits}
    assert signalled == {first: sorted(("TERM", p) for p in WORKERS), other: []}
    assert await goes(tmp_path) == [(first, WORKERS)]
    assert f"answered no for {other}" in out
