"""``[security]`` and ``[audit]``: what is masked wherever text leaves the bot, and how
the audit log rides out a database it cannot write for a while."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from bot.settings.base import Section, expand


class SecuritySettings(Section):
    # Extra literal values (passwords, tokens) masked wherever text leaves the bot.
    redact: list[SecretStr] = Field(default_factory=list)


class AuditSettings(Section):
    """How the audit log rides out a database that cannot be written for a while
    (locked by another process, disk full); see ``bot.audit.resilient``."""

    # SQLite's own wait for another process's write lock, per attempt.
    busy_timeout_s: float = Field(10.0, gt=0)
    # How long a running job's write is retried (with back-off) before it goes to the
    # fallback journal and the job is brought back to a safe state.
    retry_s: float = Field(15.0, ge=0)
    # Where the fallback journal goes when the database's own directory cannot take it
    # (the disk is full): default, the system's temporary directory.
    journal_fallback_dir: Path | None = None
    # Where the fallback journal goes first: default, next to the SQLite file; with
    # PostgreSQL (no file of ours), the bot's working directory.
    journal_dir: Path | None = None

    @field_validator("journal_fallback_dir", "journal_dir")
    @classmethod
    def _expand_dir(cls, v: Path | None) -> Path | None:
        return None if v is None else expand(v)
