"""GPU snapshots: parse nvidia-smi, judge a drain, render a fixed-width table.

Pure parsing and rendering; the I/O (running nvidia-smi over SSH, calling NVML)
happens in the callers.  Every parser is strict: output it does not understand
raises ``GpuQueryError`` quoting the line, because a drain check that guesses
could start vLLM on GPUs that are still full.  The one exception is a warning
nvidia-smi is known to print among good rows (a corrupted infoROM): it is set
aside and kept (``GpuSnapshot.warnings``), never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from bot.core.results import CommandResult
from bot.errors import GpuQueryError

# The exact argv the engine runs; kept here so parsers and commands cannot drift apart.
GPU_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
)
APPS_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi",
    "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
    "--format=csv,noheader",
)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None  # None when the driver reports [N/A] / [Not Supported]
    gpu_uuid: str


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...] = ()
    # What nvidia-smi printed for memory.used when it gave no number ("[N/A]" on a
    # unified-memory GPU such as GB10, "[Unknown Error]" on a GPU in trouble).
    memory_note: str = ""

    @property
    def memory_not_reported(self) -> bool:
        """The GPU reports no memory figure by design (unified memory: the driver prints
        ``[N/A]`` or ``[Not Supported]``), as opposed to one it failed to read."""
        return self.memory_used_mib is None and self.memory_note in _NOT_REPORTED


# What nvidia-smi prints for a value a GPU does not have, as opposed to an error reading it.
_NOT_REPORTED = frozenset({"[N/A]", "N/A", "[Not Supported]"})


@dataclass(frozen=True, slots=True)
class DriverWarning:
    """A warning nvidia-smi prints among its rows, one it is known to print (the rows
    around it are still good): ``WARNING: infoROM is corrupted at gpu 0000:67:00.0``."""

    kind: Literal["inforom_corrupted"]
    pci: str  # the GPU's address as printed: "0000:67:00.0"
    line: str  # the line as printed (the evidence)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    host: str
    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...] = field(default=())
    # The uuids of the GPUs a service uses (its ``gpus`` setting); None: all of them.
    # The drain, the totals and the health verdict look at those only; the others are
    # shown, and what runs on them never blocks the drain.
    scope: frozenset[str] | None = None
    # The known warnings nvidia-smi printed with the rows (the GPU check reports them).
    warnings: tuple[DriverWarning, ...] = ()

    def in_scope(self, gpu: Gpu) -> bool:
        return self.scope is None or gpu.uuid in self.scope

    @property
    def scoped_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if self.in_scope(g))

    @property
    def used_mib(self) -> int | None:
        """Memory in use on the GPUs in scope; None when any of them does not say (a sum
        that leaves a GPU out would read as that GPU being empty)."""
        return _total(g.memory_used_mib for g in self.scoped_gpus)

    @property
    def total_mib(self) -> int | None:
        return _total(g.memory_total_mib for g in self.scoped_gpus)


def _total(values: Iterable[int | None]) -> int | None:
    known = list(values)
    if not known or any(v is None for v in known):
        return None
    return sum(v for v in known if v is not None)


def memory_summary(snapshot: GpuSnapshot, noun: str = "") -> str:
    """``12,345 of 783,000 MiB [noun ]in use``, or why there is no such figure (never 0)."""
    used, total = snapshot.used_mib, snapshot.total_mib
    if not snapshot.scoped_gpus:
        return "no GPU listed"
    if used is not None and total is not None:
        return f"{used:,} of {total:,} MiB {noun + ' ' if noun else ''}in use"
    if all(g.memory_not_reported for g in snapshot.scoped_gpus):
        return "GPU memory not reported (unified memory): n/a"
    return "GPU memory in use: n/a (not every GPU reports it)"


@dataclass(frozen=True, slots=True)
class Selection:
    """The GPUs of a service on one host, from its ``gpus`` setting."""

    gpus: tuple[Gpu, ...]  # found, in the host's order
    missing: tuple[str, ...]  # wanted but not listed ("GPU 5", "GPU-3f…")
    wanted: str  # what the setting asks for, for messages ("GPUs 0, 1, 2, 3", "all GPUs")

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self.gpus)

    def refusal(self, host: str, listed: Sequence[Gpu]) -> str | None:
        """Why a run must not go on here (None: every wanted GPU is listed). A host that
        lists fewer GPUs than the service needs, or none, is never drained: a drain over
        no GPU would pass at once."""
        if not listed:
            return (f"nvidia-smi on {host} lists no GPU (it printed no row), but the service "
                    f"needs {self.wanted}: the driver may have lost them")
        if self.missing:
            found = ", ".join(str(g.index) for g in listed)
            return (f"the service needs {self.wanted}, but {host} lists {len(listed)} GPU"
                    f"{'s' if len(listed) != 1 else ''} ({found}): {', '.join(self.missing)} "
                    "missing")
        return None


def select_gpus(gpus: Sequence[Gpu], wanted: Sequence[int | str] | None) -> Selection:
    """The GPUs ``wanted`` names (indexes or uuids; None: all the host lists)."""
    if wanted is None:
        return Selection(tuple(gpus), () if gpus else ("any GPU",), "all GPUs")
    found: list[Gpu] = []
    missing: list[str] = []
    for w in wanted:
        gpu = next((g for g in gpus if (g.index == w if isinstance(w, int) else g.uuid == w)),
                   None)
        if gpu is None:
            missing.append(f"GPU {w}")
        elif gpu not in found:
            found.append(gpu)
    found.sort(key=lambda g: g.index)
    label = ", ".join(str(w) for w in wanted)
    return Selection(tuple(found), tuple(missing),
                     f"GPU{'s' if len(wanted) != 1 else ''} {label}")


def scoped(snapshot: GpuSnapshot, selection: Selection | None) -> GpuSnapshot:
    """The snapshot with its scope set to a service's GPUs (None: all, as built)."""
    if selection is None:
        return snapshot
    return replace(snapshot, scope=selection.uuids)


