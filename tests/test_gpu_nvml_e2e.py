"""Issue 12 on a host the bot runs on (``address = "local"``): the GPU check reads the
GPUs' state through NVML, not ``nvidia-smi -q``, and falls back to ``nvidia-smi -q``
where NVML fails. The Xid lines still come from the kernel log, a command either way.

Through the real engine and audit DB. The simulated host's tools (systemctl, nvidia-smi,
journalctl ...) are this process's own commands, as they are for a bot on the GPU box:
its PATH and state directory are this process's environment. NVML is the fake of
tests/test_nvml_health.py at the library boundary (values as pynvml returns them),
handed to the runtime as production hands it the real pynvml."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.health import Level
from bot.core.status import Action, RunStatus
from bot.engine.gpu_health import read_gpu_health
from bot.engine.runtime import open_runtime
from bot.hosts.fleet import fleet_gpus
from bot.settings import Settings
from bot.sim.forkclient import SOCKET_ENV
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import STATE_DIR_ENV, gpu_uuid
from tests.test_gpu_e2e import run
from tests.test_nvml import FakeDevice, FakeNVMLError, h200
from tests.test_nvml_health import Health, HealthNVML

SICK = 3  # the simulated host's GPU the faults hit (its stuck_gpu)
SICK_BUS = "00000000:61:00.0"  # where its Xid lines say it is


def local_settings(kit: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The simulated host as the bot's own machine: its tools run here, without SSH."""
    env = kit.env()
    for name in ("PATH", STATE_DIR_ENV, "SIM_PYTHON", SOCKET_ENV):
        monkeypatch.setenv(name, env[name])
    return Settings(
        hosts={kit.hostname: {"address": "local"}},
        services={SERVICE: kit.service_settings()},
        db_path=tmp_path / "audit.db",
    )


class RemapsUnreadable(HealthNVML):
    """NVML that lists the GPUs but fails a health query (NVML_ERROR_UNKNOWN)."""

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:
        raise FakeNVMLError(999)


def nvml_of(
    kit: SimKit, sick: Health | None = None, cls: type[HealthNVML] = HealthNVML
) -> HealthNVML:
    """NVML for the simulated host's GPUs (same uuids): all clean but ``sick`` on GPU 3."""
    gpus = kit.state().config.gpus
    devices = [h200(i) for i in range(gpus)]
    for i, d in enumerate(devices):
        d.uuid = gpu_uuid(kit.hostname, i)
    health = {
        str(d.uuid): Health(bus=f"00000000:{0x21 + i:02X}:00.0") for i, d in enumerate(devices)
    }
    if sick is not None:
        health[gpu_uuid(kit.hostname, SICK)] = sick
    return cls(devices, health)


def health_queries(kit: SimKit) -> int:
    return sum(1 for c in kit.calls("nvidia-smi") if c.argv == ("nvidia-smi", "-q"))


@pytest.mark.parametrize(
    ("sick", "needle"),
    [
        (Health(rows=(0, 0, 1, 0), bus=SICK_BUS), "GPU 3: a row remap is pending"),
        (
            Health(volatile=1, aggregate=1, bus=SICK_BUS),
            "GPU 3: 1 uncorrectable ECC error(s) since the last reset",
        ),
    ],
)
async def test_a_critical_gpu_read_from_nvml_refuses_before_any_stop(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sick: Health, needle: str
) -> None:
    kit = sim_host
    settings = local_settings(kit, tmp_path, monkeypatch)
    async with open_runtime(settings, nvml=nvml_of(kit, sick)) as rt:
        result, _ = await run(rt, Action.RESTART)
        steps = await rt.audit.steps(result.run_id)
    assert result.status == RunStatus.ABORTED, result.summary
    # The same words as the sshd host's nvidia-smi -q gives (tests/test_gpu_e2e.py).
    assert "preflight refused; service untouched" in result.summary
    assert needle in result.summary and "reset the GPU" in result.summary
    assert [(s.step, s.status) for s in steps] == [("preflight", "ok"), ("gpu_check", "failed")]
    check = steps[-1]
    assert "GPU health from NVML" in check.output_tail
    assert "NVML (else nvidia-smi -q)" in check.command
    # NVML read the state; nvidia-smi -q never ran; the Xid lines came from the kernel log.
    assert health_queries(kit) == 0
    assert any(c.argv[:2] == ("journalctl", "-k") for c in kit.calls("journalctl"))
    assert kit.changes() == [] and kit.unit_state() == "active"


