"""The leftover-process branches of the flows driven by hand-made outcomes (the pure host
model of tests/test_sequence.py), and the bounded wait for an approver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bot.audit.records import RunRecord
from bot.core.leftovers import Approval
from bot.core.service_state import ServiceState
from bot.core.status import Action, RunStatus, Source
from bot.engine.leftover_gate import LeftoverRequest, ask_bounded
from bot.engine.recovery import interrupted_message
from bot.hosts.base import CommandResult
from tests.test_sequence import Host, ok, run, steps, verbs

OURS = "0::/system.slice/vllm-kimi-k25.service"


class Leftover(Host):
    """The stuck worker (PID 48304, GPU 3) with what ps says of it, and what signals do."""

    def __init__(
        self,
        *,
        cgroup: str = OURS,
        user: str = "vllm",
        state: str = "Sl",
        dies_on: tuple[str, ...] = ("TERM", "KILL"),
        memory_only: bool = False,
        **kw: object,
    ) -> None:
        super().__init__(stuck=True, approval=Approval("U0BOB"), **kw)  # type: ignore[arg-type]
        self.cgroup, self.user, self.state = cgroup, user, state
        self.dies_on, self.memory_only = dies_on, memory_only
        self.alive = True
        self.host_refuses = False
        self.signals: list[tuple[str, ...]] = []

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:2] == ("/bin/sh", "-c") and a[8:9] in (("TERM",), ("KILL",)):
            # What the rule fixes: the tools' absolute paths and the unit.
            assert a[4:8] == ("systemctl", "/usr/bin/ps", "/usr/bin/kill", "vllm-kimi-k25.service")
            if self.host_refuses:  # the host's own judgement of the PID differs
                return ok(a, "48304 refused\n")
            self.signals.append(a[8:])
            self.alive = self.alive and a[8] not in self.dies_on
            return ok(a, "48304 sent\n")
        if a[:3] == ("env", "LC_ALL=C", "ps"):
            if not self.alive:
                return ok(a, status=1)
            return ok(a, f"48304 {self.state} {self.user} Mon Nov 30 13:00:00 2026 {self.cgroup}\n")
        if a[0] == "nvidia-smi" and not a[1].startswith("--query-gpu") and a[1] != "-q":
            if self.memory_only:
                return ok(a, "")  # 96 GB used on GPU 3, and no process listed
            return ok(
                a,
                "48304, VLLM::Worker_TP3, 96000 MiB, GPU-00000003-aaaa-bbbb-cccc-000000000003\n"
                if self.alive
                else "",
            )
        if a[0] == "nvidia-smi" and a[1].startswith("--query-gpu") and not self.alive:
            self.stuck = False  # its memory went with it
        if a[0] == "pgrep" and not self.alive:
            return ok(a, status=1)
        return super().command(a)


def test_the_services_own_worker_is_terminated_with_an_approvers_go() -> None:
    h = Leftover()
    out = run(h, "restart")
    assert out.status == "succeeded", out.summary
    assert [a.pids for a in h.asked] == [(48304,)]
    assert h.signals == [("TERM", "48304:Mon Nov 30 13:00:00 2026")]
    assert ("leftovers", True) in steps(h) and verbs(h) == ["stop", "start"]


def test_a_pid_the_host_refuses_to_signal_fails_the_run_with_no_further_signal() -> None:
    h = Leftover()
    h.host_refuses = True
    out = run(h, "restart")
    assert out.status == "failed"
    assert (
        "the host refused to signal PID(s) 48304: not in vllm-kimi-k25.service's cgroup, "
        "nor a VLLM:: process of its user"
    ) in out.summary
    assert h.signals == [] and ("leftovers", False) in steps(h) and verbs(h) == ["stop"]


def test_one_that_ignores_sigterm_gets_sigkill() -> None:
    h = Leftover(dies_on=("KILL",))
    assert run(h, "restart").status == "succeeded"
    assert [s[0] for s in h.signals] == ["TERM", "KILL"]


def test_one_that_survives_sigkill_needs_a_reset_or_a_reboot() -> None:
    h = Leftover(dies_on=())
    out = run(h, "restart")
    assert out.status == "failed"
    assert "survived SIGKILL (PID 48304 state Sl): it needs a GPU reset or a reboot" in out.summary
    assert out.state == ServiceState.STOPPED and verbs(h) == ["stop"]


class RootUnit(Leftover):
    """A unit with no User= (systemd answers an empty User: it runs as root)."""

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:4] == ("systemctl", "show", "-p", "User"):
            return ok(a, "\n")
        return super().command(a)


def test_a_root_units_vllm_process_outside_its_cgroup_is_not_claimed() -> None:
    # Root's VLLM:: process in a session (an admin's `vllm serve`) is not the root unit's
    # worker for sure: only the unit's cgroup says so. The host's signal script judges
    # the same way (tests/test_leftovers.py), so the approver is never asked for a signal
    # the host would refuse.
    h = RootUnit(cgroup="0::/user.slice/user-0.slice/session-3.scope", user="root")
    out = run(h, "restart")
    assert out.status == "failed" and h.asked == [] and h.signals == []
    assert "user root, cgroup 0::/user.slice/user-0.slice/session-3.scope" in out.summary
    # In the unit's cgroup, root's worker is the service's.
    h = RootUnit(user="root")
    assert run(h, "restart").status == "succeeded" and len(h.signals) == 1


def test_a_process_not_the_services_is_named_and_never_signalled() -> None:
    h = Leftover(cgroup="0::/user.slice/user-1000.slice/session-3.scope", user="alice")
    out = run(h, "restart")
    assert out.status == "failed"
    assert (
        "Processes that are not vllm-kimi-k25's hold its GPUs; they were not signalled"
        in out.summary
    )
    assert "user alice, cgroup 0::/user.slice/user-1000.slice/session-3.scope" in out.summary
    assert h.asked == [] and h.signals == []


def test_memory_with_no_process_needs_a_reset_or_a_reboot() -> None:
    h = Leftover(memory_only=True)
    h.command = _no_workers(h.command)  # type: ignore[method-assign, assignment]
    out = run(h, "restart")
    assert out.status == "failed"
    assert "needs a GPU reset or a reboot" in out.summary
    assert "GPU 3: 96000 MiB used, no process listed" in out.summary
    assert h.asked == [] and h.signals == []


def test_no_approval_ends_the_run_with_the_reason_and_no_signal() -> None:
    h = Leftover()
    h.approval = Approval(None, "nobody approved within 900s (the approval window)")
    out = run(h, "restart")
    assert out.status == "failed"
    assert "not terminated: nobody approved within 900s" in out.summary
    assert h.signals == [] and verbs(h) == ["stop"]


def _no_workers(
    inner: Callable[[tuple[str, ...]], CommandResult],
) -> Callable[[tuple[str, ...]], CommandResult]:
    def command(a: tuple[str, ...]) -> CommandResult:
        if a[0] == "pgrep" and "VLLM" in a[-1]:
            return ok(a, status=1)
        return inner(a)

    return command


# --------------------------------------------------------------------------- the wait


class Never:
    def __init__(self) -> None:
        self.cancelled = False

    async def ask(self, request: LeftoverRequest) -> Approval:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True  # the front end takes its button back here
            raise
        raise AssertionError("unreachable")


REQUEST = LeftoverRequest(7, "gpu-node-1", "?", (48304,))


async def test_the_wait_ends_with_the_window_and_takes_the_question_back() -> None:
    gate = Never()
    answer = await ask_bounded(gate, REQUEST, timeout_s=0.05, cancelled=asyncio.Event())
    assert answer == Approval(None, "nobody approved within 0.05s (the approval window)")
    assert gate.cancelled


async def test_a_cancel_ends_the_wait_at_once() -> None:
    gate, cancel = Never(), asyncio.Event()
    cancel.set()
    answer = await ask_bounded(gate, REQUEST, timeout_s=3600, cancelled=cancel)
    assert answer.approved_by is None and "cancelled" in answer.reason


# --------------------------------------------------------------------------- recovery


@pytest.mark.parametrize(
    ("step", "needle"),
    [
        ("gpu_check", "Nothing was changed"),
        ("leftovers", "The service is STOPPED"),
        ("gpu_recheck", "only the GPU recheck was left"),
    ],
)
def test_a_run_interrupted_in_a_gpu_step_says_what_the_service_may_be(
    step: str, needle: str
) -> None:
    run_ = RunRecord(
        7,
        "kimi-k25",
        Action.REDEPLOY,
        ["gpu-node-1"],
        "U0ALICE",
        Source.CLI,
        RunStatus.INTERRUPTED,
        step,
        None,
        None,
        None,
        "t",
        "t",
        None,
        None,
        None,
        None,
        {},
        None,
        None,
        False,
        [],
        [],
    )
    assert needle in interrupted_message(run_)
