"""Issue 20, item 4, end to end on the real-sshd simulated host: a server whose engine
dies inside the watch window is rolled back (the previous version serves again, the
audit log names the check and the time); a healthy server passes the window and the run
succeeds only after it; watch_s = 0 keeps today's steps."""

from __future__ import annotations

from pathlib import Path

from bot.core.status import RunStatus, StepStatus
from bot.engine.runtime import open_runtime
from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.support.sim import sim_settings
from tests.test_environment_e2e import NEW, redeploy


async def test_an_engine_that_dies_inside_the_window_is_rolled_back(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    before = sim_sshd_host.environment()
    # The new build dies 3 s after it is ready; readiness passes before that, the window
    # (8 s, a round a second) is still open then. The rollback's build does not die.
    sim_sshd_host.update_config(die_after_ready_s=3.0)
    sim_sshd_host.set_faults(engine_dies_after_ready=True)
    settings = sim_settings(sim_sshd_host, tmp_path, watch_s=8, watch_interval_s=1)
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = await rt.audit.steps(result.run_id)
    assert result.status == RunStatus.ROLLED_BACK, out
    assert "watch window: journal: engine dead" in result.summary, result.summary
    assert "of 8s)" in result.summary
    watch = next(s for s in steps if s.step == "watch")
    assert watch.status == StepStatus.FAILED
    assert "FAILED at" in watch.output_tail
    changes = sim_sshd_host.changes()
    assert changes[-3:] == ["stop", "rollback", "start"], changes
    assert sim_sshd_host.environment() == before
    assert sim_sshd_host.installed_version == DEFAULT_VERSION


async def test_a_healthy_server_passes_the_window_and_succeeds_after_it(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    settings = sim_settings(sim_sshd_host, tmp_path, watch_s=2, watch_interval_s=1)
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = await rt.audit.steps(result.run_id)
    assert result.status == RunStatus.SUCCEEDED, out
    assert "watched 2s clean" in result.summary
    names = [s.step for s in steps]
    assert names.index("readiness") < names.index("watch") < names.index("postcheck")
    watch = steps[names.index("watch")]
    assert watch.status == StepStatus.OK and watch.duration_s is not None
    assert watch.duration_s >= 2
    assert "ok at" in watch.output_tail


async def test_watch_off_has_no_window(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = await rt.audit.steps(result.run_id)
    assert result.status == RunStatus.SUCCEEDED, out
    assert "watch" not in [s.step for s in steps]


async def test_a_hung_engine_behind_a_healthy_health_is_rolled_back(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # /health stays 200; completions of the new build hang from 3 s after it is ready.
    sim_sshd_host.update_config(
        hang_after_ready_s=3.0, engine_hang_s=2.0, api_faults_new_build_only=True
    )
    sim_sshd_host.set_faults(engine_hangs_after_ready=True)
    settings = sim_settings(
        sim_sshd_host,
        tmp_path,
        watch_s=10,
        watch_interval_s=1,
        smoke_prompt="The capital of France is",
        smoke_timeout_s=1,
    )
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ROLLED_BACK, out
    assert "watch window: POST " in result.summary, result.summary
    assert "/v1/completions" in result.summary
    assert sim_sshd_host.installed_version == DEFAULT_VERSION