async def test_nvml_failing_falls_back_to_nvidia_smi_q_and_says_so(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    kit.set_faults(pending_remap=True)  # what nvidia-smi -q will show; NVML cannot
    fake = nvml_of(kit)
    fake.fail = {"nvmlInit": FakeNVMLError(9)}
    settings = local_settings(kit, tmp_path, monkeypatch)
    async with open_runtime(settings, nvml=fake) as rt:
        result, _ = await run(rt, Action.RESTART)
        check = (await rt.audit.steps(result.run_id))[-1]
    assert result.status == RunStatus.ABORTED, result.summary
    assert "GPU 3: a row remap is pending" in result.summary
    assert (check.step, check.status) == ("gpu_check", "failed")
    assert (
        "GPU health from nvidia-smi -q (NVML failed: could not initialise NVML: the "
        "NVIDIA driver is not loaded (NVML error 9))"
    ) in check.output_tail
    assert health_queries(kit) == 1
    assert kit.changes() == [] and kit.unit_state() == "active"


async def test_clean_nvml_lets_the_run_through_and_the_recheck_reads_nvml_too(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    # nvidia-smi -q would refuse: a pass proves the verdict came from NVML.
    kit.set_faults(pending_remap=True)
    settings = local_settings(kit, tmp_path, monkeypatch)
    async with open_runtime(settings, nvml=nvml_of(kit)) as rt:
        result, out = await run(rt, Action.RESTART)
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.SUCCEEDED, out
    # The remap's Xid 63 is still in the kernel log: a warning, as NVML says none pends.
    assert steps["gpu_check"].output_tail.startswith("GPU health from NVML\n")
    assert "Xid 63" in steps["gpu_check"].output_tail
    assert steps["gpu_recheck"].output_tail == "GPU health from NVML"
    assert steps["gpu_recheck"].command.startswith("NVML (else nvidia-smi -q); journalctl")
    assert health_queries(kit) == 0
    assert kit.changes() == ["stop", "start"]


async def test_the_approval_cards_read_at_the_request_is_nvmls_too(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    settings = local_settings(kit, tmp_path, monkeypatch)
    sick = Health(rows=(0, 0, 1, 0), bus=SICK_BUS)
    async with open_runtime(settings, nvml=nvml_of(kit, sick)) as rt:
        (note,) = await read_gpu_health(settings, rt.pool, rt.engine.plan(Action.RESTART, SERVICE))
    assert note.level == Level.CRITICAL and "GPU 3 critical: a row remap is pending" in note.text
    assert health_queries(kit) == 0 and kit.changes() == []


async def test_vllm_gpus_reads_nvml_and_falls_back_to_nvidia_smi_q_keeping_the_mark(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = sim_host
    kit.set_faults(pending_remap=True)  # what nvidia-smi -q shows; the fake NVML does not
    settings = local_settings(kit, tmp_path, monkeypatch)
    levels = []
    for nvml in (nvml_of(kit), nvml_of(kit, cls=RemapsUnreadable)):
        before = health_queries(kit)
        async with open_runtime(settings, nvml=nvml) as rt:
            (row,) = await fleet_gpus(settings, rt.pool, [kit.hostname])
        assert row.snapshot is not None and row.health is not None, row.health_error
        levels.append((row.health.level(), health_queries(kit) - before))
    # NVML read: no remap pends (the kernel log's Xid 63 is a warning), no nvidia-smi -q.
    # NVML failing: nvidia-smi -q read the pending remap; the host kept its mark.
    assert levels == [(Level.WARN, 0), (Level.CRITICAL, 1)]
