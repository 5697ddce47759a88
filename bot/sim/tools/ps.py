"""Simulated ``ps`` (procps-ng): ``-p PID[,PID...]`` with ``-o FIELD[:WIDTH][=][,...]``.

It sees the host's simulated processes only (the unit's, and a neighbour service's),
with the fields the bot reads: ``pid``, ``stat``, ``user``, ``lstart`` (in the C
locale: ``Mon Jan  1 00:00:00 2024``), ``cgroup`` (``0::/system.slice/<unit>.service``),
``comm`` and ``args``. Exit 1 when none of the PIDs exists, as procps-ng does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from bot.sim.state import SimProcess, StateStore, host_view


def lstart(ts: float) -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(ts))


def _cgroup(p: SimProcess) -> str:
    unit = p.unit if p.unit.endswith(".service") else f"{p.unit}.service"
    return f"0::/system.slice/{unit}" if p.unit else "0::/init.scope"


_FIELDS: dict[str, Callable[[SimProcess], str]] = {
    "pid": lambda p: str(p.pid),
    "stat": lambda p: p.state,
    "user": lambda p: p.user,
    "lstart": lambda p: lstart(p.started),
    "cgroup": _cgroup,
    "comm": lambda p: p.cmdline.split(" ", 1)[0].rsplit("/", 1)[-1][:15],
    "args": lambda p: p.cmdline,
}


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    print("\nUsage:\n ps [options]", file=sys.stderr)
    return 1


def main(store: StateStore, args: list[str]) -> int:
    fields: list[str] = []
    pids: set[int] = set()
    it = iter(args)
    for a in it:
        if a in ("-o", "-p"):
            value = next(it, "")
            if a == "-o":
                fields += [f.split("=")[0].split(":")[0] for f in value.split(",") if f]
            elif all(v.isdigit() for v in value.split(",")):
                pids |= {int(v) for v in value.split(",")}
            else:
                return _usage("process ID list syntax error")
        elif a not in ("-w", "-ww"):
            return _usage(f"unsupported option {a}")
    unknown = [f for f in fields if f not in _FIELDS]
    if unknown or not fields:
        return _usage(f'unknown user-defined format specifier "{(unknown or [""])[0]}"')
    procs = [p for p in host_view(store.read(), time.time())[1] if p.pid in pids]
    for p in sorted(procs, key=lambda p: p.pid):
        print(" ".join(_FIELDS[f](p) for f in fields))
    return 0 if procs else 1
