"""What the SSH and local transports share: the remote timeout wrapper, bounded
capture of a stream, and the line pump that feeds it.

Memory per command is bounded whatever the host prints: the pump reads what the
reader holds (never ``readline()``, which holds a line whole however long it grows)
and splits lines itself, keeping at most ``MAX_LINE_CHARS`` of any line; the capture
keeps the last ``MAX_CAPTURE_CHARS`` of a stream.  Unread data stays in the SSH
channel's window (or the pipe), so a fast host is slowed down rather than buffered.
"""

from __future__ import annotations

import asyncio
import codecs
import math
import shlex
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from bot.hosts.base import LINE_OVERHEAD, MAX_LINE_CHARS, LineCallback, Stream, cut_line

# Seconds between the remote TERM and KILL, and the extra local grace on top of it.
KILL_AFTER_S = 10
LOCAL_GRACE_S = 15
# Keep at most this much of each stream in the result (characters, and LINE_OVERHEAD
# per line); the full text is streamed.
MAX_CAPTURE_CHARS = 1_000_000
# The most one read may return.  Each read must empty the reader: asyncssh (2.24)
# re-opens the SSH window when it moves data from the channel to the stream, not when
# we read it, so reads smaller than the window let a fast host fill the channel's
# buffer without end (a 300 MB line grew the bot by 200 MB with 64 KiB reads).
# Drained each time, asyncssh holds at most about twice its 2 MiB window, and an
# asyncio pipe reader twice its 64 KiB limit: that, not this number, bounds a read.
READ_MAX = 16 * 1024 * 1024
# The text split between two yields to the event loop, which also lets the engine hand
# the lines of one slice to its sinks before the next (a flood of short lines).
SLICE_CHARS = 16 * 1024
TIMEOUT_EXIT = 124  # coreutils timeout: the command timed out
KILLED_EXIT = 137  # coreutils timeout: it had to KILL


def wrap_with_timeout(argv: Sequence[str], timeout_s: float) -> str:
    seconds = max(1, math.ceil(timeout_s))
    return shlex.join(("timeout", f"--kill-after={KILL_AFTER_S}s", f"{seconds}s", *argv))


class Capture:
    """The newest lines of one stream, up to ``MAX_CAPTURE_CHARS`` (the pump has already
    cut every line to ``MAX_LINE_CHARS``, so the one line always kept is bounded too)."""

    def __init__(self) -> None:
        self.parts: deque[str] = deque()
        self.size = 0

    def add(self, line: str) -> None:
        self.parts.append(line)
        self.size += len(line) + LINE_OVERHEAD
        while self.size > MAX_CAPTURE_CHARS and len(self.parts) > 1:
            self.size -= len(self.parts.popleft()) + LINE_OVERHEAD

    def text(self) -> str:
        return "".join(self.parts)


class LineSplitter:
    """Cuts a stream of text into lines, holding at most ``limit`` characters of the
    line in progress; the rest of an over-long line is only counted."""

    def __init__(self, limit: int = MAX_LINE_CHARS) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._kept = 0
        self._total = 0

    def feed(self, text: str) -> list[str]:
        """The lines that ``text`` completes, each with its newline."""
        last = text.rfind("\n")
        if last < 0:
            self._keep(text, 0, len(text))
            return []
        lines = []
        start = 0
        if self._total:  # the line in progress ends at the first newline
            end = text.index("\n")
            self._keep(text, 0, end)
            lines.append(self._finish() + "\n")
            start = end + 1
        if start <= last:
            # The lines whole in ``text`` (already in memory, at most a slice long): one
            # split rather than a find, a kept part and a join each, five times faster
            # (0.8 against 0.15 ms for a freeze's 1,200 lines).
            whole = text[start:last].split("\n")
            lines += [cut_line(line, limit=self.limit) + "\n" for line in whole]
        self._keep(text, last + 1, len(text))
        return lines

    def close(self) -> str | None:
        """The last line when the stream did not end with a newline."""
        return self._finish() if self._total else None

    def _keep(self, text: str, start: int, end: int) -> None:
        take = min(end - start, self.limit - self._kept)
        if take > 0:
            self._parts.append(text[start : start + take])
            self._kept += take
        self._total += end - start

    def _finish(self) -> str:
        line = cut_line("".join(self._parts), self._total, self.limit)
        self._parts, self._kept, self._total = [], 0, 0
        return line


class ChunkReader(Protocol):
    """What the pump reads: asyncssh's SSHReader (str) or an asyncio pipe (bytes)."""

    async def read(self, n: int = -1) -> str | bytes: ...


async def pump(
    reader: ChunkReader, stream: Stream, capture: Capture, on_line: LineCallback | None
) -> None:
    splitter = LineSplitter()
    # A local pipe gives bytes, and a chunk may end inside a UTF-8 character.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def deliver(line: str) -> None:
        capture.add(line)
        if on_line is not None:
            on_line(stream, line.rstrip("\n"))

    while True:
        chunk = await reader.read(READ_MAX)
        if not chunk:
            break
        text = chunk if isinstance(chunk, str) else decoder.decode(chunk)
        for start in range(0, len(text), SLICE_CHARS):
            for line in splitter.feed(text[start : start + SLICE_CHARS]):
                deliver(line)
            # read() returns at once while data is buffered: without this a host that
            # prints without pause would keep every other task (Slack acks) waiting.
            await asyncio.sleep(0)
    for line in splitter.feed(decoder.decode(b"", final=True)):
        deliver(line)
    last = splitter.close()
    if last is not None:
        deliver(last)


def reason(e: BaseException) -> str:
    text = getattr(e, "reason", None) or str(e) or type(e).__name__
    return str(text).strip()
