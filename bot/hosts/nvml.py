"""Probe the GPUs of the machine the bot runs on through NVML (nvidia-ml-py).

Used for hosts configured as ``address = "local"`` (the bot runs on the GPU box)
and by ``python -m bot gpus --local``, so no nvidia-smi process or SSH hop is
needed.  The NVML module is a parameter: tests pass a small fake with the same
function names and an ``NVMLError`` of the same shape, and production passes
nothing and gets the real ``pynvml``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bot.core.gpu import Gpu, GpuProcess, GpuSnapshot
from bot.core.health import GpuReading, normal_pci
from bot.errors import GpuQueryError

if TYPE_CHECKING:
    from bot.hosts.nvml_deep import NvmlDeep

T = TypeVar("T")

_MIB = 1024 * 1024
_UNKNOWN_NAME = "[unknown]"

# What an operator should do about the NVML return codes that mean "this host is
# not fit for GPU work"; the rest fall back to pynvml's own text for the code.
_NVML_HINTS: dict[int, str] = {
    4: "permission denied (is the bot's user allowed to open /dev/nvidia*?)",
    9: "the NVIDIA driver is not loaded",
    12: "the NVML library (libnvidia-ml.so.1) was not found: is the NVIDIA driver installed?",
    15: "a GPU has fallen off the bus or has otherwise become inaccessible",
    18: "the NVIDIA driver and NVML versions do not match (reboot or reload the driver)",
}
_NOT_SUPPORTED = 3


def probe_local(host: str = "local", nvml: Any = None) -> GpuSnapshot:
    """Read every local GPU, its memory, utilization and compute processes.

    Raises ``GpuQueryError`` when NVML cannot be initialised or a query fails.
    Utilization is None where the device does not support it (e.g. MIG mode),
    like nvidia-smi's ``[N/A]``; a process list that cannot be read is an error,
    because a drain check must not mistake "unknown" for "empty".
    """
    lib = nvml if nvml is not None else _import_pynvml()
    errors: tuple[type[BaseException], ...] = (
        lib.NVMLError,
        # pynvml raises this plain Exception when the driver's NVML lacks a function.
        getattr(lib, "NVMLLibraryMismatchError", lib.NVMLError),
    )
    try:
        lib.nvmlInit()
    except errors as exc:
        raise _error(host, "could not initialise NVML", exc) from exc
    try:
        gpus = tuple(_read_device(lib, i) for i in range(lib.nvmlDeviceGetCount()))
    except errors as exc:
        raise _error(host, "an NVML query failed", exc) from exc
    finally:
        try:
            lib.nvmlShutdown()
        except errors:
            # The readings are complete (or already failing); a shutdown error
            # must neither discard them nor hide the original failure.
            pass
    processes = tuple(p for g in gpus for p in g.processes)
    return GpuSnapshot(host=host, gpus=gpus, processes=processes)


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def _read_device(lib: Any, index: int) -> Gpu:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    uuid = _text(lib.nvmlDeviceGetUUID(handle))
    # A unified-memory GPU (GB10) has no memory of its own to report: unknown, never 0.
    memory = _optional(lib, lib.nvmlDeviceGetMemoryInfo, handle)
    try:
        utilization: int | None = int(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) != _NOT_SUPPORTED:
            raise
        utilization = None
    processes = tuple(
        GpuProcess(
            pid=int(info.pid),
            name=_process_name(lib, int(info.pid)),
            used_mib=None if info.usedGpuMemory is None else int(info.usedGpuMemory) // _MIB,
            gpu_uuid=uuid,
        )
        for info in lib.nvmlDeviceGetComputeRunningProcesses(handle)
    )
    return Gpu(
        index=index,
        uuid=uuid,
        name=_text(lib.nvmlDeviceGetName(handle)),
        memory_used_mib=None if memory is None else int(memory.used) // _MIB,
        memory_total_mib=None if memory is None else int(memory.total) // _MIB,
        utilization_pct=utilization,
        processes=processes,
        memory_note="[N/A]" if memory is None else "",
    )


def _process_name(lib: Any, pid: int) -> str:
    """NVML's name for pid; /proc/<pid>/comm when NVML cannot say (exited, other namespace)."""
    try:
        name = _text(lib.nvmlSystemGetProcessName(pid))
    except lib.NVMLError:
        name = ""
    if name:
        return name
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return _UNKNOWN_NAME


