"""Final review of issue 23 ("cut wires", second pass): safety properties of the host flow
that no test held, each named by the mutation of the production code it catches (the
mutation was made, this test failed, the mutation was reverted). Same pure model as
test_host_flow: hand-made outcomes, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.core import host_ops
from bot.core.deep_query import DCGMI_DIAG_ARGV, DEEP_QUERY_ARGV, NVLINK_ARGV
from bot.core.flows import BeginStep, EndStep
from bot.core.phases.actions import Emit
from bot.core.plan import Step
from bot.core.privilege import Privilege, run_as_of
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus
from tests.test_flow_gates import busy
from tests.test_health import query, reset_section
from tests.test_host_flow import (
    BUS,
    RESET_IN_USE,
    MaintainedHost,
    ended,
    maintain,
    units_started,
    units_stopped,
)
from tests.test_sequence import UUIDS, ok

# ---- before the reboot: requests, then the stop, then the GPUs ---------------------------


def test_a_reboot_waits_for_in_flight_requests_before_it_stops_a_service() -> None:
    # Mutation: `part = replace(p.plan, force=True)` for every service, not only a DOWN
    # one (host_flow._stop_all): the stop would cut the requests in flight.
    host = MaintainedHost(metrics=[busy(3, 1), busy(1), busy(0)])
    outcome = maintain(host)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    first, _ = ended(host, Step.REQUESTS)
    assert first.ok and first.summary.startswith("in-flight requests finished after"), first
    reads = [r for r in host.requests if r.url.endswith("/metrics")]
    assert len(reads) >= 3  # the three loads, read before kimi's stop


def test_requests_still_in_flight_at_the_deadline_leave_the_host_untouched() -> None:
    # Same mutation: with --force for all, the reboot would go ahead over the requests.
    host = MaintainedHost(metrics=[busy(2)])
    outcome = maintain(host)
    assert outcome.status == HostStatus.ABORTED
    assert "still in flight" in outcome.summary and "nothing was done to h1" in outcome.summary
    assert units_stopped(host) == [] and not host.rebooted


def test_gpu_memory_is_checked_drained_after_the_stops_and_before_the_reboot() -> None:
    # Mutation: skip drain_clean for a reboot (host_flow._stop_all). The issue: "stops the
    # services; verifies GPU memory drained", for a reboot as for a reset.
    host = MaintainedHost()
    assert maintain(host).status == HostStatus.SUCCEEDED
    marks = [
        (type(n).__name__, n.step)
        for n in host.notices
        if isinstance(n, BeginStep | EndStep) and n.step in (Step.DRAIN, Step.REBOOT)
    ]
    assert marks[:4] == [
        ("BeginStep", Step.DRAIN),
        ("EndStep", Step.DRAIN),
        ("BeginStep", Step.DRAIN),
        ("EndStep", Step.DRAIN),
    ]
    assert marks[4] == ("BeginStep", Step.REBOOT)
    assert all(d.ok for d in ended(host, Step.DRAIN))


def test_a_cancel_after_the_last_drain_is_still_before_the_reboot() -> None:
    # Mutation: drop the checkpoint after the GPU drains (`cancelled before the
    # maintenance`, host_flow._stop_all): a cancel that came once the GPUs were drained
    # would reboot the host anyway, and say the cancel came too late.
    host = MaintainedHost()

    def after_the_last_drain(action: Any) -> bool:
        drain_end = isinstance(action, Emit) and isinstance(action.notice, EndStep)
        return drain_end and action.notice.step == Step.DRAIN and len(ended(host, Step.DRAIN)) == 1

    host.cancel_at = after_the_last_drain
    outcome = maintain(host)
    assert outcome.status == HostStatus.CANCELLED, outcome.summary
    assert "cancelled before the maintenance" in outcome.summary
    assert not host.rebooted
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]


# ---- the rights each command runs with -----------------------------------------------------


def test_the_maintenance_commands_run_as_root_and_the_reads_as_the_login() -> None:
    # Mutation: `reset_argv` (or `reboot_argv`, `persistence_argv`) a plain tuple, not a
    # root Command: on a become = "sudo" host it would run without sudo and be refused.
    # The sudoers tests match the rule's text only; this holds what the flow asks for.
    reset = MaintainedHost()
    maintain(reset, Action.GPU_RESET, (0,))
    reboot = MaintainedHost()
    maintain(reboot)
    root = [
        a
        for a in reset.calls + reboot.calls
        if a[-1:] == ("reboot",) or (a[0] == "nvidia-smi" and ("-pm" in a or "-r" in a))
    ]
    assert {tuple(a) for a in root} == {
        ("systemctl", "reboot"),
        ("nvidia-smi", "-i", "0", "-pm", "0"),
        ("nvidia-smi", "-r", "-i", "0"),
        ("nvidia-smi", "-i", "0", "-pm", "1"),
    }
    assert all(run_as_of(a) == Privilege.ROOT for a in root), root
    reads = (
        host_ops.BOOT_ID_ARGV,
        host_ops.PERSISTENCE_QUERY_ARGV,
        DEEP_QUERY_ARGV,
        NVLINK_ARGV,
        DCGMI_DIAG_ARGV,
    )
    for a in reset.calls + reboot.calls:
        if tuple(a) in reads:
            assert run_as_of(a) == Privilege.NONE, a


# ---- what the audit log's step rows say ------------------------------------------------


def test_a_refused_reset_is_a_failed_gpu_reset_step() -> None:
    # Mutation: `EndStep(Step.GPU_RESET, True, ...)` whatever the reset did (host_steps):
    # the audit row of the step would say ok for a GPU that was not reset.
    host = MaintainedHost(reset_answer=(255, RESET_IN_USE))
    maintain(host, Action.GPU_RESET, (2,))
    (step,) = ended(host, Step.GPU_RESET)
    assert not step.ok and "GPU 2 not reset" in step.summary


# ---- the deep check after a reset -------------------------------------------------------


def test_a_gpu_the_driver_still_says_needs_a_reset_keeps_the_host_out() -> None:
    # Mutation: the deep check's health findings capped at warn (deep_check.judge_health):
    # the issue's `Reset Required` / `GPU Recovery Action` items would not keep a host out.
    # nvidia-smi -q as the 535.247.01 capture of tests/test_health.py prints it.
    host = MaintainedHost(
        health_q=query(
            *(reset_section(BUS[i], UUIDS[i], "Yes" if i == 0 else "No", "No") for i in range(8))
        )
    )
    outcome = maintain(host, Action.GPU_RESET, (3,))
    assert host.resets == [3]
    assert outcome.status == HostStatus.FAILED and outcome.state == ServiceState.STOPPED
    assert "h1 stays out: deep GPU check FAIL" in outcome.summary
    assert "GPU 0" in outcome.summary and "Reset Required: Yes" in outcome.summary
    assert units_started(host) == []


# tests/samples/SOURCES.md: nvidia-smi after a kernel upgrade left no NVIDIA module to load.
NO_DRIVER = (
    Path(__file__).parent / "samples" / "deep" / "nvidia_smi_no_driver_after_kernel_upgrade.txt"
).read_text()


@dataclass
class DriverGoneAfterBoot(MaintainedHost):
    """The boot came up on a kernel without the NVIDIA module: every nvidia-smi fails."""

    def command(self, a: tuple[str, ...]) -> Any:
        if self.rebooted and a[0] == "nvidia-smi":
            return ok(a, NO_DRIVER, status=9)
        return super().command(a)


def test_a_driver_that_did_not_load_after_the_reboot_keeps_the_host_out() -> None:
    # Was: the deep check "ok" (warnings: GPU count not read, nvidia-smi -q failed) and
    # both services started and put back on a host whose GPUs nothing could read.
    host = DriverGoneAfterBoot()
    outcome = maintain(host)
    assert outcome.status == HostStatus.FAILED and outcome.state == ServiceState.STOPPED
    assert "h1 stays out: deep GPU check FAIL" in outcome.summary
    assert "could not be read" in outcome.summary
    assert units_started(host) == []
    (deep,) = ended(host, Step.DEEP_CHECK)
    assert not deep.ok and "matches the kernel module" not in deep.detail


# ---- a reset sudo never ran ----------------------------------------------------------

# What the executor makes of sudo's refusal (bot.core.become.Become.refused), for the
# rule of `-pm 0` missing from the host's drop-in.
SUDO_REFUSED = (
    "sudo refused `nvidia-smi -i 0 -pm 0` as root: a password is required. The host's "
    "sudoers drop-in lacks the host-maintenance rule `/usr/bin/nvidia-smi -i [0-9] -pm 0` "
    "(Cmnd_Alias CHATOPS__HOST_MAINT_ROOT, a GPU's persistence mode off before its reset); install "
    "the output of `python -m bot sudoers` on it (README: non-root hosts)."
)


@dataclass
class NoSudoRule(MaintainedHost):
    """The host's sudoers drop-in lacks the rules of `-pm` and `-r`: sudo runs neither."""

    def command(self, a: tuple[str, ...]) -> Any:
        if a[0] == "nvidia-smi" and ("-pm" in a or "-r" in a):
            said = "sudo: a password is required\n"
            return CommandResult(a, 1, "", said, 0.0, refused=SUDO_REFUSED)
        return super().command(a)


