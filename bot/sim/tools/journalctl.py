"""Simulated ``journalctl``: ``-u UNIT``, ``-n N``, ``-o short|cat``, ``--no-pager``.

The whole journal of the simulated host is its one unit's; lines planned for
the future (a model still loading) are not shown until their time comes.
"""

from __future__ import annotations

import sys
import time

from bot.sim.state import HostState, StateStore, format_journal
from bot.sim.tools import unit

NO_ENTRIES = "-- No entries --"


def lines(store: StateStore, st: HostState, n: int | None, *, cat: bool = False) -> list[str]:
    now = time.time()
    entries = [e for e in store.journal() if e.ts <= now]
    if n is not None:
        entries = entries[-n:] if n > 0 else []
    host = st.config.hostname
    return [e.msg if cat else format_journal(e, host) for e in entries]


def main(store: StateStore, args: list[str]) -> int:
    units: list[str] = []
    n: int | None = None
    cat = quiet = False
    it = iter(args)
    try:
        for a in it:
            if a in ("-u", "--unit"):
                units.append(next(it))
            elif a.startswith("--unit="):
                units.append(a.split("=", 1)[1])
            elif a in ("-n", "--lines"):
                n = int(next(it))
            elif a.startswith("--lines="):
                n = int(a.split("=", 1)[1])
            elif a.startswith("-n"):
                n = int(a[2:])
            elif a in ("-o", "--output"):
                cat = next(it) == "cat"
            elif a.startswith("--output="):
                cat = a.split("=", 1)[1] == "cat"
            elif a in ("-q", "--quiet"):
                quiet = True
            elif a in ("--no-pager", "-b", "--boot", "-e", "--pager-end", "-x", "--catalog"):
                pass
            else:
                print(f"journalctl: unrecognized option '{a}'", file=sys.stderr)
                return 1
    except (StopIteration, ValueError):
        print("journalctl: option requires a valid argument", file=sys.stderr)
        return 1
    st = store.read()
    ours = not units or any(unit.is_ours(st, u) for u in units)
    out = lines(store, st, n, cat=cat) if ours else []
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    elif not quiet:
        print(NO_ENTRIES)
    return 0