# --------------------------------------------------------------------------- parsing

# nvidia-smi exit codes as documented in its man page (RETURN VALUE).  They mirror
# NVML's return codes, except that the man page lists 10 as the interrupt issue.
NVIDIA_SMI_EXIT_CODES: dict[int, str] = {
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on the target device",
    4: "the current user does not have permission to access this device or operation",
    6: "a query to find an object was unsuccessful",
    8: "a device's external power cables are not properly attached",
    9: "the NVIDIA driver is not loaded",
    10: "the NVIDIA kernel detected an interrupt issue with a GPU",
    12: "the NVML shared library could not be found or loaded",
    13: "the local version of NVML does not implement this function",
    14: "the infoROM is corrupted",
    15: "a GPU has fallen off the bus or has otherwise become inaccessible",
    # Not in the man page, but what nvidia-smi returns after a driver upgrade
    # without a reboot ("Failed to initialize NVML: Driver/library version mismatch").
    18: "the NVIDIA driver and library versions do not match (reboot or reload the driver)",
    255: "another error or an internal driver error occurred",
    # Shell conventions, seen when the command runs through a login shell.
    126: "nvidia-smi is not executable",
    127: "nvidia-smi was not found (command not found): is the NVIDIA driver installed?",
}

_DIGITS = re.compile(r"[0-9]+")
_APP_MEMORY = re.compile(r"([0-9]+)(?:\s*MiB)?")
_NO_PROCESSES = "no running processes found"
_QUOTE_LIMIT = 200


def _quote(line: str) -> str:
    """repr() of a line, cut so one bad line cannot flood a Slack message."""
    if len(line) > _QUOTE_LIMIT:
        line = line[:_QUOTE_LIMIT] + "..."
    return repr(line)


# A row of either query: both start with a number (GPU index or PID) and a comma.
_DATA_ROW = re.compile(r"[0-9]+\s*,")


