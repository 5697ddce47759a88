"""The terminal's gate for leftover processes (bot.engine.leftover_gate): with
``--kill-leftovers`` the operator's command is the approval; on a terminal the operator
is asked; otherwise nobody can be asked and the run ends with the service stopped and
the processes named. An approval is recorded as a ``terminate`` decision."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TextIO

from bot.core.leftovers import Approval
from bot.core.status import Decision
from bot.engine.leftover_gate import LeftoverRequest
from bot.engine.runtime import Runtime

Ask = Callable[[str], Awaitable[bool]]


async def ask_terminal(prompt: str, stdin: TextIO = sys.stdin) -> bool:
    """y/N on the terminal, read in a daemon thread: a question the window closes on
    must not keep the process alive after the run ended."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def settle(line: str) -> None:
        if not answer.done():
            answer.set_result(line)

    def read() -> None:
        loop.call_soon_threadsafe(settle, stdin.readline())

    sys.stderr.write(prompt)
    sys.stderr.flush()
    threading.Thread(target=read, name="leftovers-question", daemon=True).start()
    return (await answer).strip().lower() in ("y", "yes")


class TerminalGate:
    def __init__(self, rt: Runtime, user: str, *, approve: bool, ask: Ask | None,
                 out: TextIO) -> None:
        self._rt = rt
        self._user = user
        self._approve = approve  # --kill-leftovers
        self._ask = ask  # None: not on a terminal
        self._out = out

    async def ask(self, request: LeftoverRequest) -> Approval:
        self._out.write(self._rt.redact(request.question) + "\n")
        self._out.flush()
        if not self._approve:
            if self._ask is None:
                return Approval(None, "not on a terminal, and --kill-leftovers was not given")
            if not await self._ask("Terminate these processes? [y/N] "):
                return Approval(None, f"{self._user} answered no")
        await self._rt.audit.record_decision(request.run_id, self._user, Decision.TERMINATE)
        return Approval(self._user)
