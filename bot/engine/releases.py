"""``python -m bot releases SERVICE``: each host's releases of a side-by-side service
(issue 20, item 3), read with the run's own listing script and sudo prefix."""

from __future__ import annotations

import asyncio

from bot.core import remote_releases
from bot.core.privilege import run_as_of
from bot.core.releases import Releases, parse_releases, render_releases
from bot.core.sudoers import become_for
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
