"""bot.hosts.nvml on the bot's own machine: GPU health (ECC, pages, remaps, recovery
action) and a unified-memory GPU, through a fake NVML at the library boundary (the
fake of tests/test_nvml.py, with the health calls added; values as pynvml returns them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from bot.core.gpu import drain_verdict, memory_summary, render_table
from bot.core.health import GpuReading, Level, judge
from bot.hosts.nvml import probe_local, probe_local_health
from tests.test_nvml import FakeDevice, FakeNVML, FakeNVMLError, h200

NOT_SUPPORTED = 3


@dataclass
class Health:
    volatile: int | None = 0
    aggregate: int | None = 0
    pages_pending: int | None = 0
    rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    recovery: int | None = 0
    bus: str = "00000000:3B:00.0"


@dataclass
class HealthNVML(FakeNVML):
    health: dict[str, Health] = field(default_factory=dict)
    unified: bool = False

    # pynvml's constants, so the probe reads them as it does from the real module.
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

    def __init__(self, devices: list[FakeDevice], health: dict[str, Health],
                 unified: bool = False) -> None:
        super().__init__(devices)
        self.health, self.unified = health, unified

    def _h(self, handle: FakeDevice) -> Health:
        return self.health[str(handle.uuid)]

    @staticmethod
    def _or_unsupported(value: Any) -> Any:
        if value is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return value

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> SimpleNamespace:
        if self.unified:
            raise FakeNVMLError(NOT_SUPPORTED)
        return super().nvmlDeviceGetMemoryInfo(handle)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDevice, kind: int, counter: int) -> int:
        assert kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        h = self._h(handle)
        return int(self._or_unsupported(h.volatile if counter == pynvml.NVML_VOLATILE_ECC
                                        else h.aggregate))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeDevice) -> int:
        return int(self._or_unsupported(self._h(handle).pages_pending))

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:
        rows: tuple[int, int, int, int] = self._or_unsupported(self._h(handle).rows)
        return rows

    def nvmlDeviceGetPciInfo(self, handle: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(busId=self._h(handle).bus.encode())  # bytes, as older pynvml

    def nvmlDeviceGetFieldValues(self, handle: FakeDevice, ids: list[int]
                                 ) -> list[SimpleNamespace]:
        assert ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        action = self._h(handle).recovery
        if action is None:
            return [SimpleNamespace(nvmlReturn=NOT_SUPPORTED, value=SimpleNamespace(uiVal=0))]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=action))]


def test_health_reads_every_field_nvidia_smi_q_prints() -> None:
    fake = HealthNVML([h200(0), h200(1)], {
        "GPU-00000000": Health(),
        "GPU-00000001": Health(volatile=2, aggregate=5, pages_pending=1, rows=(0, 1, 1, 0),
                               recovery=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
                               bus="00000000:5D:00.0")})
    clean, sick = probe_local_health(fake)
    assert clean == GpuReading("GPU-00000000", "0000:3b:00", 0, 0, False, False, False, "None")
    assert sick == GpuReading("GPU-00000001", "0000:5d:00", 2, 5, True, True, False, "Reset")
    verdict = judge("local", probe_local("local", fake).gpus, (clean, sick), ())
    assert [g.level for g in verdict.gpus] == [Level.OK, Level.CRITICAL]


def test_what_a_device_does_not_support_stays_unknown() -> None:
    fake = HealthNVML([h200(0)], {"GPU-00000000": Health(None, None, None, None, None)})
    (r,) = probe_local_health(fake)
    assert r == GpuReading("GPU-00000000", "0000:3b:00")


def test_a_failing_health_query_is_an_error_not_a_clean_gpu() -> None:
    fake = HealthNVML([h200(0)], {"GPU-00000000": Health()})
    fake.fail = {"nvmlInit": FakeNVMLError(9)}
    with pytest.raises(Exception, match="driver is not loaded"):
        probe_local_health(fake)


def test_a_unified_memory_gpu_reads_as_unknown_memory_never_0() -> None:
    fake = HealthNVML([h200(0, procs=[(48301, None)])], {"GPU-00000000": Health()},
                      unified=True)
    snap = probe_local("gb10", fake)
    (gpu,) = snap.gpus
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (None, None)
    assert gpu.memory_not_reported
    assert memory_summary(snap) == "GPU memory not reported (unified memory): n/a"
    _, _, row, total = render_table(snap).split("\n")
    assert row.split()[2:4] == ["n/a", "n/a"] and total.split()[1:3] == ["n/a", "n/a"]
    # A process is listed: judged by processes, it is not drained.
    assert not drain_verdict(snap, 1024).drained
    idle = probe_local("gb10", HealthNVML([h200(0)], {"GPU-00000000": Health()}, unified=True))
    assert drain_verdict(idle, 1024).drained
