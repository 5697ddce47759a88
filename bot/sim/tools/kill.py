"""Simulated ``kill`` (procps-ng): ``kill -s SIGNAL PID...`` (also ``-SIGNAL``, ``-9``).

It signals the host's simulated processes only; any other PID (a real process of the
machine the simulator runs on included) is "No such process". What a signal does
follows the faults: a worker in uninterruptible sleep (``d_state_worker``) survives
even SIGKILL, a hung worker (``stuck_worker``) ignores SIGTERM, everything else ends.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from bot.sim.state import StateStore, host_view

_NAMES = {
    "TERM": "TERM",
    "15": "TERM",
    "KILL": "KILL",
    "9": "KILL",
    "INT": "INT",
    "2": "INT",
    "HUP": "HUP",
    "1": "HUP",
    "0": "0",
}


def _parse(args: list[str]) -> tuple[str, list[str]]:
    sig, rest = "TERM", list(args)
    if rest and rest[0] == "-s":
        sig, rest = rest[1] if len(rest) > 1 else "", rest[2:]
    elif rest and rest[0].startswith("-") and rest[0] != "--":
        sig, rest = rest[0][1:], rest[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    return _NAMES.get(sig.upper().removeprefix("SIG"), ""), rest


def main(store: StateStore, args: list[str]) -> int:
    sig, targets = _parse(args)
    if not sig or not targets:
        print("kill: unknown signal or no PID; usage: kill -s SIGNAL PID...", file=sys.stderr)
        return 1
    status = 0
    with store.transaction() as tx:
        st = tx.state
        procs = {p.pid: p for p in host_view(st, time.time())[1]}
        dead = list(st.dead)
        for t in targets:
            p = procs.get(int(t)) if t.isdigit() else None
            if p is None:
                print(f"kill: ({t}) - No such process", file=sys.stderr)
                status = 1
                continue
            survives = (
                sig == "0"
                or p.state.startswith("D")
                or (sig != "KILL" and st.faults.stuck_worker and p.gpu == st.config.stuck_gpu)
            )
            if not survives:
                dead.append(p.pid)
        tx.state = replace(st, dead=tuple(dead))
    return status
