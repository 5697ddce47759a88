"""The seam between the engine and a GPU host.

The engine only ever talks to a host through ``HostTransport``: run an argv
(never a shell string) with a timeout, streaming lines as they arrive, and make
an HTTP GET from the host's side (so the model server's port never has to be
reachable from the bot).  ``bot.hosts.ssh`` implements it over asyncssh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# The result types live in the pure core; they are re-exported here, beside the seam
# that produces them.
from bot.core.results import (
    LINE_OVERHEAD,
    MAX_LINE_CHARS,
    CommandResult,
    HttpResult,
    LineCallback,
    Stream,
    cut_line,
    cut_marker,
)

__all__ = [
    "LINE_OVERHEAD",
    "MAX_LINE_CHARS",
    "CommandResult",
    "HostTransport",
    "HttpResult",
    "LineCallback",
    "Stream",
    "cut_line",
    "cut_marker",
]


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

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> HttpResult:
        """Any request to url as seen from the host, its answer read with bounds
        (``bot.hosts.http``): the model server may send without end."""
        ...

    async def close(self) -> None:
        """End the connection, if one is open (a later command opens a new one)."""
        ...
