"""bot.hosts.nvml_deep: the deep GPU check's readings of the bot's own GPUs through NVML,
driven by a fake NVML module at the library boundary (values and return codes as
nvidia-ml-py gives them), judged by the same code as ``nvidia-smi -q -x``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from bot.core.deep_check import Check, DeepFinding
from bot.core.deep_query import NvLinks
from bot.core.deep_reads import DeepRead, deep_reads, deep_report
from bot.core.health_types import Level
from bot.core.results import CommandResult
from bot.engine.deep_check import deep_check
from bot.engine.runtime import open_runtime
from bot.errors import GpuQueryError
from bot.hosts import nvml_deep
from bot.hosts.nvml_deep import probe_local_deep
from bot.sim.kit import SimKit
from bot.sim.state import gpu_uuid
from tests.test_gpu_nvml_e2e import local_settings
from tests.test_nvml import FakeDevice, FakeNVMLError, h200
from tests.test_nvml_health import Health, HealthNVML

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH


@dataclass
class Deep:
    """One GPU's deep state; None answers NVML_ERROR_NOT_SUPPORTED for that query."""

    gen: int | None = 5
    gen_max: int | None = 5
    width: int | None = 16
    width_max: int | None = 16
    reasons: int | None = pynvml.nvmlClocksEventReasonGpuIdle
    persistence: int | None = pynvml.NVML_FEATURE_ENABLED
    fabric: tuple[int, int] | None = None  # (state, status)
    links: list[int] | None = None  # each link's NVML_FEATURE_*; None: no NVLink
    bus: str = "00000000:18:00.0"


class DeepNVML(HealthNVML):
    """HealthNVML (GPU query and health) with the deep check's queries."""

    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t

    def __init__(self, devices: list[FakeDevice], deep: dict[str, Deep], **kw: Any) -> None:
        super().__init__(devices, {str(d.uuid): Health(bus=deep[str(d.uuid)].bus) for d in devices})
        self.deep = deep
        self.init_fails: int | None = kw.get("init_fails")

    def nvmlInit(self) -> None:
        super().nvmlInit()
        if self.init_fails is not None:
            raise FakeNVMLError(self.init_fails)

    def _n(self, value: int | None) -> int:
        return int(self._or_unsupported(value))

    def _d(self, handle: FakeDevice) -> Deep:
        return self.deep[str(handle.uuid)]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "590.44.01"

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeDevice) -> int:
        return self._n(self._d(h).gen)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeDevice) -> int:
        return self._n(self._d(h).gen_max)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeDevice) -> int:
        return self._n(self._d(h).width)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeDevice) -> int:
        return self._n(self._d(h).width_max)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeDevice) -> int:
        return self._n(self._d(h).reasons)

    def nvmlDeviceGetPersistenceMode(self, h: FakeDevice) -> int:
        return self._n(self._d(h).persistence)

    def nvmlDeviceGetGpuFabricInfoV(self, h: FakeDevice, ref: Any) -> int:
        fabric = self._or_unsupported(self._d(h).fabric)
        info = ref._obj  # the structure behind ctypes.byref, as the C library fills it
        info.state, info.status = fabric
        return 0

    def nvmlDeviceGetNvLinkCapability(self, h: FakeDevice, link: int, cap: int) -> int:
        assert cap == pynvml.NVML_NVLINK_CAP_VALID
        links = self._or_unsupported(self._d(h).links)
        if link >= len(links):
            raise FakeNVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkState(self, h: FakeDevice, link: int) -> int:
        links = self._or_unsupported(self._d(h).links)
        if link >= len(links):
            raise FakeNVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(links[link])


@dataclass
class Host:
    deep: list[Deep] = field(default_factory=lambda: [Deep(), Deep()])

    def nvml(self, **kw: Any) -> DeepNVML:
        devices = [h200(i) for i in range(len(self.deep))]
        return DeepNVML(
            devices, {str(d.uuid): x for d, x in zip(devices, self.deep, strict=True)}, **kw
        )


def _judged(lib: DeepNVML) -> list[DeepFinding]:
    got = probe_local_deep(lib)
    read = _drive(deep_reads("local", got.readings, driver=got.driver_version))
    found = deep_report("local", read, None, None, len(got.readings)).findings
    return [f for f in found if f.check != Check.HEALTH]  # the health check's own tests


