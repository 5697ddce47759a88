"""GPU status across hosts: one concurrent fan-out, a row per host, never a failed query.

A broken or unreachable host becomes a row saying why; the answer comes back in
about the time of the slowest host (bounded by the per-host timeout).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bot import remote
from bot.errors import ChatOpsError, InputError
from bot.gpu import GpuSnapshot, build_snapshot, check_nvidia_smi, render_table
from bot.nvml import probe_local
from bot.settings import Settings
from bot.ssh import HostPool
from bot.transport import HostTransport

DEFAULT_HOST_TIMEOUT_S = 10.0
# A GPU with more than this in use (or any compute process) counts as busy.
BUSY_MIB = 1024


@dataclass(frozen=True, slots=True)
class HostGpus:
    host: str
    snapshot: GpuSnapshot | None
    error: str | None
    duration_s: float


def resolve_targets(settings: Settings, target: str | None) -> list[str]:
    """All hosts, one host, or a service's hosts."""
    if target is None:
        return sorted(settings.hosts)
    if target in settings.hosts:
        return [target]
    if target in settings.services:
        return list(settings.services[target].hosts)
    hosts = ", ".join(sorted(settings.hosts)) or "none"
    services = ", ".join(sorted(settings.services)) or "none"
    raise InputError(f"`{target[:64]}` is neither a host ({hosts}) nor a service ({services})")


async def query_transport(transport: HostTransport, timeout_s: float) -> GpuSnapshot:
    gpus, apps = await asyncio.gather(
        transport.run(remote.gpu_query(), timeout_s=timeout_s),
        transport.run(remote.apps_query(), timeout_s=timeout_s))
    check_nvidia_smi(transport.host, gpus)
    check_nvidia_smi(transport.host, apps)
    return build_snapshot(transport.host, gpus.stdout, apps.stdout)


async def query_host(settings: Settings, pool: HostPool, host: str,
                     timeout_s: float = DEFAULT_HOST_TIMEOUT_S) -> HostGpus:
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            if settings.hosts[host].is_local:
                snap = await asyncio.to_thread(probe_local, host)
            else:
                snap = await query_transport(pool.get(host), timeout_s)
    except TimeoutError:
        return HostGpus(host, None, f"no answer within {timeout_s:g}s",
                        time.monotonic() - start)
    except ChatOpsError as e:
        reason = getattr(e, "reason", None) or str(e)
        return HostGpus(host, None, reason, time.monotonic() - start)
    return HostGpus(host, snap, None, time.monotonic() - start)


async def fleet_gpus(settings: Settings, pool: HostPool, hosts: list[str],
                     timeout_s: float = DEFAULT_HOST_TIMEOUT_S) -> list[HostGpus]:
    return list(await asyncio.gather(*(query_host(settings, pool, h, timeout_s)
                                       for h in hosts)))


def fleet_summary(results: list[HostGpus]) -> str:
    snaps = [r.snapshot for r in results if r.snapshot is not None]
    gpus = [g for s in snaps for g in s.gpus]
    busy = sum(1 for g in gpus if (g.memory_used_mib or 0) > BUSY_MIB or g.processes)
    used = sum(s.used_mib for s in snaps)
    total = sum(s.total_mib for s in snaps)
    down = len(results) - len(snaps)
    return (f"{len(snaps)}/{len(results)} hosts ok" + (f", {down} unreachable" if down else "")
            + f"; {len(gpus)} GPUs: {busy} busy, {len(gpus) - busy} idle; "
            f"{used:,} of {total:,} MiB in use")


def render_fleet(results: list[HostGpus]) -> str:
    parts = [fleet_summary(results)]
    for r in results:
        if r.snapshot is None:
            parts.append(f"{r.host}: UNAVAILABLE: {r.error}")
        else:
            parts.append(render_table(r.snapshot))
    return "\n\n".join(parts)
