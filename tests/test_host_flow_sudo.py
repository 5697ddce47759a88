"""A host run on a ``become = "sudo"`` host asks sudo, before it stops anything, whether
it would run each command the maintenance runs as root (issue 23): a missing rule used to
be found at the reboot or reset step, once every service was stopped (a 1T model reloaded
for nothing). Pure: the host answers ``AskSudo`` as the executor does (``sudo -n -l``);
the real sudo's answers are tests/test_nonroot.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.core import host_ops
from bot.core.phases.actions import AskSudo, SudoAnswer
from bot.core.plan import Step
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus
from bot.settings import MaintenanceSettings
from tests.test_host_flow import MaintainedHost, ended, maintain, units_stopped

M = MaintenanceSettings(reboot_timeout_s=60, reboot_poll_s=5)
REBOOT = host_ops.reboot_argv(M)


@dataclass
class Watched(MaintainedHost):
    """Records how many commands had run when sudo was first asked; ``lose_sudo``: the
    questions get no answer."""

    sudo: bool = True
    asked_after: int | None = None
    lose_sudo: bool = False

    def sudo_answer(self, action: AskSudo) -> SudoAnswer:
        if self.asked_after is None:
            self.asked_after = len(self.calls)
        if self.lose_sudo:
            return SudoAnswer(lost="Connection lost")
        return super().sudo_answer(action)


def _gpu(i: int) -> list[tuple[str, ...]]:
    return [
        host_ops.persistence_argv(M, i, False),
        host_ops.reset_argv(M, i),
        host_ops.persistence_argv(M, i, True),
    ]


def test_a_missing_reboot_rule_refuses_the_run_before_any_service_stops() -> None:
    host = Watched(sudo_missing={REBOOT})
    outcome = maintain(host)
    assert outcome.status == HostStatus.ABORTED
    assert outcome.summary.startswith("preflight refused; host untouched: sudo on h1 would not")
    assert "1 of the 1 commands this run needs as root (`systemctl reboot`" in outcome.summary
    assert "so nothing was stopped" in outcome.summary
    assert f"LACKS {REBOOT}" in outcome.summary  # the executor's rule sentence, as said
    assert units_stopped(host) == [] and not host.rebooted
    (pre,) = ended(host, Step.PREFLIGHT)
    assert not pre.ok and "would not run" in pre.summary
    # Asked after the boot id, the GPUs and the units were read, before anything else.
    assert host.asked_after is not None
    assert [a[:2] for a in host.calls[host.asked_after :]] == []


def test_a_reset_asks_for_each_named_gpu_its_persistence_off_reset_and_on() -> None:
    host = Watched()
    outcome = maintain(host, Action.GPU_RESET, (0, 3))
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert host.sudo_asked == _gpu(0) + _gpu(3)
    (pre,) = ended(host, Step.PREFLIGHT)
    assert pre.ok and pre.summary.endswith("sudo allows all 6 maintenance commands (sudo -n -l)")
    # Asked before the first stop.
    assert host.asked_after is not None
    assert ("systemctl", "stop") not in [a[:2] for a in host.calls[: host.asked_after]]


def test_a_reset_of_every_gpu_asks_for_each_gpu_the_host_lists() -> None:
    host = Watched()
    assert maintain(host, Action.GPU_RESET).status == HostStatus.SUCCEEDED
    assert host.sudo_asked == [argv for i in range(8) for argv in _gpu(i)]


def test_each_refused_command_is_named_and_each_missing_rule_once() -> None:
    host = Watched(sudo_missing={host_ops.reset_argv(M, i) for i in range(8)})
    outcome = maintain(host, Action.GPU_RESET)
    assert outcome.status == HostStatus.ABORTED and outcome.state == ServiceState.UNKNOWN
    assert "8 of the 24 commands" in outcome.summary
    assert "`nvidia-smi -r -i 0`" in outcome.summary and "and 2 more" in outcome.summary
    assert outcome.summary.count("no rule of the login's allows it") == 1
    assert host.resets == [] and units_stopped(host) == []
    assert all(host.persistence.values())  # nothing was turned off


def test_no_answer_from_sudo_refuses_and_stops_nothing() -> None:
    host = Watched(lose_sudo=True)
    outcome = maintain(host)
    assert outcome.status == HostStatus.ABORTED
    assert "cannot ask sudo on h1 whether it would run `systemctl reboot`" in outcome.summary
    assert units_stopped(host) == [] and not host.rebooted


def test_a_host_without_sudo_is_not_asked() -> None:
    host = Watched(sudo=False)
    outcome = maintain(host)
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    assert host.sudo_asked == []
    (pre,) = ended(host, Step.PREFLIGHT)
    assert "sudo" not in pre.summary
