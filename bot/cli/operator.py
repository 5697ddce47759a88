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
from typing import Any, TextIO

from bot.audit.records import RunRecord
from bot.core.status import ACTIVE_STATUSES
from bot.engine.recovery import (
    DRIVEN,
    ByHand,
    Expired,
    NotDriven,
    OwnerAlive,
    Recovered,
    driver_alive,
    overdue,
    recover_by_hand,
)
from bot.engine.runtime import Runtime
from bot.errors import InputError

EXIT_RECOVERED = 0
EXIT_REFUSED = 1

_HEADERS = ("ID", "SERVICE", "ACTION", "STATUS", "STEP", "OWNER", "ALIVE", "LEASE UNTIL",
            "LOCKS")


def _liveness(run: RunRecord, rt: Runtime) -> bool | None:
    """Alive or dead for a run a driver holds; None for the others (nothing drives them)."""
    if run.status not in DRIVEN:
        return None
    return driver_alive(run, rt.lifecycle.clock())


def _row(run: RunRecord, alive: bool | None, locks: Sequence[str]) -> list[str]:
    return [str(run.id), run.service, run.action, run.status, run.current_step or "-",
            run.owner or "-", "-" if alive is None else ("yes" if alive else "NO"),
            run.lease_until or "-", ", ".join(locks) or "-"]


def runs_text(rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "no runs"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(_HEADERS), *(line(r) for r in rows)])


async def list_runs(rt: Runtime, *, active: bool, limit: int, as_json: bool,
                    out: TextIO = sys.stdout) -> int:
    """``runs``: the active runs (all of them), or the newest ``limit``."""
    if active:
        runs = await rt.audit.list_runs(statuses=sorted(ACTIVE_STATUSES), limit=10_000)
    else:
        runs = await rt.audit.list_runs(limit=limit)
    locks = await rt.audit.locks_held()
    if as_json:
        objects: list[dict[str, Any]] = [
            {"id": r.id, "service": r.service, "action": r.action.value,
             "status": r.status.value, "current_step": r.current_step,
             "requested_by": r.requested_by, "source": r.source.value, "owner": r.owner,
             "owner_alive": _liveness(r, rt), "lease_until": r.lease_until,
             "locks": locks.get(r.id, []), "started_at": r.started_at}
            for r in runs]
        out.write(json.dumps(objects, indent=2, ensure_ascii=False) + "\n")
    elif active and not runs:
        out.write("no active runs\n")
    else:
        out.write(runs_text([_row(r, _liveness(r, rt), locks.get(r.id, [])) for r in runs])
                  + "\n")
    return 0


async def recover_run(rt: Runtime, run_id: int, *, force: bool, yes: bool, user: str,
                      confirm: Callable[[str], bool] | None, out: TextIO = sys.stdout) -> int:
    """``recover``: mark one run of a dead driver interrupted, by hand. ``confirm`` asks
    the operator; None when nobody can be asked (not on a terminal)."""
    run = await rt.audit.get_run(run_id)
    locks = (await rt.audit.locks_held()).get(run_id, [])
    alive = _liveness(run, rt)
    out.write(runs_text([_row(run, alive, locks)]) + "\n")
    command = f"recover run #{run_id}" + (" --force" if force else "")
    if alive is None:
        if overdue(run, rt.lifecycle.clock()):
            # Expired without asking: its window closed it already, nobody can approve it.
            return await _report(rt, user, command, out, await recover_by_hand(
                rt.audit, run_id, by=user, clock=rt.lifecycle.clock))
        return await _refuse(rt, user, command, NotDriven(run).reason)
    if alive and not force:
        return await _refuse(rt, user, command, OwnerAlive(run).reason)
    if not yes:
        if confirm is None:
            raise InputError("not confirmed (use --yes when not on a terminal)")
        warning = " ITS OWNER IS ALIVE: it may still be changing the service." if alive else ""
        if not confirm(f"Mark run #{run_id} interrupted and release its locks?{warning} "
                       "[y/N] "):
            raise InputError("not confirmed")
    return await _report(rt, user, command, out, await recover_by_hand(
        rt.audit, run_id, by=user, force=force, clock=rt.lifecycle.clock))


async def _report(rt: Runtime, user: str, command: str, out: TextIO, result: ByHand) -> int:
    if isinstance(result, Recovered):
        out.write(rt.redact(result.item.message) + "\n")
        return EXIT_RECOVERED
    if isinstance(result, Expired):
        out.write(rt.redact(result.message) + "\n")
        return EXIT_RECOVERED
    # It changed between the look and the recovery (it finished, or its owner came back).
    return await _refuse(rt, user, command, result.reason)


async def _refuse(rt: Runtime, user: str, command: str, reason: str) -> int:
    await rt.audit.record_refusal(user=user, channel=None, command=command, reason=reason)
    sys.stderr.write(f"refused: {reason}\n")
    return EXIT_REFUSED
