"""Processes that still hold a service's GPUs after its unit stopped: whose they are,
and the fixed commands that signal them.

Pure parsing, judging and argv building; the flow (``bot.core.flows``) runs the
commands and asks an approver (``AskApproval``) before any signal.

Who a process belongs to is read from the host, never guessed from its name alone:

* in the unit's cgroup (``/system.slice/<unit>.service`` in ``/proc/<pid>/cgroup``, as
  ``ps -o cgroup`` prints it): the service's, whatever its name;
* in another unit's cgroup: that unit's, never the service's, whatever its name (a
  second vLLM on the same host runs ``VLLM::`` workers too);
* a ``VLLM::`` process of the unit's user in no unit (a worker reparented out of a
  session, or a cgroup systemd already removed): the service's;
* anything else: someone else's, named with its user and cgroup, never signalled.

A signal goes only to a PID whose start time is still the one read before asking:
the check and the signal run in one fixed script on the host, so a PID the kernel
reused meanwhile is skipped, never hit. PIDs reach the script as validated integers
and start times as validated ``ps -o lstart`` text (``LC_ALL=C``), never as shell text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from bot.core.gpu import DrainVerdict, Holder
from bot.core.privilege import SAFE_PRELUDE, SH, Command, Privilege

Argv = tuple[str, ...]
Signal = Literal["TERM", "KILL"]

# ps in the C locale: lstart is then always "Mon Jan  1 00:00:00 2024" (five words).
# -ww: never cut a column to the terminal's width; cgroup last, as it is the widest.
PS_FORMAT = "pid=,stat=,user:32=,lstart=,cgroup="
_LSTART = re.compile(
    r"[A-Z][a-z]{2} [A-Z][a-z]{2} [0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} "
    r"[0-9]{4}"
)
_SIGNAL_LINE = re.compile(r"([0-9]+) (sent|gone|reused|refused|failed)")

# Signals each "<pid>:<lstart>" given, in order, only if the PID's start time is still
# the one given and the process is the unit's by the same rules as ``judge_owner``, read
# again on the host: prints "<pid> sent|gone|reused|refused|failed" per target. A fixed
# script: the paths of systemctl, ps and kill, the unit and the signal come first and
# are fixed in the sudoers rule; only the targets vary. So the bot's key can never signal
# a process outside the unit under sudo, whatever PIDs it names (sshd, another unit's
# workers).
#
# It runs as root, so it runs nothing found by name (issue 17, F1): on a host whose sudo
# keeps the caller's PATH (`Defaults !secure_path`) a `ps` the login account put first in
# its PATH would run as root. Every tool is an absolute path from the rule, and PATH is
# fixed anyway before anything else (SAFE_PRELUDE).
#
# A PID the kernel reuses between the last start-time check and the signal would be hit:
# the window is the time one exec of kill takes (the check runs again right before it).
# Closing it needs pidfd_send_signal on a pidfd opened before that check, and no tool on
# Debian 12 can do that from a shell: procps 4.0.2's kill and pkill call kill(2) (seen
# with strace), and util-linux's kill (not Debian's kill) opens its pidfd with --timeout
# only as it sends, after no check of ours. A python3 or perl helper run as root would
# add an interpreter that reads its environment and search path to the root rule. And
# reusing a PID needs the kernel to hand out the other PIDs first (pid_max is 4194304
# where systemd sets it) within those milliseconds.
SIGNAL_SCRIPT = (
    SAFE_PRELUDE +
    # set -f: the unquoted expansions below only trim spaces, never expand a glob.
    "set -f; systemctl=$1; ps=$2; kill=$3; unit=$4; sig=$5; shift 5; "
    'case $sig in TERM|KILL) ;; *) echo "not a signal this script sends: $sig" >&2; exit 2;; '
    'esac; owner=$("$systemctl" show -p User --value --no-pager -- "$unit" 2>/dev/null); '
    "owner=$(echo $owner); "
    # The start time as ps prints it now (spaces collapsed), empty when the PID is gone.
    'started() { echo $(LC_ALL=C "$ps" -o lstart= -p "$1" 2>/dev/null); }; '
    "for spec do pid=${spec%%:*}; want=${spec#*:}; "
    # Digits only, no leading zero (ps reads "01" as PID 1), never PID 1.
    'case $pid in ""|*[!0-9]*|0*|1) echo "$pid refused"; continue;; esac; '
    'now=$(started "$pid"); if [ -z "$now" ]; then echo "$pid gone"; continue; fi; '
    'if [ "$now" != "$want" ]; then echo "$pid reused"; continue; fi; '
    'cg="$(echo $("$ps" -ww -o cgroup= -p "$pid" 2>/dev/null)),"; case $cg in '
    '*"/$unit,"*|*"/$unit/"*) ;; '
    '*.service,*|*.service/*) echo "$pid refused"; continue;; '
    '*) u=$("$ps" -o user:32= -p "$pid" 2>/dev/null); u=$(echo $u); '
    'a=$("$ps" -ww -o args= -p "$pid" 2>/dev/null); '
    'if [ -z "$owner" ] || [ "$u" != "$owner" ]; then echo "$pid refused"; continue; fi; '
    'case $a in VLLM::*) ;; *) echo "$pid refused"; continue;; esac;; esac; '
    # Once more right before the signal: the owner checks above took time.
    'now=$(started "$pid"); if [ -z "$now" ]; then echo "$pid gone"; continue; fi; '
    'if [ "$now" != "$want" ]; then echo "$pid reused"; continue; fi; '
    'if "$kill" -s "$sig" "$pid" 2>/dev/null; then echo "$pid sent"; '
    'else echo "$pid failed"; fi; done'
)
# Where Debian 12, Ubuntu and RHEL put them (``ServiceSettings.ps`` and ``.kill``).
PS = "/usr/bin/ps"
KILL = "/usr/bin/kill"


def service_name(unit: str) -> str:
    return unit if unit.endswith(".service") else f"{unit}.service"


# ---- commands ---------------------------------------------------------------------------


def facts_query(pids: Iterable[int]) -> Argv:
    """State, user, start time and cgroup of each PID (``ps`` exits 1 when none exists)."""
    return (
        "env",
        "LC_ALL=C",
        "ps",
        "-ww",
        "-o",
        PS_FORMAT,
        "-p",
        ",".join(str(_pid(p)) for p in pids),
    )


def unit_user_query(unit: str, systemctl: str = "systemctl") -> Argv:
    """The account the unit runs as (empty: root)."""
    return (systemctl, "show", "-p", "User", "--value", "--no-pager", "--", unit)


def signal_command(
    sig: Signal,
    targets: Sequence[ProcFacts],
    unit: str,
    systemctl: str = "systemctl",
    *,
    ps: str = PS,
    kill: str = KILL,
) -> Command:
    """The fixed script that signals exactly ``targets`` (re-checked on the host by start
    time and by owner: ``unit``'s cgroup, or a ``VLLM::`` process of its user in no unit),
    reading them with ``ps`` and signalling them with ``kill`` (absolute paths)."""
    if sig not in ("TERM", "KILL"):
        raise ValueError(f"not a signal this bot sends: {sig!r}")
    specs = []
    for t in targets:
        if not _LSTART.fullmatch(t.started):
            raise ValueError(f"not a start time: {t.started!r}")
        specs.append(f"{_pid(t.pid)}:{t.started}")
    # As root (bot.core.privilege): the workers run as the unit's account, not the bot's.
    return Command(
        (SH, "-c", SIGNAL_SCRIPT, "sh", systemctl, ps, kill, service_name(unit), sig, *specs),
        Privilege.ROOT,
    )


def shown_signal(sig: Signal, targets: Sequence[ProcFacts]) -> str:
    """What the signal command does, as a person reads it."""
    pids = " ".join(str(t.pid) for t in targets)
    return f"kill -s {sig} {pids} (each only if its start time is unchanged)"


def _pid(value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 1:
        raise ValueError(f"not a PID this bot may signal: {value!r}")
    return value


# ---- parsing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcFacts:
    pid: int
    state: str  # ps STAT: R, S, D (uninterruptible), Z (zombie), T, with modifiers
    user: str
    started: str  # ps -o lstart in the C locale, spaces collapsed
    cgroup: str  # as ps prints it ("0::/system.slice/x.service"; v1 lines joined by ",")

    @property
    def uninterruptible(self) -> bool:
        return self.state.startswith("D")

    @property
    def zombie(self) -> bool:
        return self.state.startswith("Z")

    def units(self) -> tuple[str, ...]:
        """Every ``*.service`` the cgroup path names (innermost last)."""
        out: list[str] = []
        for entry in self.cgroup.split(","):
            path = entry.split(":", 2)[-1]
            out += [c for c in path.split("/") if c.endswith(".service") and c not in out]
        return tuple(out)


def parse_facts(text: str) -> dict[int, ProcFacts]:
    """``facts_query`` output: ``pid stat user Www Mmm d hh:mm:ss yyyy cgroup`` per line.
    A line of another shape is skipped: a PID without facts counts as gone, which
    only ever means it is not signalled."""
    out: dict[int, ProcFacts] = {}
    for raw in text.splitlines():
        words = raw.split()
        if len(words) < 8 or not words[0].isdigit():
            continue
        started = " ".join(words[3:8])
        if not _LSTART.fullmatch(started):
            continue
        cgroup = " ".join(words[8:]) or "-"
        out[int(words[0])] = ProcFacts(int(words[0]), words[1], words[2], started, cgroup)
    return out


def parse_signalled(text: str) -> dict[int, str]:
    """``SIGNAL_SCRIPT`` output: pid -> sent | gone | reused | refused | failed."""
    out: dict[int, str] = {}
    for raw in text.splitlines():
        m = _SIGNAL_LINE.fullmatch(raw.strip())
        if m is not None:
            out[int(m[1])] = m[2]
    return out


# ---- whose they are -----------------------------------------------------------------------


class Owner(StrEnum):
    SERVICE = "service"
    OTHER = "other"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Leftover:
    """One process that holds (or held) the service's GPUs when the drain timed out."""

    pid: int
    name: str
    used_mib: int | None
    gpu_index: int | None
    owner: Owner
    why: str  # the evidence for ``owner``, for the thread
    facts: ProcFacts | None = None

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}" if self.gpu_index is not None else "no GPU listed"
        memory = f"{self.used_mib:,} MiB" if self.used_mib is not None else "memory n/a"
        return f"PID {self.pid} ({self.name}): {where}, {memory}; {self.why}"


