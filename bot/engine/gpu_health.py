"""The service's GPUs' health read when a run is requested (issue 12), for the approval card.

The run's GPU check refuses a critical GPU before the stop, but approvers should know
before they approve: a warning is theirs to weigh, and a critical GPU means the run will
be refused anyway. So at request time each host of the plan is read with the GPU check's
own reads and verdict (``bot.core.flows.gpu_health_flow``: the GPU query, the GPUs'
state (NVML where the bot runs on the host, else ``nvidia-smi -q``), the kernel's Xid
lines; read-only, only the service's GPUs), driven by the same executor as a run
(``bot.engine.host_reads``), with no run and no audit record of its own. The front end shows a
line per host whose GPUs are not all ok; the terminal prints them before confirming.

A host that cannot be read says so (unknown, never ok): the preflight reads it again
before anything changes, and refuses if it must.
"""

from __future__ import annotations

from typing import assert_never

from bot.core import events as ev
from bot.core.flows import gpu_health_flow
from bot.core.health import GpuCheck, HealthNote, Level, health_note
from bot.core.plan import Plan
from bot.core.status import Action
from bot.engine.host_reads import HostRead, read_hosts
from bot.hosts.pool import HostPool
from bot.settings import Settings

# The actions whose run has a GPU check before the stop.
CHECKED = (Action.REDEPLOY, Action.RESTART, Action.ROLLBACK)
# Critical first, then the hosts nobody could read, then warnings.
_ORDER = {Level.CRITICAL: 0, None: 1, Level.WARN: 2}


class _Collect:
    def __init__(self) -> None:
        self.check: GpuCheck | None = None

    async def handle(self, event: ev.Event) -> None:
        match event:
            case ev.GpuHealthKnown():
                self.check = event.check
            case (
                ev.RunStarted()
                | ev.StepStarted()
                | ev.StepProgress()
                | ev.OutputLine()
                | ev.StepFinished()
                | ev.GpuTable()
                | ev.VersionsKnown()
                | ev.PackagesKnown()
                | ev.HostFinished()
                | ev.RunFinished()
                | ev.Notice()
                | ev.RotationChanged()
                | ev.ReleaseSwitched()
            ):
                # Only the verdict goes on the approval card; the read's own steps and
                # output are not shown to anyone.
                pass
            case _:
                assert_never(event)


async def read_gpu_health(settings: Settings, pool: HostPool, plan: Plan) -> tuple[HealthNote, ...]:
    """A note per host whose service GPUs are not all ok, critical first (none for a dry
    run, whose GPU check runs at once, or an action without one). Through sudo where the
    host says so, exactly as the run's check runs."""
    if plan.action not in CHECKED or plan.dry_run:
        return ()
    svc = settings.services[plan.service]
    reads = await read_hosts(
        settings, pool, plan, lambda host: gpu_health_flow(svc, host), _Collect
    )
    notes = [n for n in map(_note_of, reads) if n is not None]
    return tuple(sorted(notes, key=lambda n: _ORDER.get(n.level, 1)))


def _note_of(read: HostRead[_Collect]) -> HealthNote | None:
    if read.outcome is None:
        return health_note(read.host, None, read.error)
    check = read.collected.check
    return health_note(read.host, check, None if check else "no verdict")


def health_lines(notes: tuple[HealthNote, ...]) -> list[str]:
    """The notes as the terminal prints them: ``GPU health: <host>: ...``."""
    return [f"GPU health: {n.text}" for n in notes]
