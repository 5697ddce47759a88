"""The terminal's gate for leftover processes (bot.engine.leftover_gate): with
``--kill-leftovers`` the operator's command is the approval; on a terminal the operator
is asked; otherwise nobody can be asked and the run ends with the service stopped and
the processes named. An approval is recorded by the operations service
(``Operations.confirm_leftovers``) as a ``terminate`` decision, with the host and the
exact PIDs it was for (``leftover_approvals``).

Each host asks for itself (issue 17 F5): in a batch of two hosts with leftovers, the
operator gets one question per host, one at a time (the list, then "Terminate these 9
processes on gpu-node-1 (PIDs ...)?"), so an answer is never read as another host's."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TextIO

from bot.cli.terminal import say
from bot.core.leftovers import Approval
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
    def __init__(
        self, rt: Runtime, user: str, *, approve: bool, ask: Ask | None, out: TextIO
    ) -> None:
        self._rt = rt
        self._user = user
        self._approve = approve  # --kill-leftovers
        self._ask = ask  # None: not on a terminal
        self._out = out
        # The hosts of a batch ask at once: one question on the terminal at a time, so
        # the line the operator types answers the question just shown.
        self._turn = asyncio.Lock()

    async def ask(self, request: LeftoverRequest) -> Approval:
        async with self._turn:
            return await self._one(request)

    async def _one(self, request: LeftoverRequest) -> Approval:
        say(self._out, self._rt.redact(request.question))
        n = len(request.pids)
        pids = ", ".join(map(str, request.pids))
        if not self._approve:
            if self._ask is None:
                return Approval(None, "not on a terminal, and --kill-leftovers was not given")
            if not await self._ask(
                f"Terminate these {n} process{'es' if n != 1 else ''} on "
                f"{request.host} (PIDs {pids})? [y/N] "
            ):
                return Approval(None, f"{self._user} answered no for {request.host}")
        approved = await self._rt.operations.confirm_leftovers(request, user=self._user)
        return Approval(", ".join(approved.approved_by))
