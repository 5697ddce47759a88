"""The simulated host's whole Python environment (issue 10): freeze, sync, uv's cache and
downloads, the venv's interpreter, and the faults torch_cuda_mismatch, import_error,
index_drops_old and uv_fails_midway. The tools run directly (no SSH), with the argv
the bot builds (bot.core.remote)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from bot.core import remote
from bot.core.cuda import GateReport, parse_driver_cuda, parse_gate_output
from bot.core.packages import parse_freeze, parse_install_changes
from bot.settings import ServiceSettings
from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.sim.test_tools import Ran, run


def svc(kit: SimKit) -> ServiceSettings:
    return ServiceSettings(**kit.service_settings())


async def run_in(kit: SimKit, argv: tuple[str, ...], stdin: bytes | None = None) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=kit.env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin or b"")
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


async def save_snapshot(kit: SimKit) -> str:
    frozen = await run(kit, *remote.freeze(svc(kit)))
    path = remote.lock_path(svc(kit), parse_freeze(frozen.stdout).digest)
    saved = await run_in(kit, remote.save_lock(svc(kit), path), frozen.stdout.encode())
    assert saved.status == 0, saved.stderr
    return path


async def test_freeze_lists_the_release_on_stdout(sim_host: SimKit) -> None:
    r = await run(sim_host, *remote.freeze(svc(sim_host)))
    assert r.status == 0
    assert r.stderr.startswith("Using Python 3.12.3 environment at: ")
    frozen = parse_freeze(r.stdout)
    assert frozen.count == 43 and frozen.others == ()
    assert (frozen.version_of("vllm"), frozen.version_of("torch")) == (
        DEFAULT_VERSION,
        "2.12.1+cu129",
    )


async def test_the_snapshot_is_kept_owner_only_next_to_the_venv(sim_host: SimKit) -> None:
    path = await save_snapshot(sim_host)
    kept = Path(path)
    assert kept.parent == sim_host.venv_dir.parent / ".chatops"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert parse_freeze(kept.read_text()).version_of("vllm") == DEFAULT_VERSION
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no temporary left


async def test_sync_restores_the_exact_snapshot_from_the_cache(sim_host: SimKit) -> None:
    before = sim_host.environment()
    path = await save_snapshot(sim_host)
    r = await run(sim_host, *remote.install(svc(sim_host), "vllm==0.31.0", None))
    assert r.status == 0 and sim_host.environment()["torch"] == "2.13.0"
    # uv pip install never removes: the CUDA 12 wheels are still there beside the 13 ones.
    assert "nvidia-cudnn-cu12" in sim_host.environment()
    sim_host.set_faults(index_drops_old=True)  # the old build is gone from the index
    online = await run(sim_host, *remote.sync_lock(svc(sim_host), path, offline=False))
    assert online.status == 1 and "there is no version of" in online.stderr
    assert sim_host.environment()["torch"] == "2.13.0"  # a failed sync changes nothing
    r = await run(sim_host, *remote.sync_lock(svc(sim_host), path, offline=True))
    assert r.status == 0, r.stderr
    assert sim_host.environment() == before
    assert " - cuda-toolkit==13.0.3.0" in r.stderr.splitlines()  # what the snapshot did not have


async def test_offline_finds_only_what_is_cached(sim_host: SimKit) -> None:
    path = await save_snapshot(sim_host)
    sim_host.set_installed_version(None)  # as a killed install leaves it
    # Drop the old vllm wheel from the cache: offline cannot bring it back.
    with sim_host.store.transaction() as tx:
        tx.state = replace(
            tx.state, cache=tuple(c for c in tx.state.cache if not c.startswith("vllm=="))
        )
    r = await run(sim_host, *remote.sync_lock(svc(sim_host), path, offline=True))
    assert r.status == 2
    assert (
        f"error: Failed to download `vllm=={DEFAULT_VERSION}`\n  Caused by: Network "
        "connectivity is disabled, but the requested data wasn't found in the cache"
    ) in r.stderr
    r = await run(sim_host, *remote.sync_lock(svc(sim_host), path, offline=False))
    assert r.status == 0 and sim_host.installed_version == DEFAULT_VERSION


async def test_downloads_happen_once_then_come_from_the_cache(sim_host: SimKit) -> None:
    sim_host.update_config(install_duration_s=0.1)
    argv = remote.install_dry_run(svc(sim_host), "vllm==0.31.0", None)
    dry = await run(sim_host, *argv)
    wanted = parse_install_changes(dry.stderr)
    assert "Would download 13 packages" in dry.stderr and len(wanted) == 13
    pinned = parse_freeze((await run(sim_host, *remote.freeze(svc(sim_host)))).stdout)
    stdin = pinned.applied(wanted).requirements().encode()
    cached = sim_host.cached()
    fetched = await run_in(sim_host, remote.prefetch(svc(sim_host), None), stdin)
    assert fetched.status == 0, fetched.stderr
    # Judged by what uv did, not by how long it took: the thirteen wheels not in the
    # cache were fetched into it, each announced by a Downloading line but cuda-toolkit
    # (uv announces no wheel under 1 MiB; that metapackage is much smaller).
    assert sim_host.cached() - cached == {f"{c.name}=={c.after}" for c in wanted}
    announced = [
        line.split()[1] for line in fetched.stderr.splitlines() if line.startswith("Downloading ")
    ]
    assert sorted(announced) == sorted(c.name for c in wanted if c.name != "cuda-toolkit")
    assert len(announced) == 12 and "Downloading torch (880.0MiB)" in fetched.stderr
    assert sim_host.environment()["torch"] == "2.12.1+cu129"  # a prefetch installs nothing here
    assert "torch==2.13.0" in sim_host.cached()
    assert not list((sim_host.venv_dir.parent / ".chatops").glob("prefetch-*"))  # removed
    r = await run(sim_host, *remote.install(svc(sim_host), "vllm==0.31.0", None))
    assert r.status == 0 and "Downloading" not in r.stderr  # all thirteen from the cache


async def test_the_venv_interpreter_runs_the_gate(sim_host: SimKit) -> None:
    r = await run(sim_host, *remote.import_gate(svc(sim_host)))
    assert r.status == 0, r.stderr
    assert parse_gate_output(r.stdout) == GateReport(DEFAULT_VERSION, "2.12.1+cu129", "12.9")
    await run(sim_host, *remote.install(svc(sim_host), "vllm==0.31.0", None))
    assert parse_gate_output(
        (await run(sim_host, *remote.import_gate(svc(sim_host)))).stdout
    ) == GateReport("0.31.0", "2.13.0", "13.0")


async def test_import_error_spares_only_the_boot_version(sim_host: SimKit) -> None:
    sim_host.set_faults(import_error=True)
    assert (await run(sim_host, *remote.import_gate(svc(sim_host)))).status == 0
    await run(sim_host, *remote.install(svc(sim_host), "vllm==0.31.0", None))
    r = await run(sim_host, *remote.import_gate(svc(sim_host)))
    assert r.status == 3 and parse_gate_output(r.stdout) is None
    assert r.stderr.rstrip().endswith("undefined symbol: _ZN3c104cuda9SetDeviceEab")


async def test_torch_cuda_mismatch_is_an_older_driver(sim_host: SimKit) -> None:
    assert parse_driver_cuda((await run(sim_host, "nvidia-smi")).stdout) == "13.1"
    sim_host.set_faults(torch_cuda_mismatch=True)
    assert parse_driver_cuda((await run(sim_host, "nvidia-smi")).stdout) == "12.9"


async def test_uv_fails_midway_leaves_a_mixed_environment(sim_host: SimKit) -> None:
    sim_host.set_faults(uv_fails_midway=True)
    r = await run(sim_host, *remote.install(svc(sim_host), "vllm==0.31.0", None))
    assert r.status == 2 and "No space left on device" in r.stderr
    env = sim_host.environment()
    assert env["torch"] == "2.13.0" and "vllm" not in env
    assert not sim_host.faults.uv_fails_midway  # one-shot
