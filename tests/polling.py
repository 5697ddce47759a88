"""Waiting in tests: poll a real condition until it holds, with a deadline.

This is not a sleep used as synchronisation: the test waits for the thing it
needs (a call in the host's log, a row in the audit DB, a dead PID) and fails
with what it was waiting for when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

# The first checks come quickly (most conditions hold within milliseconds); a long wait
# (a whole run) backs off to MAX_POLL_S, as each check reads the audit DB or the host's
# call log and those polls were a visible part of the suite's CPU.
POLL_S = 0.01
MAX_POLL_S = 0.1
BACKOFF = 1.5


async def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    pause = POLL_S
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(pause)
        pause = min(pause * BACKOFF, MAX_POLL_S)
