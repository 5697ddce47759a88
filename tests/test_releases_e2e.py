"""Side-by-side releases (issue 20, item 3) end to end: the engine against the simulated
host behind a real OpenSSH sshd, the venv's path a real symlink into its releases
directory. What reached the host is read from its own call log, which release is live
from the link itself."""

from __future__ import annotations

from pathlib import Path

from bot.core import remote_releases
from bot.core.status import Action, RunStatus, StepStatus
from bot.engine.releases import releases_text
from bot.engine.runtime import open_runtime
from bot.sim import kit as sim_kit
from bot.sim.kit import READY_SETTINGS, SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, Call
from tests.support.runs import run
from tests.support.sim import MakeSimHost, sim_settings
from tests.test_environment_e2e import NEW, redeploy


def _stop_at(calls: list[Call]) -> int:
    return next(i for i, c in enumerate(calls) if c.argv[:2] == ("systemctl", "stop"))


def _installs(calls: list[Call]) -> list[Call]:
    """Every uv call that makes or fills an environment."""
    return [
        c
        for c in calls
        if c.argv[:2] == ("uv", "venv")
        or (
            c.argv[:3] in (("uv", "pip", "install"), ("uv", "pip", "sync"))
            and "--dry-run" not in c.argv
        )
    ]


def test_the_sims_release_mark_is_the_bots() -> None:
    assert sim_kit.RELEASE_MARK == remote_releases.RELEASE_MARK


async def _host(make_sim_host: MakeSimHost) -> SimKit:
    return await make_sim_host(access="sshd", side_by_side=True)


