"""Simulated ``nvidia-smi``: the default table, ``-L``, ``--query-gpu`` and
``--query-compute-apps`` with ``--format=csv[,noheader][,nounits]``, and ``nvlink -s``.

CSV values are joined with ", " and carry units (``97012 MiB``, ``0 %``)
unless ``nounits``; the header names a unit in brackets either way.  With the
no_driver fault every call prints the driver error and exits 9, as the real
tool does when the kernel module is gone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.sim.packages import driver_cuda
from bot.sim.state import HostState, SimGpu, SimProcess, StateStore, host_view
from bot.sim.tools import nvidia_smi_admin, nvidia_smi_q, nvidia_smi_qx

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NO_DRIVER_EXIT = 9
# The driver_mismatch fault: what nvidia-smi prints (on stdout) and its exit status, as
# a real one did (mozilla/translations issue #1167; tests/samples/deep).
MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48"
)
MISMATCH_EXIT = 18
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
DRIVER_VERSION = "590.44.01"
CUDA_VERSION = "13.1"
POWER_CAP_W = 600


def _bus_id(index: int) -> str:
    return f"00000000:{(0x01 + index * 0x20) % 0x100:02X}:00.0"


def _power(g: SimGpu) -> float:
    return 33.5 + (90.0 if g.used_mib else 0.0) + 4.0 * g.util_pct


# field -> (header unit, value). Aliases nvidia-smi accepts point at the same entry.
_GpuField = tuple[str, Callable[[SimGpu], str]]
_GPU_FIELDS: dict[str, _GpuField] = {
    "index": ("", lambda g: str(g.index)),
    "uuid": ("", lambda g: g.uuid),
    "name": ("", lambda g: g.name),
    "memory.used": ("MiB", lambda g: _memory(g, g.used_mib)),
    "memory.total": ("MiB", lambda g: _memory(g, g.total_mib)),
    "memory.free": ("MiB", lambda g: _memory(g, g.total_mib - g.used_mib)),
    "utilization.gpu": ("%", lambda g: str(g.util_pct)),
    "utilization.memory": ("%", lambda g: str(g.util_pct // 2)),
    "temperature.gpu": ("", lambda g: str(34 + g.util_pct // 2)),
    "power.draw": ("W", lambda g: f"{_power(g):.2f}"),
    "power.limit": ("W", lambda g: f"{POWER_CAP_W:.2f}"),
    "pci.bus_id": ("", lambda g: _bus_id(g.index)),
    "driver_version": ("", lambda g: DRIVER_VERSION),
    "persistence_mode": ("", lambda g: "Enabled" if g.persistence else "Disabled"),
    "pstate": ("", lambda g: "P0" if g.used_mib else "P8"),
}
_GPU_FIELDS |= {
    "gpu_name": _GPU_FIELDS["name"],
    "gpu_uuid": _GPU_FIELDS["uuid"],
    "gpu_bus_id": _GPU_FIELDS["pci.bus_id"],
}

_AppField = tuple[str, str, Callable[[SimProcess, SimGpu], str]]  # header name, unit, value
_APP_FIELDS: dict[str, _AppField] = {
    "pid": ("pid", "", lambda p, g: str(p.pid)),
    "process_name": ("process_name", "", lambda p, g: p.cmdline),
    "used_memory": ("used_gpu_memory", "MiB", lambda p, g: _memory(g, p.used_mib)),
    "gpu_uuid": ("gpu_uuid", "", lambda p, g: g.uuid),
    "gpu_bus_id": ("gpu_bus_id", "", lambda p, g: _bus_id(g.index)),
    "gpu_name": ("gpu_name", "", lambda p, g: g.name),
}
_APP_FIELDS |= {"name": _APP_FIELDS["process_name"], "used_gpu_memory": _APP_FIELDS["used_memory"]}


def _memory(g: SimGpu, mib: int) -> str:
    # A unified-memory GPU (GB10) reports no memory figure at all.
    return str(mib) if g.memory_reported else "[N/A]"


def _cell(value: str, unit: str, nounits: bool) -> str:
    # A missing value carries no unit: "[N/A]", never "[N/A] MiB".
    return value if nounits or not unit or value.startswith("[") else f"{value} {unit}"


# What nvidia-smi says of a GPU that has fallen off the bus, and its exit status then.
LOST_EXIT = 15


def _lost_line(g: SimGpu) -> str:
    return f"Unable to determine the device handle for GPU{_bus_id(g.index)[4:]}: Unknown Error"


def _header(name: str, unit: str) -> str:
    return f"{name} [{unit}]" if unit else name


def _query_gpu(gpus: list[SimGpu], names: list[str], header: bool, nounits: bool) -> str:
    rows = []
    if header:
        rows.append(", ".join(_header(n, _GPU_FIELDS[n][0]) for n in names))
    for g in gpus:
        rows.append(
            ", ".join(_cell(_GPU_FIELDS[n][1](g), _GPU_FIELDS[n][0], nounits) for n in names)
        )
    return "".join(r + "\n" for r in rows)


def _query_apps(
    gpus: list[SimGpu], procs: list[SimProcess], names: list[str], header: bool, nounits: bool
) -> str:
    rows = []
    if header:
        rows.append(", ".join(_header(_APP_FIELDS[n][0], _APP_FIELDS[n][1]) for n in names))
    by_index = {g.index: g for g in gpus}
    for p in procs:
        if p.gpu is None or p.gpu not in by_index:
            continue
        g = by_index[p.gpu]
        rows.append(
            ", ".join(_cell(_APP_FIELDS[n][2](p, g), _APP_FIELDS[n][1], nounits) for n in names)
        )
    return "".join(r + "\n" for r in rows)


_COLS = (41, 24, 22)
_WIDE = sum(_COLS) + len(_COLS) - 1


def _row(*cells: str) -> str:
    return "|" + "|".join(f" {c:<{w - 2}} " for c, w in zip(cells, _COLS, strict=True)) + "|"


def _rule(fill: str = "-", edge: str = "+") -> str:
    return edge + edge.join(fill * w for w in _COLS) + edge


def _wide(text: str) -> str:
    return f"| {text:<{_WIDE - 2}} |"


def _table(gpus: list[SimGpu], procs: list[SimProcess], cuda: str = CUDA_VERSION) -> str:
    """An approximation of the default nvidia-smi screen."""
    full = "+" + "-" * _WIDE + "+"
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        full,
        _wide(
            f"NVIDIA-SMI {DRIVER_VERSION}             Driver Version: {DRIVER_VERSION}"
            f"     CUDA Version: {cuda}"
        ),
        _rule(),
        _row(
            "GPU  Name                 Persistence-M",
            "Bus-Id          Disp.A",
            "Volatile Uncorr. ECC",
        ),
        _row(
            "Fan  Temp   Perf          Pwr:Usage/Cap",
            "          Memory-Usage",
            "GPU-Util  Compute M.",
        ),
        _row("", "", "              MIG M."),
        _rule("=", "|"),
    ]
    for g in gpus:
        name = g.name if len(g.name) <= 24 else g.name[:21] + "..."
        power = f"{_power(g):.0f}W /  {POWER_CAP_W}W"
        out += [
            _row(
                f"{g.index:>3}  {name:<24}{'On' if g.persistence else 'Off':>8}",
                f"  {_bus_id(g.index)} Off",
                f"{'Off':>20}",
            ),
            _row(
                f"30%   {34 + g.util_pct // 2:>2}C    {'P0' if g.used_mib else 'P8'}  {power:>21}",
                f"{g.used_mib}MiB /  {g.total_mib}MiB".rjust(22),
                f"{g.util_pct:>5}%      Default",
            ),
            _row("", "", f"{'N/A':>20}"),
            _rule(),
        ]
    out += [
        "",
        full,
        _wide("Processes:"),
        _wide(
            " GPU   GI   CI              PID   Type   Process name"
            "                        GPU Memory"
        ),
        _wide(
            "       ID   ID                                           "
            "                    Usage      "
        ),
        "|" + "=" * _WIDE + "|",
    ]
    shown = [p for p in procs if p.gpu is not None]
    if not shown:
        out.append(_wide(" No running processes found"))
    for p in shown:
        out.append(
            _wide(
                f"{p.gpu:>4}   N/A  N/A  {p.pid:>14}      C   {p.cmdline[:32]:<32}"
                f"{p.used_mib:>8}MiB"
            )
        )
    out.append(full)
    return "\n".join(out) + "\n"


class _BadArgs(Exception):
    """A command line nvidia-smi rejects: it prints the message on stdout and exits 2."""

    def __init__(self, message: str = BAD_ARGS) -> None:
        super().__init__(message)


@dataclass
class _Args:
    query_gpu: list[str] | None = None
    query_apps: list[str] | None = None
    fmt: list[str] | None = None
    ids: set[int] | None = None
    list_gpus: bool = False
    query_all: bool = False  # -q: the full report (bot.sim.tools.nvidia_smi_q)
    xml: bool = False  # -x with -q: the report as XML (bot.sim.tools.nvidia_smi_qx)
    pm: bool | None = None  # -pm 0|1: set persistence mode (bot.sim.tools.nvidia_smi_admin)
    reset: bool = False  # -r: reset the GPUs (bot.sim.tools.nvidia_smi_admin)


_TAKES_VALUE = (
    "--query-gpu",
    "--query-compute-apps",
    "--format",
    "--id",
    "-i",
    "-d",
    "--display",
    "-pm",
    "--persistence-mode",
)


# The options that take no value, and the field each sets.
_SWITCHES = {
    "-L": "list_gpus",
    "--list-gpus": "list_gpus",
    "-q": "query_all",
    "--query": "query_all",
    "-x": "xml",
    "--xml-format": "xml",
    "-r": "reset",
    "--gpu-reset": "reset",
}


# nvidia-smi -h: "-pm, --persistence-mode= Set persistence mode: 0/DISABLED, 1/ENABLED".
_PM_VALUES = {"0": False, "DISABLED": False, "1": True, "ENABLED": True}


def _parse(args: list[str]) -> _Args:
    parsed = _Args()
    it = iter(args)
    for a in it:
        key, eq, val = a.partition("=")
        if key in _TAKES_VALUE and not eq:
            val = next(it, "")
        if key == "--query-gpu":
            parsed.query_gpu = val.split(",")
        elif key == "--query-compute-apps":
            parsed.query_apps = val.split(",")
        elif key == "--format":
            parsed.fmt = val.split(",")
        elif key in ("--id", "-i") and all(v.isdigit() for v in val.split(",")):
            parsed.ids = {int(v) for v in val.split(",")}
        elif a in _SWITCHES:
            setattr(parsed, _SWITCHES[a], True)
        elif key in ("-pm", "--persistence-mode") and val.upper() in _PM_VALUES:
            parsed.pm = _PM_VALUES[val.upper()]
        elif key in ("-d", "--display"):
            pass  # which sections: the simulated report always has the health ones
        else:
            raise _BadArgs
    _check(parsed)
    return parsed


def _check(parsed: _Args) -> None:
    """The combinations nvidia-smi rejects."""
    if parsed.query_gpu is not None and parsed.query_apps is not None:
        raise _BadArgs
    if parsed.xml and not parsed.query_all:
        raise _BadArgs
    admin = (parsed.pm is not None) + parsed.reset
    others = (parsed.query_gpu, parsed.query_apps, parsed.fmt)
    if admin > 1 or (admin and (any(o is not None for o in others) or parsed.list_gpus)):
        raise _BadArgs
    if admin and parsed.query_all:
        raise _BadArgs


def _csv(a: _Args, gpus: list[SimGpu], procs: list[SimProcess]) -> str:
    """``--query-gpu`` or ``--query-compute-apps`` output, as ``--format`` asks."""
    fmt = a.fmt
    if fmt is None or fmt[0] != "csv" or not set(fmt[1:]) <= {"noheader", "nounits"}:
        raise _BadArgs
    header, nounits = "noheader" not in fmt, "nounits" in fmt
    names = a.query_gpu if a.query_gpu is not None else a.query_apps
    assert names is not None
    known = _GPU_FIELDS if a.query_gpu is not None else _APP_FIELDS
    for n in names:
        if n not in known:
            raise _BadArgs(f'Field "{n}" is not a valid field to query.\n')
    if a.query_gpu is not None:
        return _query_gpu(gpus, a.query_gpu, header, nounits)
    return _query_apps(gpus, procs, names, header, nounits)


def _output(a: _Args, gpus: list[SimGpu], procs: list[SimProcess], cuda: str = CUDA_VERSION) -> str:
    if a.query_gpu is not None or a.query_apps is not None:
        return _csv(a, gpus, procs)
    if a.fmt is not None:
        raise _BadArgs
    if a.list_gpus:
        return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus)
    if a.query_all and a.xml:
        return nvidia_smi_qx.render(gpus, len(gpus), cuda)
    if a.query_all:
        return nvidia_smi_q.render(gpus, len(gpus), cuda)
    return _table(gpus, procs, cuda)


def main(store: StateStore, args: list[str]) -> int:
    st = store.read()
    if st.faults.no_driver:
        print(NO_DRIVER)
        return NO_DRIVER_EXIT
    if st.faults.driver_mismatch:
        print(MISMATCH)
        return MISMATCH_EXIT
    if args[:1] == ["nvlink"]:
        return _nvlink(st, args[1:])
    try:
        a = _parse(args)
        if a.pm is not None or a.reset:
            return nvidia_smi_admin.run(store, a.ids, a.pm, a.reset)
        gpus, procs = host_view(st, time.time())
        if a.ids is not None:
            gpus = [g for g in gpus if g.index in a.ids]
        lost = [g for g in gpus if g.lost]
        sys.stdout.write(_output(a, [g for g in gpus if not g.lost], procs, driver_cuda(st)))
    except _BadArgs as e:
        print(e)
        return 2
    for g in lost:
        print(_lost_line(g))
    return LOST_EXIT if lost else 0


# `nvidia-smi nvlink -s`: an H200's 18 NVLink4 links, as real H100/H200 hosts print them
# (tests/samples/deep: "\t Link 0: 26.562 GB/s", "\t Link 3: <inactive>").
NVLINK_LINKS = 18
NVLINK_RATE = "26.562 GB/s"
NVLINK_DOWN = 3  # the link the nvlink_down fault takes down on GPU stuck_gpu
# A GPU with no link up, in NVML's words (leptonai/gpud#1085): what fabric_stuck prints.
NVLINK_ALL_DOWN = "NVML: Unable to retrieve NVLink information as all links are inActive"


def _nvlink(st: HostState, args: list[str]) -> int:
    if not args or args[0] not in ("-s", "--status"):
        print(BAD_ARGS)
        return 2
    gpus, _ = host_view(st, time.time())
    for g in gpus:
        if g.lost:
            continue
        print(f"GPU {g.index}: {g.name} (UUID: {g.uuid})")
        if st.faults.fabric_stuck:
            print(NVLINK_ALL_DOWN)
            continue
        down = st.faults.nvlink_down and g.index == st.config.stuck_gpu
        for n in range(NVLINK_LINKS):
            print(f"\t Link {n}: {'<inactive>' if down and n == NVLINK_DOWN else NVLINK_RATE}")
    return 0