def _drive(reads: Any) -> DeepRead:
    """The reads with NVML's readings: only dcgmi is asked (not installed here)."""
    argv = next(reads)
    assert argv == ("dcgmi", "diag", "-r", "1")
    try:
        reads.send(CommandResult(argv, 127, "", "dcgmi: not found", 0.0))
    except StopIteration as stop:
        read: DeepRead = stop.value
        return read
    raise AssertionError("more than dcgmi asked")


def _of(found: list[DeepFinding], check: Check) -> list[DeepFinding]:
    return [f for f in found if f.check == check]


def test_the_reason_bits_are_nvidia_ml_pys() -> None:
    bits = nvml_deep._REASON_BITS
    assert bits["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert bits["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert bits["hw_power_brake_slowdown"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert bits["sw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert nvml_deep._GPU_IDLE == pynvml.nvmlClocksThrottleReasonGpuIdle
    assert nvml_deep._FEATURE_ENABLED == pynvml.NVML_FEATURE_ENABLED
    assert nvml_deep._COMPLETED == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert nvml_deep._INVALID_ARGUMENT == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert nvml_deep._FUNCTION_NOT_FOUND == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


def test_a_healthy_x16_gen5_gpu_is_ok_and_said_to_be_nvmls() -> None:
    lib = Host().nvml()
    got = probe_local_deep(lib)
    assert got.driver_version == "590.44.01"
    r = got.readings[0]
    assert (r.pcie_gen, r.pcie_gen_max, r.pcie_width, r.pcie_width_max) == (5, 5, 16, 16)
    assert (r.throttle, r.gpu_idle, r.persistence, r.fabric_state, r.nvlink) == (
        (),
        True,
        True,
        None,
        None,
    )
    found = _judged(lib)
    assert {f.level for f in found} == {Level.OK}, found
    (src,) = _of(found, Check.NVML)
    assert src.what == "GPU readings from NVML"
    assert lib.calls[-1] == "nvmlShutdown"


def test_an_x8_of_x16_link_fails() -> None:
    found = _judged(Host([Deep(), Deep(width=8)]).nvml())
    (bad,) = [f for f in found if f.level == Level.CRITICAL]
    assert (bad.check, bad.gpu, bad.what) == (Check.PCIE, "GPU 1", "PCIe link x8 of x16")


def test_the_hw_slowdown_bit_fails() -> None:
    reasons = pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    found = _judged(Host([Deep(reasons=reasons)]).nvml())
    (bad,) = [f for f in found if f.level == Level.CRITICAL]
    assert bad.check == Check.THROTTLE and "HW slowdown" in bad.what
    # Busy (no gpu_idle bit) at gen4 of gen5: a warning, as from nvidia-smi.
    (pcie,) = [f for f in _judged(Host([Deep(gen=4, reasons=0)]).nvml()) if f.level == Level.WARN]
    assert pcie.what == "PCIe gen4 of gen5 under load"


def test_not_supported_fields_are_skipped_not_failed() -> None:
    lib = Host([Deep(None, None, None, None, None, None)]).nvml()
    (r,) = probe_local_deep(lib).readings
    assert (r.pcie_gen, r.pcie_width, r.gpu_idle, r.persistence, r.nvlink) == (None,) * 5
    found = _judged(lib)
    assert {f.level for f in found} == {Level.OK}
    assert not _of(found, Check.PERSISTENCE)
    # Skipped and said, as nvidia-smi's N/A is (tests/test_deep_check.py).
    assert [f.what for f in _of(found, Check.PCIE)] == ["PCIe link not reported: not judged"]
    (clocks,) = _of(found, Check.THROTTLE)
    assert clocks.what == "clock event reasons not reported: not judged"
    (nv,) = _of(found, Check.NVLINK)
    assert "no NVLink" in nv.what and "skipped" in nv.what


def test_an_older_nvidia_ml_py_reads_the_throttle_reasons() -> None:
    class Older(DeepNVML):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeDevice) -> int:
            return int(pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)

    devices = [h200(0)]
    lib = Older(devices, {str(devices[0].uuid): Deep()})
    (r,) = probe_local_deep(lib).readings
    assert r.throttle == ("hw_thermal_slowdown",) and r.gpu_idle is False


def test_nvlink_and_fabric_from_nvml() -> None:
    on, off = pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED
    done = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0)
    host = Host([Deep(links=[on] * 18, fabric=done), Deep(links=[on, on, off] + [on] * 15)])
    got = probe_local_deep(host.nvml())
    assert got.readings[0].nvlink == NvLinks(up=tuple(range(18)))
    assert (got.readings[0].fabric_state, got.readings[0].fabric_status) == ("Completed", "Success")
    assert got.readings[1].nvlink == NvLinks(up=(0, 1, *range(3, 18)), down=(2,))
    found = _judged(host.nvml())
    (bad,) = [f for f in found if f.level == Level.CRITICAL]
    assert (bad.check, bad.gpu) == (Check.NVLINK, "GPU 1") and "link(s) 2 inactive" in bad.what
    assert "Fabric Manager" in bad.action


def test_links_past_the_gpus_own_are_not_counted_down() -> None:
    class A100(DeepNVML):
        """12 links of NVML's maximum: past them, CAP_VALID 0 and the state DISABLED."""

        def nvmlDeviceGetNvLinkCapability(self, h: FakeDevice, link: int, cap: int) -> int:
            return int(link < 12)

        def nvmlDeviceGetNvLinkState(self, h: FakeDevice, link: int) -> int:
            return int(pynvml.NVML_FEATURE_ENABLED if link < 12 else pynvml.NVML_FEATURE_DISABLED)

    devices = [h200(0)]
    lib = A100(devices, {str(devices[0].uuid): Deep()})
    (r,) = probe_local_deep(lib).readings
    assert r.nvlink == NvLinks(up=tuple(range(12)))
    assert nvml_deep._CAP_VALID == pynvml.NVML_NVLINK_CAP_VALID


def test_a_driver_without_the_versioned_fabric_call_answers_the_older_one() -> None:
    class OlderDriver(DeepNVML):
        c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t

        def nvmlDeviceGetGpuFabricInfoV(self, h: FakeDevice, ref: Any) -> int:
            raise FakeNVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def nvmlDeviceGetGpuFabricInfo(self, h: FakeDevice, ref: Any) -> int:
            return super().nvmlDeviceGetGpuFabricInfoV(h, ref)

    devices = [h200(0)]
    state = (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0)
    lib = OlderDriver(devices, {str(devices[0].uuid): Deep(fabric=state)})
    (r,) = probe_local_deep(lib).readings
    assert (r.fabric_state, r.fabric_status) == ("In Progress", None)


def test_nvml_init_failing_with_the_mismatch_raises_its_reason() -> None:
    with pytest.raises(GpuQueryError) as e:
        probe_local_deep(Host().nvml(init_fails=MISMATCH))
    assert "driver and NVML versions do not match" in e.value.reason
    assert f"NVML error {MISMATCH}" in e.value.reason


# ---- through bot.engine.deep_check on a local host: the simulated host's tools are this
# process's own commands (tests/test_gpu_nvml_e2e.py), NVML the fake above.


def _local_nvml(kit: SimKit, **kw: Any) -> DeepNVML:
    devices = [h200(i) for i in range(kit.state().config.gpus)]
    for i, d in enumerate(devices):
        d.uuid = gpu_uuid(kit.hostname, i)
    return DeepNVML(devices, {str(d.uuid): Deep() for d in devices}, **kw)


def _deep_calls(kit: SimKit) -> int:
    deep = {("nvidia-smi", "-q", "-x"), ("nvidia-smi", "nvlink", "-s")}
    return sum(1 for c in kit.calls("nvidia-smi") if c.argv in deep)


async def test_a_local_host_reads_nvml_not_nvidia_smi(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    kit.set_faults(pcie_degraded=True)  # what nvidia-smi -q -x would say; NVML does not
    settings = local_settings(kit, tmp_path, monkeypatch)
    async with open_runtime(settings, nvml=_local_nvml(kit)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert _deep_calls(kit) == 0
    (src,) = _of(list(report.findings), Check.NVML)
    assert src.level == Level.OK and src.what == "GPU readings from NVML"
    assert {f.level for f in _of(list(report.findings), Check.PCIE)} == {Level.OK}


async def test_nvml_failing_with_the_mismatch_falls_back_and_says_so(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    kit.set_faults(driver_mismatch=True)
    settings = local_settings(kit, tmp_path, monkeypatch)
    async with open_runtime(settings, nvml=_local_nvml(kit, init_fails=MISMATCH)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert _deep_calls(kit) == 1  # -q -x; it listed no GPU, so no nvlink -s
    (src,) = _of(list(report.findings), Check.NVML)
    assert src.level == Level.WARN
    assert src.what.startswith("NVML failed (could not initialise NVML: the NVIDIA driver and")
    assert "read nvidia-smi -q -x instead" in src.what
    (driver,) = _of(list(report.findings), Check.DRIVER)
    assert driver.level == Level.CRITICAL and "reboot the node" in driver.action
    assert report.level == Level.CRITICAL
