"""A host reached as an ordinary account (``become = "sudo"``), end to end: the real
OpenSSH sshd logs a non-root account in, the real sudo decides with the drop-in that
``python -m bot sudoers`` prints, and the simulated tools refuse what a real host
refuses an ordinary account (tests/support/nonroot.py).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from bot.cli.setup_commands import doctor
from bot.cli.terminal import TerminalSink
from bot.core import remote
from bot.core.host_ops import reboot_argv, reset_argv
from bot.core.leftovers import (
    Approval,
    facts_query,
    parse_facts,
    parse_signalled,
    signal_command,
)
from bot.core.privilege import Privilege
from bot.core.status import Action, Decision, RunStatus, Source
from bot.core.sudoers import grants, render
from bot.core.sudoers_host import host_grants
from bot.engine.engine import RunResult
from bot.engine.host_runs import plan_host
from bot.engine.leftover_gate import LeftoverRequest
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import ServiceSettings, Settings
from bot.sim.kit import READY_SETTINGS, SERVICE, fast_config
from bot.sim.sshd import free_port
from bot.sim.state import DEFAULT_VERSION
from tests.support.nonroot import (
    NonRootKit,
    accounts,
    copy_sim,
    marked,
    plant_tools,
    require_root_and_sudo,
    sudoers_installed,
    usable_python,
    workspace,
)
from tests.support.runs import run


@pytest.fixture
async def host() -> AsyncIterator[NonRootKit]:
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        kit = NonRootKit(
            base / "host",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(),
        )
        try:
            yield await kit.start()
        finally:
            await kit.close()


def settings_of(
    kit: NonRootKit, tmp_path: Path, *, host: dict[str, Any] | None = None, **service: Any
) -> Settings:
    return Settings(
        hosts={kit.hostname: kit.host_settings(**(host or {}))},
        services={SERVICE: kit.service_settings(**service)},
        maintenance=kit.maintenance_settings(),
        db_path=tmp_path / "audit.db",
    )


async def doctor_json(
    settings: Settings, capsys: pytest.CaptureFixture[str], target: str | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """``python -m bot doctor [target] --json``: its exit code and its checks."""
    capsys.readouterr()
    code = await doctor(settings, target, as_json=True)
    checks: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return code, checks


def only(
    checks: list[dict[str, Any]], name: str, service: str | None = SERVICE, host: str | None = None
) -> dict[str, Any]:
    found = [
        c
        for c in checks
        if c["check"] == name and c["service"] == service and host in (None, c["host"])
    ]
    assert len(found) == 1, (name, checks)
    return found[0]


async def test_redeploy_and_rollback_as_a_non_root_account_under_real_sudo(
    host: NonRootKit, tmp_path: Path
) -> None:
    settings = settings_of(host, tmp_path)
    with sudoers_installed(render(settings, host.who.login)):
        async with open_runtime(settings) as rt:
            # The new vllm cannot be imported: the snapshot is restored (as the venv's
            # owner) and the old version started again (as root).
            host.set_faults(stale_plugin=True)
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0", index="nightly")
            assert result.status == RunStatus.ROLLED_BACK, out
            assert host.installed_version == DEFAULT_VERSION
            assert host.unit_state() == "active"

            host.clear_faults()
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0", index="nightly")
            assert result.status == RunStatus.SUCCEEDED, out
            assert host.installed_version == "0.31.0"
            assert host.unit_state() == "active"
            assert host.changes()[-4:] == ["prefetch", "stop", "install", "start"]
    # The snapshot the rollback restored was written by the venv's owner, not the login.
    snapshots = list((host.venv_dir.parent / ".chatops").glob("*.freeze.txt"))
    assert snapshots and all(p.owner() == host.who.owner for p in snapshots)


async def test_side_by_side_releases_under_real_sudo(tmp_path: Path) -> None:
    # Issue 20, item 3: the build, the switch, the switch back and the prune run as the
    # venv's owner under the printed rules, in directories that account owns.
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        kit = NonRootKit(
            base / "host",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(api_faults_new_build_only=True),
            venv_dir=base / "host" / "venvs" / "vllm",
            side_by_side=True,
        )
        try:
            await kit.start()
            old = kit.live_release()
            settings = settings_of(
                kit, tmp_path, strategy="side_by_side", keep_releases=2, **READY_SETTINGS
            )
            with sudoers_installed(render(settings, who.login)):
                async with open_runtime(settings) as rt:
                    # The new build's smoke test fails: switched back, nothing installed.
                    kit.set_faults(smoke_fail=True)
                    result, out = await run(rt, Action.REDEPLOY, version="0.31.0", index="nightly")
                    assert result.status == RunStatus.ROLLED_BACK, out
                    assert kit.live_release() == old and kit.unit_state() == "active"
                    kit.clear_faults()
                    result, out = await run(rt, Action.REDEPLOY, version="0.30.0", index="nightly")
                    assert result.status == RunStatus.SUCCEEDED, out
            new = kit.live_release()
            assert new is not None and new.startswith("0.30.0-")
            assert kit.installed_version == "0.30.0"
            # keep_releases 2: the refused 0.31.0 release went, the previous one stayed.
            assert kit.releases() == sorted([str(old), new]), out
            assert "pruned 1 old release" in result.summary
            assert (
                all((kit.releases_dir / n).owner() == who.owner for n in kit.releases())
                and kit.venv_dir.owner() == who.owner
            )
        finally:
            await kit.close()


async def test_without_sudo_the_login_cannot_stop_the_unit(
    host: NonRootKit, tmp_path: Path
) -> None:
    # The guard that makes the other tests mean something: as the login itself (become
    # = "none"), the host refuses the stop as a real one would.
    settings = settings_of(host, tmp_path, host={"become": "none"})
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.RESTART)
    assert result.status == RunStatus.FAILED
    assert "Access denied" in out
    assert host.unit_state() == "active"


async def test_a_missing_rule_fails_the_first_step_that_needs_it_naming_the_rule(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_of(host, tmp_path)
    svc = settings.services[SERVICE]
    stop_rule = next(g for g in grants(svc) if tuple(g.sample) == remote.unit_stop(svc))
    with sudoers_installed(render(settings, host.who.login, omit=[stop_rule.line()])):
        # doctor names the rule before anything runs...
        code, checks = await doctor_json(settings, capsys)
        assert code == 1
        rules = only(checks, "sudo rules")
        assert rules["result"] == "fail" and stop_rule.line() in rules["detail"]
        assert "python -m bot sudoers" in rules["fix"]
        # ...and the redeploy stops at the first step that needs it, naming it too.
        async with open_runtime(settings) as rt:
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0")
    assert result.status == RunStatus.FAILED, out
    assert stop_rule.line() in result.summary
    assert "KIMI_K25_ROOT" in result.summary
    assert "the service was not touched" in result.summary
    # Truthfully: still running the version it had, the stop never reached systemd.
    assert host.unit_state() == "active"
    assert host.installed_version == DEFAULT_VERSION
    assert "stop" not in host.changes()


async def test_a_missing_start_rule_after_the_stop_says_the_service_is_stopped(
    host: NonRootKit, tmp_path: Path
) -> None:
    # The stop is allowed, the start is not: the worst place for a rule to be missing.
    settings = settings_of(host, tmp_path)
    svc = settings.services[SERVICE]
    start_rule = next(g for g in grants(svc) if tuple(g.sample) == remote.unit_start(svc))
    with sudoers_installed(render(settings, host.who.login, omit=[start_rule.line()])):
        async with open_runtime(settings) as rt:
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0")
    assert result.status == RunStatus.FAILED, out
    assert start_rule.line() in result.summary and "KIMI_K25_ROOT" in result.summary
    assert "rolled back to 0.31.0rc2.dev313" in result.summary  # the venv is back...
    # ...not started: the start never ran, so the unit is as the stop left it (issue 18).
    assert result.summary.endswith("The service is STOPPED."), result.summary
    assert host.unit_state() == "inactive"  # truthfully: stopped, and said so


async def test_doctor_passes_a_correct_non_root_setup(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_of(host, tmp_path)
    with sudoers_installed(render(settings, host.who.login)):
        code, checks = await doctor_json(settings, capsys)
        assert code == 0, checks
        assert {c["result"] for c in checks} == {"ok"}, checks
        assert only(checks, "nvidia-smi", None)["detail"].startswith("8 GPU(s)")
        assert only(checks, "unit")["detail"] == "vllm-kimi-k25: active (running), runs as vllm"
        # Read as the login account, with no sudo rule (issue 20).
        assert only(checks, "unit command")["detail"].startswith("`vllm serve` with 4 flags")
        assert only(checks, "venv")["detail"].endswith(f"vllm {DEFAULT_VERSION}")
        assert "rules, none beyond what the bot needs" in only(checks, "sudo -l", None)["detail"]
        maint = only(checks, "host maintenance sudo rules", None)["detail"]
        assert maint.startswith("all 7 host-maintenance rules"), maint
        # sshd reads the key from a file root owns (the kit's own sshd_config says which).
        keys = only(checks, "authorized_keys", None)["detail"]
        assert keys.startswith("sshd reads ") and "cannot change them" in keys
        # The table form, as a person reads it.
        assert await doctor(settings, SERVICE, as_json=False) == 0
        assert "all checks passed" in capsys.readouterr().out
    # It changed nothing: no stop, start or install reached the host.
    assert host.changes() == []


async def test_doctor_reports_each_broken_piece_with_its_fix(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = settings_of(host, tmp_path)
    wrong_keys = tmp_path / "known_hosts.other"
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    wrong_keys.write_text(f"[127.0.0.1]:{host.port} {other}")
    closed = f"http://127.0.0.1:{free_port()}/health"
    svc = good.services[SERVICE].model_dump()
    settings = Settings(
        hosts={
            host.hostname: good.hosts[host.hostname],
            "impostor": {**host.host_settings(), "known_hosts": str(wrong_keys)},
        },
        services={
            SERVICE: svc,
            "wrong-unit": {**svc, "unit": "vllm-no-such-unit"},
            "no-venv": {**svc, "python": f"{host.root}/missing/bin/python"},
            "no-health": {**svc, "health_url": closed},
            "on-impostor": {**svc, "hosts": ["impostor"]},
        },
        maintenance=host.maintenance_settings(),
        db_path=tmp_path / "audit.db",
    )
    stop_rule = next(
        g
        for g in grants(settings.services[SERVICE])
        if tuple(g.sample) == remote.unit_stop(settings.services[SERVICE])
    )
    with sudoers_installed(render(settings, host.who.login, omit=[stop_rule.line()])):
        code, checks = await doctor_json(settings, capsys)
    assert code == 1
    key = only(checks, "host key", None, "impostor")
    assert key["result"] == "fail" and "trusts SHA256:" in key["detail"]
    assert "ssh-keygen -R" in key["fix"]
    # Nothing more is asked of a host whose key is wrong.
    assert only(checks, "unit", "on-impostor")["result"] == "skip"
    unit = only(checks, "unit", "wrong-unit")
    assert unit["result"] == "fail" and "LoadState=not-found" in unit["detail"]
    assert "services.wrong-unit.unit" in unit["fix"]
    venv = only(checks, "venv", "no-venv")
    assert venv["result"] == "fail" and "no interpreter at" in venv["detail"]
    assert "services.no-venv.python" in venv["fix"]
    rules = only(checks, "sudo rules")
    assert rules["result"] == "fail" and stop_rule.line() in rules["detail"]
    health = only(checks, "health", "no-health")
    assert health["result"] == "fail" and closed in health["detail"]
    assert "services.no-health.health_url" in health["fix"]
    # What is right on the same host still reads ok.
    assert only(checks, "unit")["result"] == "ok"
    assert only(checks, "health")["result"] == "ok"
    assert host.changes() == []


def sudo_allows(login: str, argv: Sequence[str], as_user: str | None = None) -> bool:
    """Whether the real sudo lets ``login`` run ``argv`` (as root, or ``as_user``)."""
    who = ["-u", as_user] if as_user else []
    r = subprocess.run(
        ["runuser", "-u", login, "--", "sudo", "-n", "-l", *who, "--", *argv],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return r.returncode == 0


async def test_real_sudo_allows_exactly_the_printed_rules(host: NonRootKit, tmp_path: Path) -> None:
    settings = settings_of(host, tmp_path)
    svc = settings.services[SERVICE]
    login, owner = host.who.login, host.who.owner
    with sudoers_installed(render(settings, login)):
        for g in grants(svc):
            runas = owner if g.run_as == Privilege.VENV_OWNER else None
            assert sudo_allows(login, g.sample, runas), g.line()
        unit, ctl, jctl, uv = svc.unit, svc.systemctl, svc.journalctl, svc.uv
        for argv in (
            [ctl, "stop", "--", "ssh"],
            [ctl, "stop", "--", unit, "ssh"],
            [ctl, "--now", "stop", "--", unit],
            [ctl, "edit", "--", unit],
            [ctl, "stop", "--", f"{unit} ssh"],
            # The lines before --no-pager (issue 17, F10): no rule is left for them.
            [ctl, "stop", "--", unit],
            [ctl, "show", "-p", remote.UNIT_PROPERTIES, "--", unit],
            [jctl, "-u", unit, "-n", "1001", "--no-pager"],
            [jctl, "-u", unit, "-n", "5", "-u", "ssh", "--no-pager"],
            ["/bin/sh", "-c", "id"],
            ["/usr/bin/id"],
        ):
            assert not sudo_allows(login, argv), argv
        # As the owner, only uv's pip install and sync into this venv: not uv run.
        assert not sudo_allows(login, [uv, "run", "sh"], owner)
        assert not sudo_allows(
            login, [uv, "pip", "install", "--python", "/usr/bin/python3", "vllm"], owner
        )
        # Host maintenance (issue 23), only asked (-l), never run: each line, and no other
        # argument after the GPU's index, no other index and no other systemctl verb.
        for g in host_grants(settings.maintenance):
            assert sudo_allows(login, g.sample), g.line()
        smi, ctl = settings.maintenance.nvidia_smi, settings.maintenance.systemctl
        for argv in (
            [smi, "-r", "-i", "0", "-q"],
            [smi, "-r", "-i", "0;", "rm"],
            [smi, "-r", "-i", "100"],
            [smi, "-r"],
            [smi, "-i", "3", "-pm", "1", "--anything"],
            [ctl, "reboot", "--force"],
            [ctl, "poweroff"],
        ):
            assert not sudo_allows(login, argv), argv
        install = remote.install(svc, "vllm==0.31.0", None)
        assert sudo_allows(login, install, owner)
        # What the venv owner may run, root may not, and nor may any other account.
        assert not sudo_allows(login, install)
        assert not sudo_allows(login, install, login)
        assert not sudo_allows(login, remote.unit_stop(svc), owner)


async def test_the_signal_rule_cannot_reach_a_process_outside_the_unit(
    host: NonRootKit, tmp_path: Path
) -> None:
    # The rule's wildcard takes any PID: whoever holds the bot's key could name sshd. The
    # fixed script re-judges on the host, as root, and refuses what is not the unit's.
    # The real ps and kill (the victim is a real process, which the simulated ones do
    # not see).
    settings = settings_of(host, tmp_path, ps="/usr/bin/ps", kill="/usr/bin/kill")
    svc = settings.services[SERVICE]
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)  # root's, no unit
    try:
        (facts,) = parse_facts(
            subprocess.run(
                facts_query([victim.pid]), capture_output=True, text=True, check=True
            ).stdout
        ).values()
        with sudoers_installed(render(settings, host.who.login)):
            script = signal_command(
                "KILL", [facts], svc.unit, svc.systemctl, ps=svc.ps, kill=svc.kill
            )
            assert sudo_allows(host.who.login, script)  # the rule lets the call through
            r = subprocess.run(
                ["runuser", "-u", host.who.login, "--", "sudo", "-n", "--", *script],
                capture_output=True,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        assert r.returncode == 0, r.stderr
        assert parse_signalled(r.stdout) == {victim.pid: "refused"}
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


async def test_an_index_url_reaches_uv_under_sudo_through_its_environment_only(
    host: NonRootKit, tmp_path: Path
) -> None:
    token = "tok-5e4d3c2b1a"
    private = f"https://ci-bot:{token}@pypi.private.example/simple"
    only_there = "0.17.0rc1.dev5+g1a2b3c4"
    host.update_config(index_url=private, index_versions=(only_there,))
    settings = settings_of(host, tmp_path, indexes={"private": private})
    with sudoers_installed(render(settings, host.who.login)) as path:
        assert token not in path.read_text()
        async with open_runtime(settings) as rt:
            result, out = await run(rt, Action.REDEPLOY, version=only_there, index="private")
    # uv found the version only the private index has: sudo passed UV_EXTRA_INDEX_URL on.
    assert result.status == RunStatus.SUCCEEDED, out
    assert host.installed_version == only_there
    assert all(token not in " ".join(c.argv) for c in host.calls())


async def test_doctor_warns_naming_a_missing_host_maintenance_rule(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 23: a host without the GPU reset rule still serves (a warning, exit 0), and
    # doctor names the line its drop-in lacks.
    settings = settings_of(host, tmp_path)
    m = settings.maintenance
    reset = next(g for g in host_grants(m) if g.sample == reset_argv(m, 0))
    with sudoers_installed(render(settings, host.who.login, omit=[reset.line()])):
        code, checks = await doctor_json(settings, capsys)
    maint = only(checks, "host maintenance sudo rules", None)
    assert maint["result"] == "warn" and f"`{reset.line()}`" in maint["detail"], maint
    assert "missing 1 of 7" in maint["detail"] and "python -m bot sudoers" in maint["fix"]
    assert only(checks, "sudo rules")["result"] == "ok"
    assert code == 0, checks


async def _host_run(
    rt: Runtime, action: Action, host: str, gpus: tuple[int, ...] = ()
) -> tuple[RunResult, str]:
    """A host run (issue 23) requested, approved by a second person and executed."""
    out = io.StringIO()
    p = plan_host(rt.settings, action, host, gpus)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    return await rt.engine.execute(record.id, TerminalSink(out)), out.getvalue()


async def test_a_host_run_missing_a_maintenance_rule_is_refused_before_any_service_stops(
    host: NonRootKit, tmp_path: Path
) -> None:
    # Issue 23: the real sudo, asked `sudo -n -l` at the preflight, says no for the one
    # line left out; was: every service stopped, then the reboot (or reset) refused.
    settings = settings_of(host, tmp_path)
    m, login = settings.maintenance, host.who.login
    reboot = next(g for g in host_grants(m) if g.sample == reboot_argv(m))
    reset = next(g for g in host_grants(m) if g.sample == reset_argv(m, 0))
    for action, gpus, rule in ((Action.REBOOT, (), reboot), (Action.GPU_RESET, (0, 3), reset)):
        with sudoers_installed(render(settings, login, omit=[rule.line()])):
            async with open_runtime(settings) as rt:
                result, out = await _host_run(rt, action, host.hostname, gpus)
                steps = await rt.audit.steps(result.run_id)
        assert result.status == RunStatus.ABORTED, out
        assert "so nothing was stopped" in result.summary
        assert f"`{rule.line()}`" in result.summary and "HOST_MAINT_ROOT" in result.summary
        assert [(s.step, s.status) for s in steps] == [("preflight", "failed")]
        # Truthfully untouched: still serving, no stop, no reboot, no GPU touched.
        assert host.unit_state() == "active" and host.changes() == []
        assert host.reboots() == 0 and host.resets() == [] and host.persistence(0)
    # Asked of the exact argv: GPU 3's reset too (its rule is the same [0-9] line).
    assert f"`{m.nvidia_smi} -r -i 3`" in result.summary


async def test_a_gpu_reset_with_every_rule_passes_the_sudo_preflight_and_resets(
    host: NonRootKit, tmp_path: Path
) -> None:
    # The good case under the real sudo: each exact command allowed, and then run.
    settings = settings_of(host, tmp_path)
    with sudoers_installed(render(settings, host.who.login)):
        async with open_runtime(settings) as rt:
            result, out = await _host_run(rt, Action.GPU_RESET, host.hostname, (0,))
    assert result.status == RunStatus.SUCCEEDED, out
    assert "sudo allows all 3 maintenance commands (sudo -n -l)" in out
    assert host.resets() == [0] and host.persistence(0)
    assert host.unit_state() == "active"


async def test_doctor_warns_about_rights_beyond_the_rules(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_of(host, tmp_path)
    rules = render(settings, host.who.login) + f"{host.who.login} ALL = (ALL) NOPASSWD: ALL\n"
    with sudoers_installed(rules):
        code, checks = await doctor_json(settings, capsys)
    listing = only(checks, "sudo -l", None)
    assert listing["result"] == "warn" and "may run any command" in listing["detail"]
    assert code == 0  # a warning is no failure: the bot works, with more than it needs


# ---- issue 17: what runs with rights finds nothing through the login's PATH --------------


class Terminate:
    """An approver at the leftover gate who lets the run terminate (as the front ends
    record it)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.asked = 0

    async def ask(self, request: LeftoverRequest) -> Approval:
        self.asked += 1
        await self.rt.audit.record_decision(request.run_id, "U0BOB", Decision.TERMINATE)
        return Approval("U0BOB")