def _explaining_line(result: CommandResult) -> str:
    """The line that says why nvidia-smi failed.

    When one GPU of several fails, nvidia-smi still prints the healthy GPUs' rows
    and exits non-zero; the first line is then a healthy row that explains
    nothing.  So: the first line that is not a data row (stderr before stdout,
    since an error there is never a row), else the first line at all."""
    lines = [ln.strip() for text in (result.stderr, result.stdout)
             for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if not _DATA_ROW.match(line):
            return line
    return _first_line(result.output)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _unavailable(value: str) -> bool:
    # nvidia-smi writes every missing value in brackets: [N/A], [Not Supported],
    # [Unknown Error], [Insufficient Permissions], [GPU is lost], ...
    return (value.startswith("[") and value.endswith("]")) or value == "N/A"


class _LineError(Exception):
    """A field did not parse; turned into a GpuQueryError that quotes the whole line."""


def _required_int(value: str, what: str) -> int:
    if not _DIGITS.fullmatch(value):
        raise _LineError(f"{what} is not a number: {value!r}")
    return int(value)


def _optional_int(value: str, what: str) -> int | None:
    if _unavailable(value):
        return None
    return _required_int(value, what)


def _uuid(value: str) -> str:
    if not value or any(ch.isspace() for ch in value) or _unavailable(value):
        raise _LineError(f"not a GPU UUID: {value!r}")
    return value


# The warnings nvidia-smi prints between (or before) its CSV rows while the rows stay
# good. Only these are set aside; any other line that is not a row is an error.
# infoROM: nvidia-smi's "WARNING: infoROM is corrupted at gpu 0000:67:00.0" (NVIDIA/DCGM
# issue #2, NVIDIA/gpu-operator issue #20), with exit status 14 where it says so.
_INFOROM = re.compile(
    r"WARNING: infoROM is corrupted at gpu (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f])", re.IGNORECASE)
INFOROM_EXIT = 14  # nvidia-smi's exit status for a corrupted infoROM (its man page)


def _known_warning(line: str) -> DriverWarning | None:
    m = _INFOROM.fullmatch(line.strip())
    return DriverWarning("inforom_corrupted", m["pci"], line.strip()) if m else None


def driver_warnings(*texts: str) -> tuple[DriverWarning, ...]:
    """The known warnings in nvidia-smi's output (stdout and stderr alike), each once."""
    found: dict[str, DriverWarning] = {}
    for text in texts:
        for raw in text.splitlines():
            w = _known_warning(raw)
            if w is not None:
                found.setdefault(w.line, w)
    return tuple(found.values())


def _data_lines(text: str) -> Iterable[str]:
    # splitlines() also takes care of CRLF from Windows-built or PTY-wrapped output.
    for raw in text.splitlines():
        line = raw.strip()
        if line and _known_warning(line) is None:
            yield line


def parse_gpu_csv(host: str, text: str) -> tuple[Gpu, ...]:
    """Parse ``GPU_QUERY_ARGV`` output: ``index, uuid, name, used, total, util`` per line.

    The name may contain commas, so index and uuid are taken from the front and
    the three numbers from the back.  Bracketed values such as ``[N/A]`` become None.
    """
    gpus: list[Gpu] = []
    for line in _data_lines(text):
        fields = line.split(",")
        try:
            if len(fields) < 6:
                raise _LineError(f"expected 6 fields, got {len(fields)}")
            name = ",".join(fields[2:-3]).strip()
            if not name:
                raise _LineError("the GPU name is empty")
            used, total, util = (f.strip() for f in fields[-3:])
            gpu = Gpu(
                index=_required_int(fields[0].strip(), "the GPU index"),
                uuid=_uuid(fields[1].strip()),
                name=name,
                memory_used_mib=_optional_int(used, "memory.used"),
                memory_total_mib=_optional_int(total, "memory.total"),
                utilization_pct=_optional_int(util, "utilization.gpu"),
                memory_note=used if _unavailable(used) else "",
            )
        except _LineError as exc:
            raise GpuQueryError(
                host, f"unexpected line from nvidia-smi --query-gpu: {_quote(line)} ({exc})",
                output=text,
            ) from None
        if any(g.index == gpu.index or g.uuid == gpu.uuid for g in gpus):
            raise GpuQueryError(
                host, f"nvidia-smi --query-gpu listed GPU {gpu.index} ({gpu.uuid}) twice",
                output=text,
            )
        gpus.append(gpu)
    return tuple(gpus)


def parse_apps_csv(host: str, text: str) -> tuple[GpuProcess, ...]:
    """Parse ``APPS_QUERY_ARGV`` output: ``pid, process_name, used_memory, gpu_uuid``.

    The memory carries its unit (``96998 MiB``).  The process name may contain
    commas: pid is first, uuid last, memory second last and the name is the rest.
    Empty output, or nvidia-smi's "No running processes found", means no processes.
    """
    processes: list[GpuProcess] = []
    for line in _data_lines(text):
        if line.lower() == _NO_PROCESSES:
            continue
        fields = line.split(",")
        try:
            if len(fields) < 4:
                raise _LineError(f"expected 4 fields, got {len(fields)}")
            memory = fields[-2].strip()
            used: int | None = None
            if not _unavailable(memory):
                match = _APP_MEMORY.fullmatch(memory)
                if match is None:
                    raise _LineError(f"used_memory is not a MiB amount: {memory!r}")
                used = int(match.group(1))
            process = GpuProcess(
                pid=_required_int(fields[0].strip(), "the PID"),
                name=",".join(fields[1:-2]).strip(),
                used_mib=used,
                gpu_uuid=_uuid(fields[-1].strip()),
            )
        except _LineError as exc:
            raise GpuQueryError(
                host,
                f"unexpected line from nvidia-smi --query-compute-apps: {_quote(line)} ({exc})",
                output=text,
            ) from None
        processes.append(process)
    return tuple(processes)


def check_nvidia_smi(host: str, result: CommandResult) -> None:
    """Raise ``GpuQueryError`` unless nvidia-smi exited 0 in time (or 14, a corrupted
    infoROM, when its known warning is all that is not a row: ``driver_warnings``).

    The message names the documented meaning of the exit code and quotes the
    line that explains the failure (nvidia-smi writes its own error text to
    stdout, between the rows of the GPUs that did answer).
    """
    output = result.output
    said = _explaining_line(result)
    detail = f": {_quote(said)}" if said else ""
    if result.exit_status == INFOROM_EXIT and _only_known_warnings(result):
        return  # a corrupted infoROM: the rows are good, the warning is reported
    if result.timed_out:
        message = (
            f"nvidia-smi did not finish within {result.duration_s:.0f} s "
            f"(a hung driver or a GPU in a bad state can cause this){detail}"
        )
    elif result.exit_status is None:
        message = f"nvidia-smi was killed by signal {result.signal or 'unknown'}{detail}"
    elif result.exit_status == 0:
        return
    else:
        meaning = NVIDIA_SMI_EXIT_CODES.get(result.exit_status, "unknown error")
        message = f"nvidia-smi failed with exit status {result.exit_status}: {meaning}{detail}"
    raise GpuQueryError(host, message, exit_status=result.exit_status, output=output)


def _only_known_warnings(result: CommandResult) -> bool:
    """Exit 14 (a corrupted infoROM) with a known warning, and on stderr nothing else:
    nvidia-smi still printed every row. The rows themselves are parsed strictly after."""
    if not driver_warnings(result.stdout, result.stderr):
        return False
    return all(_known_warning(ln) is not None for ln in result.stderr.splitlines()
               if ln.strip())


def build_snapshot(host: str, gpu_text: str, apps_text: str,
                   stderr: Sequence[str] = ()) -> GpuSnapshot:
    """Parse both queries and attach each process to the GPU with its uuid.

    Processes whose uuid matches no GPU (a GPU that vanished between the two
    queries, or a MIG instance) are kept in ``snapshot.processes`` only. A known
    warning among the rows (``stderr``: the queries' stderr, where it may be too) is
    kept in ``snapshot.warnings``.
    """
    gpus = parse_gpu_csv(host, gpu_text)
    processes = parse_apps_csv(host, apps_text)
    attached = tuple(
        replace(gpu, processes=tuple(p for p in processes if p.gpu_uuid == gpu.uuid))
        for gpu in gpus
    )
    return GpuSnapshot(host=host, gpus=attached, processes=processes,
                       warnings=driver_warnings(gpu_text, apps_text, *stderr))


# --------------------------------------------------------------------------- drain

HolderKind = Literal["process", "memory", "worker", "missing"]


@dataclass(frozen=True, slots=True)
class Holder:
    """One reason a host is not drained.

    ``process``: a compute app holds memory on a GPU (``gpu_index`` is None when
    its uuid matches no GPU).  ``memory``: a GPU is above the threshold (or does not
    report its memory) with no process listed.  ``worker``: a ``VLLM::`` process
    from pgrep is still alive but nvidia-smi lists it on no GPU.  ``missing``: nvidia-smi
    lists none of the GPUs in scope (a drain over no GPU must never pass).
    """

    kind: HolderKind
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pid: int | None = None
    name: str = ""
    used_mib: int | None = None

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}" if self.gpu_index is not None else f"GPU {self.gpu_uuid}"
        if self.kind == "worker":
            return f"PID {self.pid} ({self.name}) is still running"
        if self.kind == "missing":
            return "nvidia-smi lists no GPU of this service, so none can be confirmed free"
        if self.kind == "memory":
            if self.used_mib is None:
                return f"{where}: memory use not reported, cannot confirm it is free"
            return f"{where}: {self.used_mib} MiB used, no process listed"
        amount = f"{self.used_mib} MiB" if self.used_mib is not None else "memory"
        return f"{where}: {amount} held by PID {self.pid} ({self.name})"


