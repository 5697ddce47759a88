"""What a request shows before anyone approves, read on its hosts at once (read-only):
the load a stop would wait for (``bot.engine.load``), the package change a redeploy
would make (``bot.engine.preview``), where a rollback by hand would go
(``bot.engine.releases``) and the service's GPUs' health (``bot.engine.gpu_health``).
The Slack card and the terminal's confirmation show the same, so both front ends read
it here."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bot.audit.store import AuditLog
from bot.core.health import HealthNote
from bot.core.plan import Plan
from bot.engine.gpu_health import read_gpu_health
from bot.engine.load import load_note, read_load
from bot.engine.preview import HostPreview, preview
from bot.engine.releases import rollback_targets
from bot.hosts.pool import HostPool
from bot.settings import Settings


@dataclass(frozen=True, slots=True)
class RequestReads:
    previews: tuple[HostPreview, ...]  # none for an action or a run without a preview
    health: tuple[HealthNote, ...]  # the hosts whose service GPUs are not all ok
    load: str | None  # the load sentence; None when it was not asked for
    # A rollback by hand: per host, the release it would go to and why (else none).
    targets: tuple[str, ...] = ()


async def read_at_request(
    settings: Settings, pool: HostPool, audit: AuditLog, plan: Plan, *, load: bool
) -> RequestReads:
    """The reads, concurrently (``load``: whether the load is read at all). A host's
    maintenance has none of them: its card lists each service it will stop."""
    if plan.action.host_wide:
        return RequestReads((), (), None)
    svc = settings.services[plan.service]

    async def load_line() -> str | None:
        if not load:
            return None
        return load_note(plan, svc, await read_load(pool, svc, plan.hosts))

    previews, health, note, targets = await asyncio.gather(
        preview(settings, pool, plan),
        read_gpu_health(settings, pool, plan),
        load_line(),
        rollback_targets(settings, pool, audit, plan),
    )
    return RequestReads(previews, health, note, targets)