def _text(value: str | bytes) -> str:
    # Current nvidia-ml-py returns str; older releases returned the raw bytes.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _error(host: str, doing: str, exc: BaseException) -> GpuQueryError:
    code = getattr(exc, "value", None)
    reason = _NVML_HINTS.get(code, str(exc)) if isinstance(code, int) else str(exc)
    suffix = f" (NVML error {code})" if isinstance(code, int) else ""
    return GpuQueryError(host, f"{doing}: {reason}{suffix}", output=str(exc))


# ---- hardware health (issue 12): the same fields nvidia-smi -q prints ------------------------

# NVML's nvmlDeviceGpuRecoveryAction_t, as nvidia-smi -q words them.
_RECOVERY_ACTIONS = {
    0: "None",
    1: "Reset",
    2: "Reboot",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "Reboot",
}
# The return codes that mean "this device or this driver does not offer it": the
# field stays unknown (None), never "no". NVML_ERROR_FUNCTION_NOT_FOUND: a driver's NVML
# older than the function nvidia-ml-py calls.
_FUNCTION_NOT_FOUND = 13
_NOT_OFFERED = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
# NVML_ERROR_RESET_REQUIRED: "GPU requires restart". Any query of the device answering it
# is the driver saying the GPU needs a reset, as nvidia-smi -q's Reset Required: Yes.
_RESET_REQUIRED = 16


def nvml_session(nvml: Any, what: str, read: Callable[[Any], T]) -> T:
    """NVML initialised, ``read(lib)``, NVML shut down: what ``read`` returned, or
    ``GpuQueryError`` saying which NVML step failed (``what``: the query's name). ``nvml``:
    the module (None: the real ``pynvml``). The library mismatch is an ``NVMLError`` too."""
    lib = nvml if nvml is not None else _import_pynvml()
    errors: tuple[type[BaseException], ...] = (
        lib.NVMLError,
        getattr(lib, "NVMLLibraryMismatchError", lib.NVMLError),
    )
    try:
        lib.nvmlInit()
    except errors as exc:
        raise _error("local", "could not initialise NVML", exc) from exc
    try:
        return read(lib)
    except errors as exc:
        raise _error("local", f"an NVML {what} query failed", exc) from exc
    finally:
        try:
            lib.nvmlShutdown()
        except errors:
            pass


def probe_local_health(nvml: Any = None) -> tuple[GpuReading, ...]:
    """Each local GPU's ECC counts, pending page retirement, row remaps and recovery
    action, through NVML. A query the device does not support leaves that field unknown
    (None), as nvidia-smi's ``N/A``; any other failure raises ``GpuQueryError``."""

    def read(lib: Any) -> tuple[GpuReading, ...]:
        return tuple(
            _read_health(lib, lib.nvmlDeviceGetHandleByIndex(i))
            for i in range(lib.nvmlDeviceGetCount())
        )

    return nvml_session(nvml, "health", read)


