"""``doctor`` at the edge: perform each probe of ``bot.core.doctor`` and judge its answer.

Hosts are checked at the same time, each host's probes in order; when a probe that
others depend on fails (TCP, host key, login), the host's later probes are reported as
not checked rather than failing for the same reason again.  Nothing here changes a host:
the commands are the probes' read-only ones, run through the host's sudo prefix like
the flows' (``bot.engine.executor.run_command``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncssh

from bot.audit.inspect import inspect
from bot.audit.migrations import MIGRATIONS
from bot.core.become import become_for
from bot.core.doctor import Answer, Check, Kind, Outcome, Probe, judge, probes, skipped
from bot.core.doctor_approvers import approver_checks, services_checked
from bot.core.doctor_database import judge_database
from bot.engine.executor import run_command
from bot.engine.slack_groups import read_groups
from bot.errors import HostError
from bot.hosts.known_hosts import host_key_of, trusted_algorithms
from bot.hosts.pool import HostPool
from bot.hosts.streams import reason
from bot.settings import HostSettings, Settings


async def run_doctor(
    settings: Settings, pool: HostPool, hosts: Sequence[str], service: str | None = None
) -> list[Check]:
    """Every check for ``hosts`` (and the services on them, or only ``service``), in the
    order ``bot.core.doctor.probes`` lists them."""
    wanted = probes(settings, hosts, service)
    # The hosts asked for, then the routers' hosts their services need (issue 19).
    every = dict.fromkeys([*hosts, *(p.host for p in wanted)])
    per_host = await asyncio.gather(
        *(_host(settings, pool, [p for p in wanted if p.host == h]) for h in every)
    )
    return (
        [c for checks in per_host for c in checks]
        + await _approvers(settings, services_checked(settings, hosts, service))
        + await database_checks(settings)
    )


async def database_checks(settings: Settings) -> list[Check]:
    """The audit database this process would use (issue 21): reachable, migrated, and on
    PostgreSQL this machine's clock against the database's, read without changing it."""
    state = await inspect(settings.db_path, timeout_s=settings.audit.busy_timeout_s)
    return judge_database(state, [m.name for m in MIGRATIONS], margin_s=settings.lease_margin_s())


async def _approvers(settings: Settings, services: list[str]) -> list[Check]:
    """Each service's approvers under its own policy, its groups' sizes read now."""
    policies = [settings.policy_for(name) for name in services]
    groups = {e for p in policies for e in p.approvers if e.startswith("S")}
    members, why = await read_groups(settings, groups)
    return approver_checks(settings, services, members, why)


async def _host(settings: Settings, pool: HostPool, host_probes: list[Probe]) -> list[Check]:
    out: list[Check] = []
    blocked: str | None = None
    for probe in host_probes:
        if blocked is not None:
            out.append(skipped(probe, blocked))
            continue
        check = judge(probe, await _ask(settings, pool, probe), settings)
        out.append(check)
        if probe.gate and check.outcome == Outcome.FAIL:
            blocked = f"{probe.name} failed"
    return out


async def _ask(settings: Settings, pool: HostPool, probe: Probe) -> Answer:
    cfg = settings.hosts[probe.host]
    try:
        if probe.kind == Kind.TCP:
            return await _tcp(cfg, probe.timeout_s)
        if probe.kind == Kind.HOST_KEY:
            return await _host_key(cfg, probe.timeout_s)
        if probe.kind == Kind.HTTP:
            http = await pool.get(probe.host).http_get(probe.url, timeout_s=probe.timeout_s)
            return Answer(http=http)
        if probe.kind == Kind.COMMANDS:
            transport = pool.get(probe.host)
            become = become_for(settings, probe.host, probe.service)
            results = [
                await run_command(
                    transport, become, argv, run_as, timeout_s=probe.timeout_s, stdin=probe.stdin
                )
                for argv, run_as in probe.commands
            ]
            more = probe.then(tuple(results)) if probe.then is not None else ()
            results += [
                await run_command(transport, become, argv, run_as, timeout_s=probe.timeout_s)
                for argv, run_as in more
            ]
            return Answer(results=tuple(results))
    except HostError as e:
        return Answer(error=e.reason)
    return Answer()


async def _tcp(cfg: HostSettings, timeout_s: float) -> Answer:
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(cfg.address, cfg.port)
    except TimeoutError:
        return Answer(error=f"no answer within {timeout_s:g}s")
    except OSError as e:
        return Answer(error=reason(e))
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return Answer()


async def _host_key(cfg: HostSettings, timeout_s: float) -> Answer:
    """The key the server presents, of a type known_hosts trusts for it when it trusts
    any (a host has several keys, and the one offered first may be another type)."""
    trusted = host_key_of(cfg)
    algs = trusted_algorithms(cfg)
    try:
        async with asyncio.timeout(timeout_s):
            key = await asyncssh.get_server_host_key(
                cfg.address, cfg.port, server_host_key_algs=algs or (), config=None
            )
    except TimeoutError:
        return Answer(error=f"no answer within {timeout_s:g}s", trusted=trusted)
    except (OSError, asyncssh.Error) as e:
        return Answer(error=reason(e), trusted=trusted)
    if key is None:
        return Answer(error="the server presented no key", trusted=trusted)
    return Answer(key=key.get_fingerprint("sha256"), trusted=trusted)
