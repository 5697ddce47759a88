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

POLL_S = 0.02


async def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(POLL_S)
