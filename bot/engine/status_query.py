"""Reads of a service on its hosts that are no run: ``status`` (unit state, installed
version, what the API serves and its load, the GPU table) and ``rotation`` (each replica
in or out of its router's rotation). Nothing is recorded in the audit log (a status asked
every minute by a dashboard script must not add a run a minute), no lock is taken and
nobody is asked, so anyone may ask. They are driven by the same executor and flows as a
run (``Engine.query``), so they read exactly what a run reads, through the host's sudo
prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from bot.core import events as ev
from bot.core.gpu import render_table
from bot.core.plan import Plan
from bot.core.status import HostStatus
from bot.engine.audit_reads import AuditReads
from bot.engine.engine import Engine
from bot.engine.host_reads import read_hosts
from bot.engine.host_runs import flow_of


class HostLines:
    """Keeps what a host's read reports, for one answer at the end: the host's end
    ("host: succeeded: ...", ``with_status``) and its GPU table (``tables``)."""

    def __init__(self, *, tables: bool = True, with_status: bool = True) -> None:
        self.lines: list[str] = []
        self.tables = tables
        self.with_status = with_status

    async def handle(self, event: ev.Event) -> None:
        match event:
            case ev.HostFinished():
                status = f"{event.status}: " if self.with_status else ""
                self.lines.append(f"{event.host}: {status}{event.summary}")
            case ev.GpuTable():
                if self.tables:
                    self.lines.append(render_table(event.snapshot))
            # The answer is each host's end (and its GPU table); the rest is the read's own
            # progress, which a one-shot answer does not show.
            case (
                ev.RunStarted()
                | ev.StepStarted()
                | ev.StepProgress()
                | ev.OutputLine()
                | ev.StepFinished()
                | ev.VersionsKnown()
                | ev.PackagesKnown()
                | ev.GpuHealthKnown()
                | ev.RunFinished()
                | ev.Notice()
                | ev.RotationChanged()
                | ev.ReleaseSwitched()
            ):
                pass
            case _:
                assert_never(event)


@dataclass(frozen=True, slots=True)
class Answer:
    lines: tuple[str, ...]
    # Every host answered its read in full (the terminal's exit code).
    ok: bool

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


async def query(
    engine: Engine, plan: Plan, *, tables: bool = True, with_status: bool = True
) -> Answer:
    """Each host of the read-only ``plan`` read at once (no run, no audit record, no lock,
    no lease), its lines in the plan's host order; a host that could not be read is a
    line saying why."""
    assert plan.action.read_only
    reads = await read_hosts(
        engine.settings,
        engine.pool,
        plan,
        flow_of(engine.settings, plan),
        lambda: HostLines(tables=tables, with_status=with_status),
        reads=AuditReads(engine.audit),
    )
    lines: list[str] = []
    for r in reads:
        lines += r.collected.lines if r.outcome is not None else [f"{r.host}: failed: {r.error}"]
    ok = all(r.outcome is not None and r.outcome.status == HostStatus.SUCCEEDED for r in reads)
    return Answer(tuple(lines), ok)


def router_line(plan: Plan) -> str:
    """The head of a ``rotation`` answer: which router is read, and its floor."""
    r = plan.router
    assert r is not None  # make_plan refuses a rotation of a service without a router
    return f"router {r.name} ({r.kind}) on {r.host}, min_serving {r.min_serving}"
