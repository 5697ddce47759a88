"""A host run on an NVSwitch system (issue 23; NVIDIA/NVSentinel#883, #889): after the
reboot or reset, the deep check waits for Fabric Manager to register every GPU with the
fabric, polled every ``reboot_poll_s`` of the flow's injected clock for at most
``fabric_wait_s``, and a GPU still registering then keeps the host out.

The fabric words are the real captures' (tests/test_deep_fabric.py: NVIDIA/gpu-operator
#2511's "In Progress", a set-up note's "Completed"/"Success") put in the L4 XML capture;
the NVLink answers are leptonai/gpud#1085's all-inactive line and the HGX H100 capture of
bottlerocket#4418, per GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bot.core.deep_query import DEEP_QUERY_ARGV, NVLINK_ARGV, DeepReading, NvLinks
from bot.core.flows import EndStep
from bot.core.phases.actions import Progress
from bot.core.plan import Step
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus
from tests.test_deep_fabric import COMPLETED, IN_PROGRESS, fabric_words, with_fabric
from tests.test_host_flow import MaintainedHost, deep_xml, ended, maintain, units_stopped
from tests.test_sequence import NAME, UUIDS, ok

SAMPLES = Path(__file__).parent / "samples" / "deep"
ALL_DOWN = (SAMPLES / "nvidia_smi_nvlink_s_b200_all_inactive.txt").read_text().splitlines()[1]
LINK_UP = (SAMPLES / "nvidia_smi_nvlink_s_h100_hgx.txt").read_text().splitlines()[1]


def nvlink_s(up: bool) -> str:
    """``nvidia-smi nvlink -s`` of the host's 8 GPUs: 18 links up each, or none."""
    out = []
    for i in range(8):
        out.append(f"GPU {i}: {NAME} (UUID: {UUIDS[i]})")
        out += [LINK_UP.replace("Link 0:", f"Link {n}:") for n in range(18)] if up else [ALL_DOWN]
    return "\n".join(out) + "\n"


@dataclass
class NvSwitchHost(MaintainedHost):
    """An HGX host whose GPUs register with the fabric ``done_after`` seconds (of the
    flow's clock) after the first deep read; never, with None."""

    done_after: float | None = 30.0
    first_read: float | None = None
    fabric_reads: int = 0
    last_read: float = 0.0

    def registered(self) -> bool:
        if self.first_read is None:
            self.first_read = self.now
        return self.done_after is not None and self.now - self.first_read >= self.done_after

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a == DEEP_QUERY_ARGV and (self.rebooted or self.resets):
            self.fabric_reads += 1
            self.last_read = self.now
            words = fabric_words(COMPLETED if self.registered() else IN_PROGRESS)
            return ok(a, with_fabric(*words, deep_xml()))
        if a == NVLINK_ARGV:
            return ok(a, nvlink_s(up=self.first_read is not None and self.registered()))
        return super().command(a)


def test_a_fabric_that_registers_within_the_wait_passes_and_the_services_come_back() -> None:
    host = NvSwitchHost(done_after=30.0)
    outcome = maintain(host, fabric_wait_s=120)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert outcome.state == ServiceState.UP
    (check,) = ended(host, Step.DEEP_CHECK)
    assert check.ok and check.summary == "ok", check.summary
    assert "fabric Completed, Success" in check.detail and "18 links active" in check.detail
    # Polled every reboot_poll_s (5 s) of the flow's clock until registered: the first
    # read, six polls (30 s), then the whole check again (its -q -x).
    assert host.fabric_reads == 1 + 6 + 1
    waits = [p for p in host.progress if isinstance(p, Progress) and p.step == Step.DEEP_CHECK]
    assert len(waits) == 5 and "Fabric Manager" in waits[0].text


def test_a_fabric_stuck_in_progress_keeps_the_host_out_after_fabric_wait_s() -> None:
    # Fabric Manager dead at boot (a driver upgraded without its fabricmanager): every
    # GPU stays "In Progress" and CUDA would fail with error 802. Was: a warning, the
    # host back in rotation.
    host = NvSwitchHost(done_after=None)
    outcome = maintain(host, fabric_wait_s=60)
    assert outcome.status == HostStatus.FAILED
    assert outcome.summary.startswith("h1 stays out: deep GPU check FAIL")
    assert re.search(r"fabric In Progress, still after waiting 6[01]s for it", outcome.summary)
    assert "systemctl status nvidia-fabricmanager" in outcome.summary
    # ...and the links all down on a system that reports a fabric: the same failure.
    assert "every NVLink link inactive on every GPU of an NVSwitch system" in outcome.summary
    assert outcome.state == ServiceState.STOPPED
    # Stopped for the reboot, and again once the boot had started them: nothing serves.
    assert units_stopped(host) == ["vllm-kimi-k25", "vllm-qwen"] * 2
    # The wait was bounded by fabric_wait_s of the injected clock: 12 polls of 5 s (and
    # the reads' own 0.1 s each, this host's clock).
    assert host.fabric_reads == 1 + 12
    assert host.first_read is not None and 60 <= host.last_read - host.first_read < 62


def test_no_fabric_state_means_no_wait() -> None:
    # A PCIe host (the L4 capture's fabric N/A): one read, no poll, no wait.
    host = MaintainedHost()
    outcome = maintain(host, fabric_wait_s=120)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert host.calls.count(DEEP_QUERY_ARGV) == 1
    assert not [p for p in host.progress if isinstance(p, Progress) and p.step == Step.DEEP_CHECK]


def test_after_a_gpu_reset_the_wait_is_the_same() -> None:
    host = NvSwitchHost(done_after=None)
    outcome = maintain(host, Action.GPU_RESET, (0,), fabric_wait_s=10)
    assert outcome.status == HostStatus.FAILED and host.resets == [0]
    assert re.search(r"fabric In Progress, still after waiting 1[01]s for it", outcome.summary)
    checks = [n for n in host.notices if isinstance(n, EndStep) and n.step == Step.DEEP_CHECK]
    assert [c.ok for c in checks] == [False]


def test_on_the_bots_own_host_nvml_is_read_again_not_nvidia_smi() -> None:
    # NVML's words for a stuck fabric (bot.hosts.nvml_deep: state 2, "In Progress").
    stuck = tuple(
        DeepReading(UUIDS[i], "?", fabric_state="In Progress", nvlink=NvLinks(all_down=True))
        for i in range(8)
    )
    host = MaintainedHost(nvml_deep=stuck)
    outcome = maintain(host, local=True, fabric_wait_s=20)
    assert outcome.status == HostStatus.FAILED
    assert re.search(r"fabric In Progress, still after waiting 2[01]s for it", outcome.summary)
    assert DEEP_QUERY_ARGV not in host.calls  # NVML answered every read
