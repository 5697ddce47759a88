"""A bot process for another PID namespace (issue 17, F3): run under
``unshare --pid --fork --mount-proc`` by ``tests/test_owner.py``, with the real run life
cycle, the real owner string and the real heartbeat, on the test's SQLite file.

``python -m tests.support.ns_process owner DB``: requests, confirms and starts a run (as
the CLI does), prints ``{"run": id, "owner": ...}`` and drives it until killed; its
heartbeat beats once per line read on stdin (the test says when, instead of 5 s).

``python -m tests.support.ns_process judge DB``: a judge whose monotonic clock only
moves when told; one JSON command per stdin line, one JSON answer per stdout line:
``{"advance": s}``, ``{"recover": true}`` (the ids it recovered), ``{"request": true}``
(the id of the run it got, or the busy refusal).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bot.audit import AuditLog
from bot.core.plan import make_plan
from bot.core.status import Action, Source
from bot.engine.clocks import Monotonic
from bot.engine.lifecycle import RunLifecycle
from bot.errors import LockHeldError
from bot.settings import LOCAL, Settings
from tests.support.clock import ManualClock

SERVICE = "svc"


def settings(db: Path) -> Settings:
    return Settings(
        hosts={"gpu1": {"address": LOCAL}},
        services={SERVICE: {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/opt/v/bin/python"}},
        policy={"approvers": ["U0BOB"], "min_approvals": 1, "approval_ttl_s": 600},
        db_path=db,
    )


async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


async def owner(db: Path) -> None:
    async def beat_when_told(seconds: float) -> None:
        if not await _line():
            await asyncio.Event().wait()  # stdin closed: alive, and never beating again

    s = settings(db)
    async with AuditLog.open(db) as audit:
        life = RunLifecycle(s, audit, sleep=beat_when_told)
        record = await life.request(
            make_plan(s, Action.RESTART, SERVICE), requested_by="cli:ns@inside", source=Source.CLI
        )
        assert await life.confirm(record.id, "cli:ns@inside")
        assert await life.start(record.id) is not None
        _say({"run": record.id, "owner": (await audit.get_run(record.id)).owner})
        await asyncio.Event().wait()  # drives the run until killed


async def judge(db: Path) -> None:
    s = settings(db)
    clock = ManualClock()
    async with AuditLog.open(db) as audit:
        life = RunLifecycle(s, audit, monotonic=Monotonic(clock, "judge-in-a-pid-namespace"))
        while line := await _line():
            command = json.loads(line)
            if "advance" in command:
                clock.advance(float(command["advance"]))
                _say({"ok": True})
            elif "recover" in command:
                _say({"recovered": [item.run.id for item in await life.recover()]})
            else:
                try:
                    record = await life.request(
                        make_plan(s, Action.RESTART, SERVICE),
                        requested_by="cli:judge",
                        source=Source.CLI,
                    )
                except LockHeldError as exc:
                    _say({"busy": str(exc)})
                else:
                    _say({"run": record.id})


if __name__ == "__main__":
    role, path = sys.argv[1], Path(sys.argv[2])
    asyncio.run(owner(path) if role == "owner" else judge(path))