@dataclass(frozen=True, slots=True)
class DrainVerdict:
    drained: bool
    threshold_mib: int
    holders: tuple[Holder, ...] = ()
    # GPUs judged by their processes alone (they report no memory figure: unified memory).
    by_processes: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.drained and self.by_processes:
            gpus = ", ".join(str(i) for i in self.by_processes)
            return (f"drained: no compute process and no vLLM worker of the service; GPU"
                    f"{'s' if len(self.by_processes) != 1 else ''} {gpus} report no memory "
                    "figure (unified memory), so the drain was judged by processes alone")
        if self.drained:
            return f"drained: no GPU process, every GPU at or below {self.threshold_mib} MiB"
        # No "not drained" prefix: callers put this after their own "still held: ".
        return "; ".join(h.describe() for h in self.holders)


def drain_verdict(
    snapshot: GpuSnapshot,
    threshold_mib: int,
    workers: Sequence[tuple[int, str]] = (),
) -> DrainVerdict:
    """Decide whether the GPUs in the snapshot's scope are free enough to start vLLM.

    Drained means: no compute app holds memory on them, every one of them is at or
    below ``threshold_mib`` (the driver keeps a little per GPU), and none of
    ``workers`` (the service's ``VLLM::`` processes, from ``parse_pgrep``) survives.
    Memory that cannot be read counts as held: starting on a GPU we cannot see is how
    a redeploy ends in an out-of-memory. A GPU that reports no memory figure by
    design (unified memory) is judged by its processes alone, and the verdict says so.
    Processes on GPUs outside the scope never block; a scope with no GPU never drains.
    """
    gpus = snapshot.scoped_gpus
    index_of = {g.uuid: g.index for g in snapshot.gpus}
    holders: list[Holder] = []
    held_gpus: set[str] = set()
    listed_pids: set[int] = set()
    for proc in _all_processes(snapshot):
        if proc.gpu_uuid in index_of and proc.gpu_uuid not in {g.uuid for g in gpus}:
            listed_pids.add(proc.pid)  # another service's GPU: shown, never blocking
            continue
        if proc.used_mib == 0:
            continue
        holders.append(Holder("process", index_of.get(proc.gpu_uuid), proc.gpu_uuid,
                              proc.pid, proc.name, proc.used_mib))
        held_gpus.add(proc.gpu_uuid)
        listed_pids.add(proc.pid)
    by_processes = []
    for gpu in gpus:
        used = gpu.memory_used_mib
        if gpu.uuid in held_gpus:
            continue
        if gpu.memory_not_reported:
            by_processes.append(gpu.index)
        elif used is None or used > threshold_mib:
            holders.append(Holder("memory", gpu.index, gpu.uuid, used_mib=used))
    for pid, command in workers:
        if pid not in listed_pids:
            holders.append(Holder("worker", pid=pid, name=command))
            listed_pids.add(pid)
    if not gpus:
        holders.append(Holder("missing"))
    holders.sort(key=_holder_order)
    return DrainVerdict(drained=not holders, threshold_mib=threshold_mib,
                        holders=tuple(holders), by_processes=tuple(by_processes))


