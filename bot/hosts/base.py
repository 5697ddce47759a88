"""The seam between the engine and a GPU host.

The engine only ever talks to a host through ``HostTransport``: run an argv
(never a shell string) with a timeout, streaming lines as they arrive, and make
an HTTP GET from the host's side (so the model server's port never has to be
reachable from the bot).  ``bot.hosts.ssh`` implements it over asyncssh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

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
    head = kept[:limit - _MARKER_ROOM]
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
    # rule (bot.core.sudoers.Become.refused).
    refused: str | None = None

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


class HostTransport(Protocol):
    """How the engine reaches one host."""

    @property
    def host(self) -> str: ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        on_line: LineCallback | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run argv on the host. A timeout terminates the remote process too
        (TERM, then KILL) and returns a result with ``timed_out=True``.
        Lines (to ``on_line`` and in the result) are at most ``MAX_LINE_CHARS`` long:
        a longer one is cut with ``cut_marker``, whatever the host prints.
        ``stdin``: bytes the command reads on its standard input, then end of file; a
        secret goes this way, never in argv, which every user of the host can read.
        Raises ``HostUnreachableError``/``HostKeyError`` when the host cannot be reached."""
        ...

    async def http_get(self, url: str, *, timeout_s: float) -> HttpResult:
        """GET url as seen from the host (through an SSH direct-tcpip channel)."""
        ...

    async def http_request(self, method: str, url: str, *, timeout_s: float,
                           body: bytes | None = None, content_type: str | None = None
                           ) -> HttpResult:
        """Any request to url as seen from the host, its answer read with bounds
        (``bot.hosts.http``): the model server may send without end."""
        ...
