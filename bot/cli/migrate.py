"""``python -m bot migrate``: bring the audit database's schema up to this bot's.

SQLite migrates itself whenever the bot or a command opens the file; PostgreSQL never
does (several replicas must not race to change the schema), so the operator runs this
once before starting the replicas, and again before rolling out a bot with new
migrations (``bot.audit.pg_db``). Either way it prints what it applied, or that the
schema was already current."""

from __future__ import annotations

import sys

from bot.audit.store import AuditLog
from bot.cli.terminal import say
from bot.core.redact import Redactor
from bot.settings import Settings


async def migrate(settings: Settings) -> int:
    applied: list[str] = []
    async with AuditLog.open(
        settings.db_path,
        redact=Redactor.for_settings(settings),
        busy_timeout_s=settings.audit.busy_timeout_s,
        migrate=True,
        applied=applied,
    ) as audit:
        if applied:
            say(
                sys.stdout,
                f"{audit.where}: applied {len(applied)} migration(s): {', '.join(applied)}",
            )
        else:
            say(sys.stdout, f"{audit.where}: the schema is current; nothing to apply")
        if audit.unknown_migrations:
            say(
                sys.stdout,
                f"{audit.where}: it also has migrations this bot does not know (a newer "
                f"bot's): {', '.join(audit.unknown_migrations)}",
            )
    return 0
