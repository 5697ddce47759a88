"""What a host answered, as plain values: a command's result, an HTTP answer, and the
bound on a line of output. Pure data, so the flows that judge these results need
nothing from the transports that produce them (``bot.hosts.base``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Stream = Literal["stdout", "stderr"]
LineCallback = Callable[[Stream, str], None]

# The longest line a transport hands to ``on_line`` or keeps in a result, marker
# included: a host that prints without newlines (a runaway progress bar, binary junk
# from `tr '\0' C </dev/zero`) must not grow the bot's memory with it.  vLLM's longest
# real lines (its engine config at start-up) are a few thousand characters.
MAX_LINE_CHARS = 16 * 1024
# Room kept for the marker at the end of a cut line, so a cut line is within the limit too.
_MARKER_ROOM = 64
# What CPython spends on a line beyond its characters (a short str is ~50 bytes, plus its
# slot in a deque): buffers of lines count it, or a flood of short lines (`seq 1 1e9`)
# would hold 20 times their budget.
LINE_OVERHEAD = 64


def cut_marker(dropped: int) -> str:
    return f"… [line cut: {dropped:,} more characters]"


def cut_line(kept: str, total: int | None = None, limit: int = MAX_LINE_CHARS) -> str:
    """A line of ``total`` characters (default ``len(kept)``) of which ``kept`` is the
    start: whole when it fits in ``limit``, else its head and a marker that says how
    much is missing.  Never longer than ``limit``; a cut line is left as it is."""
    total = len(kept) if total is None else total
    if total <= limit:
        return kept
    head = kept[: limit - _MARKER_ROOM]
    return head + cut_marker(total - len(head))


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one remote command did. ``exit_status`` is None when it was killed by a signal."""

    argv: tuple[str, ...]
    exit_status: int | None
    stdout: str
    stderr: str
    duration_s: float
    signal: str | None = None
    timed_out: bool = False
    # Set when sudo refused to run it (the command never ran): why, naming the missing
    # rule (bot.core.become.Become.refused).
    refused: str | None = None
    # Set when the host answered with a key known_hosts does not hold for it (the command
    # never ran): after a reboot, another machine answering at its address.
    host_key_refused: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout then stderr, the way an operator would read them."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr


@dataclass(frozen=True, slots=True)
class HttpResult:
    """An HTTP request made from the host. ``status`` is None when no response came back.
    ``body`` is at most ``bot.hosts.http.MAX_BODY_BYTES`` (decoded); ``truncated`` when
    the server sent more, which was not read."""

    url: str
    status: int | None
    body: str = ""
    error: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200
