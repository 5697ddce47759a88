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
    # Issue 17: the reset-status fields (NVML_FI_DEV_RESET_STATUS, ..._DRAIN_AND_RESET_
    # STATUS): None answers NOT_SUPPORTED for the field; RESET_REQUIRED, a return code
    # every state query of the device answers.
    reset: int | None = None
    drain: int | None = None
    refuses: int | None = None
    fields_fail: int | None = None  # nvmlDeviceGetFieldValues itself raises this code


@dataclass
class HealthNVML(FakeNVML):
    health: dict[str, Health] = field(default_factory=dict)
    unified: bool = False

    # pynvml's constants, so the probe reads them as it does from the real module.
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    NVML_FI_DEV_RESET_STATUS = pynvml.NVML_FI_DEV_RESET_STATUS
    NVML_FI_DEV_DRAIN_AND_RESET_STATUS = pynvml.NVML_FI_DEV_DRAIN_AND_RESET_STATUS

    def __init__(
        self, devices: list[FakeDevice], health: dict[str, Health], unified: bool = False
    ) -> None:
        super().__init__(devices)
        self.health, self.unified = health, unified

    def _h(self, handle: FakeDevice) -> Health:
        h = self.health[str(handle.uuid)]
        if h.refuses is not None:
            raise FakeNVMLError(h.refuses)
        return h

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
        return int(
            self._or_unsupported(h.volatile if counter == pynvml.NVML_VOLATILE_ECC else h.aggregate)
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeDevice) -> int:
        return int(self._or_unsupported(self._h(handle).pages_pending))

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:
        rows: tuple[int, int, int, int] = self._or_unsupported(self._h(handle).rows)
        return rows

    def nvmlDeviceGetPciInfo(self, handle: FakeDevice) -> SimpleNamespace:
        bus = self.health[str(handle.uuid)].bus  # it answers even a GPU needing a reset
        return SimpleNamespace(busId=bus.encode())  # bytes, as older pynvml

    def nvmlDeviceGetFieldValues(self, handle: FakeDevice, ids: list[int]) -> list[SimpleNamespace]:
        h = self._h(handle)
        if h.fields_fail is not None:
            raise FakeNVMLError(h.fields_fail)
        by_id = {
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: h.recovery,
            pynvml.NVML_FI_DEV_RESET_STATUS: h.reset,
            pynvml.NVML_FI_DEV_DRAIN_AND_RESET_STATUS: h.drain,
        }
        return [
            SimpleNamespace(nvmlReturn=NOT_SUPPORTED, value=SimpleNamespace(uiVal=0))
            if by_id[i] is None
            else SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=by_id[i]))
            for i in ids
        ]


def test_health_reads_every_field_nvidia_smi_q_prints() -> None:
    fake = HealthNVML(
        [h200(0), h200(1)],
        {
            "GPU-00000000": Health(),
            "GPU-00000001": Health(
                volatile=2,
                aggregate=5,
                pages_pending=1,
                rows=(0, 1, 1, 0),
                recovery=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
                bus="00000000:5D:00.0",
            ),
        },
    )
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
    fake = HealthNVML([h200(0, procs=[(48301, None)])], {"GPU-00000000": Health()}, unified=True)
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


# --------------------------------------------------------------------------- issue 17, D1

# nvidia-ml-py 13.615.71 (the locked one, pynvml.py) names NVML_FI_DEV_RESET_STATUS (226)
# and NVML_FI_DEV_DRAIN_AND_RESET_STATUS (227), "deprecated, use
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION instead", read with nvmlDeviceGetFieldValues, and
# NVML_ERROR_RESET_REQUIRED (16, "GPU requires restart"); nvidia-smi -q prints the two
# fields as GPU Reset Status on drivers 535-560.


def test_nvml_reset_status_fields_make_the_gpu_critical() -> None:
    fake = HealthNVML(
        [h200(0), h200(1)],
        {
            "GPU-00000000": Health(reset=0, drain=0),
            "GPU-00000001": Health(reset=1, drain=1, recovery=None, bus="00000000:5D:00.0"),
        },
    )
    clean, sick = probe_local_health(fake)
    assert (clean.reset_required, clean.drain_and_reset) == (False, False)
    assert (sick.reset_required, sick.drain_and_reset, sick.recovery_action) == (True, True, None)
    verdict = judge("local", probe_local("local", fake).gpus, (clean, sick), ())
    assert [g.level for g in verdict.gpus] == [Level.OK, Level.CRITICAL]
    assert "drain and reset" in verdict.problems(Level.CRITICAL)[0]


def test_a_device_answering_reset_required_is_a_gpu_needing_a_reset() -> None:
    fake = HealthNVML(
        [h200(0), h200(1)],
        {
            "GPU-00000000": Health(),
            "GPU-00000001": Health(
                refuses=pynvml.NVML_ERROR_RESET_REQUIRED, bus="00000000:5D:00.0"
            ),
        },
    )
    clean, sick = probe_local_health(fake)
    assert sick == GpuReading("GPU-00000001", "0000:5d:00", reset_required=True)
    assert (
        judge("local", probe_local("local", fake).gpus, (clean, sick), ()).gpus[1].level
        == Level.CRITICAL
    )


@pytest.mark.parametrize("code", [NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_field_values_a_driver_does_not_offer_stay_unknown_not_no(code: int) -> None:
    fake = HealthNVML([h200(0)], {"GPU-00000000": Health(reset=1, fields_fail=code)})
    (r,) = probe_local_health(fake)
    assert (r.reset_required, r.drain_and_reset, r.recovery_action) == (None, None, None)
    # The per-field NOT_SUPPORTED of a driver without the reset fields: unknown too.
    (r,) = probe_local_health(HealthNVML([h200(0)], {"GPU-00000000": Health()}))
    assert (r.reset_required, r.drain_and_reset, r.recovery_action) == (None, None, "None")