class LocalGpuHealth:
    """The health reads of the GPUs of the machine the bot runs on, for a run's GPU
    check (``bot.engine.executor``): NVML, off the event loop. ``nvml``: the module
    (None: the real ``pynvml``; tests pass a fake at the library boundary)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    async def read(self) -> tuple[GpuReading, ...]:
        """As ``probe_local_health``; raises ``GpuQueryError`` when NVML cannot be used."""
        return await asyncio.to_thread(probe_local_health, self._nvml)

    async def read_deep(self) -> NvmlDeep:
        """The deep GPU check's readings (``bot.hosts.nvml_deep``), for a host run's deep
        check step; raises ``GpuQueryError`` when NVML cannot be used."""
        from bot.hosts.nvml_deep import probe_local_deep  # it imports this module

        return await asyncio.to_thread(probe_local_deep, self._nvml)


def _optional(lib: Any, call: Any, *args: Any) -> Any:
    """``call(*args)``, or None where the device does not support it."""
    try:
        return call(*args)
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) == _NOT_SUPPORTED:
            return None
        raise


class _ResetRequired(Exception):
    """A field value of the device answered NVML_ERROR_RESET_REQUIRED."""


def _read_health(lib: Any, handle: Any) -> GpuReading:
    uuid = _text(lib.nvmlDeviceGetUUID(handle))
    try:
        return _read_state(lib, handle, uuid)
    except (lib.NVMLError, _ResetRequired) as exc:
        if not isinstance(exc, _ResetRequired) and getattr(exc, "value", None) != _RESET_REQUIRED:
            raise
        # The driver refuses to answer until the GPU is reset: that is the answer.
        pci = _optional(lib, lib.nvmlDeviceGetPciInfo, handle)
        return GpuReading(
            uuid, normal_pci(_text(pci.busId)) if pci is not None else None, reset_required=True
        )


def _read_state(lib: Any, handle: Any, uuid: str) -> GpuReading:
    uncorrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = _optional(
        lib,
        lib.nvmlDeviceGetTotalEccErrors,
        handle,
        uncorrected,
        getattr(lib, "NVML_VOLATILE_ECC", 0),
    )
    aggregate = _optional(
        lib,
        lib.nvmlDeviceGetTotalEccErrors,
        handle,
        uncorrected,
        getattr(lib, "NVML_AGGREGATE_ECC", 1),
    )
    pending_pages = _optional(lib, lib.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    rows = _optional(lib, lib.nvmlDeviceGetRemappedRows, handle)
    pci = _optional(lib, lib.nvmlDeviceGetPciInfo, handle)
    fields = _fields(lib, handle)
    action = fields.get("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    reset = fields.get("NVML_FI_DEV_RESET_STATUS")
    drain = fields.get("NVML_FI_DEV_DRAIN_AND_RESET_STATUS")
    return GpuReading(
        uuid=uuid,
        pci=normal_pci(_text(pci.busId)) if pci is not None else None,
        volatile_uncorrectable=None if volatile is None else int(volatile),
        aggregate_uncorrectable=None if aggregate is None else int(aggregate),
        retired_pending=None if pending_pages is None else bool(pending_pages),
        remap_pending=None if rows is None else bool(rows[2]),
        remap_failure=None if rows is None else bool(rows[3]),
        recovery_action=None
        if action is None
        else _RECOVERY_ACTIONS.get(action, f"action {action}"),
        reset_required=None if reset is None else bool(reset),
        drain_and_reset=None if drain is None else bool(drain),
    )


# The field values health reads, by the name nvidia-ml-py gives their id: the recovery
# action (R570+), and the reset status nvidia-smi -q prints as GPU Reset Status (drivers
# 535-560; deprecated since for the recovery action, so newer drivers may not answer).
_FIELDS = (
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NVML_FI_DEV_RESET_STATUS",
    "NVML_FI_DEV_DRAIN_AND_RESET_STATUS",
)


def _fields(lib: Any, handle: Any) -> dict[str, int]:
    """The fields of ``_FIELDS`` the device answers, by name; one it does not (a driver
    without it, an nvidia-ml-py that does not name it) is left out: unknown."""
    ids = {name: getattr(lib, name) for name in _FIELDS if hasattr(lib, name)}
    if not ids:
        return {}
    try:
        values = lib.nvmlDeviceGetFieldValues(handle, list(ids.values()))
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) in _NOT_OFFERED:
            return {}
        raise
    out: dict[str, int] = {}
    for name, v in zip(ids, values, strict=True):
        status = getattr(v, "nvmlReturn", 1)
        if status == _RESET_REQUIRED:
            raise _ResetRequired
        if status == 0:
            out[name] = int(v.value.uiVal)
    return out
