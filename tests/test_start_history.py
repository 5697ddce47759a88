"""How long this service's starts take: the audit log's record of them
(``bot.audit.steps.start_durations``, on a real SQLite file) and the estimate a later
start shows while it waits (the real engine and the simulated host)."""

from __future__ import annotations

from pathlib import Path

from bot.audit import AuditLog
from bot.core.startup import duration
from bot.core.status import Action, RunStatus, Source, StepStatus
from bot.engine.runtime import open_runtime
from tests.support.runs import run
from tests.support.sim import MakeSimHost, sim_settings


async def finished_run(
    log: AuditLog,
    service: str,
    status: RunStatus,
    steps: list[tuple[str, StepStatus, float | None]],
) -> None:
    """A run of ``service`` that ended ``status`` after ``steps`` (name, status, seconds)."""
    run_id = await log.create_run(
        service=service,
        action=Action.RESTART,
        hosts=["gpu1"],
        requested_by="U1",
        source=Source.CLI,
        plan={},
        package_spec=None,
    )
    for name, step_status, seconds in steps:
        step = await log.step_started(run_id, "gpu1", name, "systemctl is-active ...")
        await log.step_finished(step, status=step_status, duration_s=seconds)
    assert await log.transition(run_id, status)


async def test_only_the_health_gates_of_successful_runs_count_newest_first(tmp_path: Path) -> None:
    ok, failed = StepStatus.OK, StepStatus.FAILED
    async with AuditLog.open(tmp_path / "audit.db") as log:
        await finished_run(
            log, "kimi", RunStatus.SUCCEEDED, [("start", ok, 0.5), ("health", ok, 100.0)]
        )
        # Healthy, then failed readiness: the start is not one to expect again.
        await finished_run(
            log, "kimi", RunStatus.FAILED, [("health", ok, 5.0), ("readiness", failed, 1.0)]
        )
        # The start that failed, and the rollback's start of the old version after it.
        await finished_run(
            log,
            "kimi",
            RunStatus.ROLLED_BACK,
            [("health", failed, 300.0), ("rollback_health", ok, 7.0)],
        )
        # Another service's start.
        await finished_run(log, "qwen", RunStatus.SUCCEEDED, [("health", ok, 9.0)])
        # A rollback's start in a run recorded as succeeded: not a real run's shape, so
        # only the step's name can leave it out.
        await finished_run(log, "kimi", RunStatus.SUCCEEDED, [("rollback_health", ok, 8.0)])
        await finished_run(log, "kimi", RunStatus.SUCCEEDED, [("health", ok, 200.0)])
        await finished_run(log, "kimi", RunStatus.SUCCEEDED, [("health", ok, 400.0)])

        history = await log.start_history("kimi")
        assert history.durations_s == (400.0, 200.0, 100.0)
        assert (history.last_s, history.estimate_s) == (400.0, 200.0)
        assert (await log.start_history("kimi", limit=2)).durations_s == (400.0, 200.0)
        assert (await log.start_history("qwen")).durations_s == (9.0,)
        assert (await log.start_history("nobody")).estimate_s is None


async def test_a_later_start_shows_the_median_of_the_previous_ones(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host()
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        outs = []
        for _ in range(3):
            result, out = await run(rt, Action.RESTART)
            assert result.status == RunStatus.SUCCEEDED, out
            outs.append(out)
        history = await rt.audit.start_history("kimi-k25")
    first, second, third = outs
    # The first start has nothing to compare with; each later one says what the earlier
    # ones took, on the health gate's progress lines.
    assert "usually ~" not in first
    assert f"usually ~{duration(history.durations_s[2])} (median of 1 start)" in second
    earlier = sorted(history.durations_s[1:])
    assert f"usually ~{duration((earlier[0] + earlier[1]) / 2)} (median of 2 starts)" in third, (
        third
    )
