"""Issue 12 end to end: GPU health, per-service GPUs, unified memory and leftover workers,
through the real engine and audit DB and the simulated host behind a real OpenSSH sshd
(the embedded server where only the flow's logic is at stake).

What reached the host is read from its own call log: ``changes()`` (stop, start,
install...), ``signalled()`` (every kill) and ``dead()`` (what a signal ended)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.leftovers import Approval
from bot.core.plan import Step
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import RunResult
from bot.engine.leftover_gate import LeftoverGate, LeftoverRequest
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit, fast_config
from bot.sim.state import NEIGHBOUR_PID
from tests.support.sim import MakeSimHost, sim_settings

STUCK = 48304  # Worker_TP3 of the unit running at boot


class Approver:
    """An approver at the gate: lets the run terminate, recording the decision as the
    front ends do; ``asked`` keeps what was asked."""

    def __init__(self, rt: Runtime, user: str | None = "U0BOB") -> None:
        self.rt, self.user = rt, user
        self.asked: list[LeftoverRequest] = []

    async def ask(self, request: LeftoverRequest) -> Approval:
        self.asked.append(request)
        if self.user is None:
            return Approval(None, "the approver said no")
        await self.rt.audit.record_decision(request.run_id, self.user, Decision.TERMINATE)
        return Approval(self.user)


class Hook:
    """A sink that runs ``then`` when ``step`` starts (to change the host mid-run)."""

    def __init__(self, sink: ev.EventSink, step: Step, then: Any) -> None:
        self.sink, self.step, self.then = sink, step, then

    async def handle(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepStarted) and event.step == self.step:
            self.then()
        await self.sink.handle(event)


async def run(
    rt: Runtime,
    action: Action = Action.REDEPLOY,
    *,
    gate: LeftoverGate | None = None,
    sink: ev.EventSink | None = None,
) -> tuple[RunResult, str]:
    out = io.StringIO()
    plan = rt.engine.plan(action, SERVICE)
    record = await rt.lifecycle.request(plan, requested_by="U0ALICE", source=Source.CLI)
    await rt.lifecycle.confirm(record.id, "U0BOB")
    result = await rt.engine.execute(record.id, sink or TerminalSink(out), gate=gate)
    return result, out.getvalue()


async def steps(rt: Runtime, run_id: int) -> list[tuple[str, str]]:
    return [(s.step, s.status) for s in await rt.audit.steps(run_id)]


# --------------------------------------------------------------------------- hardware


async def test_each_hardware_fault_refuses_before_any_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    expected = {
        "xid_79": "Xid 79 (GPU has fallen off the bus)",
        "pending_remap": "GPU 3: a row remap is pending",
        "ecc_uncorrected": "GPU 3: 1 uncorrectable ECC error(s) since the last reset",
    }
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        for fault, needle in expected.items():
            kit.clear_faults()
            kit.set_faults(**{fault: True})
            for action in (Action.REDEPLOY, Action.RESTART):
                result, _ = await run(rt, action)
                assert result.status == RunStatus.ABORTED, (fault, result.summary)
                assert "preflight refused; service untouched" in result.summary
                assert needle in result.summary, (fault, result.summary)
                assert "stop" not in kit.changes() and kit.unit_state() == "active"
                check = (await rt.audit.steps(result.run_id))[-1]
                assert (check.step, check.status) == ("gpu_check", "failed")
                # The evidence: the Xid line as the kernel log printed it.
                assert "kernel: NVRM: Xid (PCI:0000:61:00)" in check.output_tail
            # NVIDIA's action for it is in the summary.
            assert ("reboot the node" if fault == "xid_79" else "reset the GPU") in result.summary
    assert "start" not in kit.changes()


async def test_a_gpu_the_driver_wants_reset_refuses_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    """Issue 17 (D1): nvidia-smi -q's GPU Reset Status says Yes (drivers 535-560; the
    section's shape from public captures, tests/samples/SOURCES.md) and no Xid says
    anything: the GPU check refuses the run with the service untouched."""
    kit = sim_sshd_host
    kit.set_faults(reset_required=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        for action in (Action.REDEPLOY, Action.RESTART):
            result, out = await run(rt, action)
            assert result.status == RunStatus.ABORTED, result.summary
            assert "preflight refused; service untouched" in result.summary
            assert (
                "GPU 3: the driver recommends a drain and reset (GPU Reset Status: Reset "
                "Required: Yes, Drain and Reset Recommended: Yes)"
            ) in result.summary
            assert "then reset it with nvidia-smi -r" in result.summary  # NVIDIA's action
            assert "GPU 3: the driver recommends a drain and reset" in out  # the terminal
            assert await steps(rt, result.run_id) == [("preflight", "ok"), ("gpu_check", "failed")]
            check = (await rt.audit.steps(result.run_id))[-1]
            assert "GPU health from nvidia-smi -q" in check.output_tail
            assert (await rt.audit.get_run(result.run_id)).status == RunStatus.ABORTED
    # Nothing changed on the host (the preflight's dry run aside): never stopped, never
    # installed, still serving.
    assert kit.changes() == ["dry-run"] and kit.unit_state() == "active"


async def test_a_mig_xid_is_a_warning_on_its_gpu_and_the_run_goes_on(
    sim_host: SimKit, tmp_path: Path
) -> None:
    """Issue 17 (D6): an Xid 94 of a MIG instance, "(PCI:0000:61:00 GPU-I:05)", is GPU 3's
    warning, on the step's line, and the restart goes on."""
    sim_host.set_faults(mig_xid=True)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        result, out = await run(rt, Action.RESTART)
        assert result.status == RunStatus.SUCCEEDED, result.summary
        check = next(s for s in await rt.audit.steps(result.run_id) if s.step == "gpu_check")
    assert check.status == "ok"
    assert "warning: GPU 3: Xid 94 (contained ECC error) on MIG instance GPU-I:05" in out
    assert (
        "GPU 3 GPU-" in check.output_tail
        and "warn: Xid 94 (contained ECC error) on MIG instance GPU-I:05" in check.output_tail
    )
    assert "NVRM: Xid (PCI:0000:61:00 GPU-I:05): 94" in check.output_tail


