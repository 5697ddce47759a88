"""The operator's way out: ``python -m bot runs`` and ``python -m bot recover RUN_ID``.

``runs`` shows each run with the process that owns it, whether that process is alive
now, its lease and the locks it holds: what an operator needs to see why a service is
busy. ``recover`` marks a run whose driver is gone ``interrupted`` and releases its
locks, after confirmation, refusing while the owner is alive unless ``--force``; who
did it is a 'recover' decision in the audit log (a refusal is a refusals row), and the
message printed says what state the service may be in, as a recovered run's thread does.
A request awaiting approval past its window (no bot expired it) is expired at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, assert_never

from bot.audit.records import RunRecord
from bot.cli.terminal import say
from bot.core import table
from bot.core.status import ACTIVE_STATUSES
from bot.core.table import Column
from bot.engine.liveness import DRIVEN, JudgedBy, Verdict
from bot.engine.recovery import Expired, Recovered
from bot.engine.run_results import Refused
from bot.engine.runtime import Runtime
from bot.errors import InputError, NotConfirmed

EXIT_RECOVERED = 0
EXIT_REFUSED = 1

_HEADERS = (
    "ID",
    "SERVICE",
    "ACTION",
    "STATUS",
    "STEP",
    "OWNER",
    "ALIVE",
    "JUDGED BY",
    "LEASE UNTIL",
    "LOCKS",
)


def _liveness(run: RunRecord, rt: Runtime) -> Verdict | None:
    """The verdict on a run a driver holds; None for the others (nothing drives them).
    The judge must have looked (``Judge.look``)."""
    if run.status not in DRIVEN:
        return None
    return rt.lifecycle.judge.verdict(run)


def _judged_by(verdict: Verdict | None) -> str:
    if verdict is None:
        return "-"
    if verdict.by is JudgedBy.PROCESS:
        return "process"
    return f"lease, unchanged {verdict.unchanged_s:.0f} s"


def _row(run: RunRecord, verdict: Verdict | None, locks: Sequence[str]) -> list[str]:
    alive = "-" if verdict is None else ("yes" if verdict.alive else "NO")
    return [
        str(run.id),
        run.service,
        run.action,
        run.status,
        run.current_step or "-",
        run.owner or "-",
        alive,
        _judged_by(verdict),
        run.lease_until or "-",
        ", ".join(locks) or "-",
    ]


def _json(run: RunRecord, verdict: Verdict | None, locks: Sequence[str]) -> dict[str, Any]:
    # How long this machine has seen its heartbeat unchanged: only for a lease verdict.
    unchanged = (
        round(verdict.unchanged_s, 1)
        if verdict is not None and verdict.by is JudgedBy.LEASE
        else None
    )
    return {
        "id": run.id,
        "service": run.service,
        "action": run.action.value,
        "status": run.status.value,
        "current_step": run.current_step,
        "requested_by": run.requested_by,
        "source": run.source.value,
        "owner": run.owner,
        "owner_alive": None if verdict is None else verdict.alive,
        "owner_judged_by": None if verdict is None else verdict.by.value,
        "heartbeat_unchanged_s": unchanged,
        "lease_until": run.lease_until,
        "lease_renewals": run.lease_renewals,
        "locks": list(locks),
        "started_at": run.started_at,
    }


def runs_text(rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "no runs"
    return table.render([Column(h) for h in _HEADERS], rows)


async def list_runs(
    rt: Runtime, *, active: bool, limit: int, as_json: bool, out: TextIO = sys.stdout
) -> int:
    """``runs``: the active runs (all of them), or the newest ``limit``."""
    if active:
        runs = await rt.audit.list_runs(statuses=sorted(ACTIVE_STATUSES), limit=10_000)
    else:
        runs = await rt.audit.list_runs(limit=limit)
    locks = await rt.audit.locks_held()
    # This look is recorded: a `recover` on this machine LEASE_S later can judge by it.
    await rt.lifecycle.judge.look(rt.audit, [r.id for r in runs])
    if as_json:
        objects = [_json(r, _liveness(r, rt), locks.get(r.id, [])) for r in runs]
        say(out, json.dumps(objects, indent=2, ensure_ascii=False))
    elif active and not runs:
        out.write("no active runs\n")
    else:
        say(out, runs_text([_row(r, _liveness(r, rt), locks.get(r.id, [])) for r in runs]))
    return 0


async def recover_run(
    rt: Runtime,
    run_id: int,
    *,
    force: bool,
    yes: bool,
    user: str,
    confirm: Callable[[str], bool] | None,
    out: TextIO = sys.stdout,
) -> int:
    """``recover``: mark one run of a dead driver interrupted, by hand. ``confirm`` asks
    the operator; None when nobody can be asked (not on a terminal). The operations
    service judges, records and refuses (``Operations.recover_run``)."""
    look = await rt.operations.look(run_id)
    say(out, runs_text([_row(look.run, look.verdict, look.locks)]))

    def confirmed(alive: bool) -> None:
        if yes:
            return
        if confirm is None:
            raise InputError("not confirmed (use --yes when not on a terminal)")
        warning = " ITS OWNER IS ALIVE: it may still be changing the service." if alive else ""
        if not confirm(f"Mark run #{run_id} interrupted and release its locks?{warning} [y/N] "):
            raise NotConfirmed("not confirmed: nothing was done")

    result = await rt.operations.recover_run(look, user=user, force=force, confirm=confirmed)
    match result:
        case Recovered(item=item):
            say(out, rt.redact(item.message))
            return EXIT_RECOVERED
        case Expired():
            say(out, rt.redact(result.message))
            return EXIT_RECOVERED
        case Refused(reason=reason):
            say(sys.stderr, f"refused: {reason}")
            return EXIT_REFUSED
        case _:
            assert_never(result)
