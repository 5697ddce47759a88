"""The load on a service's hosts now, for the approval card: ``GET /metrics`` through
each host's SSH connection (read-only, bounded by a short timeout), and the sentence
the card shows: how many requests a stop would wait for or, with ``--force``,
interrupt."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from bot.core.metrics import Load, MetricsError, parse_load
from bot.core.plan import Plan
from bot.core.readiness import metrics_url
from bot.errors import HostError
from bot.hosts.pool import HostPool
from bot.settings import ServiceSettings

# The card waits this long at most for a host's /metrics: a host that does not answer
# shows as unknown rather than hold the card back.
LOAD_TIMEOUT_S = 3.0
_HOSTS_NAMED = 3

Reading = tuple[Load | None, str]  # the load, or None and why it is unknown


async def read_load(pool: HostPool, svc: ServiceSettings, hosts: tuple[str, ...], *,
                    timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, Reading]:
    """Each host's load now, read at once on all of them."""
    url = metrics_url(svc)

    async def one(host: str) -> Reading:
        try:
            async with asyncio.timeout(timeout_s + 1):
                h = await pool.get(host).http_request("GET", url, timeout_s=timeout_s)
        except HostError as e:
            return None, e.reason
        except TimeoutError:
            return None, f"no answer within {timeout_s:g}s"
        if not h.ok:
            return None, h.error or f"HTTP {h.status}"
        try:
            load = parse_load(h.body, truncated=h.truncated)
        except MetricsError as e:
            return None, str(e)
        return (load, "") if load.known else (None, "no request metrics")

    readings = await asyncio.gather(*(one(h) for h in hosts))
    return dict(zip(hosts, readings, strict=True))


def load_note(plan: Plan, svc: ServiceSettings, readings: Mapping[str, Reading]) -> str:
    """The card's sentence about the load: what the stop will wait for, or (``--force``)
    "will interrupt N running requests"."""
    known = {h: r[0] for h, r in readings.items() if r[0] is not None}
    running = sum(load.running or 0 for load in known.values())
    waiting = sum(load.waiting or 0 for load in known.values())
    busy = [f"{h}: {load.describe()}" for h, load in known.items() if not load.idle]
    unknown = [f"{h} (unknown: {r[1]})" for h, r in readings.items() if r[0] is None]
    shown = busy[:_HOSTS_NAMED] + (["…"] if len(busy) > _HOSTS_NAMED else [])
    parts = [f"Load now: {'; '.join(shown)}" if busy else
             f"Load now: no request in flight on {len(known)} host(s)" if known else
             "Load now: unknown"]
    if unknown:
        parts.append(f"no metrics from {', '.join(unknown[:_HOSTS_NAMED])}"
                     + (" …" if len(unknown) > _HOSTS_NAMED else "")
                     + ": counted as idle")
    if plan.force:
        parts.append(f"--force: will interrupt {running} running request"
                     f"{'s' if running != 1 else ''}"
                     + (f" (and {waiting} waiting)" if waiting else "")
                     + "; the stop does not wait")
    elif busy and svc.request_drain_timeout_s > 0:
        parts.append(f"the stop waits up to {svc.request_drain_timeout_s:g}s for "
                     f"{running + waiting} request(s) to finish, else the run ends with the "
                     "service untouched")
    elif busy:
        parts.append(f"request_drain_timeout_s = 0: {running} running request(s) will be "
                     "interrupted")
    return ". ".join(parts) + "."