async def test_no_gpus_never_reaches_the_stop(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    sim_sshd_host.set_faults(no_gpus=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, _ = await run(rt)
        assert result.status == RunStatus.ABORTED
        assert "lists no GPU (it printed no row)" in result.summary
        assert await steps(rt, result.run_id) == [("preflight", "ok"), ("gpu_check", "failed")]
    assert "stop" not in sim_sshd_host.changes()


async def test_fewer_gpus_than_the_service_needs_refuses(sim_host: SimKit, tmp_path: Path) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path, gpus=[0, 1, 8, 9])) as rt:
        result, _ = await run(rt, Action.RESTART)
    assert result.status == RunStatus.ABORTED
    assert "the service needs GPUs 0, 1, 8, 9, but gpu-node-1 lists 8 GPUs" in result.summary
    assert "GPU 8, GPU 9 missing" in result.summary
    assert sim_host.changes() == []


async def test_unified_memory_redeploys_judged_by_processes(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    sim_sshd_host.set_faults(unified_memory=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await run(rt)
        assert result.status == RunStatus.SUCCEEDED, out
        drain = next(s for s in await rt.audit.steps(result.run_id) if s.step == "drain")
        assert drain.status == "ok"
        post = next(s for s in await rt.audit.steps(result.run_id) if s.step == "postcheck")
    assert "GPU memory not reported (unified memory): n/a" in out  # the post-check
    assert " 0 of 0 MiB" not in out and "total           0" not in out
    assert "install" in sim_sshd_host.changes() and sim_sshd_host.unit_state() == "active"
    assert post.status == "ok"


async def test_a_new_xid_during_the_run_is_reported_by_the_recheck(
    sim_host: SimKit, tmp_path: Path
) -> None:
    line = "NVRM: Xid (PCI:0000:21:00): 13, pid=48302, name=python3, Graphics Exception"
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        hook = Hook(TerminalSink(io.StringIO()), Step.DRAIN, lambda: sim_host.kernel_message(line))
        result, _ = await run(rt, Action.RESTART, sink=hook)
        assert result.status == RunStatus.SUCCEEDED
        assert (
            "1 NEW Xid error(s) during the run: GPU 1: Xid 13 (graphics engine exception)"
            in result.summary
        )
        recheck = (await rt.audit.steps(result.run_id))[-1]
        assert (recheck.step, recheck.status) == ("gpu_recheck", "failed")
        assert line in recheck.output_tail


# --------------------------------------------------------------------------- leftovers


async def test_orphan_workers_end_on_the_approvers_go_and_the_run_succeeds(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    kit.set_faults(orphan_workers=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        approver = Approver(rt)
        result, out = await run(rt, gate=approver)
        assert result.status == RunStatus.SUCCEEDED, out
        (asked,) = approver.asked
        workers = [48253, *range(48301, 48309)]  # EngineCore and Worker_TP0..7
        assert sorted(asked.pids) == workers
        # SIGTERM to exactly those PIDs, nothing else, no SIGKILL needed.
        assert sorted(kit.signalled()) == sorted(("TERM", p) for p in workers)
        assert kit.dead() == set(workers)
        assert await steps(rt, result.run_id) == [
            ("preflight", "ok"),
            ("gpu_check", "ok"),
            ("prefetch", "ok"),
            ("requests", "ok"),
            ("stop", "ok"),
            ("drain", "failed"),
            ("leftovers", "ok"),
            ("drain", "ok"),
            ("reinstall", "ok"),
            ("gate", "ok"),
            ("start", "ok"),
            ("health", "ok"),
            ("readiness", "ok"),
            ("postcheck", "ok"),
            ("gpu_recheck", "ok"),
        ]
        decisions = [(d.user, d.decision) for d in await rt.audit.decisions(result.run_id)]
        assert ("U0BOB", Decision.TERMINATE) in decisions
    assert kit.changes()[-2:] == ["install", "start"]


async def test_leftovers_nobody_approves_end_the_run_with_the_service_stopped(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(orphan_workers=True)
    async with open_runtime(sim_settings(sim_host, tmp_path, drain_timeout_s=1.0)) as rt:
        result, _ = await run(rt, Action.RESTART, gate=Approver(rt, user=None))
    assert result.status == RunStatus.FAILED
    assert "The leftover processes were not terminated: the approver said no" in result.summary
    assert "STOPPED" in result.summary and sim_host.signalled() == []


async def test_a_d_state_worker_ends_the_run_with_reset_or_reboot(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    sim_sshd_host.set_faults(d_state_worker=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path, drain_timeout_s=1.0)) as rt:
        approver = Approver(rt)
        result, _ = await run(rt, gate=approver)
    assert result.status == RunStatus.FAILED
    assert "needs a GPU reset or a reboot" in result.summary
    assert f"PID {STUCK} (VLLM::Worker_TP3)" in result.summary
    assert "uninterruptible sleep (state D)" in result.summary
    # No signal reaches a process in D state: nobody was asked, nothing was sent.
    assert approver.asked == [] and sim_sshd_host.signalled() == []
    assert "install" not in sim_sshd_host.changes()


# --------------------------------------------------------------------------- two services


def two_services(kit: SimKit, tmp_path: Path, **svc: Any) -> Settings:
    return Settings(
        hosts={kit.hostname: kit.host_settings()},
        services={
            SERVICE: kit.service_settings(gpus=[0, 1, 2, 3], **svc),
            "other": kit.service_settings(unit="vllm-other", gpus=[4, 5, 6, 7]),
        },
        db_path=tmp_path / "audit.db",
    )


async def test_one_service_redeploys_while_the_other_keeps_serving(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(
        access="sshd", config=fast_config(neighbour_unit="vllm-other", neighbour_gpus=(4, 5, 6, 7))
    )
    theirs = {p.pid for p in kit.processes() if p.unit == "vllm-other"}
    assert len(theirs) == 6 and NEIGHBOUR_PID in theirs
    async with open_runtime(two_services(kit, tmp_path)) as rt:
        result, out = await run(rt, gate=Approver(rt))
        assert result.status == RunStatus.SUCCEEDED, out
    # Its VLLM:: workers never blocked the drain, and nothing of it was ever signalled.
    assert ("drain", "ok") in await steps_of(tmp_path, result.run_id)
    assert kit.signalled() == [] and not kit.dead()
    assert {p.pid for p in kit.processes() if p.unit == "vllm-other"} == theirs
    assert [g.used_mib > 80000 for g in kit.gpus()[4:]] == [True] * 4
    assert not any("vllm-other" in " ".join(c.argv) for c in kit.calls("systemctl"))
    # The thread's GPU table marks the other service's GPUs and leaves them out of the total.
    assert "(4)" in out and "another service's GPU" in out


async def test_orphans_beside_another_service_only_ours_are_signalled(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(
        config=fast_config(neighbour_unit="vllm-other", neighbour_gpus=(4, 5, 6, 7))
    )
    kit.set_faults(orphan_workers=True)
    async with open_runtime(two_services(kit, tmp_path)) as rt:
        approver = Approver(rt)
        result, out = await run(rt, Action.RESTART, gate=approver)
        assert result.status == RunStatus.SUCCEEDED, out
    ours = [48253, *range(48301, 48305)]  # EngineCore and Worker_TP0..3 on GPUs 0-3
    assert sorted(approver.asked[0].pids) == ours
    assert sorted(p for _, p in kit.signalled()) == ours


async def steps_of(tmp_path: Path, run_id: int) -> list[tuple[str, str]]:
    from bot.audit.store import AuditLog

    audit = await AuditLog.open(tmp_path / "audit.db")
    try:
        return [(s.step, s.status) for s in await audit.steps(run_id)]
    finally:
        await audit.close()
