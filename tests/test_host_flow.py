"""A host's maintenance (issue 23: ``host reboot``, ``host gpu-reset``) driven by hand-made
outcomes: every branch of ``bot.core.host_flow``, no I/O. The host is test_sequence's pure
model with what maintenance adds: a boot id, a reboot that takes the host away for a few
polls, persistence mode, ``nvidia-smi -r`` and the deep check's reads.

Real output where the bot judges it: ``nvidia-smi -r`` refused and done as
NVIDIA/NVSentinel#1690/#1692 and NVIDIA/gpu-operator#118 show it; ``nvidia-smi -q -x`` is
the captured L4 sample of tests/samples/deep/ (its GPU block repeated per GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.core import host_ops
from bot.core.deep_query import DCGMI_DIAG_ARGV, DEEP_QUERY_ARGV, DeepReading
from bot.core.flows import EndStep, HostOutcome
from bot.core.host_flow import host_flow
from bot.core.host_plan import gpu_indexes, host_service, make_host_plan
from bot.core.phases.actions import AskSudo, DeepStateRead, ReadDeepState, SudoAnswer
from bot.core.plan import Step
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus
from bot.engine.lifecycle import lock_scopes
from bot.errors import InputError
from bot.settings import RouterSettings, ServicePolicySettings, Settings, WindowSettings
from tests.test_sequence import UUIDS, Host, drive, ok

SAMPLES = Path(__file__).parent / "samples"
_XML = (SAMPLES / "deep" / "nvidia_smi_qx_l4_555.xml").read_text()
_HEAD, _REST = _XML.split('<gpu id="', 1)
_GPU = '<gpu id="' + _REST.split("</gpu>", 1)[0] + "</gpu>\n"
_TAIL = _REST.split("</gpu>", 1)[1]
BOOT_A = "8f2c6b1e-4c1d-4e8a-9b3f-0a1b2c3d4e5f"
BOOT_B = "1d9e7f20-6a5b-4c3d-8e9f-aabbccddeeff"
BUS = [f"00000000:{0x18 + i:02X}:00.0" for i in range(8)]

# nvidia-smi -r refused while persistence mode holds the GPU (NVIDIA/NVSentinel#1690).
RESET_IN_USE = (
    "The following GPUs could not be reset:\n"
    "  GPU 00000000:1A:00.0: In use by another client\n\n"
    "1 device is currently being used by one or more other processes (e.g. Fabric\n"
    "Manager, CUDA application, graphics application such as an X server, or a\n"
    "monitoring application such as another instance of nvidia-smi). Please first kill\n"
    "all processes using this device and all compute applications running in the\n"
    "system.\n"
)
# ... and while a process does (NVIDIA/gpu-operator#118).
RESET_PROCESS = (
    "GPU 00000000:C1:00.0 is currently in use by another process.\n\n"
    "1 device is currently being used by one or more other processes (e.g., Fabric "
    "Manager, CUDA application, graphics application such as an X server, or a monitoring "
    "application such as another instance of nvidia-smi). Please first kill all processes "
    "using this device and all compute applications running in the system.\n"
)
RESET_DONE = "GPU 00000000:1A:00.0 was successfully reset.\n"  # NVIDIA/NVSentinel#1692
# ... and an older driver's words for the same (418.87.00; tests/samples/host/README.md).
RESET_OLDER = (SAMPLES / "host" / "nvidia_smi_r_in_use_older_418.txt").read_text()
# nvidia-smi's warning before its rows, exit 14 (tests/test_gpu.py has its sources).
INFOROM = "WARNING: infoROM is corrupted at gpu 0000:1A:00.0"


def deep_xml(gpus: int = 8, narrow: int | None = None) -> str:
    """The captured sample with one GPU block per GPU (each its own uuid), GPU ``narrow``'s
    link at x8 of x16."""
    blocks = []
    for i in range(gpus):
        block = re.sub(r"<uuid>[^<]*</uuid>", f"<uuid>{UUIDS[i]}</uuid>", _GPU)
        if i == narrow:
            block = block.replace(
                "<current_link_width>16x</current_link_width>",
                "<current_link_width>8x</current_link_width>",
            )
        blocks.append(block)
    head = _HEAD.replace(
        "<attached_gpus>1</attached_gpus>", f"<attached_gpus>{gpus}</attached_gpus>"
    )
    return head + "".join(blocks).rstrip("\n") + _TAIL


@dataclass
class MaintainedHost(Host):
    boot_id: str = BOOT_A
    reboot_exit: int | None = None  # None: the session dies under `systemctl reboot`
    reboot_stderr: str = ""
    down_polls: int = 2  # boot id reads that find the host away, after the reboot
    never_back: bool = False
    other_key: bool = False  # it comes back with another host key
    persistence: dict[int, bool] = field(default_factory=lambda: dict.fromkeys(range(8), True))
    # A line nvidia-smi prints before the persistence rows, and the query's exit status.
    persistence_said: tuple[str, int] | None = None
    reset_answer: tuple[int, str] = (0, RESET_DONE)
    narrow_after: int | None = None  # a GPU whose link comes back at x8
    inactive: set[str] = field(default_factory=set)  # units inactive at preflight
    rebooted: bool = False
    resets: list[int] = field(default_factory=list)
    # Where the bot runs on the host: NVML's deep readings (None: NVML fails, saying this).
    nvml_deep: tuple[DeepReading, ...] | None = None
    nvml_error: str = "NVML: Driver/library version mismatch"
    # A `become = "sudo"` host (its executor asks `sudo -n -l`); the argv no rule allows.
    sudo: bool = False
    sudo_missing: set[tuple[str, ...]] = field(default_factory=set)
    sudo_asked: list[tuple[str, ...]] = field(default_factory=list)

    def sudo_answer(self, action: AskSudo) -> SudoAnswer:
        if not self.sudo:
            return SudoAnswer(asked=False)
        self.sudo_asked.append(action.argv)
        if action.argv not in self.sudo_missing:
            return SudoAnswer()
        return SudoAnswer(refused="no rule of the login's allows it", rule=f"LACKS {action.argv}")

    def respond(self, action: Any) -> Any:
        if isinstance(action, AskSudo):
            return self.sudo_answer(action)
        if isinstance(action, ReadDeepState):
            if self.nvml_deep is None:
                return DeepStateRead(nvml_error=self.nvml_error)
            return DeepStateRead(self.nvml_deep, "590.44.01")
        return super().respond(action)

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a == host_ops.BOOT_ID_ARGV:
            return self._boot_id(a)
        if a[-1:] == ("reboot",):
            self.rebooted = True
            if self.reboot_exit is None:
                return CommandResult(a, None, "", "connection lost while running `systemctl`", 0.0)
            return ok(a, stderr=self.reboot_stderr, status=self.reboot_exit)
        if a == host_ops.PERSISTENCE_QUERY_ARGV:
            rows = [
                f"{i}, {BUS[i]}, {'Enabled' if on else 'Disabled'}"
                for i, on in self.persistence.items()
            ]
            said, status = self.persistence_said or ("", 0)
            return ok(a, "".join(f"{ln}\n" for ln in (said, *rows) if ln), status=status)
        if a[0] == "nvidia-smi" and "-pm" in a:
            i = int(a[a.index("-i") + 1])
            self.persistence[i] = a[-1] == "1"
            state = "Enabled" if a[-1] == "1" else "Disabled"
            return ok(a, f"{state} persistence mode for GPU {BUS[i]}.\nAll done.\n")
        if a[:2] == ("nvidia-smi", "-r"):
            i = int(a[a.index("-i") + 1])
            self.resets.append(i)
            status, out = self.reset_answer
            return ok(a, out, status=status) if status == 0 else ok(a, stderr=out, status=status)
        if a == DEEP_QUERY_ARGV:
            narrow = self.narrow_after if (self.rebooted or self.resets) else None
            return ok(a, deep_xml(narrow=narrow))
        if a == DCGMI_DIAG_ARGV:
            return ok(a, stderr="sh: 1: dcgmi: not found\n", status=127)
        if a[:2] == ("systemctl", "show") and any(u in a for u in self.inactive):
            return ok(a, "LoadState=loaded\nActiveState=inactive\nSubState=dead\nMainPID=0\n")
        return super().command(a)

    def _boot_id(self, a: tuple[str, ...]) -> CommandResult:
        if not self.rebooted:
            return ok(a, self.boot_id + "\n")
        if self.never_back or self.down_polls > 0:
            self.down_polls -= 1
            return CommandResult(a, None, "", "cannot connect: Connection refused", 0.0)
        if self.other_key:
            return CommandResult(
                a, None, "", "host key is unknown or has changed", 0.0, host_key_refused=True
            )
        return ok(a, BOOT_B + "\n")


def settings(local: bool = False, **maintenance: Any) -> Settings:
    svc = {
        "unit": "vllm-kimi-k25",
        "python": "/opt/venvs/vllm/bin/python",
        "drain_timeout_s": 10,
        "drain_poll_s": 1,
        "start_timeout_s": 30,
        "health_poll_s": 2,
    }
    return Settings(
        hosts={
            "h1": {"address": "local"}
            if local
            else {"address": "10.0.0.1", "known_hosts": "/tmp/kh"},
            "h2": {"address": "10.0.0.2", "known_hosts": "/tmp/kh"},
            "lb": {"address": "10.0.0.3", "known_hosts": "/tmp/kh"},
        },
        services={
            "kimi": {**svc, "hosts": ["h1", "h2"]},
            "qwen": {**svc, "hosts": ["h1"], "unit": "vllm-qwen", "python": "/opt/q/bin/python"},
        },
        maintenance={"reboot_timeout_s": 60, "reboot_poll_s": 5, **maintenance},
    )


def maintain(
    host: MaintainedHost,
    action: Action = Action.REBOOT,
    gpus: tuple[int, ...] = (),
    local: bool = False,
    **m: Any,
) -> HostOutcome:
    s = settings(local, **m)
    plan = make_host_plan(s, action, "h1", gpus=gpus)
    return drive(host_flow(plan, s.services, s.maintenance, "h1"), host)


def units_started(host: Host) -> list[str]:
    return [a[-1] for a in host.calls if a[:2] == ("systemctl", "start")]


def units_stopped(host: Host) -> list[str]:
    return [a[-1] for a in host.calls if a[:2] == ("systemctl", "stop")]


def ended(host: Host, step: Step) -> list[EndStep]:
    return [n for n in host.notices if isinstance(n, EndStep) and n.step == step]


# ---- the plan ---------------------------------------------------------------------------


def test_the_plan_names_every_service_on_the_host_and_holds_all_their_locks() -> None:
    s = settings()
    plan = make_host_plan(s, Action.REBOOT, "h1")
    assert plan.service == host_service("h1") == "host:h1"
    assert [p.service for p in plan.parts] == ["kimi", "qwen"]
    assert all(p.hosts == ("h1",) for p in plan.parts)  # kimi's h2 is not touched
    assert lock_scopes(plan) == ["service:kimi", "service:qwen", "host:h1"]
    shown = [(str(s.step), s.command) for s in plan.steps]
    assert [step for step, _ in shown].count("stop") == 2
    reboot = dict(shown)["reboot"]
    assert "systemctl reboot" in reboot and "up to 60s" in reboot
    # The approval covers the parts: a unit changed after it is a changed plan.
    assert plan.to_json()["parts"][1]["unit"] == "vllm-qwen"
    qwen = s.services["qwen"].model_copy(update={"unit": "vllm-qwen-2"})
    other = s.model_copy(update={"services": {**s.services, "qwen": qwen}})
    assert make_host_plan(other, Action.REBOOT, "h1").to_json() != plan.to_json()


def test_the_plan_refuses_what_the_config_does_not_have() -> None:
    s = settings()
    with pytest.raises(InputError, match="unknown host `h9`"):
        make_host_plan(s, Action.REBOOT, "h9")
    with pytest.raises(InputError, match="lb carries no configured service"):
        make_host_plan(s, Action.REBOOT, "lb")
    with pytest.raises(InputError, match="GPU indexes only apply to gpu-reset"):
        make_host_plan(s, Action.REBOOT, "h1", gpus=(0,))
    assert gpu_indexes(["3", "0"]) == (0, 3)
    with pytest.raises(InputError, match="named twice"):
        gpu_indexes(["1", "1"])


# ---- reboot -----------------------------------------------------------------------------


def test_reboot_stops_every_service_waits_for_a_new_boot_and_starts_them_again() -> None:
    host = MaintainedHost()
    outcome = maintain(host)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert outcome.state == ServiceState.UP
    assert units_stopped(host) == ["vllm-kimi-k25", "vllm-qwen"]
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]
    # Both stopped before the reboot, both started after it.
    reboot_at = next(i for i, a in enumerate(host.calls) if a[-1:] == ("reboot",))
    starts = [i for i, a in enumerate(host.calls) if a[:2] == ("systemctl", "start")]
    stops = [i for i, a in enumerate(host.calls) if a[:2] == ("systemctl", "stop")]
    assert max(stops) < reboot_at < min(starts)
    (reboot,) = ended(host, Step.REBOOT)
    assert reboot.ok and "boot id 8f2c6b1e → 1d9e7f20" in reboot.summary
    (deep,) = ended(host, Step.DEEP_CHECK)
    assert deep.ok and "dcgm" in deep.detail


def test_a_host_that_comes_back_with_another_key_is_refused_and_nothing_starts() -> None:
    host = MaintainedHost(other_key=True)
    outcome = maintain(host)
    assert outcome.status == HostStatus.FAILED
    assert outcome.state == ServiceState.UNKNOWN
    assert "refused as a different machine" in outcome.summary
    assert units_started(host) == []
    assert not ended(host, Step.DEEP_CHECK)


def test_a_host_that_never_comes_back_fails_at_the_timeout_of_the_injected_clock() -> None:
    host = MaintainedHost(never_back=True)
    outcome = maintain(host, reboot_timeout_s=60, reboot_poll_s=5)
    assert outcome.status == HostStatus.FAILED and outcome.state == ServiceState.UNKNOWN
    assert "no new boot within 60s" in outcome.summary
    assert "kimi, qwen" in outcome.summary  # which services may be down
    polls = [a for a in host.calls if a == host_ops.BOOT_ID_ARGV]
    # Preflight's read, then one every 5 s for 60 s: bounded, never a blind loop.
    assert 11 <= len(polls) - 1 <= 13
    assert units_started(host) == []


def test_a_refused_reboot_starts_the_services_again() -> None:
    host = MaintainedHost(reboot_exit=1, reboot_stderr="Failed to reboot: Access denied\n")
    outcome = maintain(host)
    assert outcome.status == HostStatus.FAILED
    assert "Access denied" in outcome.summary and "nothing was done to h1" in outcome.summary
    assert outcome.state == ServiceState.UP
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]
    assert not any(a == host_ops.BOOT_ID_ARGV for a in host.calls[3:])


def test_a_service_stopped_by_hand_is_not_started_after_the_reboot() -> None:
    host = MaintainedHost(inactive={"vllm-qwen"})
    outcome = maintain(host)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert units_stopped(host) == ["vllm-kimi-k25"]
    assert units_started(host) == ["vllm-kimi-k25"]


def test_a_failed_deep_check_keeps_the_host_out_with_its_services_stopped() -> None:
    host = MaintainedHost(narrow_after=3)
    outcome = maintain(host)
    assert outcome.status == HostStatus.FAILED
    assert outcome.state == ServiceState.STOPPED
    assert "h1 stays out: deep GPU check FAIL" in outcome.summary
    assert "GPU 3" in outcome.summary and "x8" in outcome.summary
    assert "reseat" in outcome.summary  # NVIDIA's action is on the card
    # The boot started the enabled units by itself: they are stopped again.
    assert units_started(host) == []
    assert units_stopped(host) == ["vllm-kimi-k25", "vllm-qwen"] * 2


def test_restore_starts_the_services_of_a_host_that_failed_its_check() -> None:
    host = MaintainedHost(narrow_after=3)
    outcome = maintain(host, on_failed_check="restore")
    assert outcome.status == HostStatus.FAILED
    assert outcome.state == ServiceState.UP
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]


def test_a_cancel_before_anything_stopped_changes_nothing() -> None:
    host = MaintainedHost()
    host.cancel_at = lambda action: type(action).__name__ == "Checkpoint"
    outcome = maintain(host)
    assert outcome.status == HostStatus.CANCELLED
    assert units_stopped(host) == units_started(host) == []
    assert not host.rebooted


def test_a_cancel_before_the_reboot_starts_the_services_again() -> None:
    host = MaintainedHost()
    # Once both services are stopped: the next safe point ends the run there.
    host.cancel_at = lambda action: len(units_stopped(host)) == 2
    outcome = maintain(host)
    assert outcome.status == HostStatus.CANCELLED
    assert not host.rebooted
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]


def nvml_gpu(i: int, width: int = 16) -> DeepReading:
    return DeepReading(UUIDS[i], BUS[i], 5, 5, width, 16, (), True, True)


def test_on_the_bots_own_host_the_deep_check_reads_nvml_not_nvidia_smi() -> None:
    host = MaintainedHost(nvml_deep=tuple(nvml_gpu(i, 8 if i == 5 else 16) for i in range(8)))
    outcome = maintain(host, local=True)
    assert DEEP_QUERY_ARGV not in host.calls
    # NVML's reading judged as nvidia-smi's would be: GPU 5 at x8 keeps the host out.
    assert outcome.status == HostStatus.FAILED and "GPU 5" in outcome.summary


def test_nvml_failing_on_the_bots_own_host_falls_back_and_says_why() -> None:
    host = MaintainedHost()
    outcome = maintain(host, local=True)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert DEEP_QUERY_ARGV in host.calls
    (deep,) = ended(host, Step.DEEP_CHECK)
    assert "Driver/library version mismatch" in deep.detail


# ---- GPU reset --------------------------------------------------------------------------


def test_gpu_reset_turns_persistence_off_resets_once_and_turns_it_back_on() -> None:
    host = MaintainedHost()
    host.persistence[1] = False
    outcome = maintain(host, Action.GPU_RESET, (0, 1))
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    maint = [a[1:] for a in host.calls if a[0] == "nvidia-smi" and ("-pm" in a or "-r" in a)]
    assert maint == [
        ("-i", "0", "-pm", "0"),
        ("-r", "-i", "0"),
        ("-i", "0", "-pm", "1"),
        ("-r", "-i", "1"),  # persistence was off on GPU 1: left so
    ]
    assert host.persistence == {**dict.fromkeys(range(8), True), 1: False}
    assert not host.rebooted


@pytest.mark.parametrize("answer", [RESET_IN_USE, RESET_PROCESS])
def test_a_refused_reset_is_never_retried_and_says_the_host_needs_a_reboot(answer: str) -> None:
    host = MaintainedHost(reset_answer=(255, answer))
    outcome = maintain(host, Action.GPU_RESET, (2,))
    assert outcome.status == HostStatus.FAILED
    assert host.resets == [2]  # once
    assert "needs a reboot (/vllm host reboot h1)" in outcome.summary
    assert "in use by another" in outcome.summary.lower()
    assert outcome.state == ServiceState.STOPPED
    assert host.persistence[2] is True  # restored after the refusal too


def test_a_corrupted_inforom_warning_before_the_persistence_rows_still_resets() -> None:
    """nvidia-smi warns of the infoROM before its rows and exits 14: the rows are good, as
    for the GPU query (the same function sets the warning aside)."""
    host = MaintainedHost(persistence_said=(INFOROM, 14))
    outcome = maintain(host, Action.GPU_RESET, (2,))
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert host.resets == [2] and host.persistence[2] is True


@pytest.mark.parametrize(
    "said",
    [
        ("WARNING: something else is wrong with gpu 0000:1A:00.0", 14),  # not a known warning
        ("", 14),  # exit 14 without the warning
        (INFOROM, 3),  # the warning, but another failure's exit status
    ],
)
def test_a_persistence_query_that_says_anything_else_resets_nothing(said: tuple[str, int]) -> None:
    host = MaintainedHost(persistence_said=said)
    outcome = maintain(host, Action.GPU_RESET, (2,))
    assert outcome.status == HostStatus.FAILED
    assert "cannot read the GPUs' persistence mode" in outcome.summary
    assert host.resets == []


def test_an_exit_0_without_nvidia_smis_words_is_not_a_reset() -> None:
    host = MaintainedHost(reset_answer=(0, "All done.\n"))
    outcome = maintain(host, Action.GPU_RESET, (0,))
    assert outcome.status == HostStatus.FAILED
    assert "needs a reboot" in outcome.summary


def test_a_reset_names_only_gpus_the_host_lists() -> None:
    host = MaintainedHost()
    outcome = maintain(host, Action.GPU_RESET, (9,))
    assert outcome.status == HostStatus.FAILED
    assert "GPU 9 is not listed" in outcome.summary
    assert host.resets == []


# ---- what the output means ---------------------------------------------------------------


def test_reset_verdicts_on_real_output_both_ways() -> None:
    def r(status: int | None, out: str) -> CommandResult:
        return CommandResult(("nvidia-smi", "-r", "-i", "0"), status, out, "", 0.1)

    assert host_ops.reset_verdict(r(0, RESET_DONE + "All done.\n")).ok
    assert host_ops.reset_verdict(r(255, RESET_IN_USE)).end == host_ops.ResetEnd.IN_USE
    assert host_ops.reset_verdict(r(255, RESET_PROCESS)).end == host_ops.ResetEnd.IN_USE
    assert host_ops.reset_verdict(r(255, RESET_OLDER)).end == host_ops.ResetEnd.IN_USE
    assert host_ops.reset_verdict(r(0, "All done.\n")).end == host_ops.ResetEnd.FAILED
    assert host_ops.reset_verdict(r(None, "")).end == host_ops.ResetEnd.LOST


def test_boot_ids_and_persistence_rows() -> None:
    assert host_ops.parse_boot_id(BOOT_A.upper() + "\n") == BOOT_A
    assert host_ops.parse_boot_id("cat: /proc/sys/kernel/random/boot_id: No such file\n") is None
    rows = host_ops.parse_persistence(
        "0, 00000000:18:00.0, Enabled\n1, 00000000:2A:00.0, Disabled\n"
    )
    assert [(g.index, g.enabled) for g in rows] == [(0, True), (1, False)]
    with pytest.raises(ValueError, match="unexpected persistence row"):
        host_ops.parse_persistence("0, 00000000:18:00.0, [N/A]\n")


def test_a_host_runs_policy_is_no_weaker_than_any_of_its_services() -> None:
    base = settings()

    def with_policies(kimi: ServicePolicySettings, qwen: ServicePolicySettings) -> Settings:
        svcs = {
            "kimi": base.services["kimi"].model_copy(update={"policy": kimi}),
            "qwen": base.services["qwen"].model_copy(update={"policy": qwen}),
        }
        return base.model_copy(update={"services": svcs})

    P = ServicePolicySettings
    s = with_policies(
        P(approvers=["S0GPU", "U0ALICE"], min_approvals=2), P(approvers=["S0GPU", "U0BOB"])
    )
    policy = s.policy_for("host:h1")
    assert policy.approvers == ["S0GPU"] and policy.min_approvals == 2
    assert make_host_plan(s, Action.REBOOT, "h1").parts
    # No approver in common: refused at the request, and no click could approve it.
    s = with_policies(P(approvers=["U0ALICE"]), P(approvers=["U0BOB"]))
    with pytest.raises(InputError, match="no approver in common"):
        make_host_plan(s, Action.REBOOT, "h1")
    assert s.policy_for("host:h1").approvers == ["U0NOBODY0"]
    # Different windows: a host run would stop one of them outside its own.
    s = with_policies(P(windows=WindowSettings(open=["daily 01:00-05:00"])), P())
    with pytest.raises(InputError, match="different maintenance windows"):
        make_host_plan(s, Action.REBOOT, "h1")


def test_a_host_that_runs_a_router_is_refused() -> None:
    # Rebooting the router's own host takes routing down for every replica behind it.
    s = settings()
    routed = s.model_copy(
        update={
            "routers": {
                "front": RouterSettings(
                    kind="command",
                    host="h1",
                    drain=["/bin/lb", "out", "{server}"],
                    undrain=["/bin/lb", "in", "{server}"],
                )
            }
        }
    )
    with pytest.raises(InputError, match="h1 is the host of router front"):
        make_host_plan(routed, Action.REBOOT, "h1")
    assert make_host_plan(s, Action.REBOOT, "h1").parts


def test_a_cancel_once_the_reboot_began_is_said_too_late_and_the_services_come_back() -> None:
    host = MaintainedHost()
    host.cancel_at = lambda action: host.rebooted
    outcome = maintain(host)
    assert outcome.status == HostStatus.SUCCEEDED
    assert units_started(host) == ["vllm-kimi-k25", "vllm-qwen"]
    assert "A cancel came after the maintenance had begun" in outcome.summary
