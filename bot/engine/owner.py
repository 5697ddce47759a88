"""Which process drives a run, so recovery after a crash never interrupts a live one.

An owner is ``host:pid:start-time``; the start time (from /proc) guards against
a PID reused by an unrelated process after the bot died.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else "?"


def process_owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(owner: str | None) -> bool:
    """True when the owning process may still be running (then it is left alone)."""
    if not owner:
        return False
    try:
        host, pid_text, start = owner.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True  # another machine's process: we cannot tell, so we do not touch it
    if pid == os.getpid():
        return False  # our own previous life cannot be running in this process
    return _start_time(pid) == start != "?"
