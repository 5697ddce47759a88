"""``python -m bot scheduled``: the runs approved for later (``--at``, issue 22), starting
the terminal's own when they are due (``--start-due``), cancelling one (``--cancel N``).

A run scheduled in Slack is started by the Slack bot, which tells its card and thread; a
run scheduled on a terminal has neither, so it is started by ``--start-due`` on this
machine (a systemd timer or cron every minute), whose output is the run's progress.
Either way the start is one compare-and-set, so two lookers never start it twice."""

from __future__ import annotations

import json
import sys
from typing import TextIO, assert_never
from zoneinfo import ZoneInfo

from bot.audit.records import RunRecord
from bot.audit.store import parse_ts
from bot.cli.leftovers import TerminalGate
from bot.cli.terminal import TerminalSink, say
from bot.core.status import RunStatus, Source
from bot.core.table import Column, render
from bot.core.windows import when
from bot.engine.operations import Operator
from bot.engine.run_results import Cancelled, Refused
from bot.engine.runtime import Runtime
from bot.engine.schedule import NotStarted, Started, describe_outcome

_OK = (RunStatus.SUCCEEDED,)


def _zone(rt: Runtime, record: RunRecord) -> ZoneInfo:
    return ZoneInfo(rt.settings.policy_for(record.service).timezone)


def starts(rt: Runtime, record: RunRecord) -> str:
    """``Fri 2026-12-04 02:00 CET``: when it starts, in its windows' time zone."""
    assert record.scheduled_at is not None
    return when(parse_ts(record.scheduled_at), _zone(rt, record))


async def list_scheduled(rt: Runtime, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    runs = await rt.operations.scheduled()
    if as_json:
        say(out, json.dumps([r.to_json() for r in runs], indent=2, ensure_ascii=False))
        return 0
    if not runs:
        out.write("no scheduled runs\n")
        return 0
    rows = [
        [f"#{r.id}", f"{r.action} {r.service}", starts(rt, r), r.source.value, r.requested_by]
        for r in runs
    ]
    columns = [Column(h) for h in ("RUN", "WHAT", "STARTS", "FROM", "REQUESTED BY")]
    say(out, rt.redact(render(columns, rows)))
    return 0


async def cancel(rt: Runtime, run_id: int, *, user: str, out: TextIO = sys.stdout) -> int:
    result = await rt.operations.cancel_scheduled(run_id, by=Operator(user))
    match result:
        case Cancelled():
            say(out, result.text)
            return 0
        case Refused():
            print(f"error: {rt.redact(result.text)}", file=sys.stderr)
            return 1
        case _:
            assert_never(result)


async def start_due(rt: Runtime, *, user: str, out: TextIO = sys.stdout) -> int:
    """Start every due run scheduled on a terminal, one after another. Exit 0 when each
    that started succeeded (and none was refused at its start)."""
    outcomes = await rt.operations.start_due(source=Source.CLI)
    if not outcomes:
        out.write("nothing is due\n")
        return 0
    worst = 0
    for outcome in outcomes:
        say(out, rt.redact(describe_outcome(outcome)))
        match outcome:
            case Started(record=record):
                sink = TerminalSink(out, redact=rt.redact)
                # Nobody watches a timer's run: leftover processes are never killed
                # without a person's yes (the run waits, then fails safe).
                gate = TerminalGate(rt, user, approve=False, ask=None, out=out)
                try:
                    result = await rt.engine.execute(record.id, sink, gate=gate)
                finally:
                    sink.close()
                if result.status not in _OK:
                    worst = 1
            case NotStarted():
                worst = 1
            case _:
                assert_never(outcome)
    return worst
