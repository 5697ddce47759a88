"""bot.hosts.nvml: the local NVML probe, driven by a fake NVML module at the library boundary."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from bot.core.gpu import Gpu, GpuProcess, drain_verdict
from bot.errors import GpuQueryError
from bot.hosts.nvml import probe_local

MIB = 1024 * 1024
NOT_A_PID = 2**31 - 1  # above any pid_max, so /proc/<pid> cannot exist


class FakeNVMLError(Exception):
    """Same shape as pynvml.NVMLError: constructed from a return code kept in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


class FakeMismatchError(Exception):
    """Like pynvml.NVMLLibraryMismatchError: not an NVMLError subclass."""


@dataclass
class FakeDevice:
    name: str | bytes
    uuid: str | bytes
    used: int
    total: int
    util: int | None  # None: the device answers NOT_SUPPORTED, as in MIG mode
    procs: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNVML:
    """The subset of pynvml that bot.hosts.nvml calls; ``fail`` makes a named call raise a code."""

    NVMLError = FakeNVMLError
    NVMLLibraryMismatchError = FakeMismatchError
    NVML_ERROR_NOT_SUPPORTED = 3

    def __init__(
        self,
        devices: list[FakeDevice],
        names: dict[int, str | bytes] | None = None,
        fail: dict[str, BaseException] | None = None,
    ) -> None:
        self.devices = devices
        self.names = names or {}
        self.fail = fail or {}
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._call("nvmlDeviceGetHandleByIndex")
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        self._call("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str | bytes:
        self._call("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            total=handle.total, used=handle.used, free=handle.total - handle.used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates")
        if handle.util is None:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.procs]

    def nvmlSystemGetProcessName(self, pid: int) -> str | bytes:
        self._call("nvmlSystemGetProcessName")
        if pid not in self.names:
            raise FakeNVMLError(6)  # NVML_ERROR_NOT_FOUND
        return self.names[pid]


def h200(
    i: int,
    *,
    used_mib: int = 3,
    util: int | None = 0,
    procs: list[tuple[int, int | None]] | None = None,
) -> FakeDevice:
    return FakeDevice(
        "NVIDIA H200", f"GPU-{i:08d}", used_mib * MIB, 143771 * MIB, util, procs or []
    )


def test_probe_reads_every_device_and_process() -> None:
    fake = FakeNVML(
        [h200(0, used_mib=96998, util=87, procs=[(48301, 96990 * MIB)]), h200(1)],
        names={48301: "VLLM::Worker_TP0"},
    )
    snap = probe_local("gpu-a1", fake)
    worker = GpuProcess(48301, "VLLM::Worker_TP0", 96990, "GPU-00000000")
    assert snap.host == "gpu-a1"
    assert snap.gpus == (
        Gpu(0, "GPU-00000000", "NVIDIA H200", 96998, 143771, 87, (worker,)),
        Gpu(1, "GPU-00000001", "NVIDIA H200", 3, 143771, 0, ()),
    )
    assert snap.processes == (worker,)
    assert fake.calls[0] == "nvmlInit"
    assert fake.calls[-1] == "nvmlShutdown"
    assert {h.pid for h in drain_verdict(snap, 1024).holders} == {48301}


def test_probe_default_host_name_and_no_devices() -> None:
    fake = FakeNVML([])
    snap = probe_local(nvml=fake)
    assert (snap.host, snap.gpus, snap.processes) == ("local", (), ())
    assert fake.calls == ["nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown"]


def test_probe_converts_bytes_to_mib_rounding_down() -> None:
    device = FakeDevice("H200", "GPU-x", 2 * MIB - 1, 3 * MIB + 5, 1, [(9, MIB - 1)])
    snap = probe_local("h", FakeNVML([device], names={9: "p"}))
    assert (snap.gpus[0].memory_used_mib, snap.gpus[0].memory_total_mib) == (1, 3)
    assert snap.processes[0].used_mib == 0


def test_probe_accepts_bytes_from_older_bindings() -> None:
    device = FakeDevice(b"NVIDIA A100-SXM4-80GB", b"GPU-abc", 0, MIB, 0, [(9, None)])
    snap = probe_local("h", FakeNVML([device], names={9: b"/usr/bin/python3"}))
    assert snap.gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert snap.gpus[0].uuid == "GPU-abc"
    assert snap.processes == (GpuProcess(9, "/usr/bin/python3", None, "GPU-abc"),)


def test_unsupported_utilization_is_none() -> None:
    snap = probe_local("h", FakeNVML([h200(0, util=None)]))
    assert snap.gpus[0].utilization_pct is None


def test_process_name_falls_back_to_proc_comm() -> None:
    me = os.getpid()
    snap = probe_local("h", FakeNVML([h200(0, procs=[(me, MIB), (NOT_A_PID, None)])]))
    comm = Path(f"/proc/{me}/comm").read_text().strip()
    assert comm
    assert [p.name for p in snap.processes] == [comm, "[unknown]"]


