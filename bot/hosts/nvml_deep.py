"""The deep GPU check's readings of the machine the bot runs on (``address = "local"``),
through NVML instead of ``nvidia-smi -q -x`` and ``nvidia-smi nvlink -s``: the same
``DeepReading`` per GPU, judged by the same code.

nvidia-smi's "Max" PCIe generation is ``nvmlDeviceGetMaxPcieLinkGeneration`` (what the
device and the slot can do together; nvidia-smi -q -x prints the GPU's own maximum
apart, as ``max_device_link_gen``: tests/samples/deep's L4 at max 4 of host max 5). A
query the device does not offer (NVML_ERROR_NOT_SUPPORTED, or FUNCTION_NOT_FOUND from
a driver older than nvidia-ml-py) leaves its field None: skipped, never failed. Any
other failure, NVML's initialisation included (no driver, NVML_ERROR_LIB_RM_VERSION_
MISMATCH), raises ``GpuQueryError``: the caller reads nvidia-smi instead and says why.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.core.deep_query import DeepReading, NvLinks
from bot.hosts.nvml import _text, nvml_session

# NVML return codes (nvidia-ml-py's NVML_ERROR_*).
_INVALID_ARGUMENT = 2  # nvmlDeviceGetNvLinkState: a link number past the GPU's links
_NOT_SUPPORTED = 3
_FUNCTION_NOT_FOUND = 13
_NOT_OFFERED = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED: nvmlDeviceGetNvLinkState's "active"
_CAP_VALID = 5  # NVML_NVLINK_CAP_VALID, nvmlDeviceGetNvLinkCapability's "a link"
# The clock event reasons' bits (nvmlClocksEventReason*, the same values as the older
# nvmlClocksThrottleReason*), by the names of deep_query.THROTTLE_REASONS; checked
# against nvidia-ml-py's constants by tests/test_nvml_deep.py.
_GPU_IDLE = 0x01
_REASON_BITS = {
    "hw_slowdown": 0x08,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "sw_thermal_slowdown": 0x20,
}
# nvmlGpuFabricState_t as nvidia-smi -q words it; NOT_SUPPORTED (0) is no fabric.
_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
_COMPLETED = 3


@dataclass(frozen=True, slots=True)
class NvmlDeep:
    driver_version: str | None
    readings: tuple[DeepReading, ...]


def probe_local_deep(nvml: Any = None) -> NvmlDeep:
    """Every local GPU's deep readings; raises ``GpuQueryError`` when NVML cannot be used
    (the caller falls back to nvidia-smi and says why)."""

    def read(lib: Any) -> NvmlDeep:
        driver = _offered(lib, lib.nvmlSystemGetDriverVersion)
        readings = tuple(
            _reading(lib, lib.nvmlDeviceGetHandleByIndex(i))
            for i in range(lib.nvmlDeviceGetCount())
        )
        return NvmlDeep(None if driver is None else _text(driver), readings)

    return nvml_session(nvml, "deep", read)


def _offered(lib: Any, call: Callable[..., Any] | None, *args: Any) -> Any:
    """``call(*args)``, or None where the device or driver does not offer it."""
    if call is None:
        return None  # an nvidia-ml-py without the function
    try:
        return call(*args)
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) in _NOT_OFFERED:
            return None
        raise


def _reading(lib: Any, handle: Any) -> DeepReading:
    pci = _offered(lib, lib.nvmlDeviceGetPciInfo, handle)
    reasons = _offered(
        lib,
        getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        handle,
    )
    persistence = _offered(lib, lib.nvmlDeviceGetPersistenceMode, handle)
    state, status = _fabric(lib, handle)
    return DeepReading(
        uuid=_text(lib.nvmlDeviceGetUUID(handle)),
        pci=_text(pci.busId) if pci is not None else "?",
        pcie_gen=_offered(lib, lib.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_gen_max=_offered(lib, lib.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_width=_offered(lib, lib.nvmlDeviceGetCurrPcieLinkWidth, handle),
        pcie_width_max=_offered(lib, lib.nvmlDeviceGetMaxPcieLinkWidth, handle),
        throttle=()
        if reasons is None
        else tuple(r for r, bit in _REASON_BITS.items() if int(reasons) & bit),
        gpu_idle=None if reasons is None else bool(int(reasons) & _GPU_IDLE),
        persistence=None if persistence is None else persistence == _FEATURE_ENABLED,
        fabric_state=state,
        fabric_status=status,
        nvlink=_nvlink(lib, handle),
    )


# The fabric calls, newest first, each with the structure it fills: the versioned one
# (R550+) and the one before it, for a driver that has only that.
_FABRIC_CALLS = (
    ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
    ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
)


def _fabric(lib: Any, handle: Any) -> tuple[str | None, str | None]:
    """Fabric Manager's state and status of the GPU (NVSwitch systems); None, None where
    the GPU has none or no call answers."""
    for name, struct in _FABRIC_CALLS:
        call, make = getattr(lib, name, None), getattr(lib, struct, None)
        if call is None or make is None:
            continue
        info = make()
        try:
            call(handle, ctypes.byref(info))
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _FUNCTION_NOT_FOUND:
                continue  # a driver older than this call: the one before it
            if code == _NOT_SUPPORTED:
                return None, None
            raise
        return _fabric_words(int(info.state), int(info.status))
    return None, None


def _fabric_words(state: int, status: int) -> tuple[str | None, str | None]:
    words = _FABRIC_STATES.get(state)
    if words is None or state != _COMPLETED:
        return words, None
    return words, "Success" if status == 0 else f"NVML error {status}"


def _nvlink(lib: Any, handle: Any) -> NvLinks | None:
    """Each valid link's state; None where no link answers (no NVLink: a PCIe card)."""
    up: list[int] = []
    down: list[int] = []
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not _link_valid(lib, handle, link):
                continue
            state = lib.nvmlDeviceGetNvLinkState(handle, link)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) in _NOT_OFFERED | {_INVALID_ARGUMENT}:
                continue  # no such link on this GPU, or no NVLink at all
            raise
        (up if state == _FEATURE_ENABLED else down).append(link)
    return NvLinks(tuple(up), tuple(down)) if up or down else None


def _link_valid(lib: Any, handle: Any, link: int) -> bool:
    """NVML_NVLINK_CAP_VALID, as NCCL's RAS diagnostics ask it before a link's state: a
    link number past the GPU's own (12 on an A100, 18 on an H100, of NVML's maximum)
    is not one of its links, whatever state it answers. Not offered: the state decides."""
    call = getattr(lib, "nvmlDeviceGetNvLinkCapability", None)
    if call is None:
        return True
    try:
        return bool(call(handle, link, _CAP_VALID))
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) in _NOT_OFFERED:
            return True
        raise
