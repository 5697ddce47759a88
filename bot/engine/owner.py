"""Which process drives a run, and whether it still can, so recovery never interrupts
a live run and never waits for a dead one.

An owner is ``host:pid:start-time``; the start time (field 22 of /proc/<pid>/stat,
in clock ticks since boot) guards against a PID reused by an unrelated process
after the bot died.

How a run's owner is judged:

* on this machine, by its process: gone, a different process under the same PID,
  or a zombie (state ``Z``/``X``: killed, but its parent has not reaped it yet; with
  the parent killed too, PID 1 may take a while) are all dead;
* on another machine (a rescheduled container gets a new hostname), by the
  heartbeat lease the driving process renews on its runs: expired, or never
  written, is dead. We cannot see that machine's processes, so the lease is the
  only evidence there is.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# /proc/<pid>/stat states of a process that will never run again.
_DEAD_STATES = frozenset({"Z", "X", "x"})


@dataclass(frozen=True, slots=True)
class ProcStat:
    state: str
    start_time: str


def read_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    """The state and start time of a process, or None when there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19:
        return None
    return ProcStat(state=fields[0], start_time=fields[19])


def process_owner() -> str:
    pid = os.getpid()
    stat = read_stat(pid)
    return f"{socket.gethostname()}:{pid}:{stat.start_time if stat else '?'}"


def owner_alive(owner: str | None, *, lease_until: datetime | None = None,
                now: datetime | None = None, proc: Path = Path("/proc")) -> bool:
    """True when the owning process may still be driving its run (then it is left alone).

    ``lease_until``/``now`` judge an owner on another machine (see the module doc);
    on this machine the process itself is the evidence, so a slow heartbeat never
    gets a live run interrupted.
    """
    if not owner:
        return False
    try:
        host, pid_text, start = owner.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return lease_until is not None and now is not None and now < lease_until
    stat = read_stat(pid, proc)
    if stat is None or stat.state in _DEAD_STATES:
        return False
    return start != "?" and stat.start_time == start