def judge_owner(facts: ProcFacts | None, name: str, unit: str, unit_user: str) -> tuple[Owner, str]:
    """Whose process it is, and the evidence (see the module doc)."""
    if facts is None or facts.zombie:
        return Owner.GONE, "exited" if facts is None else "exited (a zombie, holding nothing)"
    ours = service_name(unit)
    units = facts.units()
    if ours in units:
        return Owner.SERVICE, f"in {ours}'s cgroup, user {facts.user}"
    if units:
        return Owner.OTHER, f"in {units[-1]}'s cgroup, user {facts.user}: not this service's"
    if name.startswith("VLLM::") and facts.user == unit_user:
        return Owner.SERVICE, f"a VLLM:: process of {unit_user}, the unit's user, in no unit"
    return Owner.OTHER, f"user {facts.user}, cgroup {facts.cgroup}: not this service's"


@dataclass(frozen=True, slots=True)
class Candidates:
    """Who holds the service's GPUs, from a drain verdict."""

    processes: tuple[tuple[int, str, int | None, int | None], ...]  # pid, name, MiB, GPU
    memory_only: tuple[Holder, ...]  # memory held with no process listed at all
    missing: bool  # nvidia-smi listed none of the service's GPUs


def candidates(verdict: DrainVerdict) -> Candidates:
    seen: dict[int, tuple[int, str, int | None, int | None]] = {}
    for h in verdict.holders:
        if h.pid is not None and h.pid not in seen:
            seen[h.pid] = (h.pid, h.name, h.used_mib, h.gpu_index)
    return Candidates(
        tuple(seen.values()),
        tuple(h for h in verdict.holders if h.kind == "memory"),
        any(h.kind == "missing" for h in verdict.holders),
    )


