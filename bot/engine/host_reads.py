"""Read-only flows driven on each host of a plan when it is requested, before anyone
approves: the package preview (``bot.engine.preview``) and the GPU health read
(``bot.engine.gpu_health``) for the approval card.

Each is driven by the same executor as a run, through the host's sudo prefix exactly as
the run's own step would be, with no run and no audit record of its own: its events go
to a collector only. A host whose flow cannot be driven (unreachable, a refused key) is
a read with the reason, never an exception, so one host never hides the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from bot.core import events as ev
from bot.core.become import become_for
from bot.core.flows import Flow, HostOutcome
from bot.core.plan import Plan
from bot.engine.audit_reads import AuditReads
from bot.engine.executor import Executor
from bot.engine.host_runs import reach_of
from bot.errors import HostError
from bot.hosts.pool import HostPool
from bot.settings import Settings

# At most this many hosts are read at once: a 64-host fleet is not 64 dry runs at a time.
CONCURRENCY = 8
# No run exists yet; the events go nowhere but the collector.
NO_RUN = 0

S = TypeVar("S", bound=ev.EventSink)


@dataclass(frozen=True, slots=True)
class HostRead(Generic[S]):
    """One host's read: what its collector kept, and how its flow ended (``outcome``
    None: it could not be driven, ``error`` says why)."""

    host: str
    collected: S
    outcome: HostOutcome | None
    error: str | None = None


async def read_hosts(
    settings: Settings,
    pool: HostPool,
    plan: Plan,
    flow: Callable[[str], Flow],
    collector: Callable[[], S],
    *,
    reads: AuditReads | None = None,
) -> tuple[HostRead[S], ...]:
    """Drive ``flow(host)`` on every host of ``plan`` (``CONCURRENCY`` at once), each into
    a fresh ``collector()``; the reads in the plan's host order. The flow may name the
    plan's other hosts (a router's, a sibling replica), and ask the audit log through
    ``reads`` (none: it is told there is no audit log to ask)."""
    limit = asyncio.Semaphore(CONCURRENCY)
    reach = reach_of(settings, pool, plan)

    async def one(host: str) -> HostRead[S]:
        sink = collector()
        async with limit:
            try:
                become = become_for(settings, host, plan.service)
                outcome = await Executor(
                    NO_RUN,
                    pool.get(host),
                    sink,
                    become=become,
                    gpu_health=pool.gpu_health(host),
                    reach=reach,
                    reads=reads,
                ).drive(flow(host))
            except (HostError, OSError) as e:
                return HostRead(host, sink, None, e.reason if isinstance(e, HostError) else str(e))
        return HostRead(host, sink, outcome)

    return tuple(await asyncio.gather(*map(one, plan.hosts)))
