"""Open everything a process needs once (settings in, audit log, host pool, engine) and
close it in the right order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from bot.audit.store import AuditLog
from bot.core.redact import Redactor
from bot.engine.engine import Engine
from bot.hosts.pool import HostPool
from bot.settings import Settings


@dataclass
class Runtime:
    settings: Settings
    audit: AuditLog
    pool: HostPool
    engine: Engine
    redact: Redactor


@asynccontextmanager
async def open_runtime(settings: Settings) -> AsyncIterator[Runtime]:
    redact = Redactor(settings.secret_values())
    audit = await AuditLog.open(settings.db_path, redact=redact)
    pool = HostPool(settings)
    try:
        yield Runtime(settings, audit, pool, Engine(settings, audit, pool), redact)
    finally:
        await pool.close()
        await audit.close()
