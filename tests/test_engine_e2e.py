"""The engine end to end: real audit DB, the simulated host behind a real OpenSSH sshd.

The command order is read from the simulated host's own call log, so these
tests check what really reached the host, not what the engine meant to send.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.status import Action, Source
from bot.engine.runtime import open_runtime
from bot.engine.status_query import query
from bot.errors import HostKeyError, LockHeldError
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.support.runs import run
from tests.support.sim import sim_settings


async def test_happy_redeploy_over_real_sshd(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    settings = sim_settings(sim_sshd_host, tmp_path)
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.31.0", index="nightly")
        assert result.status == "succeeded", out
        assert sim_sshd_host.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
        calls = sim_sshd_host.calls()
        tools = [c.argv[0] for c in calls]
        # Preflight reads the unit (its state, then its ExecStart) before anything else.
        assert tools[:3] == ["systemctl", "systemctl", "uv"]
        stop_i = next(i for i, c in enumerate(calls) if c.argv[:2] == ("systemctl", "stop"))
        install_i = next(
            i
            for i, c in enumerate(calls)
            if c.argv[:3] == ("uv", "pip", "install")
            and "--dry-run" not in c.argv
            and str(sim_sshd_host.python) in c.argv
        )  # not the prefetch
        # The drain polls nvidia-smi and pgrep between the stop and the install.
        assert "nvidia-smi" in tools[stop_i:install_i] and "pgrep" in tools[stop_i:install_i]
        assert any(c.tool == "http" for c in sim_sshd_host.calls())
        assert sim_sshd_host.installed_version == "0.31.0"
        assert sim_sshd_host.unit_state() == "active"

        record = await rt.audit.get_run(result.run_id)
        assert (record.status, record.requested_by, record.approved_by) == (
            "succeeded",
            "U0ALICE",
            ["U0BOB"],
        )
        assert (record.version_before, record.version_after) == (DEFAULT_VERSION, "0.31.0")
        steps = await rt.audit.steps(result.run_id)
        assert [(s.step, s.status) for s in steps] == [
            (n, "ok")
            for n in (
                "preflight",
                "gpu_check",
                "prefetch",
                "requests",
                "stop",
                "drain",
                "reinstall",
                "gate",
                "start",
                "health",
                "readiness",
                "postcheck",
                "gpu_recheck",
            )
        ]
        reinstall = next(s for s in steps if s.step == "reinstall")
        assert reinstall.exit_status == 0 and "+ vllm==0.31.0" in reinstall.output_tail
        # The index went to uv on stdin: the recorded command names where, not the URL.
        assert reinstall.command.startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> uv ")
        assert reinstall.command.endswith("--force-reinstall vllm==0.31.0")
        assert "wheels.vllm.ai" not in reinstall.command
        labels = [s.label for s in await rt.audit.snapshots(result.run_id)]
        assert labels == ["after drain", "after restart"]
        assert await rt.audit.lock_holder(f"service:{SERVICE}") is None


async def test_drain_timeout_never_calls_uv_install(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    sim_sshd_host.set_faults(stuck_worker=True)
    settings = sim_settings(sim_sshd_host, tmp_path, drain_timeout_s=1.0)
    async with open_runtime(settings) as rt:
        result, _out = await run(rt, Action.REDEPLOY)
    assert result.status == "failed"
    assert sim_sshd_host.changes() == ["dry-run", "prefetch", "stop"]
    assert "PID 48304 (VLLM::Worker_TP3)" in result.summary
    assert "GPU 3" in result.summary and "STOPPED" in result.summary
    assert sim_sshd_host.installed_version == DEFAULT_VERSION


async def test_uv_failure_rolls_back(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    sim_sshd_host.set_faults(uv_fails=True)
    settings = sim_settings(sim_sshd_host, tmp_path)
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.31.0", index="nightly")
        assert result.status == "rolled_back", out
        assert sim_sshd_host.changes() == [
            "dry-run",
            "prefetch",
            "stop",
            "install",
            "rollback",
            "start",
        ]
        # The whole environment goes back: a sync of the snapshot, from uv's cache.
        rollback = next(
            c.argv for c in sim_sshd_host.calls() if c.argv[:3] == ("uv", "pip", "sync")
        )
        assert "--offline" in rollback and rollback[-1].endswith(".freeze.txt")
        assert sim_sshd_host.installed_version == DEFAULT_VERSION
        assert sim_sshd_host.unit_state() == "active"
        record = await rt.audit.get_run(result.run_id)
        assert record.status == "rolled_back"
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert steps["reinstall"].status == "failed" and steps["reinstall"].exit_status == 2
        assert "Failed to download" in steps["reinstall"].output_tail
        assert steps["rollback_health"].status == "ok"


async def test_an_install_that_always_fails_is_rolled_back_without_the_network(
    sim_host: SimKit, tmp_path: Path
) -> None:
    # Every download fails, rollbacks included; but the failed install changed nothing,
    # so restoring the snapshot needs no download and the old version starts again.
    # (A rollback that cannot restore: tests/test_environment_e2e.py.)
    sim_host.set_faults(uv_fails_always=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        result, _ = await run(rt, Action.REDEPLOY)
        assert result.status == "rolled_back", result.summary
        assert sim_host.changes() == ["dry-run", "prefetch", "stop", "install", "rollback", "start"]
        assert sim_host.unit_state() == "active"


async def test_health_failure_posts_journal_tail(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    sim_sshd_host.set_faults(health_503=True)
    settings = sim_settings(sim_sshd_host, tmp_path, start_timeout_s=1.5)
    async with open_runtime(settings) as rt:
        result, _out = await run(rt, Action.REDEPLOY)
        assert result.status == "failed"
        assert "HTTP 503" in result.summary
        health = next(s for s in await rt.audit.steps(result.run_id) if s.step == "health")
        assert health.status == "failed"
        # The journal's last lines (the tail kept in the audit row) show the 503s.
        assert '"GET /health HTTP/1.1" 503 Service Unavailable' in health.output_tail
        assert "gpu-node-1 python3[" in health.output_tail
    assert any(c.argv[0] == "journalctl" for c in sim_sshd_host.calls())


async def test_unit_that_fails_to_start(sim_host: SimKit, tmp_path: Path) -> None:
    sim_host.set_faults(start_fails=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        result, _ = await run(rt, Action.REDEPLOY)
    assert result.status == "failed"
    # The new version never came up: the snapshot was restored, and the old one fails
    # to start too (start_fails stays set), so the service is DOWN, said as such.
    assert "The service is DOWN" in result.summary
    assert sim_host.changes()[-3:] == ["stop", "rollback", "start"]


async def test_preflight_refusal_leaves_the_service_untouched(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(resolve_fails=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        result, _ = await run(rt, Action.REDEPLOY, version="0.31.0")
    assert result.status == "aborted"
    assert "dry run failed" in result.summary and "No solution found" in result.summary
    assert sim_host.changes() == ["dry-run"]
    assert sim_host.unit_state() == "active"


async def test_unknown_host_key_is_refused(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    sim_sshd_host.known_hosts.write_text(f"[127.0.0.1]:{sim_sshd_host.port} {other}\n")
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, _out = await run(rt, Action.REDEPLOY)
        assert result.status == "aborted"
        assert "host key is unknown or has changed" in result.summary
        assert str(sim_sshd_host.known_hosts) not in result.summary  # paths stay private
        with pytest.raises(HostKeyError):
            await rt.pool.get(sim_sshd_host.hostname).run(["true"], timeout_s=5)
    assert sim_sshd_host.calls() == []


async def test_restart_and_status(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, _ = await run(rt, Action.RESTART)
        assert result.status == "succeeded"
        assert sim_sshd_host.changes() == ["stop", "start"]
        runs = await rt.audit.list_runs()
        status = await query(rt.engine, rt.engine.plan(Action.STATUS, SERVICE))
        assert status.ok, status.text
        assert "vllm-kimi-k25: active (running)" in status.text
        assert f"vllm {DEFAULT_VERSION}" in status.text
        assert "RTX PRO 6000" in status.text
        assert sim_sshd_host.changes() == ["stop", "start"]
        # A read is no run: the audit log holds the restart alone.
        assert await rt.audit.list_runs() == runs


async def test_second_request_for_a_busy_service_is_refused(
    sim_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE)
        first = await rt.lifecycle.request(plan, requested_by="U0ALICE", source=Source.CLI)
        await rt.audit.acquire_locks(first.id, [f"service:{SERVICE}"])
        with pytest.raises(LockHeldError) as held:
            await rt.lifecycle.request(plan, requested_by="U0CAROL", source=Source.CLI)
        assert held.value.run_id == first.id
        assert f"run #{first.id}" in str(held.value) and "U0ALICE" in str(held.value)


async def test_preflight_refusal_keeps_uvs_reason_in_terminal_and_audit(
    sim_host: SimKit, tmp_path: Path
) -> None:
    # Issue 9: a wrong `python`, and uv's reason appeared nowhere.  The simulated uv
    # answers `uv pip show` with a missing interpreter as uv does (exit 2, its reason on
    # stderr); the query is quiet, so only the refusal can carry that reason.
    wrong = str(tmp_path / "no-venv" / "bin" / "python")
    async with open_runtime(sim_settings(sim_host, tmp_path, python=wrong)) as rt:
        result, out = await run(rt, Action.REDEPLOY)
        assert result.status == "aborted"
        reason = f"Failed to inspect Python interpreter from provided path at `{wrong}`"
        assert "rollback would be impossible" in result.summary and reason in result.summary
        assert reason in out  # the terminal
        record = await rt.audit.get_run(result.run_id)
        assert reason in (record.summary or "")  # runs.summary
        [preflight] = await rt.audit.steps(result.run_id)
        assert preflight.status == "failed" and reason in preflight.output_tail
    assert sim_host.changes() == []
