"""Side-by-side releases (issue 20, item 3) end to end: the engine against the simulated
host behind a real OpenSSH sshd, the venv's path a real symlink into its releases
directory. What reached the host is read from its own call log, which release is live
from the link itself."""

from __future__ import annotations

import html
import io
from pathlib import Path

from bot.audit.store import AuditLog
from bot.core import remote_releases
from bot.core.plan import Step
from bot.core.releases import SwitchKind
from bot.core.status import Action, RunStatus, StepStatus
from bot.engine.releases import releases_text, rollback_targets
from bot.engine.runtime import open_runtime
from bot.sim import kit as sim_kit
from bot.sim.kit import READY_SETTINGS, SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, Call
from tests.slack_harness import CHANNEL, blocks_text, slack_bot
from tests.support.cli import cli, write_toml
from tests.support.runs import run
from tests.support.sim import MakeSimHost, sim_settings
from tests.test_environment_e2e import NEW, Tap, redeploy


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


async def test_a_rollback_by_hand_after_a_failed_redeploy_goes_back_not_forward(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """The reported case: A live, a redeploy to B, a redeploy to C whose readiness fails
    and is switched back to B, C kept for a look. A rollback by hand then went to C, the
    newest release not live ("0.16.0 -> 0.15.1": forward), and its prune removed A. It
    goes to A, the release live before B by the audit log's switches, and the prune keeps
    it."""
    kit = await _host(make_sim_host)
    a = kit.live_release()
    assert a is not None
    settings = sim_settings(
        kit, tmp_path, strategy="side_by_side", keep_releases=2, **READY_SETTINGS
    )
    async with open_runtime(settings) as rt:
        first, out = await redeploy(rt, version=NEW, index="nightly")
        assert first.status == RunStatus.SUCCEEDED, out
        b = kit.live_release()
        assert b is not None
        # C's smoke completion fails; the fault is gone once the switch back begins, so B
        # serves again.
        kit.set_faults(smoke_fail=True)
        tap = Tap(io.StringIO())
        tap.on_start[Step.ROLLBACK_SWITCH] = lambda: kit.set_faults(smoke_fail=False)
        failed, out = await redeploy(rt, tap, version="0.30.0", index="nightly")
        assert failed.status == RunStatus.ROLLED_BACK, out
        assert kit.live_release() == b
        [c] = set(kit.releases()) - {a, b}
        assert c.startswith("0.30.0-")

    # `python -m bot rollback kimi-k25 --yes`, as an operator runs it: what it prints
    # before it asks says where it goes and why.
    config = kit.settings_fragment(strategy="side_by_side", keep_releases=2, **READY_SETTINGS)
    env = {
        "CHATOPS_CONFIG": str(write_toml(tmp_path / "chatops.toml", config)),
        "CHATOPS_DB": str(tmp_path / "audit.db"),
    }
    code, out, err = await cli("rollback", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 0, err + out
    assert kit.live_release() == a and kit.installed_version == DEFAULT_VERSION, out
    why = f"the release live before this one, switched away from by run #{first.run_id}"
    assert f"rollback (read now):\n{kit.hostname}: from release {b} to {a} ({why})" in out, out
    assert f"switching to {a}: {why}" in out  # the preflight's own choice
    # The prune kept the target and the release it left; the failed one went.
    assert kit.releases() == sorted([a, b])
    assert "pruned 1 old release" in out
    async with AuditLog.open(tmp_path / "audit.db") as audit:
        back = (await audit.list_runs(limit=1))[0]
        switches = await audit.release_switches([first.run_id, failed.run_id, back.id])
    assert back.action == Action.ROLLBACK and back.status == RunStatus.SUCCEEDED
    # Every switch the bot made, per run, in order.
    assert {
        run_id: [(s.from_release, s.to_release, s.kind) for s in rows]
        for run_id, rows in switches.items()
    } == {
        first.run_id: [(a, b, SwitchKind.SWITCH)],
        failed.run_id: [(b, c, SwitchKind.SWITCH), (c, b, SwitchKind.SWITCH_BACK)],
        back.id: [(b, a, SwitchKind.SWITCH)],
    }

    # `python -m bot audit --run N` shows the switches, as does `/vllm audit <run>`.
    code, text, err = await cli("audit", "--run", str(back.id), cwd=tmp_path, env=env)
    assert code == 0, err
    assert f"release switches:\n  {kit.hostname}: {b} -> {a} at " in text, text
    services = {SERVICE: kit.service_settings(strategy="side_by_side")}
    async with slack_bot(tmp_path, kit, services=services) as bot:
        await bot.command(f"audit #{failed.run_id}")
        msg = await bot.fake.wait_for_message(
            CHANNEL, lambda m: m.get("text", "") == f"Run #{failed.run_id}"
        )
        # Asked again, the card says it would go back to B, which the rollback left.
        await bot.command(f"rollback {SERVICE}")
        asked = await bot.wait_for_run(
            lambda r: r.action == Action.ROLLBACK and r.message_ts is not None, "the card"
        )
        card = html.unescape(blocks_text(await bot.card(asked.id)))
    shown = html.unescape(blocks_text(msg))  # Slack's text escapes ">"
    assert f"{kit.hostname}: {b} -> {c} at " in shown, shown
    assert f"{kit.hostname}: {c} -> {b} (switched back: the release it went to failed)" in shown
    assert (
        f"Rollback {kit.hostname}: from release {a} to {b} (the release live before this one, "
        f"switched away from by run #{back.id})"
    ) in card, card


async def test_the_request_says_when_a_rollback_has_nowhere_to_go(
    make_sim_host: MakeSimHost, sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # One release only (nothing recorded, nothing built before it), and a venv that is
    # no link at all: each host's line says so before anyone approves.
    kit = await _host(make_sim_host)
    one = sim_settings(kit, tmp_path, strategy="side_by_side")
    async with open_runtime(one) as rt:
        plan = rt.engine.plan(Action.ROLLBACK, SERVICE)
        [line] = await rollback_targets(rt.settings, rt.pool, rt.audit, plan)
        assert (
            await rollback_targets(
                rt.settings, rt.pool, rt.audit, rt.engine.plan(Action.RESTART, SERVICE)
            )
            == ()
        )
    assert line == (
        f"{kit.hostname}: nothing to go back to (no switch to the live release recorded, and "
        "no other complete release was built before the live one); the run would change "
        "nothing"
    )
    (tmp_path / "plain").mkdir()
    plain = sim_settings(sim_sshd_host, tmp_path / "plain", strategy="side_by_side")
    async with open_runtime(plain) as rt:
        plan = rt.engine.plan(Action.ROLLBACK, SERVICE)
        [line] = await rollback_targets(rt.settings, rt.pool, rt.audit, plan)
    assert line.startswith(f"{sim_sshd_host.hostname}: ") and "not a side-by-side layout" in line
    assert sim_sshd_host.changes() == [] and kit.changes() == []
