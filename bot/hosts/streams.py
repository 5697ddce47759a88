"""What the SSH and local transports share: the remote timeout wrapper, bounded
capture of a stream, and the line pump that feeds it."""

from __future__ import annotations

import asyncio
import math
import shlex
from collections import deque
from collections.abc import Sequence

import asyncssh

from bot.hosts.base import LineCallback, Stream

# Seconds between the remote TERM and KILL, and the extra local grace on top of it.
KILL_AFTER_S = 10
LOCAL_GRACE_S = 15
# Keep at most this much of each stream in the result; the full text is streamed.
MAX_CAPTURE_CHARS = 1_000_000
TIMEOUT_EXIT = 124  # coreutils timeout: the command timed out
KILLED_EXIT = 137  # coreutils timeout: it had to KILL


def wrap_with_timeout(argv: Sequence[str], timeout_s: float) -> str:
    seconds = max(1, math.ceil(timeout_s))
    return shlex.join(("timeout", f"--kill-after={KILL_AFTER_S}s", f"{seconds}s", *argv))


class Capture:
    def __init__(self) -> None:
        self.parts: deque[str] = deque()
        self.size = 0

    def add(self, line: str) -> None:
        self.parts.append(line)
        self.size += len(line)
        while self.size > MAX_CAPTURE_CHARS and len(self.parts) > 1:
            self.size -= len(self.parts.popleft())

    def text(self) -> str:
        return "".join(self.parts)


async def pump(reader: asyncssh.SSHReader[str] | asyncio.StreamReader, stream: Stream,
                capture: Capture, on_line: LineCallback | None) -> None:
    while True:
        raw = await reader.readline()
        if not raw:
            return
        line = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        capture.add(line)
        if on_line is not None:
            on_line(stream, line.rstrip("\n"))


def reason(e: BaseException) -> str:
    text = getattr(e, "reason", None) or str(e) or type(e).__name__
    return str(text).strip()
