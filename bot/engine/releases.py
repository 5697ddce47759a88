"""``python -m bot releases SERVICE``: each host's releases of a side-by-side service
(issue 20, item 3), read with the run's own listing script and sudo prefix; and where a
rollback by hand would go on each, by those releases and the audit log's switches."""

from __future__ import annotations

import asyncio

from bot.audit.store import AuditLog
from bot.core import remote_releases
from bot.core.become import become_for
from bot.core.plan import Plan
from bot.core.privilege import run_as_of
from bot.core.releases import (
    Releases,
    Target,
    layout_refusal,
    parse_releases,
    render_releases,
    rollback_target,
)
from bot.core.status import Action
from bot.engine.audit_reads import switch_history
from bot.engine.executor import run_command
from bot.errors import HostError, InputError
from bot.hosts.pool import HostPool
from bot.settings import Settings


async def host_releases(
    settings: Settings, pool: HostPool, service: str, host: str
) -> tuple[Releases | None, str | None]:
    """One host's listing, or None and why there is none. Never raises for the host."""
    svc = settings.services[service]
    argv = remote_releases.releases_list(svc)
    try:
        r = await run_command(
            pool.get(host),
            become_for(settings, host, service),
            argv,
            run_as_of(argv),
            timeout_s=svc.command_timeout_s,
        )
    except HostError as e:
        return None, f"unreachable: {e.reason}"
    layout = parse_releases(r.stdout, svc.venv_dir) if r.ok else None
    if layout is None:
        why = r.refused or (r.output.strip().splitlines() or [f"exit {r.exit_status}"])[-1]
        return None, f"not a side-by-side layout ({why})"
    return layout, None


async def releases_text(settings: Settings, pool: HostPool, service: str) -> tuple[str, bool]:
    """Every host's releases, and whether each host answered with a listing."""
    if service not in settings.services:
        known = ", ".join(sorted(settings.services)) or "none configured"
        raise InputError(f"unknown service `{service[:64]}`; configured services: {known}")
    svc = settings.services[service]
    got = await asyncio.gather(*(host_releases(settings, pool, service, h) for h in svc.hosts))
    pairs = zip(svc.hosts, got, strict=True)
    text = "\n".join(render_releases(h, layout, err) for h, (layout, err) in pairs)
    if svc.strategy != "side_by_side":
        text = f"{service} is configured in_place (strategy); its hosts as they are:\n" + text
    return text, all(layout is not None for layout, _ in got)


async def rollback_targets(
    settings: Settings, pool: HostPool, audit: AuditLog, plan: Plan
) -> tuple[str, ...]:
    """Where a rollback by hand would go on each host of ``plan`` and why, read when it is
    requested, for the approval card and the terminal (none for another action). The
    run's preflight decides again, the same way, before anything stops."""
    if plan.action != Action.ROLLBACK:
        return ()
    svc = settings.services[plan.service]

    async def one(host: str) -> str:
        layout, error = await host_releases(settings, pool, plan.service, host)
        refused = layout_refusal(svc, layout, error or "")
        if refused is not None or layout is None:
            return f"{host}: {refused or error}"
        history = await switch_history(audit, plan.service, host)
        target = rollback_target(layout, history.switches, history.error or "")
        match target:
            case Target():
                return f"{host}: from release {layout.live} to {target.name} ({target.why})"
            case str():
                return f"{host}: nothing to go back to ({target}); the run would change nothing"

    return tuple(await asyncio.gather(*map(one, plan.hosts)))
