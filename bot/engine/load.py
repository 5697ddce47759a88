"""The load on a service's hosts now, for the approval card: ``GET /metrics`` through
each host's SSH connection (read-only, bounded by a short timeout), and the sentence
the card shows: how many requests a stop would wait for or, with ``--force``,
interrupt. A host whose load cannot be read (no answer, no ``vllm:`` request gauges) is
unknown, never idle: the card says its stop will be refused unless ``--force`` (the
flow's rule, ``bot.core.flows._unknown_load``)."""

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


async def read_load(
    pool: HostPool,
    svc: ServiceSettings,
    hosts: tuple[str, ...],
    *,
    timeout_s: float = LOAD_TIMEOUT_S,
) -> dict[str, Reading]:
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
        return (load, "") if load.known else (None, f"/metrics has no {load.missing()}")

    readings = await asyncio.gather(*(one(h) for h in hosts))
    return dict(zip(hosts, readings, strict=True))


def load_note(plan: Plan, svc: ServiceSettings, readings: Mapping[str, Reading]) -> str:
    """The card's sentence about the load: what the stop will wait for, or (``--force``)
    "will interrupt N running requests"."""
    known = {h: r[0] for h, r in readings.items() if r[0] is not None}
    running = sum(load.running or 0 for load in known.values())
    waiting = sum(load.waiting or 0 for load in known.values())
    busy = [f"{h}: {load.describe()}" for h, load in known.items() if not load.idle]
    unknown = [f"{h} ({r[1]})" for h, r in readings.items() if r[0] is None]
    shown = busy[:_HOSTS_NAMED] + (["…"] if len(busy) > _HOSTS_NAMED else [])
    parts = [
        f"Load now: {'; '.join(shown)}"
        if busy
        else f"Load now: no request in flight on {len(known)} host(s)"
        if known
        else ""
    ]
    if unknown:
        parts.append(
            f"{'load' if known else 'Load now:'} unknown on "
            f"{', '.join(unknown[:_HOSTS_NAMED])}"
            + (" …" if len(unknown) > _HOSTS_NAMED else "")
            + f": {_unknown_rule(plan, svc)}"
        )
    parts = [p for p in parts if p]
    if plan.force:
        if known:  # of the unknown ones it cannot say a number
            parts.append(
                f"--force: will interrupt {running} running request"
                f"{'s' if running != 1 else ''}"
                + (f" (and {waiting} waiting)" if waiting else "")
                + "; the stop does not wait"
            )
    elif busy and svc.request_drain_timeout_s > 0:
        parts.append(
            f"the stop waits up to {svc.request_drain_timeout_s:g}s for "
            f"{running + waiting} request(s) to finish, else the run ends with the "
            "service untouched"
        )
    elif busy:
        parts.append(
            f"request_drain_timeout_s = 0: {running} running request(s) will be interrupted"
        )
    return ". ".join(parts) + "."


def _unknown_rule(plan: Plan, svc: ServiceSettings) -> str:
    """What the stop does on a host whose load is unknown (the drain step's rule)."""
    if plan.force:
        return "--force stops it anyway, interrupting whatever runs there"
    if svc.request_drain_timeout_s == 0:
        return (
            "request_drain_timeout_s = 0: the stop does not wait and interrupts whatever runs there"
        )
    return (
        "unknown is not idle: the run stops it only if its unit is not running, else "
        "it ends with the service untouched; pass --force to stop anyway"
    )