def without_safe_path(text: str) -> str:
    """The drop-in without its `Defaults!<alias> ... secure_path` lines (an older one, or
    one an admin edited), on a host whose sudo keeps the login's PATH for it: upstream
    sudo's default, `Defaults !secure_path`, here for the test's login only."""
    kept = [
        line
        for line in text.splitlines()
        if not (line.startswith("Defaults!") and "secure_path" in line)
    ]
    assert len(kept) < len(text.splitlines())
    return "\n".join(kept) + "\n"


@pytest.fixture
async def planted() -> AsyncIterator[tuple[NonRootKit, Path]]:
    """A host whose login has its own ps, kill, env, cat, mkdir... first in its PATH, each
    writing who ran it to a marker file (tests/support/nonroot.plant_tools)."""
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        own = base / "home" / who.login / "bin"
        marker = base / "marker"
        plant_tools(own, marker, base / "host" / "tools", who.login)
        kit = NonRootKit(
            base / "host",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(),
            path_first=own,
        )
        try:
            yield await kit.start(), marker
        finally:
            await kit.close()


async def test_the_leftover_kill_never_runs_a_tool_from_the_logins_path(
    planted: tuple[NonRootKit, Path], tmp_path: Path
) -> None:
    # Issue 17, F1: the root script used to call ps, env and kill by name; where sudo keeps
    # the caller's PATH, the login's own `ps` ran as root. Even without the drop-in's
    # secure_path lines, nothing run as root or as the venv's owner finds one.
    host, marker = planted
    settings = settings_of(host, tmp_path, drain_timeout_s=1.0)
    rules = without_safe_path(render(settings, host.who.login))
    host.set_faults(orphan_workers=True)
    with sudoers_installed(rules + f"Defaults:{host.who.login} !secure_path\n"):
        async with open_runtime(settings) as rt:
            gate = Terminate(rt)
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0", gate=gate)
    assert result.status == RunStatus.SUCCEEDED, out
    # The root script ran and signalled the unit's leftover workers (with the host's kill)...
    assert gate.asked == 1 and {sig for sig, _ in host.signalled()} == {"TERM"}
    # ...the snapshot was written by the owner's script...
    assert list((host.venv_dir.parent / ".chatops").glob("*.freeze.txt"))
    # ...and no planted tool ran as anyone but the login (which did run its own).
    runs = marked(marker)
    assert ("root", "ps") not in runs and ("root", "kill") not in runs
    assert {who for who, _ in runs} == {host.who.login}, runs


