"""Simulated ``journalctl``: ``-u UNIT``, ``-n N``, ``-o short|cat``, ``--no-pager``, ``--``,
``--show-cursor`` and ``--after-cursor=CURSOR``.

The whole journal of the simulated host is its one unit's; lines planned for
the future (a model still loading) are not shown until their time comes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from bot.sim import kernel
from bot.sim.state import HostState, StateStore, format_journal
from bot.sim.tools import unit

NO_ENTRIES = "-- No entries --"


def lines(store: StateStore, st: HostState, n: int | None, *, cat: bool = False) -> list[str]:
    return entries(store, st, n, cat=cat)[0]


def _cursor(ts: float, index: int) -> str:
    """A cursor like journald's (``s=…;i=…;t=…``): this entry's place in time order."""
    return f"s=sim;i={index:x};t={ts!r}"


def _place(cursor: str) -> tuple[float, int] | None:
    fields_ = dict(p.partition("=")[::2] for p in cursor.split(";"))
    try:
        return float(fields_["t"]), int(fields_["i"], 16)
    except (KeyError, ValueError):
        return None


def entries(
    store: StateStore, st: HostState, n: int | None, *, cat: bool = False, after: str | None = None
) -> tuple[list[str], str | None]:
    """The entries up to now in time order (as journald interleaves them): the last ``n``,
    or with the cursor ``after`` the first ``n`` after it, as journalctl does (systemd
    issue #14722), so that a reader that falls behind reads on from there; and the
    cursor of the last one shown."""
    now = time.time()
    # (ts, index) is unique, so the tuples sort by it alone.
    shown = sorted((e.ts, i, e) for i, e in enumerate(store.journal()) if e.ts <= now)
    if after is not None:
        place = _place(after)
        shown = [x for x in shown if place is None or (x[0], x[1]) > place]
    if n is not None and after is not None:
        shown = shown[: max(n, 0)]
    elif n is not None:
        shown = shown[-n:] if n > 0 else []
    host = st.config.hostname
    cursor = _cursor(shown[-1][0], shown[-1][1]) if shown else None
    return [e.msg if cat else format_journal(e, host) for _, _, e in shown], cursor


class _Unrecognized(Exception):
    """An option journalctl does not know (the option is the message)."""


# The options that take a value, by their short and long names.
_VALUE_OPTIONS = {
    "-u": "unit",
    "--unit": "unit",
    "-n": "lines",
    "--lines": "lines",
    "-o": "output",
    "--output": "output",
    "-g": "grep",
    "--grep": "grep",
}
_VALUE_OPTIONS["--after-cursor"] = "after"  # following a start from where it was
_IGNORED = frozenset({"--no-pager", "-b", "--boot", "-e", "--pager-end", "-x", "--catalog"})


def _option(a: str, it: Iterator[str]) -> tuple[str, str]:
    """(name, value) of one option (name "" for one that changes nothing here); raises
    StopIteration when its value is missing, _Unrecognized when it is unknown."""
    key, eq, val = a.partition("=")
    if key.startswith("--") and eq and key in _VALUE_OPTIONS:
        return _VALUE_OPTIONS[key], val
    if a in _VALUE_OPTIONS:
        return _VALUE_OPTIONS[a], next(it)
    if a.startswith("-n"):
        return "lines", a[2:]
    if a in ("-q", "--quiet"):
        return "quiet", ""
    if a == "--show-cursor":
        return "show_cursor", ""
    if a in ("-k", "--dmesg"):
        return "kernel", ""
    if a in _IGNORED:
        return "", ""
    raise _Unrecognized(a)


@dataclass
class _Args:
    units: list[str] = field(default_factory=list)
    n: int | None = None
    cat: bool = False
    quiet: bool = False
    after: str | None = None
    show_cursor: bool = False
    kernel: bool = False  # -k: the kernel's messages (bot.sim.kernel)
    grep: str | None = None


class _Match(Exception):
    """An operand: a journal match, which the simulator does not implement."""


def _parse(args: list[str]) -> _Args:
    parsed = _Args()
    it = iter(args)
    for a in it:
        if a == "--":  # getopt: the rest are operands (journal matches)
            matches = list(it)
            if matches:
                raise _Match(matches[0])
            break
        name, value = _option(a, it)
        if name == "unit":
            parsed.units.append(value)
        elif name == "lines":
            parsed.n = int(value)
        elif name == "output":
            parsed.cat = value == "cat"
        elif name == "quiet":
            parsed.quiet = True
        elif name == "after":
            parsed.after = value
        elif name == "show_cursor":
            parsed.show_cursor = True
        elif name in ("kernel", "grep"):
            setattr(parsed, name, value if name == "grep" else True)
    return parsed


def main(store: StateStore, args: list[str]) -> int:
    try:
        a = _parse(args)
    except _Unrecognized as e:
        print(f"journalctl: unrecognized option '{e}'", file=sys.stderr)
        return 1
    except _Match as e:
        if "=" not in str(e):  # what systemd 252's journalctl says of it
            print(f"Failed to add match '{e}': Invalid argument", file=sys.stderr)
        else:
            print(f"journalctl (simulated): matches are not implemented: '{e}'", file=sys.stderr)
        return 1
    except (StopIteration, ValueError):
        print("journalctl: option requires a valid argument", file=sys.stderr)
        return 1
    st = store.read()
    ours = not a.units or any(unit.is_ours(st, u) for u in a.units)
    out, cursor = entries(store, st, a.n, cat=a.cat, after=a.after) if ours else ([], None)
    if a.kernel:
        out = kernel.lines(store, st.config.hostname, a.grep)
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    elif not a.quiet:
        print(NO_ENTRIES)
    if a.show_cursor and cursor is not None:
        print(f"-- cursor: {cursor}")
    return 0
