"""The deep GPU check end to end (issue 23) against the simulated host over real sshd:
``bot.engine.deep_check`` as ``gpus --deep`` runs it, each deep fault flagged with
NVIDIA's action, and a healthy idle host (links at gen1) passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.deep_check import Check, DeepFinding, DeepReport
from bot.core.health_types import Level
from bot.engine import deep_check as engine_deep_check
from bot.engine.deep_check import LABEL, deep_check
from bot.engine.runtime import open_runtime
from bot.errors import AuditError, HostError
from bot.sim.kit import SimKit
from tests.support.sim import sim_settings


def _by(report: DeepReport, check: Check) -> list[DeepFinding]:
    return [f for f in report.findings if f.check == check]


async def test_a_healthy_idle_host_passes_and_its_count_is_recorded(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
        assert report.level == Level.OK, report.text()
        # A GPU with no work drops its link to gen1 (power saving, not a finding); the
        # serving ones run at gen5 of gen5.
        assert {f.level for f in _by(report, Check.PCIE)} == {Level.OK}
        (dcgm,) = _by(report, Check.DCGM)
        assert "skipped" in dcgm.what  # no dcgmi on this host: said
        snap = await rt.audit.last_snapshot(kit.hostname, LABEL)
        assert snap is not None and snap.data["gpus"] == len(_by(report, Check.THROTTLE))
        (again,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
        (count,) = _by(again, Check.GPU_COUNT)
        assert count.level == Level.OK and "as last time" in count.what


async def test_degraded_link_throttling_and_a_failing_dcgm_diag_fail_the_host(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    kit.set_faults(pcie_degraded=True, hw_slowdown=True, dcgmi_fails=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert report.level == Level.CRITICAL
    text = report.text()
    assert "FAIL pcie        GPU 3: PCIe link x8 of x16 -> reseat the GPU" in text
    assert "GPU 3: clocks held back: HW slowdown -> check the GPU's cooling" in text
    (dcgm,) = _by(report, Check.DCGM)
    assert dcgm.level == Level.CRITICAL and "Persistence Mode: fail" in dcgm.what
    # Only the faulty GPU is flagged.
    assert {f.gpu for f in report.findings if f.level == Level.CRITICAL and f.gpu} == {"GPU 3"}


async def test_a_driver_library_mismatch_says_reboot_and_a_lost_gpu_count_fails(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])  # the count
        kit.set_faults(driver_mismatch=True, dcgmi_present=True)
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
        (driver,) = _by(report, Check.DRIVER)
        assert driver.level == Level.CRITICAL and "reboot the node" in driver.action
        assert "Driver/library version mismatch" in driver.what
        kit.set_faults(driver_mismatch=False, dcgmi_present=False, xid_79=True)
        (lost,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    (count,) = _by(lost, Check.GPU_COUNT)
    assert count.level == Level.CRITICAL, lost.text()


async def test_an_nvlink_link_down_fails_its_gpu_only(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        (healthy,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
        kit.set_faults(nvlink_down=True)
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert {f.level for f in _by(healthy, Check.NVLINK)} == {Level.OK}
    assert "GPU 0: NVLink: 18 links active" in healthy.text()
    assert report.level == Level.CRITICAL
    (down,) = [f for f in _by(report, Check.NVLINK) if f.level == Level.CRITICAL]
    assert (down.gpu, down.what) == ("GPU 3", "NVLink link(s) 3 inactive, 17 active")
    assert "dcgmi diag -r 2" in down.action


async def test_a_stuck_fabric_warns_as_transitional_when_checked_alone(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # `gpus --deep` cannot tell a boot in progress from a dead Fabric Manager: warnings
    # that say so (the host run waits, then fails it: tests/test_host_e2e.py).
    kit = sim_sshd_host
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        (healthy,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
        kit.set_faults(fabric_stuck=True)
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    # The simulated HGX with its Fabric Manager up: every GPU registered, and passing.
    assert [f.what for f in _by(healthy, Check.FABRIC)] == ["fabric Completed, Success"] * 8
    assert report.level == Level.WARN, report.text()
    assert {f.level for f in _by(report, Check.FABRIC) + _by(report, Check.NVLINK)} == {Level.WARN}
    (first, *_) = _by(report, Check.FABRIC)
    assert "In Progress (transitional" in first.what and "nvidia-fabricmanager" in first.action


async def test_a_host_whose_driver_is_not_loaded_fails_the_deep_check(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # The sim's no_driver: every nvidia-smi exits 9, "couldn't communicate with the NVIDIA
    # driver" (a kernel upgraded without its module). Nothing can say the GPUs are fit.
    kit = sim_sshd_host
    kit.set_faults(no_driver=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert report.level == Level.CRITICAL, report.text()
    (driver,) = _by(report, Check.DRIVER)
    assert driver.level == Level.CRITICAL and "could not be read" in driver.what


async def test_an_audit_log_that_fails_does_not_hide_a_failing_host(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU count is compared with the audit log's last deep check and recorded there.
    # Was: an AuditError from either (a locked or full database) replaced the whole report
    # with one "warn: not read", so a host whose reads had found a x8 link passed `gpus
    # --deep` (exit 0). The findings stand, and the count's trouble is said beside them.
    kit = sim_host
    kit.set_faults(pcie_degraded=True)

    async def failing(*_: object, **__: object) -> None:
        raise AuditError("database is locked")

    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        monkeypatch.setattr(rt.audit, "add_snapshot", failing)
        monkeypatch.setattr(rt.audit, "last_snapshot", failing)
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [kit.hostname])
    assert report.level == Level.CRITICAL, report.text()
    assert "FAIL pcie        GPU 3: PCIe link x8 of x16" in report.text()
    (count,) = _by(report, Check.GPU_COUNT)
    assert count.level == Level.WARN and "database is locked" in count.what


async def test_a_host_whose_check_could_not_run_is_not_a_pass(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host the check could not judge at all is unknown: FAIL, never a warning that lets
    # `gpus --deep` exit 0 (was: "warn not read", as if it had been looked at).
    async def refused(*_: object, **__: object) -> None:
        raise HostError(sim_host.hostname, "the check could not run")

    monkeypatch.setattr(engine_deep_check, "check_host", refused)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        (report,) = await deep_check(rt.settings, rt.pool, rt.audit, [sim_host.hostname])
    assert report.level == Level.CRITICAL and "not read" in report.text()