def test_a_reset_sudo_refused_to_run_restarts_the_services_and_names_the_rule() -> None:
    # Was: "GPU 0 not reset: sudo refused ...: the host needs a reboot", the services left
    # STOPPED and the host kept out, for a sudoers line missing: nothing had been done to
    # any GPU, and a reboot (hours for a 1T model) would not have added the rule. As a
    # refused `systemctl reboot` does (docs/reliability.md 23-6): started again, said.
    host = NoSudoRule()
    outcome = maintain(host, Action.GPU_RESET, (0,))
    assert outcome.status == HostStatus.FAILED
    assert "needs a reboot" not in outcome.summary
    assert "nothing was done to h1" in outcome.summary
    assert "lacks the host-maintenance rule" in outcome.summary
    assert host.resets == [] and host.persistence[0] is True
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]
    assert outcome.state == ServiceState.UP


# ---- the parsers on the real captures (tests/samples/host/README.md) ------------------

HOST_SAMPLES = Path(__file__).parent / "samples" / "host"


def _sample(name: str) -> str:
    return (HOST_SAMPLES / name).read_text()


def test_reset_verdicts_of_the_real_nvidia_smi_captures() -> None:
    def verdict(status: int, name: str) -> host_ops.ResetEnd:
        r = CommandResult(("nvidia-smi", "-r", "-i", "0"), status, _sample(name), "", 0.1)
        return host_ops.reset_verdict(r).end

    assert verdict(0, "nvidia_smi_r_done.txt") == host_ops.ResetEnd.DONE
    assert verdict(255, "nvidia_smi_r_in_use_by_client.txt") == host_ops.ResetEnd.IN_USE
    assert verdict(255, "nvidia_smi_r_in_use_by_process.txt") == host_ops.ResetEnd.IN_USE
    # `-pm 0`'s own "All done." with exit 0 is not a reset's words.
    assert verdict(0, "nvidia_smi_pm_0.txt") == host_ops.ResetEnd.FAILED


def test_the_boot_id_as_a_real_kernel_prints_it() -> None:
    said = _sample("boot_id_debian12.txt")
    boot = host_ops.parse_boot_id(said)
    assert boot is not None and boot == said.strip() and len(boot) == 36
    # Anything else is no boot id, so never taken for a new boot.
    assert host_ops.parse_boot_id(said.strip()[:-1]) is None
    assert host_ops.parse_boot_id("") is None
