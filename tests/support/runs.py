"""Run a plan through the real engine as a CLI request approved by a second person,
the way the end-to-end tests drive a redeploy without a front end."""

from __future__ import annotations

import io
from typing import Any

from bot.cli.terminal import TerminalSink
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import RunResult
from bot.engine.leftover_gate import LeftoverGate
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