def _holder_order(h: Holder) -> tuple[int, int, int]:
    # GPUs in index order, then unknown GPUs, then stray workers: how people read nvidia-smi.
    rank = 0 if h.gpu_index is not None else (1 if h.kind not in ("worker", "missing") else 2)
    return (rank, h.gpu_index if h.gpu_index is not None else 0, h.pid or 0)


def _all_processes(snapshot: GpuSnapshot) -> tuple[GpuProcess, ...]:
    """snapshot.processes, plus any attached to a GPU but missing there (hand-built snapshots)."""
    seen = set(snapshot.processes)
    extra = tuple(p for g in snapshot.gpus for p in g.processes if p not in seen)
    return snapshot.processes + extra


def parse_pgrep(text: str, host: str = "unknown host") -> tuple[tuple[int, str], ...]:
    """Parse ``pgrep -a -f ^VLLM::`` output into ``(pid, command line)`` pairs.

    pgrep prints ``PID COMMAND`` per process and nothing (exit 1) when none match.
    A command line containing a newline continues on the next line, so a line
    without a leading PID extends the previous entry; one before any entry is garbage.
    """
    entries: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        head, _, rest = raw.strip().partition(" ")
        if _DIGITS.fullmatch(head):
            entries.append((int(head), rest.strip()))
        elif entries:
            pid, command = entries[-1]
            entries[-1] = (pid, f"{command} {raw.strip()}")
        else:
            raise GpuQueryError(
                host, f"unexpected line from pgrep (no PID): {_quote(raw)}", output=text
            )
    return tuple(entries)


