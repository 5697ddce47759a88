"""Simulated ``pgrep`` over the host's simulated processes (procps-ng options -a -f -l -c -x).

Exit 0 when something matched, 1 when nothing did, 2 on a usage error.
"""

from __future__ import annotations

import re
import sys
import time

from bot.sim.state import StateStore, host_view

COMM_LEN = 15  # the kernel truncates a process name to 15 characters


def main(store: StateStore, args: list[str]) -> int:
    flags: set[str] = set()
    patterns: list[str] = []
    for a in args:
        if a.startswith("-") and len(a) > 1 and set(a[1:]) <= set("aflcx"):
            flags |= set(a[1:])
        elif a.startswith("-"):
            print(f"pgrep: invalid option -- '{a.lstrip('-')[:1]}'", file=sys.stderr)
            return 2
        else:
            patterns.append(a)
    if len(patterns) != 1:
        print("pgrep: no matching criteria specified" if not patterns
              else "pgrep: only one pattern can be provided", file=sys.stderr)
        print("Try `pgrep --help' for more information.", file=sys.stderr)
        return 2
    try:
        rx = re.compile(patterns[0])
    except re.error as e:
        print(f"pgrep: cannot compile regular expression '{patterns[0]}': {e}", file=sys.stderr)
        return 2
    found = []
    for p in sorted(host_view(store.read(), time.time())[1], key=lambda p: p.pid):
        comm = p.cmdline.split(" ", 1)[0].rsplit("/", 1)[-1][:COMM_LEN]
        subject = p.cmdline if "f" in flags else comm
        hit = rx.fullmatch(subject) if "x" in flags else rx.search(subject)
        if hit:
            found.append(f"{p.pid} {p.cmdline}" if "a" in flags
                         else f"{p.pid} {comm}" if "l" in flags else str(p.pid))
    if "c" in flags:
        print(len(found))
    elif found:
        sys.stdout.write("\n".join(found) + "\n")
    return 0 if found else 1
