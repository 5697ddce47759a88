"""Run a plan through the real engine as a CLI request approved by a second person,
the way the end-to-end tests drive a redeploy without a front end."""

from __future__ import annotations

import io
import socket
from collections.abc import Sequence
from typing import Any

from bot.audit.store import AuditLog
from bot.cli.terminal import TerminalSink
from bot.core.status import Action, Decision, RunStatus, Source, StepStatus
from bot.engine.engine import RunResult
from bot.engine.leftover_gate import LeftoverGate
from bot.engine.owner import Owner, this_namespace
from bot.engine.runtime import Runtime
from bot.sim.kit import SERVICE


async def run(
    rt: Runtime, action: Action, *, gate: LeftoverGate | None = None, **plan: Any
) -> tuple[RunResult, str]:
    """Request, approve (U0BOB for U0ALICE) and execute; the result and the terminal text.
    ``gate``: who is asked about leftover workers (none: nobody can be asked)."""
    out = io.StringIO()
    p = rt.engine.plan(action, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    result = await rt.engine.execute(record.id, TerminalSink(out), gate=gate)
    return result, out.getvalue()


async def left_running_by_a_dead_bot(
    audit: AuditLog, run_id: int, host: str, done: Sequence[str], during: str
) -> None:
    """The run as a bot that died mid-run left it: approved, 'running' under an owner no
    process is (a PID above pid_max in this namespace), the steps ``done`` finished and
    ``during`` begun; a recovery must find it."""
    assert await audit.transition(run_id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,))
    dead = str(Owner(socket.gethostname(), 2**22 + 17, "1", this_namespace()))
    assert await audit.transition(
        run_id, RunStatus.RUNNING, expect=(RunStatus.APPROVED,), owner=dead
    )
    for step in done:
        started = await audit.step_started(run_id, host, step, step)
        await audit.step_finished(started, status=StepStatus.OK, duration_s=0.5)
    await audit.step_started(run_id, host, during, during)
