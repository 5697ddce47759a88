"""A driving replica cut off from PostgreSQL while another recovers its run (issue 21):
in one process, the driver's real runtime and engine on the simulated host, a second
replica's own connection to the same real PostgreSQL server. The cut is the database
refusing the driver's writes (another session holds the writers' lock past the busy
timeout: what a driver whose connections fail sees, ``AuditUnavailable``), made the
moment the stop is recorded, right after the other replica recovered the run.

Its audit writes then go to its fallback journal, which is not fenced (it is history),
so only the lease, asked before each action on a host, can keep it off the host: it
must not bring the service back, or go on, as the owner of a run that is no longer its
own, while the other replica has told the thread the service may be stopped and freed
its locks for the next request."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.plan import Step
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.recovery import Recovered, recover_by_hand, system_judge
from bot.engine.runtime import open_runtime
from bot.errors import FencedError
from bot.settings import AuditSettings, PostgresUrl, ReplicaSettings
from bot.sim.kit import SERVICE, SimKit
from tests.polling import eventually
from tests.support.audit_db import Locker
from tests.support.postgres import migrate_pg
from tests.support.sim import sim_settings

# The lease outlasts its margin (7 s: the simulated host's 5 s SSH connect timeout plus a
# command's start) by less than the writer's retry window (1 s), so the driver's first
# action after the cut is past its lease by its own clock.
LEASE = ReplicaSettings(lease_s=7.9, renew_every_s=2.6)


class OnStop:
    """A sink that runs ``do`` once, when the stop's start is recorded (the audit sink
    comes first), before the stop is sent."""

    def __init__(self, do: object) -> None:
        self.do = do
        self.done = False

    async def handle(self, event: ev.Event) -> None:
        if not self.done and isinstance(event, ev.StepStarted) and event.step == Step.STOP:
            self.done = True
            await self.do()  # type: ignore[operator]


async def test_a_driver_cut_off_from_the_database_acts_on_no_host_once_another_recovered_its_run(
    sim_host: SimKit, pg_url: PostgresUrl, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.engine.heartbeat")
    await migrate_pg(pg_url)
    settings = sim_settings(sim_host, tmp_path).model_copy(
        update={
            "db_path": pg_url,
            "replicas": LEASE,
            "audit": AuditSettings(
                busy_timeout_s=0.2,
                retry_s=1.0,
                journal_dir=tmp_path,
                journal_fallback_dir=tmp_path / "fallback",
            ),
        }
    )
    locker = Locker(pg_url)
    async with open_runtime(settings) as rt, AuditLog.open(pg_url) as other:

        async def recovered_then_cut_off() -> None:
            result = await recover_by_hand(
                other, run_id, by="replica-b", judge=system_judge(600), force=True
            )
            assert isinstance(result, Recovered)
            locker.lock()

        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version="0.31.0")
        record = await rt.lifecycle.request(plan, requested_by="U0ALICE", source=Source.CLI)
        run_id = record.id
        await rt.audit.record_decision(run_id, "U0BOB", Decision.APPROVE)
        assert await rt.audit.transition(
            run_id, RunStatus.APPROVED, expect=[RunStatus.PENDING_APPROVAL]
        )
        driving = asyncio.create_task(rt.engine.execute(run_id, OnStop(recovered_then_cut_off)))
        try:
            await eventually(
                lambda: (
                    "no action on a host until the database answers" in caplog.text
                    or driving.done()
                ),
                "the driver to wait for the database before its next action",
                30,
            )
            # Not brought back up (nor installed) by a driver that no longer owns the run.
            assert "start" not in sim_host.changes()
            assert not driving.done()
        finally:
            locker.unlock()
            locker.close()
        # The database answers: the run is another's now, and the driver stops for good.
        with pytest.raises(FencedError, match="lost the run's lease"):
            await driving
        assert "start" not in sim_host.changes()
        run = await other.get_run(run_id)
        assert run.status == RunStatus.INTERRUPTED and run.recovered_by == ["replica-b"]
