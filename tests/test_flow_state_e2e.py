"""The service's state on the events of a real run (engine, executor, simulated host over
SSH): each host's ``HostFinished`` carries its outcome's state, and ``RunFinished`` the
worst of them, whatever the summary's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.core import events as ev
from bot.core.service_state import ServiceState
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.runtime import Runtime, open_runtime
from bot.sim.kit import SERVICE, SimKit
from tests.support.sim import sim_settings


class Recorder:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    async def handle(self, event: ev.Event) -> None:
        self.events.append(event)

    def states(self) -> tuple[list[ServiceState], ServiceState]:
        hosts = [e.state for e in self.events if isinstance(e, ev.HostFinished)]
        runs = [e.state for e in self.events if isinstance(e, ev.RunFinished)]
        assert len(runs) == 1
        return hosts, runs[0]


async def _run(rt: Runtime, action: Action, **plan: Any) -> tuple[str, Recorder]:
    p = rt.engine.plan(action, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    sink = Recorder()
    result = await rt.engine.execute(record.id, sink)
    return result.status, sink


async def test_a_healthy_redeploy_leaves_the_service_up(sim_host: SimKit, tmp_path: Path) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        status, sink = await _run(rt, Action.REDEPLOY, version="0.31.0")
    assert status == "succeeded"
    assert sink.states() == ([ServiceState.UP], ServiceState.UP)


async def test_a_unit_that_never_starts_leaves_the_run_down(
    sim_host: SimKit, tmp_path: Path
) -> None:
    # The new version fails to start, the restored one too: the service is DOWN.
    sim_host.set_faults(start_fails=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        status, sink = await _run(rt, Action.REDEPLOY)
    assert status == "failed"
    assert sink.states() == ([ServiceState.DOWN], ServiceState.DOWN)


async def test_a_preflight_refusal_leaves_the_service_as_it_was(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(resolve_fails=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        status, sink = await _run(rt, Action.REDEPLOY, version="0.31.0")
    assert status == "aborted"
    assert sink.states() == ([ServiceState.UP], ServiceState.UP)
    assert sim_host.unit_state() == "active"
