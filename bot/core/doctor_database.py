"""``doctor``'s judgement of the audit database (issue 21), from what
``bot.audit.inspect`` read: reachable, migrated to exactly this bot's schema, and (for
replicas on PostgreSQL) this machine's clock close enough to the database's.

The leases that decide between replicas are judged by the database's clock alone, so
skew cannot make a live replica look dead; but each replica stamps what people read
(an approval window's end, a run's times) with its own clock, and a replica whose clock
is off by more than the heartbeat's margin counts its own lease wrongly. Within
``SKEW_OK_S``: ok; up to the margin: a warning; beyond it: a failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.doctor_types import Check, Outcome

HOST = "(audit database)"
SKEW_OK_S = 1.0
MIGRATE_FIX = "run `python -m bot migrate` once (from any replica), then restart the replicas"


@dataclass(frozen=True, slots=True)
class DatabaseState:
    """What ``bot.audit.inspect`` read of the audit database."""

    where: str  # for people: the file, or the URL without its password
    postgres: bool
    exists: bool  # SQLite: the file is there (PostgreSQL: always, once reached)
    applied: tuple[str, ...] = ()
    server: str | None = None  # PostgreSQL's version
    skew_s: float | None = None  # the server's clock less this machine's (PostgreSQL)
    error: str | None = None  # why it could not be read


def judge_database(state: DatabaseState, known: Sequence[str], *, margin_s: float) -> list[Check]:
    """Checks of ``state`` against the migrations this bot knows (``known``)."""
    where, postgres, error = state.where, state.postgres, state.error
    kind = "PostgreSQL" if postgres else "SQLite"
    if error is not None:
        return [
            Check(
                HOST,
                None,
                "reachable",
                Outcome.FAIL,
                f"{kind} at {where}: {error}",
                "check CHATOPS_DB, the server, the network and the credentials "
                "(PGPASSWORD, ~/.pgpass or a libpq service file)",
            )
        ]
    if not state.exists:
        return [
            Check(
                HOST,
                None,
                "reachable",
                Outcome.OK,
                f"no audit database at {where} yet: the bot creates it at its first start",
            )
        ]
    server = state.server
    checks = [
        Check(
            HOST,
            None,
            "reachable",
            Outcome.OK,
            f"{kind}{' ' + server if server else ''} at {where}",
        ),
        _schema(state.applied, known, postgres=postgres),
    ]
    if state.skew_s is not None:
        checks.append(_skew(state.skew_s, margin_s))
    return checks


def _schema(applied: tuple[str, ...], known: Sequence[str], *, postgres: bool) -> Check:
    missing = [n for n in known if n not in applied]
    unknown = [n for n in applied if n not in known]
    if unknown:
        return Check(
            HOST,
            None,
            "schema",
            Outcome.FAIL if postgres else Outcome.WARN,
            f"migrated by a newer bot (migrations this bot does not know: {', '.join(unknown)})",
            "run the newer version of the bot",
        )
    if missing and postgres:
        return Check(
            HOST,
            None,
            "schema",
            Outcome.FAIL,
            f"behind this bot: {len(missing)} migration(s) not applied ({', '.join(missing)}); "
            "a replica refuses to start on it",
            MIGRATE_FIX,
        )
    if missing:
        return Check(
            HOST,
            None,
            "schema",
            Outcome.OK,
            f"{len(missing)} migration(s) to apply, which the bot does at its next start",
        )
    return Check(HOST, None, "schema", Outcome.OK, f"current ({len(known)} migrations)")


def _skew(skew_s: float, margin_s: float) -> Check:
    side = "behind" if skew_s > 0 else "ahead of"
    said = f"this machine's clock is {abs(skew_s):.2f} s {side} the database's"
    fix = (
        "run chrony or systemd-timesyncd against the same time source here and on the "
        "database server"
    )
    if abs(skew_s) < SKEW_OK_S:
        return Check(HOST, None, "clock skew", Outcome.OK, said)
    if abs(skew_s) < margin_s:
        return Check(HOST, None, "clock skew", Outcome.WARN, said, fix)
    return Check(
        HOST,
        None,
        "clock skew",
        Outcome.FAIL,
        f"{said}: more than the lease margin ({margin_s:g} s)",
        fix,
    )