# --------------------------------------------------------------------------- rendering

LINE_LIMIT = 100
_NAME_WIDTH = 25
_GAP = "  "
_ELLIPSIS = "…"
_HEADER = ("GPU", "NAME", "USED MiB", "TOTAL MiB", "UTIL", "PROCESSES")
_RIGHT = (True, False, True, True, True, False)
# Vendor boilerplate that makes every row wider without telling two GPUs apart.
_NAME_REWRITES = ((" Server Edition", " SE"), (" Workstation Edition", " WE"))


def short_gpu_name(name: str) -> str:
    """'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'RTX PRO 6000 Blackwell SE'."""
    short = name.removeprefix("NVIDIA ").strip()
    for long, abbreviation in _NAME_REWRITES:
        short = short.replace(long, abbreviation)
    return _fit(short or name.strip(), _NAME_WIDTH)


def _fit(text: str, width: int) -> str:
    text = _printable(text)
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + _ELLIPSIS


def _printable(text: str) -> str:
    # Process names come from the host: a control character could drive a terminal,
    # and a backtick could close the Slack code block the table is posted in.
    return "".join(ch if ch.isprintable() and ch != "`" else "?" for ch in text)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _pct(value: int | None) -> str:
    return "n/a" if value is None else f"{value}%"


def _process_cell(proc: GpuProcess, width: int) -> str:
    head, tail = str(proc.pid), "n/a" if proc.used_mib is None else f"{proc.used_mib} MiB"
    name_width = max(width - len(head) - len(tail) - 2, 4)
    return f"{head} {_fit(proc.name, name_width)} {tail}"