async def test_a_side_by_side_redeploy_builds_first_then_only_switches(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await _host(make_sim_host)
    old = kit.live_release()
    assert old is not None and kit.installed_version == DEFAULT_VERSION
    settings = sim_settings(kit, tmp_path, strategy="side_by_side")
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.SUCCEEDED, out
    new = kit.live_release()
    assert new is not None and new != old and new.startswith(f"{NEW}-")
    assert kit.releases() == sorted([old, new])  # the old release is kept
    assert kit.installed_version == NEW and kit.environment()["torch"] == "2.13.0"
    calls = kit.calls()
    stop = _stop_at(calls)
    built = _installs(calls)
    # The build (uv venv, then the pinned set into the new release) came before the stop,
    # and nothing was installed after it.
    assert [c.argv[:2] for c in built] == [("uv", "venv"), ("uv", "pip")], built
    assert all(calls.index(c) < stop for c in built)
    assert f"{kit.releases_dir}/{new}" in built[0].argv
    assert kit.changes() == ["dry-run", "build", "stop", "start"]
    assert steps["build"].status == StepStatus.OK
    assert "it passed the import gate" in out
    # The unit's flags, judged against the new release's own `vllm serve --help=all`.
    assert "every flag of the unit's ExecStart (4) is accepted by vllm 0.31.0" in out, out
    assert steps["switch"].status == StepStatus.OK
    assert f"live release {new}" in out
    assert f"release {new} is live, {old} kept" in result.summary

    # A rollback by hand (`/vllm rollback`, `python -m bot rollback`): back to the previous
    # release with a stop, a switch and a start; nothing installed.
    async with open_runtime(settings) as rt:
        back, out = await run(rt, Action.ROLLBACK)
    assert back.status == RunStatus.SUCCEEDED, out
    assert kit.live_release() == old and kit.installed_version == DEFAULT_VERSION
    assert kit.changes()[-2:] == ["stop", "start"]
    assert f"release {old} is live, {new} kept" in back.summary


async def test_a_release_that_fails_readiness_is_switched_back_without_an_install(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await _host(make_sim_host)
    old = kit.live_release()
    # The new build's smoke completion fails; the booted build's does not.
    kit.update_config(api_faults_new_build_only=True)
    kit.set_faults(smoke_fail=True)
    settings = sim_settings(kit, tmp_path, strategy="side_by_side", **READY_SETTINGS)
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.ROLLED_BACK, out
    assert kit.live_release() == old
    assert kit.installed_version == DEFAULT_VERSION
    calls = kit.calls()
    stop = _stop_at(calls)
    assert not [c for c in _installs(calls) if calls.index(c) > stop]
    assert kit.changes() == ["dry-run", "build", "stop", "start", "stop", "start"]
    assert steps["rollback_switch"].status == StepStatus.OK
    assert "rollback" not in steps  # no snapshot sync
    assert f"live release {old}" in result.summary and "nothing reinstalled" in result.summary
    # The refused release stays for a look (the next successful run prunes it).
    assert len(kit.releases()) == 2


async def test_pruning_keeps_the_live_and_the_previous_release(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await _host(make_sim_host)
    settings = sim_settings(kit, tmp_path, strategy="side_by_side", keep_releases=2)
    lives: list[str | None] = [kit.live_release()]
    async with open_runtime(settings) as rt:
        for version in (NEW, "0.30.0", DEFAULT_VERSION):
            result, out = await redeploy(rt, version=version, index="nightly")
            assert result.status == RunStatus.SUCCEEDED, out
            lives.append(kit.live_release())
            assert kit.installed_version == version
        # `python -m bot releases`: what the host holds, newest first, the live one marked.
        text, ok = await releases_text(rt.settings, rt.pool, SERVICE)
    assert len(set(lives)) == 4  # a release per run, the last one a new build of the first
    assert kit.releases() == sorted(str(n) for n in lives[-2:])  # the live and the previous
    assert "pruned 1 old release" in result.summary
    assert ok, text
    rows = text.splitlines()
    assert rows[0] == f"== {kit.hostname}: live {lives[-1]}"
    assert rows[1].startswith(f"  * {DEFAULT_VERSION}") and rows[1].endswith(f"{lives[-1]}  (live)")
    assert rows[2].startswith("    0.30.0 ") and len(rows) == 3


async def test_a_venv_that_is_no_link_is_refused_before_anything_changes(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    settings = sim_settings(sim_sshd_host, tmp_path, strategy="side_by_side")
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert "not a side-by-side layout" in result.summary
    assert sim_sshd_host.changes() == ["dry-run"]


async def test_a_release_its_gate_refuses_is_removed_and_nothing_stops(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await _host(make_sim_host)
    old = kit.live_release()
    kit.set_faults(torch_cuda_mismatch=True)  # the new torch needs a newer driver
    settings = sim_settings(kit, tmp_path, strategy="side_by_side")
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert "refused before the stop; service untouched" in result.summary
    assert "removed" in result.summary
    assert kit.changes() == ["dry-run", "build"]
    assert kit.live_release() == old and kit.releases() == [old]
    assert kit.unit_state() == "active"


async def test_releases_of_an_in_place_host_say_it_is_no_side_by_side_layout(
    sim_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        text, ok = await releases_text(rt.settings, rt.pool, SERVICE)
    assert not ok
    assert "configured in_place" in text
    assert f"== {sim_host.hostname}: not a side-by-side layout (" in text
    assert "is not a symbolic link" in text


async def test_a_release_that_drops_a_unit_flag_is_removed_before_the_stop(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # Issue 20, item 2 on a side-by-side host: the new release's help lacks the unit's
    # `--task`; the release is removed and nothing stops.
    kit = await _host(make_sim_host)
    old = kit.live_release()
    kit.set_faults(removed_flag=True)
    async with open_runtime(sim_settings(kit, tmp_path, strategy="side_by_side")) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert result.summary.startswith(
        "refused before the stop; service untouched: `--task` is not accepted by vllm 0.31.0"
    ), result.summary
    assert "removed" in result.summary
    assert not any(c.argv[:2] == ("systemctl", "stop") for c in kit.calls())
    assert kit.live_release() == old and kit.releases() == [old]
    assert kit.unit_state() == "active"