async def test_doctor_fails_where_sudo_would_keep_the_logins_path(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_of(host, tmp_path)
    login = host.who.login
    keeps = f"Defaults:{login} !secure_path\n"
    with sudoers_installed(without_safe_path(render(settings, login)) + keeps):
        code, checks = await doctor_json(settings, capsys)
    path = only(checks, "sudo PATH", None)
    assert code == 1 and path["result"] == "fail", path
    assert f"sudo keeps {login}'s own PATH" in path["detail"]
    assert "secure_path" in path["fix"]
    # The drop-in as printed: its own Defaults win over the host's `!secure_path`.
    with sudoers_installed(render(settings, login) + keeps):
        code, checks = await doctor_json(settings, capsys)
    path = only(checks, "sudo PATH", None)
    assert path["result"] == "ok" and "/usr/sbin:/usr/bin:/sbin:/bin" in path["detail"], path
    assert code == 0, checks


async def test_a_pth_file_the_venv_owner_plants_never_runs_as_the_login(
    host: NonRootKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 17, F2: the venv's owner (a compromised model server) can write a .pth file
    # into site-packages, and it runs whenever the venv's interpreter starts: at the
    # import gate, and when uv starts it to learn about it (freeze, show). Run as the
    # login, that code would hold the login's root rules and its authorized_keys.
    marker = host.root.parent / "pth-ran"
    marker.touch()
    marker.chmod(0o666)
    site = host.venv_dir / "lib" / "python3.12" / "site-packages"
    line = f"import os; os.system('/usr/bin/id -un >> {marker}')\n"
    r = subprocess.run(
        [
            "runuser",
            "-u",
            host.who.owner,
            "--",
            "sh",
            "-c",
            'mkdir -p "$1" && printf %s "$2" > "$1/zz_owner.pth"',
            "sh",
            str(site),
            line,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    settings = settings_of(host, tmp_path)
    with sudoers_installed(render(settings, host.who.login)):
        async with open_runtime(settings) as rt:
            result, out = await run(rt, Action.REDEPLOY, version="0.31.0")
        assert result.status == RunStatus.SUCCEEDED, out
        ran = marker.read_text().split()
        # It ran (the freeze, the show, the gate, the installs)...
        assert len(ran) >= 4
        # ...and only ever as the venv's owner.
        assert set(ran) == {host.who.owner}, ran
        # So does doctor's read of the venv.
        code, checks = await doctor_json(settings, capsys)
        assert code == 0, checks
    ran = marker.read_text().split()
    assert set(ran) == {host.who.owner}, ran


def save_in_new_pid_namespace(
    svc: ServiceSettings, lock: str, text: str
) -> subprocess.CompletedProcess[str]:
    """The snapshot's save script run as root (user = "root", become = "none") as the
    first process of a PID namespace of its own: its $$ is then 1, so the name the old
    script wrote through ("<lock>.tmp.$$") is known in advance, as an attacker who
    counts PIDs would guess it."""
    return subprocess.run(
        ["unshare", "--pid", "--fork", *remote.save_lock(svc, lock)],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )


async def test_the_snapshot_is_never_written_through_a_planted_link() -> None:
    # Issue 17, F8: in root mode the snapshot's `cat > "$2.tmp.$$"` followed a link the
    # venv's owner planted in a .chatops it owns (the README's own layout for sudo hosts).
    require_root_and_sudo()
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to fix the script's PID")
    with workspace() as base, accounts(base) as who:
        svc = ServiceSettings(
            hosts=["h"], unit="u", python=f"{base}/venv/bin/python", uv="/bin/true"
        )
        state, lock = Path(remote.state_dir(svc)), remote.lock_path(svc, "ab" * 32)
        victim = base / "victim"
        victim.write_text("root's own file\n")
        freeze = "vllm==0.31.0\n"

        # The owner's .chatops, with a link at the old name: refused, nothing written.
        state.mkdir()
        subprocess.run(["chown", f"{who.owner}:{who.owner}", str(state)], check=True)
        subprocess.run(
            ["runuser", "-u", who.owner, "--", "ln", "-s", str(victim), f"{lock}.tmp.1"], check=True
        )
        r = save_in_new_pid_namespace(svc, lock, freeze)
        assert r.returncode != 0 and "is owned by uid" in r.stderr, r.stderr
        assert victim.read_text() == "root's own file\n"
        assert not Path(lock).exists()
        # The prefetch's throwaway venv (a name with the shell's PID) is not made there
        # either.
        r = subprocess.run(
            ["unshare", "--pid", "--fork", *remote.prefetch(svc, None)],
            input="",
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode != 0 and "is owned by uid" in r.stderr, r.stderr

        # Root's own .chatops with a stray link at that name (unusual, harmless): the
        # snapshot is written, through a name mktemp made, and the link's target is not.
        subprocess.run(["chown", "root:root", str(state)], check=True)
        r = save_in_new_pid_namespace(svc, lock, freeze)
        assert r.returncode == 0, r.stderr
        assert Path(lock).read_text() == freeze and not Path(lock).is_symlink()
        assert (Path(lock).stat().st_mode & 0o777) == 0o600
        assert victim.read_text() == "root's own file\n"


async def test_doctor_warns_when_the_login_can_change_its_own_authorized_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 17, F2: the key entry's restrict, from= and permitopen= bound the bot's key;
    # if sshd reads it from a file the login owns (~/.ssh/authorized_keys, OpenSSH's
    # default), code running as the login can add a key without them.
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        kit = NonRootKit(
            base / "host",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(),
            keys_in_home=True,
        )
        try:
            await kit.start()
            settings = settings_of(kit, tmp_path)
            with sudoers_installed(render(settings, who.login)):
                code, checks = await doctor_json(settings, capsys)
        finally:
            await kit.close()
    keys = only(checks, "authorized_keys", None)
    assert keys["result"] == "warn", keys
    assert f"{kit.home}/.ssh/authorized_keys" in keys["detail"] and "it owns" in keys["detail"]
    assert "AuthorizedKeysFile /etc/ssh/authorized_keys/%u" in keys["fix"]
    assert code == 0  # the bot works; its key can do more than it should