def test_empty_nvml_process_name_falls_back_too() -> None:
    me = os.getpid()
    snap = probe_local("h", FakeNVML([h200(0, procs=[(me, MIB)])], names={me: ""}))
    assert snap.processes[0].name == Path(f"/proc/{me}/comm").read_text().strip()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (9, "the NVIDIA driver is not loaded (NVML error 9)"),
        (
            12,
            "the NVML library (libnvidia-ml.so.1) was not found: is the NVIDIA driver "
            "installed? (NVML error 12)",
        ),
        (4, "permission denied (is the bot's user allowed to open /dev/nvidia*?) (NVML error 4)"),
        (
            18,
            "the NVIDIA driver and NVML versions do not match (reboot or reload the driver) "
            "(NVML error 18)",
        ),
        (999, "fake NVML error 999 (NVML error 999)"),
    ],
)
def test_init_failure_is_a_gpu_query_error(code: int, reason: str) -> None:
    fake = FakeNVML([h200(0)], fail={"nvmlInit": FakeNVMLError(code)})
    with pytest.raises(GpuQueryError) as caught:
        probe_local("gpu-a1", fake)
    assert str(caught.value) == f"gpu-a1: could not initialise NVML: {reason}"
    assert caught.value.output == f"fake NVML error {code}"
    assert caught.value.exit_status is None
    assert fake.calls == ["nvmlInit"]  # nothing to shut down


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetComputeRunningProcesses",
    ],
)
def test_query_failure_is_an_error_and_still_shuts_down(call: str) -> None:
    fake = FakeNVML([h200(0)], fail={call: FakeNVMLError(15)})
    with pytest.raises(GpuQueryError) as caught:
        probe_local("gpu-a1", fake)
    assert str(caught.value) == (
        "gpu-a1: an NVML query failed: a GPU has fallen off the bus or has otherwise "
        "become inaccessible (NVML error 15)"
    )
    assert fake.calls[-1] == "nvmlShutdown"


def test_utilization_errors_other_than_not_supported_fail() -> None:
    fake = FakeNVML([h200(0)], fail={"nvmlDeviceGetUtilizationRates": FakeNVMLError(15)})
    with pytest.raises(GpuQueryError, match="fallen off the bus"):
        probe_local("h", fake)


def test_library_mismatch_is_a_gpu_query_error() -> None:
    mismatch = FakeMismatchError("Unversioned function called")
    fake = FakeNVML([h200(0)], fail={"nvmlDeviceGetComputeRunningProcesses": mismatch})
    with pytest.raises(GpuQueryError) as caught:
        probe_local("h", fake)
    assert str(caught.value) == "h: an NVML query failed: Unversioned function called"
    assert fake.calls[-1] == "nvmlShutdown"


def test_shutdown_failure_keeps_the_readings() -> None:
    fake = FakeNVML([h200(0)], fail={"nvmlShutdown": FakeNVMLError(1)})
    assert len(probe_local("h", fake).gpus) == 1


def test_shutdown_failure_does_not_hide_the_query_failure() -> None:
    fake = FakeNVML(
        [h200(0)], fail={"nvmlDeviceGetCount": FakeNVMLError(9), "nvmlShutdown": FakeNVMLError(1)}
    )
    with pytest.raises(GpuQueryError, match="driver is not loaded"):
        probe_local("h", fake)


def test_real_nvml_error_class_works_with_the_probe() -> None:
    # pynvml.NVMLError(9) builds the NVMLError_DriverNotLoaded subclass.
    class RealErrors(FakeNVML):
        NVMLError = pynvml.NVMLError

    fake = RealErrors([h200(0)], fail={"nvmlInit": pynvml.NVMLError(9)})
    with pytest.raises(GpuQueryError) as caught:
        probe_local("h", fake)
    assert (
        str(caught.value) == "h: could not initialise NVML: the NVIDIA driver is not loaded "
        "(NVML error 9)"
    )
    assert caught.value.output == "Driver Not Loaded"


def test_fake_matches_the_real_pynvml_api() -> None:
    called = {name for name in vars(FakeNVML) if name.startswith("nvml")}
    assert called <= set(vars(pynvml))
    assert issubclass(pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError)
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    assert pynvml.NVMLError(12).value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND == 12
    assert pynvml.NVML_ERROR_NOT_SUPPORTED == FakeNVML.NVML_ERROR_NOT_SUPPORTED
    codes = (
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    )
    assert codes == (4, 9, 15, 18)
    assert {f for f, _ in pynvml.c_nvmlMemory_t._fields_} >= {"total", "used"}
    assert "gpu" in {f for f, _ in pynvml.c_nvmlUtilization_t._fields_}
    assert {f for f, _ in pynvml.c_nvmlProcessInfo_t._fields_} >= {"pid", "usedGpuMemory"}


def test_real_pynvml_answers_or_raises_a_gpu_query_error() -> None:
    # Without a driver (CI) this is the library-not-found path through the real
    # bindings; on a GPU host it is a real snapshot.
    try:
        snap = probe_local("here")
    except GpuQueryError as exc:
        assert exc.host == "here"
        assert "NVML" in str(exc)
    else:
        assert all(g.uuid and g.memory_total_mib for g in snap.gpus)
