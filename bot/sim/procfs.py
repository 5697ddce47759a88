"""Find and end the simulator's own processes through /proc (Linux only).

The processes a simulated host starts leave their parent's process group on
purpose (``timeout`` takes its own group, the fake vLLM server its own session,
sshd's per-connection children theirs), so cleanup finds them by session,
ancestry or command line instead of one ``killpg``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session) of a live process, None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: parse after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[3])


def start_time(pid: int) -> int | None:
    """When a live process started (clock ticks since boot): with its pid, an identity
    that a reused pid does not share."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


TOOLS_MODULE = "bot.sim.tools"
CLIENT = "/bot/sim/forkclient.py"


def tool_argv(argv: list[str]) -> list[str] | None:
    """The simulated tool call a real process stands for (``["uv", "pip", ...]``), or None.

    ``bot/sim/bin/<tool>`` execs ``python -S .../bot/sim/forkclient.py <tool> ARGS``; a
    tool run by the interpreter itself is ``python -S -m bot.sim.tools <tool> ARGS``."""
    if argv[1:2] == ["-S"] and argv[2:3] and os.path.normpath(argv[2]).endswith(CLIENT):
        return argv[3:]
    if argv[1:4] == ["-S", "-m", TOOLS_MODULE]:
        return argv[4:]
    return None


def alive(pid: int) -> bool:
    """Running and not a zombie waiting to be reaped."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] != "Z"


def session_members(sid: int) -> list[int]:
    return [p for p in _pids() if (s := _stat(p)) is not None and s[1] == sid]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in _pids():
        s = _stat(p)
        if s is not None:
            children.setdefault(s[0], []).append(p)
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# The process a tool run by the fork server stands for (its client): the tool itself, as
# far as the host's process list goes.
_stands_for: int | None = None


def stand_for(pid: int) -> None:
    global _stands_for
    _stands_for = pid


def standing_for() -> int | None:
    """The client this process runs a tool for, when the fork server forked it."""
    return _stands_for


def _me() -> set[int]:
    return {os.getpid(), *([_stands_for] if _stands_for is not None else [])}


def matching(predicate: Callable[[list[str]], bool]) -> list[int]:
    me = _me()
    return [p for p in _pids() if p not in me and predicate(cmdline(p))]


def with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has name=value (those of other users are skipped)."""
    entry = f"{name}={value}".encode()
    me, out = _me(), []
    for p in _pids():
        try:
            environ = (PROC / str(p) / "environ").read_bytes()
        except OSError:
            continue
        if p not in me and entry in environ.split(b"\0"):
            out.append(p)
    return out


def signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def terminate(pids: Iterable[int], *, grace_s: float = 3.0) -> None:
    """TERM, wait up to grace_s for them to exit, then KILL the rest."""
    pending = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_all(pending, sig)
        deadline = time.monotonic() + grace_s
        while pending and time.monotonic() < deadline:
            pending = [p for p in pending if alive(p)]
            if pending:
                time.sleep(0.01)
        if not pending:
            return
