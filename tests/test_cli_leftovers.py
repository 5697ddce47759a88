"""Leftover workers from the command line (issue 12): ``--kill-leftovers`` lets the run end
them; without it, off a terminal, nobody can be asked and the run ends with the service
stopped and the processes named. ``python -m bot`` in a subprocess, a TOML file, a real DB."""

from __future__ import annotations

from pathlib import Path

from bot.sim.kit import SERVICE, SimKit
from tests.support.cli import cli, write_toml

WORKERS = [48253, *range(48301, 48309)]


def setup(kit: SimKit, tmp_path: Path) -> dict[str, str]:
    config = write_toml(tmp_path / "chatops.toml", kit.settings_fragment(drain_timeout_s=1.0))
    return {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}


async def test_kill_leftovers_ends_them_and_the_run_goes_on(sim_host: SimKit,
                                                            tmp_path: Path) -> None:
    sim_host.set_faults(orphan_workers=True)
    env = setup(sim_host, tmp_path)
    code, out, err = await cli("restart", SERVICE, "--yes", "--kill-leftovers", cwd=tmp_path,
                               env=env)
    assert code == 0, err + out
    assert "9 processes of vllm-kimi-k25.service outlived its stop" in out
    assert sorted(sim_host.signalled()) == sorted(("TERM", p) for p in WORKERS)
    code, out, _ = await cli("gpus", "--health", cwd=tmp_path, env=env)
    assert code == 0 and "gpu-node-1: ok" in out and "GPU 3 " in out


async def test_off_a_terminal_without_the_flag_nothing_is_signalled(sim_host: SimKit,
                                                                    tmp_path: Path) -> None:
    sim_host.set_faults(orphan_workers=True)
    env = setup(sim_host, tmp_path)
    code, out, _ = await cli("restart", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 1
    assert "not on a terminal, and --kill-leftovers was not given" in out
    assert "The service is STOPPED" in out and sim_host.signalled() == []
