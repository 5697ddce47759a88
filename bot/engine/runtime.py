"""Open everything a process needs once (settings in, audit log, host pool, engine) and
close it in the right order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from bot.audit.resilient import AuditWriter
from bot.audit.store import AuditLog
from bot.core.redact import Redactor
from bot.engine.audit_sink import audit_writer
from bot.engine.engine import Engine
from bot.engine.exporter import Exporter
from bot.engine.lifecycle import Clock, RunLifecycle, utc_now
from bot.engine.liveness import settling_after_restart
from bot.engine.operations import Operations
from bot.hosts.pool import HostPool
from bot.settings import Settings


@dataclass
class Runtime:
    settings: Settings
    audit: AuditLog
    pool: HostPool
    engine: Engine
    redact: Redactor
    lifecycle: RunLifecycle  # every status change of a run, for the engine and front ends
    # Every change a person asks of a run, for both front ends (on ``lifecycle``).
    operations: Operations
    writer: AuditWriter  # the runs' resilient audit writes (its journal's depth: metrics)
    metrics: Exporter  # what this process did, for Prometheus (bot.engine.metrics_http)


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, clock: Clock = utc_now, nvml: Any = None
) -> AsyncIterator[Runtime]:
    """``clock`` is the wall clock the run life cycle decides expiry by (tests move it);
    ``nvml`` the NVML module a host the bot runs on is read with (None: pynvml)."""
    redact = Redactor.for_settings(settings)
    audit = await AuditLog.open(
        settings.db_path, redact=redact, busy_timeout_s=settings.audit.busy_timeout_s
    )
    # Records an audit outage left in the fallback journal are merged before anything
    # (recovery included) reads the runs; if the database still cannot take them, a
    # background task keeps trying.
    writer = audit_writer(audit, settings)
    await writer.start()
    pool = HostPool(settings, nvml=nvml)
    lifecycle = RunLifecycle(settings, audit, clock=clock)
    if lifecycle.judge.by_database:
        # A replica sets its own (its leader's reachability, bot.slack.front_end); this
        # covers a process that looks once, such as the command line after a restart.
        lifecycle.judge.settling = await settling_after_restart(audit, settings.replicas.lease_s)
    # Always kept (cheap): served only where [metrics] listen is set (bot.slack.app).
    metrics = Exporter()
    engine = Engine(settings, audit, pool, lifecycle, writer)
    engine.observers = (metrics,)
    lifecycle.on_refusal = metrics.refused
    try:
        yield Runtime(
            settings, audit, pool, engine, redact, lifecycle, Operations(lifecycle), writer, metrics
        )
    finally:
        await pool.close()
        await writer.close()
        await audit.close()