def classify(
    found: Candidates, facts: Mapping[int, ProcFacts], unit: str, unit_user: str
) -> tuple[Leftover, ...]:
    out = []
    for pid, name, mib, gpu in found.processes:
        f = facts.get(pid)
        owner, why = judge_owner(f, name, unit, unit_user)
        out.append(Leftover(pid, name, mib, gpu, owner, why, f))
    return tuple(out)


def prompt(host: str, unit: str, leftovers: Sequence[Leftover]) -> str:
    """The list an approver sees before pressing the button."""
    ours = [x for x in leftovers if x.owner == Owner.SERVICE]
    lines = [
        f"{host}: {len(ours)} process{'es' if len(ours) != 1 else ''} of "
        f"{service_name(unit)} outlived its stop and still hold its GPUs. Terminate "
        "them (SIGTERM, then SIGKILL to those that remain, each only if its start time "
        "is unchanged)?"
    ]
    lines += [f"- {x.describe()}" for x in ours]
    return "\n".join(lines)


def memory_without_process(host: str, holders: Sequence[Holder]) -> str:
    """The evidence for "needs a GPU reset or a reboot" when memory is held by nobody."""
    parts = [h.describe() for h in holders]
    return (
        f"{host}: GPU memory is held with no process listed at all ({'; '.join(parts)}): "
        f"no signal can free it"
    )


# ---- asking an approver (a flow action and its outcome) ------------------------------------


@dataclass(frozen=True, slots=True)
class AskApproval:
    """A flow waits here until an approver lets it terminate ``pids`` (the executor asks
    through the front end's gate, bounded by the approval window, and a cancel ends the
    wait). Sent back: ``Approval``."""

    question: str  # what the approver is shown: the PIDs, names, memory and why
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Approval:
    approved_by: str | None  # None: not approved
    reason: str = ""  # why not (nobody answered in time, nobody can be asked, cancelled)