def _gpu_label(snapshot: GpuSnapshot, gpu: Gpu, health: Mapping[str, str] | None) -> str:
    label = str(gpu.index) if snapshot.in_scope(gpu) else f"({gpu.index})"
    mark = (health or {}).get(gpu.uuid, "")
    return f"{label} {mark}" if mark else label


def render_table(snapshot: GpuSnapshot, health: Mapping[str, str] | None = None) -> str:
    """A fixed-width table for a Slack code block or a terminal, lines <= ``LINE_LIMIT``.

    One row per GPU (extra processes continue on following rows), processes that
    match no GPU under ``?``, then a total row over the GPUs in scope.  A GPU outside
    the snapshot's scope (another service's) shows its index in parentheses and counts
    in no total.  ``health``: a short mark per GPU uuid ("warn", "CRIT") shown after
    its index.  A value nobody reported reads ``n/a``, never 0.  No trailing spaces.
    """
    count = len(snapshot.gpus)
    header = _fit(f"{snapshot.host}: {count} GPU{'s' if count != 1 else ''}", LINE_LIMIT)
    if not snapshot.gpus and not snapshot.processes:
        return f"{header}, nothing reported"
    known = {g.uuid for g in snapshot.gpus}
    stray = tuple(p for p in _all_processes(snapshot) if p.gpu_uuid not in known)
    rows: list[tuple[tuple[str, ...], tuple[GpuProcess, ...]]] = []
    for gpu in snapshot.gpus:
        gpu_cells = (_gpu_label(snapshot, gpu, health), short_gpu_name(gpu.name),
                     _mib(gpu.memory_used_mib), _mib(gpu.memory_total_mib),
                     _pct(gpu.utilization_pct))
        rows.append((gpu_cells, gpu.processes))
    for proc in stray:
        rows.append((("?", _fit(proc.gpu_uuid, _NAME_WIDTH), "", "", ""), (proc,)))
    utils = [g.utilization_pct for g in snapshot.scoped_gpus if g.utilization_pct is not None]
    total_cells = ("", "total", _mib(snapshot.used_mib), _mib(snapshot.total_mib),
                   _pct(sum(utils) // len(utils) if utils else None))
    n_procs = sum(len(p) for _, p in rows)

    fixed: list[tuple[str, ...]] = [*(cells for cells, _ in rows), total_cells, _HEADER[:5]]
    widths = [max(len(c[i]) for c in fixed) for i in range(5)]

    def line(cells: Sequence[str], last: str) -> str:
        padded = (c.rjust(w) if right else c.ljust(w)
                  for c, w, right in zip(cells, widths, _RIGHT, strict=False))
        return _GAP.join([*padded, last]).rstrip()

    room = LINE_LIMIT - (sum(widths) + len(_GAP) * 5)
    out = [header, line(_HEADER[:5], _HEADER[5])]
    for cells, procs in rows:
        out.append(line(cells, _process_cell(procs[0], room) if procs else ""))
        out.extend(line(("",) * 5, _process_cell(p, room)) for p in procs[1:])
    out.append(line(total_cells, f"{n_procs} process{'es' if n_procs != 1 else ''}"))
    if any(not snapshot.in_scope(g) for g in snapshot.gpus):
        out.append("(n): another service's GPU, outside the total; what runs there never "
                   "blocks this drain")
    return "\n".join(out)
