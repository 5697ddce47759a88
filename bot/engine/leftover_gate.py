"""Who lets a run terminate the processes that outlived its service's stop.

A flow that finds the service's own processes still holding its GPUs yields
``bot.core.leftovers.AskApproval``; the executor hands it to the run's gate and waits,
at most the approval window (``[policy].approval_ttl_s``) and never past a cancel, so a
stopped service is never left waiting for an answer that does not come. Front ends
provide the gate: Slack a button on the run's card that only an approver may press,
the command line a question on the terminal (or ``--kill-leftovers``). A run with no
gate (a script driving the engine) is answered "nobody can be asked here".

Each host of a batch asks on its own (issue 17 F5): a request names its run and host, and
the gate gives it a question id of its own (``new_question``), so an answer is for that
host's list only, and the audit log records which host and which PIDs were approved.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Protocol

from bot.core.leftovers import Approval


@dataclass(frozen=True, slots=True)
class LeftoverRequest:
    run_id: int
    host: str
    question: str  # the PIDs, names, memory and why they are the service's
    pids: tuple[int, ...]


def new_question() -> str:
    """An id for one host's question, unguessable (a press must name an open question,
    not one it could make up) and URL-safe (it travels in a button's value)."""
    return secrets.token_urlsafe(12)


class LeftoverGate(Protocol):
    async def ask(self, request: LeftoverRequest) -> Approval:
        """The approver's answer; may be cancelled when the window closes or the run is
        cancelled (and must then take its question back)."""
        ...


class NoGate:
    """No one to ask: the leftovers are named and the run ends, as without this step."""

    async def ask(self, request: LeftoverRequest) -> Approval:
        return Approval(
            None,
            "nobody can be asked from here (a Slack approver presses the "
            "card's button; on a terminal answer the question or pass "
            "--kill-leftovers)",
        )


async def ask_bounded(
    gate: LeftoverGate, request: LeftoverRequest, *, timeout_s: float, cancelled: asyncio.Event
) -> Approval:
    """The gate's answer, or why there is none: the window closed, or the run was
    cancelled (the flow then brings the service back)."""
    asking = asyncio.ensure_future(gate.ask(request))
    stop = asyncio.ensure_future(cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {asking, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (asking, stop):
            if not task.done():
                task.cancel()
        await asyncio.gather(asking, stop, return_exceptions=True)
    if asking in done and not asking.cancelled() and asking.exception() is None:
        return asking.result()
    if stop in done:
        return Approval(None, "the run was cancelled while waiting for an approver")
    if asking in done:
        return Approval(None, f"asking failed: {asking.exception()}")
    return Approval(None, f"nobody approved within {timeout_s:g}s (the approval window)")
