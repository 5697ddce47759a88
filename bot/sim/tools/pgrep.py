"""Simulated ``pgrep`` (procps-ng options -a -f -l -c -x).

It sees the host's simulated processes (the vLLM unit and its workers) and
the real processes started on this host (those carrying its state directory
in their environment), such as an install that outlived its SSH connection.
A simulated tool is shown as the host would show it (``uv pip install ...``,
not the interpreter running the simulator); the fake vLLM server is left out,
as the simulated processes already stand for it.

Exit 0 when something matched, 1 when nothing did, 2 on a usage error.
"""

from __future__ import annotations

import re
import sys
import time

from bot.sim import procfs
from bot.sim.state import STATE_DIR_ENV, StateStore, host_view
from bot.sim.vllm_server import MODULE as VLLM_SERVER_MODULE

COMM_LEN = 15  # the kernel truncates a process name to 15 characters


def _real_processes(store: StateStore) -> list[tuple[int, str]]:
    """(pid, command line as the host shows it) of this host's real processes."""
    out = []
    for pid in procfs.with_env(STATE_DIR_ENV, str(store.directory)):
        argv = procfs.cmdline(pid)
        if not argv or VLLM_SERVER_MODULE in argv:
            continue
        argv = procfs.tool_argv(argv) or argv  # shown as the host would show the tool
        out.append((pid, " ".join(argv)))
    return out


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
        print(
            "pgrep: no matching criteria specified"
            if not patterns
            else "pgrep: only one pattern can be provided",
            file=sys.stderr,
        )
        print("Try `pgrep --help' for more information.", file=sys.stderr)
        return 2
    try:
        rx = re.compile(patterns[0])
    except re.error as e:
        print(f"pgrep: cannot compile regular expression '{patterns[0]}': {e}", file=sys.stderr)
        return 2
    found = []
    simulated = [(p.pid, p.cmdline) for p in host_view(store.read(), time.time())[1]]
    for pid, cmdline in sorted(simulated + _real_processes(store)):
        comm = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1][:COMM_LEN]
        subject = cmdline if "f" in flags else comm
        hit = rx.fullmatch(subject) if "x" in flags else rx.search(subject)
        if hit:
            found.append(
                f"{pid} {cmdline}"
                if "a" in flags
                else f"{pid} {comm}"
                if "l" in flags
                else str(pid)
            )
    if "c" in flags:
        print(len(found))
    elif found:
        sys.stdout.write("\n".join(found) + "\n")
    return 0 if found else 1
