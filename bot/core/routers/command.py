"""The "command" router kind: the operator's own argv lists, with the replica's server as
one whole argument (settings check that ``{server}`` is never spliced into another)."""

from __future__ import annotations

from bot.settings import SERVER_FIELD


def fill(argv: tuple[str, ...], server: str) -> tuple[str, ...]:
    """``argv`` with each ``{server}`` argument replaced by ``server``: the value from the
    config, as one argument, never through a shell."""
    return tuple(server if a == SERVER_FIELD else a for a in argv)


def parse_in_flight(stdout: str) -> int | None:
    """The integer the ``in_flight`` command prints (its last non-empty line), or None when
    it printed none: an unreadable count is not zero."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        n = int(lines[-1])
    except ValueError:
        return None
    return n if n >= 0 else None
