"""Parse nvidia-smi (and pgrep) strictly: output it does not understand raises
``GpuQueryError`` quoting the line, because a drain check that guesses could start vLLM
on GPUs that are still full. The one exception is a warning nvidia-smi is known to
print among good rows (a corrupted infoROM): it is set aside and kept
(``GpuSnapshot.warnings``), never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from bot.core.gpu_snapshot import DriverWarning, Gpu, GpuProcess, GpuSnapshot
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
    lines = [
        ln.strip()
        for text in (result.stderr, result.stdout)
        for ln in text.splitlines()
        if ln.strip()
    ]
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
    r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f])",
    re.IGNORECASE,
)
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


def data_lines(text: str) -> Iterable[str]:
    """nvidia-smi's CSV rows, stripped: blank lines and its known warnings set aside
    (every other line is a row, for the caller's parser to judge strictly)."""
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
    for line in data_lines(text):
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
                host,
                f"unexpected line from nvidia-smi --query-gpu: {_quote(line)} ({exc})",
                output=text,
            ) from None
        if any(g.index == gpu.index or g.uuid == gpu.uuid for g in gpus):
            raise GpuQueryError(
                host,
                f"nvidia-smi --query-gpu listed GPU {gpu.index} ({gpu.uuid}) twice",
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
    for line in data_lines(text):
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
    if warned_only(result):
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


def warned_only(result: CommandResult) -> bool:
    """Exit 14 (a corrupted infoROM) with a known warning, and on stderr nothing else:
    nvidia-smi still printed every row. The rows themselves are parsed strictly after
    (``data_lines`` sets the warning aside)."""
    if result.exit_status != INFOROM_EXIT or not driver_warnings(result.stdout, result.stderr):
        return False
    return all(_known_warning(ln) is not None for ln in result.stderr.splitlines() if ln.strip())


def build_snapshot(
    host: str, gpu_text: str, apps_text: str, stderr: Sequence[str] = ()
) -> GpuSnapshot:
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
    return GpuSnapshot(
        host=host,
        gpus=attached,
        processes=processes,
        warnings=driver_warnings(gpu_text, apps_text, *stderr),
    )


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
