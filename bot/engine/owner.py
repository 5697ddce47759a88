"""Which process drives a run, and whether its process can say if it still does, so
recovery never interrupts a live run and never waits long for a dead one.

An owner is ``host/boot=<boot id>/pidns=<inode>:pid:start-time``:

* the boot id (``/proc/sys/kernel/random/boot_id``) names one boot of one kernel, the
  PID namespace's inode (``/proc/self/ns/pid``) one PID namespace of it: together they
  say where the PID means this process. A hostname says neither: containers with host
  networking, a CLI next to a containerised bot and every machine's initial namespace
  (its inode is always 4026531836) share hostnames or inodes, never both with the boot;
* the start time (field 22 of /proc/<pid>/stat, in clock ticks since boot) guards
  against a PID reused by an unrelated process after the bot died;
* the host is for people (``runs``); no judgement reads it.

Its process is evidence only where this process sees the same PIDs: the same boot id
and PID namespace, and a /proc mounted for that namespace (``judge_process``). There:

* gone (and ``kill(pid, 0)`` agrees), a different process under the same PID, or a
  zombie (state ``Z``/``X``: killed, its parent has not reaped it yet) are dead;
* the same start time, not a zombie, is alive;
* a PID missing from /proc that ``kill`` says exists (``hidepid=2`` hides another
  user's processes) says nothing.

Everywhere else, and for an owner string written before issue 17 (``host:pid:start-time``,
which cannot say which namespace its PID belongs to), the process says nothing and the
heartbeat decides (``bot.engine.liveness``). The new string keeps the old one's shape
(``<head>:pid:start``), so an older bot reads its head as another hostname and judges
it by the lease too: never by a /proc it cannot see.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

PROC = Path("/proc")
UNKNOWN = "?"
# /proc/<pid>/stat states of a process that will never run again.
_DEAD_STATES = frozenset({"Z", "X", "x"})


@dataclass(frozen=True, slots=True)
class ProcStat:
    state: str
    start_time: str


def _parse_stat(stat: str) -> ProcStat | None:
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19:
        return None
    return ProcStat(state=fields[0], start_time=fields[19])


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The state and start time of a process, or None when /proc shows no such process."""
    try:
        return _parse_stat((proc / str(pid) / "stat").read_text())
    except OSError:
        return None


def boot_id(proc: Path = PROC) -> str | None:
    """This boot's id (a UUID; the same in every namespace of this kernel), or None."""
    try:
        text = (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
    return text or None


def namespace_inode(kind: str, proc: Path = PROC) -> int | None:
    """The inode of this process's namespace of ``kind`` (``pid``, ``time``), or None."""
    try:
        return os.stat(proc / "self" / "ns" / kind).st_ino
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Namespace:
    """Where a PID names one process: a boot of a kernel and a PID namespace of it."""

    boot_id: str | None
    pid_ns: int | None

    @property
    def known(self) -> bool:
        return self.boot_id is not None and self.pid_ns is not None


NOWHERE = Namespace(None, None)


def proc_is_ours(proc: Path = PROC) -> bool:
    """Whether ``proc`` is mounted for this process's own PID namespace: ``/proc/self``
    there is our own PID. (``unshare --pid`` without ``--mount-proc`` leaves the parent
    namespace's /proc, whose PIDs are not ours.)"""
    try:
        return os.readlink(proc / "self") == str(os.getpid())
    except OSError:
        return False


def this_namespace(proc: Path = PROC) -> Namespace:
    """Where this process's PIDs mean something, as far as ``proc`` can tell it; NOWHERE
    when it cannot (then no owner is judged by its process here)."""
    if not proc_is_ours(proc):
        return NOWHERE
    return Namespace(boot_id(proc), namespace_inode("pid", proc))


@dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int
    start_time: str  # UNKNOWN when it could not be read
    # None for an owner string from before issue 17: nobody knows its namespace.
    where: Namespace | None

    def __str__(self) -> str:
        if self.where is None:
            return f"{self.host}:{self.pid}:{self.start_time}"
        boot = self.where.boot_id or UNKNOWN
        ns = UNKNOWN if self.where.pid_ns is None else str(self.where.pid_ns)
        return f"{self.host}/boot={boot}/pidns={ns}:{self.pid}:{self.start_time}"


def _namespace_of(parts: list[str]) -> Namespace | None:
    fields = dict(part.partition("=")[::2] for part in parts)
    if set(fields) != {"boot", "pidns"}:
        return None
    boot, ns = fields["boot"], fields["pidns"]
    if ns != UNKNOWN and not ns.isdigit():
        return None
    return Namespace(None if boot in ("", UNKNOWN) else boot, None if ns == UNKNOWN else int(ns))


def parse_owner(text: str | None) -> Owner | None:
    """The owner a string names, or None for garbage (then nothing is known of it)."""
    if not text:
        return None
    head, _, rest = text.partition(":")
    pid_text, _, start = rest.rpartition(":")
    # A hostname holds no ':' and no '/': the head is the host, then the namespace.
    if not pid_text.isdigit() or not start or "/" in start:
        return None
    host, *where = head.split("/")
    if not host:
        return None
    if not where:
        return Owner(host, int(pid_text), start, None)
    namespace = _namespace_of(where)
    return None if namespace is None else Owner(host, int(pid_text), start, namespace)


def process_owner(proc: Path = PROC) -> str:
    """This process as an owner string. Read through /proc/self, which is this process
    whatever namespace the /proc mount belongs to."""
    try:
        stat = _parse_stat((proc / "self" / "stat").read_text())
    except OSError:
        stat = None
    where = Namespace(boot_id(proc), namespace_inode("pid", proc))
    return str(
        Owner(socket.gethostname(), os.getpid(), stat.start_time if stat else UNKNOWN, where)
    )


class ProcessSays(StrEnum):
    """What an owner's process says of it, seen from here."""

    ALIVE = "alive"
    DEAD = "dead"
    # It cannot be seen from here (another boot or namespace, an old owner string, a
    # PID /proc hides): the heartbeat decides.
    NOTHING = "nothing"


def pid_exists(pid: int) -> bool:
    """Whether the kernel has a process ``pid`` in our namespace, even one /proc hides."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is just not ours to signal
    except (OverflowError, OSError):
        return False
    return True


def judge_process(owner: str | None, here: Namespace, *, proc: Path = PROC) -> ProcessSays:
    """The owner's process, judged from ``here`` (this process's ``this_namespace``)."""
    parsed = parse_owner(owner)
    if parsed is None or parsed.where is None or not here.known or parsed.where != here:
        return ProcessSays.NOTHING
    stat = read_stat(parsed.pid, proc)
    if stat is None:
        # Gone, unless /proc only hides it (hidepid=2 and another user's process).
        return ProcessSays.NOTHING if pid_exists(parsed.pid) else ProcessSays.DEAD
    if stat.state in _DEAD_STATES:
        return ProcessSays.DEAD
    if parsed.start_time == UNKNOWN:
        return ProcessSays.NOTHING  # some process has that PID; nothing says it is this one
    return ProcessSays.ALIVE if stat.start_time == parsed.start_time else ProcessSays.DEAD
