"""The engine's own guards: a run is never left looking alive, never runs a plan nobody
approved, and never reports 'nothing changed' when something did."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.core import events as ev
from bot.core.flows import HostOutcome
from bot.core.plan import Step
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus, Source, StepStatus
from bot.engine.audit_sink import RunAudit
from bot.engine.engine import overall_status
from bot.engine.executor import CancelToken
from bot.engine.runtime import open_runtime
from bot.sim.kit import SERVICE, SimKit
from tests.support.sim import sim_settings


class StopAt:
    """A sink that lets the test act when a given step starts."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.reached = asyncio.Event()

    async def handle(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepStarted) and event.step == self.step:
            self.reached.set()


async def test_a_cancelled_execute_leaves_the_run_interrupted_not_running(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.update_config(install_duration_s=30.0)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.REDEPLOY, SERVICE), requested_by="U0ALICE", source=Source.CLI
        )
        assert await rt.lifecycle.confirm(record.id, "U0BOB")
        sink = StopAt(Step.REINSTALL)
        task = asyncio.create_task(rt.engine.execute(record.id, sink))
        await sink.reached.wait()
        task.cancel()  # what a bot shutdown (or a second Ctrl-C) does to a run's task
        with pytest.raises(asyncio.CancelledError):
            await task
        run = await rt.audit.get_run(record.id)
        assert run.status == "interrupted" and run.finished_at is not None
        assert "during step `reinstall`" in (run.summary or "")
        assert "STOPPED" in (run.summary or "")
        steps = {s.step: s.status for s in await rt.audit.steps(record.id)}
        assert steps["reinstall"] == "interrupted" and steps["stop"] == "ok"
        assert await rt.audit.lock_holder(f"service:{SERVICE}") is None


async def test_a_plan_changed_by_the_config_after_approval_is_refused(
    sim_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.REDEPLOY, SERVICE, index="nightly"),
            requested_by="U0ALICE",
            source=Source.SLACK,
        )
        assert await rt.lifecycle.confirm(record.id, "U0BOB")
    # The operator edits the config (another index URL) and the bot restarts.
    changed = sim_settings(
        sim_host, tmp_path, indexes={"nightly": "https://mirror.example.com/nightly"}
    )
    async with open_runtime(changed) as rt:
        result = await rt.engine.execute(record.id, StopAt(Step.STOP))
        assert result.status == "refused"
        assert "configuration changed since this plan was approved" in result.summary
        run = await rt.audit.get_run(record.id)
        assert run.status == "refused"
        assert [r.user for r in await rt.audit.refusals()] == ["U0ALICE"]
    assert sim_host.calls() == []


def test_aborted_only_when_no_host_was_changed() -> None:
    ok = HostOutcome(HostStatus.SUCCEEDED, "done", ServiceState.UP)
    refused = HostOutcome(HostStatus.ABORTED, "untouched", ServiceState.UP)
    assert overall_status([refused]) == "aborted"
    assert overall_status([refused, refused]) == "aborted"
    assert overall_status([ok, refused]) == "failed"  # the first host was redeployed
    rolled_back = HostOutcome(HostStatus.ROLLED_BACK, "x", ServiceState.UP)
    assert overall_status([ok, rolled_back]) == "rolled_back"
    assert overall_status([ok, ok]) == "succeeded"


async def test_a_secret_cut_by_the_output_tail_is_still_masked(
    sim_host: SimKit, tmp_path: Path
) -> None:
    body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE" * 200  # longer than the stored tail
    output = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        + body
        + "\n-----END OPENSSH PRIVATE KEY-----\nInstalled 1 package"
    )
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.REDEPLOY, SERVICE), requested_by="U0ALICE", source=Source.CLI
        )
        sink = RunAudit(rt.engine.writer, record.id, CancelToken(), ev.FanOut())
        await sink.handle(ev.StepStarted(record.id, "gpu-node-1", Step.REINSTALL, "uv"))
        await sink.handle(
            ev.StepFinished(
                record.id, "gpu-node-1", Step.REINSTALL, StepStatus.OK, 0, 1.0, "installed", output
            )
        )
        [step] = await rt.audit.steps(record.id)
    assert "b3BlbnNzaC1rZXkt" not in step.output_tail
    assert step.output_tail.endswith("Installed 1 package")
