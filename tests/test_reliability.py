"""The engine-level rows of the fault matrix (docs/reliability.md), end to end.

Real audit DB, the simulated host behind the embedded asyncssh server or a real
OpenSSH sshd, connection faults made by a ``FaultyLink`` (a TCP proxy) between
the engine and the server.  Faults are injected on what really happens: an
event the run emits (a test sink) or a call reaching the host (its call log).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.audit.store import AuditLog, RunRecord
from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.plan import Step
from bot.core.redact import Redactor
from bot.core.service_state import ServiceState
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import RunResult
from bot.engine.recovery import recover
from bot.engine.runtime import Runtime, open_runtime
from bot.errors import LockHeldError
from bot.hosts.fleet import fleet_gpus
from bot.logging_setup import setup_logging
from bot.sim import procfs
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, STATE_DIR_ENV
from tests.polling import eventually
from tests.support.cli import write_toml
from tests.support.sim import MakeSimHost, sim_settings

# ---- helpers ----------------------------------------------------------------------------


class Hooks:
    """A sink that records every event and runs the test's hooks on matching ones:
    the test's handle on the run while it goes on."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self._hooks: list[tuple[Callable[[ev.Event], bool], Callable[[ev.Event], object]]] = []

    def on(self, match: Callable[[ev.Event], bool], do: Callable[[ev.Event], object]) -> None:
        self._hooks.append((match, do))

    def on_step(self, step: Step, do: Callable[[ev.Event], object]) -> None:
        self.on(lambda e: isinstance(e, ev.StepStarted) and e.step == step, do)

    async def handle(self, event: ev.Event) -> None:
        self.events.append(event)
        for match, do in self._hooks:
            if match(event):
                do(event)


class Tee:
    """The terminal's view too, so a failing test shows what the operator would have seen."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks

    async def handle(self, event: ev.Event) -> None:
        for s in self.sinks:
            await s.handle(event)


async def approved(rt: Runtime, requested_by: str = "U0ALICE", **plan: Any) -> int:
    p = rt.engine.plan(Action.REDEPLOY, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by=requested_by, source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    return record.id


async def redeploy(rt: Runtime, hooks: Hooks | None = None, **plan: Any) -> tuple[RunResult, str]:
    out = io.StringIO()
    run_id = await approved(rt, **plan)
    sink = Tee(TerminalSink(out), hooks or Hooks())
    return await rt.engine.execute(run_id, sink), out.getvalue()


def install_checks(kit: SimKit) -> list[float]:
    """When the engine asked the host whether a uv install still runs."""
    return [c.ts for c in kit.calls("pgrep") if c.argv[-1].startswith("^uv pip (install|sync)")]


def uv_processes(kit: SimKit) -> list[int]:
    """Real `uv pip install` processes of this host (as bot/sim/bin/uv runs them)."""
    return [
        p
        for p in procfs.with_env(STATE_DIR_ENV, str(kit.state_dir))
        if (procfs.tool_argv(procfs.cmdline(p)) or [])[:3] == ["uv", "pip", "install"]
    ]


# ---- SSH connection faults ----------------------------------------------------------------


async def test_host_unreachable_at_preflight_aborts_with_the_service_untouched(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(link=True)
    kit.link.refuse()
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt)
        assert result.status == "aborted", out
        assert result.summary.startswith(
            "preflight refused; service untouched: cannot reach "
            f"{kit.hostname} over SSH: cannot connect"
        )
        record = await rt.audit.get_run(result.run_id)
        assert record.status == "aborted" and record.summary == result.summary
        [preflight] = await rt.audit.steps(result.run_id)
        assert (preflight.step, preflight.status) == ("preflight", "failed")
        assert await rt.audit.lock_holder(f"service:{SERVICE}") is None
    assert kit.calls() == [] and kit.unit_state() == "active"


async def test_dead_connection_fails_the_step_within_the_keepalive_window(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # `systemctl stop` blocks for a minute and every timeout is far longer than that:
    # only the keepalive can end the step.  Without it the test hits pytest's timeout.
    kit = await make_sim_host(link=True)
    kit.update_config(stop_delay_s=60.0)
    settings = sim_settings(
        kit,
        tmp_path,
        stop_timeout_s=600,
        command_timeout_s=600,
        host={"keepalive_interval_s": 0.3, "keepalive_count_max": 2},
    )

    async def pull_the_cable() -> None:
        await eventually(
            lambda: ("systemctl", "stop") in [c.argv[:2] for c in kit.calls()],
            "systemctl stop reached the host",
        )
        kit.link.blackhole()

    cable = asyncio.create_task(pull_the_cable())
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt)
        await cable
        assert result.status == "failed", out
        assert "connection lost during systemctl stop" in result.summary
        assert "not responding to keepalive" in result.summary
        assert "may be running, stopping or stopped" in result.summary
        assert f"`/vllm status {SERVICE}`" in result.summary
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert steps["stop"].status == "failed" and "reinstall" not in steps
    assert kit.changes() == ["dry-run", "prefetch", "stop"]


async def test_connection_dropped_mid_drain_reconnects_and_finishes(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(link=True)
    kit.update_config(release_delay_s=0.6)  # the drain polls for over half a second

    def drain_polls() -> int:
        # The GPU check runs nvidia-smi before the stop: count only the calls after it.
        stops = [c.ts for c in kit.calls("systemctl") if c.argv[1] == "stop"]
        return len([c for c in kit.calls("nvidia-smi") if stops and c.ts > stops[0]])

    async def cut_after_two_polls() -> None:
        await eventually(lambda: drain_polls() >= 2, "the drain polled twice")
        kit.link.drop()

    cutter = asyncio.create_task(cut_after_two_polls())
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, version="0.31.0")
        await cutter
        assert result.status == "succeeded", out
        steps = await rt.audit.steps(result.run_id)
        assert [(s.step, s.status) for s in steps] == [
            (n, "ok")
            for n in (
                "preflight",
                "gpu_check",
                "prefetch",
                "requests",
                "stop",
                "drain",
                "reinstall",
                "gate",
                "start",
                "health",
                "readiness",
                "postcheck",
                "gpu_recheck",
            )
        ]
    assert kit.link.accepted >= 2  # the drain went on over a new connection
    assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
    assert kit.installed_version == "0.31.0" and kit.unit_state() == "active"


async def test_connection_dropped_mid_reinstall_waits_for_uv_then_starts(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # Through a real sshd: the cut leaves uv running on the host, as OpenSSH does.  uv
    # stalls until the engine has looked for it twice, so the first look finds it running.
    kit = await make_sim_host(access="sshd", link=True)
    kit.set_faults(uv_stalls=True)
    uv_at_cut: list[list[int]] = []
    at_start: list[tuple[str | None, list[int]]] = []
    hooks = Hooks()

    def cut(event: ev.Event) -> None:
        if not uv_at_cut:
            uv_at_cut.append(uv_processes(kit))
            kit.link.drop()

    async def unstall_once_looked_for() -> None:
        # uv stays stalled until the engine's second look has begun, so its first look
        # (whatever the machine's load) can only have found uv still running.
        await eventually(lambda: len(install_checks(kit)) >= 2, "the engine looked twice")
        kit.set_faults(uv_stalls=False)

    hooks.on(lambda e: isinstance(e, ev.OutputLine) and e.step == Step.REINSTALL, cut)
    hooks.on_step(Step.START, lambda e: at_start.append((kit.installed_version, uv_processes(kit))))
    unstall = asyncio.create_task(unstall_once_looked_for())
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, hooks, version="0.31.0")
        await unstall
        assert result.status == "succeeded", out
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert steps["reinstall"].status == "ok"
        [reinstall] = [
            e for e in hooks.events if isinstance(e, ev.StepFinished) and e.step == Step.REINSTALL
        ]
        assert "connection lost during the reinstall" in reinstall.summary
        assert "uv finished on the host and vllm 0.31.0 is installed" in reinstall.summary
    assert uv_at_cut and uv_at_cut[0], "uv was not running when the link was cut"
    # The service was started only once uv had ended with the new version in place.
    assert at_start == [("0.31.0", [])]
    assert len(install_checks(kit)) >= 2  # the first look found uv still running
    assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
    assert kit.unit_state() == "active"


async def test_connection_dropped_mid_reinstall_that_fails_rolls_back_after_uv_ended(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(access="sshd", link=True)
    kit.update_config(install_duration_s=0.6)
    kit.set_faults(uv_fails=True)  # the download fails a while after the cut
    at_rollback: list[list[int]] = []
    hooks = Hooks()
    hooks.on(
        lambda e: isinstance(e, ev.OutputLine) and e.step == Step.REINSTALL,
        lambda e: kit.link.drop(),
    )
    hooks.on_step(Step.ROLLBACK, lambda e: at_rollback.append(uv_processes(kit)))
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, hooks, version="0.31.0")
        assert result.status == "rolled_back", out
        assert "connection lost during the reinstall" in result.summary
        assert f"vllm was {DEFAULT_VERSION}, not 0.31.0" in result.summary
    assert at_rollback == [[]]  # never two installs into one venv
    assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "rollback", "start"]
    assert kit.installed_version == DEFAULT_VERSION and kit.unit_state() == "active"


# ---- timeouts -----------------------------------------------------------------------------


async def test_install_past_its_timeout_is_killed_and_rolled_back(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(uv_stalls=True)  # the install makes no progress at all
    hooks = Hooks()
    hooks.on(
        lambda e: isinstance(e, ev.StepFinished) and e.step == Step.REINSTALL,
        lambda e: sim_host.set_faults(uv_stalls=False),
    )  # so the rollback can work
    # The limit bounds the prefetch too (its download and import gate, about a second of
    # this machine's time under load): 1 s cut it off on a loaded machine.
    async with open_runtime(sim_settings(sim_host, tmp_path, install_timeout_s=10)) as rt:
        result, out = await redeploy(rt, hooks, version="0.31.0")
        assert result.status == "rolled_back", out
        assert result.summary.startswith(
            "reinstall timed out after 10s (last output: Resolved 44 packages in "
        )
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        reinstall = steps["reinstall"]
        assert (reinstall.status, reinstall.exit_status) == ("failed", 124)
        assert "Resolved 44 packages" in reinstall.output_tail  # the step's last output
        assert steps["rollback_health"].status == "ok"
    assert uv_processes(sim_host) == []  # TERM reached the hung uv on the host
    assert sim_host.changes() == ["dry-run", "prefetch", "stop", "install", "rollback", "start"]
    assert sim_host.installed_version == DEFAULT_VERSION and sim_host.unit_state() == "active"


# ---- cancel -----------------------------------------------------------------------------


async def test_cancel_before_stop_ends_the_run_with_nothing_changed(
    sim_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        hooks = Hooks()
        hooks.on_step(Step.PREFLIGHT, lambda e: rt.lifecycle.request_cancel(e.run_id, "U0CAROL"))
        result, out = await redeploy(rt, hooks)
        assert result.status == "cancelled", out
        assert result.summary == "cancelled before anything was changed"
        record = await rt.audit.get_run(result.run_id)
        assert record.status == "cancelled"
        assert [(d.user, d.decision) for d in await rt.audit.decisions(result.run_id)] == [
            ("U0BOB", "approve"),
            ("U0CAROL", "cancel"),
        ]
        assert await rt.audit.lock_holder(f"service:{SERVICE}") is None
    assert sim_host.changes() == ["dry-run"] and sim_host.unit_state() == "active"


async def test_cancel_during_the_drain_wait_restarts_on_the_installed_version(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(stuck_worker=True)  # without the cancel the drain waits a minute
    settings = sim_settings(sim_host, tmp_path, drain_timeout_s=60, drain_poll_s=1.0)
    async with open_runtime(settings) as rt:
        hooks = Hooks()
        hooks.on_step(Step.DRAIN, lambda e: rt.lifecycle.request_cancel(e.run_id, "U0ALICE"))
        result, out = await redeploy(rt, hooks, version="0.31.0")
        assert result.status == "cancelled", out
        assert result.summary == f"cancelled during drain; service restarted on {DEFAULT_VERSION}"
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert steps["drain"].status == "failed" and steps["health"].status == "ok"
        assert "reinstall" not in steps
        decisions = [(d.user, d.decision) for d in await rt.audit.decisions(result.run_id)]
        assert ("U0ALICE", "cancel") in decisions
    assert sim_host.changes() == ["dry-run", "prefetch", "stop", "start"]
    assert sim_host.installed_version == DEFAULT_VERSION and sim_host.unit_state() == "active"


async def test_cancel_during_the_reinstall_takes_effect_after_it(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.update_config(install_duration_s=0.6)
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        hooks = Hooks()
        # uv's first line: the install is under way on the host when the cancel comes.
        hooks.on(
            lambda e: isinstance(e, ev.OutputLine) and e.step == Step.REINSTALL,
            lambda e: rt.lifecycle.request_cancel(e.run_id, "U0BOB"),
        )
        result, out = await redeploy(rt, hooks, version="0.31.0")
        assert result.status == "cancelled", out
        assert result.summary == "cancelled after the reinstall; service restarted on 0.31.0"
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert (steps["reinstall"].status, steps["reinstall"].exit_status) == ("ok", 0)
        assert "+ vllm==0.31.0" in steps["reinstall"].output_tail  # it ran to its end
        assert steps["health"].status == "ok"
        record = await rt.audit.get_run(result.run_id)
        assert (record.status, record.version_after) == ("cancelled", "0.31.0")
        assert ("U0BOB", "cancel") in [
            (d.user, d.decision) for d in await rt.audit.decisions(result.run_id)
        ]
    assert sim_host.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
    assert sim_host.installed_version == "0.31.0" and sim_host.unit_state() == "active"


# ---- two requests at once -----------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 2], ids=["one-bot", "bot-and-cli"])
async def test_two_redeploys_in_the_same_second_exactly_one_runs(
    sim_host: SimKit, tmp_path: Path, processes: int
) -> None:
    # Two runtimes on one DB file behave like two processes (separate connections).
    settings = sim_settings(sim_host, tmp_path)
    async with open_runtime(settings) as rt1, open_runtime(settings) as rt2:
        rts = [rt1, rt2] if processes == 2 else [rt1, rt1]

        async def request(rt: Runtime, user: str) -> RunRecord | LockHeldError:
            try:
                return await rt.lifecycle.request(
                    rt.engine.plan(Action.REDEPLOY, SERVICE), requested_by=user, source=Source.CLI
                )
            except LockHeldError as exc:
                return exc

        outcomes = await asyncio.gather(
            *(request(rt, user) for rt, user in zip(rts, ("U0ALICE", "U0CAROL"), strict=True))
        )
        won = [o for o in outcomes if isinstance(o, RunRecord)]
        lost = [o for o in outcomes if isinstance(o, LockHeldError)]
        assert len(won) == 1 and len(lost) == 1
        winner, loser_exc = won[0], lost[0]
        # The answer names the run in progress and who started it.
        assert (loser_exc.run_id, loser_exc.requested_by) == (winner.id, winner.requested_by)
        assert f"run #{winner.id}" in str(loser_exc) and winner.requested_by in str(loser_exc)
        # Both requests are recorded: the loser as refused, with its refusal row.
        [loser] = [r for r in await rt1.audit.list_runs() if r.id != winner.id]
        assert loser.status == "refused" and f"run #{winner.id}" in (loser.summary or "")
        [refusal] = await rt1.audit.refusals()
        assert refusal.user == loser.requested_by and f"run #{winner.id}" in refusal.reason

        await rt1.audit.record_decision(winner.id, "U0BOB", Decision.APPROVE)
        assert await rt1.audit.transition(
            winner.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
        )
        result = await rt1.engine.execute(winner.id, Hooks())
        assert result.status == "succeeded"
        assert (
            await rt1.audit.list_runs(
                statuses=[RunStatus.PENDING_APPROVAL, RunStatus.APPROVED, RunStatus.RUNNING]
            )
            == []
        )
        assert await rt1.audit.lock_holder(f"service:{SERVICE}") is None
    assert sim_host.changes() == ["dry-run", "prefetch", "stop", "install", "start"]


async def test_an_approved_run_that_finds_its_locks_taken_ends_refused(
    sim_host: SimKit, tmp_path: Path
) -> None:
    # Belt and braces behind the request-time lock: execute takes the locks again.
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        first = await approved(rt)
        await rt.audit.release_locks(first)  # as if the lock had been lost
        holder = await rt.lifecycle.request(
            rt.engine.plan(Action.RESTART, SERVICE), requested_by="U0CAROL", source=Source.CLI
        )
        with pytest.raises(LockHeldError) as held:
            await rt.engine.execute(first, Hooks())
        assert held.value.run_id == holder.id
        record = await rt.audit.get_run(first)
        assert record.status == "refused" and f"run #{holder.id}" in (record.summary or "")
        assert [r.user for r in await rt.audit.refusals()] == ["U0ALICE"]
    assert sim_host.changes() == []


async def test_a_second_execute_of_a_running_run_leaves_it_alone(
    sim_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        run_id = await approved(rt)
        started = asyncio.Event()
        hooks = Hooks()
        hooks.on_step(Step.PREFLIGHT, lambda e: started.set())
        first = asyncio.create_task(rt.engine.execute(run_id, hooks))
        await started.wait()
        second = await rt.engine.execute(run_id, Hooks())
        assert (second.status, second.summary) == ("running", "not started: run is running")
        holder = await rt.audit.lock_holder(f"service:{SERVICE}")
        assert holder is not None and holder.id == run_id  # its locks were not dropped
        assert rt.lifecycle.request_cancel(run_id, "U0BOB")  # and it can still be cancelled
        assert (await first).status == "cancelled"


async def test_status_and_gpus_never_wait_behind_a_job(sim_host: SimKit, tmp_path: Path) -> None:
    sim_host.set_faults(uv_stalls=True)  # the redeploy sits in its reinstall, holding the locks
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        in_reinstall = asyncio.Event()
        hooks = Hooks()
        hooks.on_step(Step.REINSTALL, lambda e: in_reinstall.set())
        job = asyncio.create_task(redeploy(rt, hooks, version="0.31.0"))
        await in_reinstall.wait()
        holder = await rt.audit.lock_holder(f"service:{SERVICE}")
        assert holder is not None and holder.status == "running"

        p = rt.engine.plan(Action.STATUS, SERVICE)
        record = await rt.lifecycle.request(p, requested_by="U0CAROL", source=Source.CLI)
        assert await rt.audit.transition(
            record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
        )
        status = await rt.engine.execute(record.id, Hooks())
        assert status.status == "succeeded" and "vllm-kimi-k25: inactive" in status.summary
        [gpus] = await fleet_gpus(rt.settings, rt.pool, [sim_host.hostname], 10)
        assert gpus.snapshot is not None and gpus.error is None
        assert not job.done()  # both answered while the job still held the service

        sim_host.set_faults(uv_stalls=False)
        result, out = await job
        assert result.status == "succeeded", out


# ---- kill -9 and restart --------------------------------------------------------------------


def _db_row(db: Path, sql: str) -> tuple[Any, ...] | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(sql).fetchone()  # type: ignore[no-any-return]


async def test_sigkill_mid_reinstall_leaves_a_clean_db_and_restart_interrupts_the_run(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(uv_stalls=True)  # the reinstall goes on until the kill
    config = write_toml(tmp_path / "chatops.toml", sim_host.settings_fragment())
    db = tmp_path / "audit.db"
    env = {
        **os.environ,
        "CHATOPS_CONFIG": str(config),
        "CHATOPS_DB": str(db),
        "PYTHONPATH": str(Path(__file__).parent.parent),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--yes",
        cwd=tmp_path,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        def in_reinstall() -> bool:
            if not db.exists():
                return False
            try:
                row = _db_row(db, "SELECT status FROM steps WHERE step = 'reinstall'")
            except sqlite3.OperationalError:  # the CLI has not created the tables yet
                return False
            return row == ("running",)

        await eventually(in_reinstall, "the CLI reached the reinstall")
        async with AuditLog.open(db) as audit:
            # The CLI is alive: a restarting bot must leave its run alone.
            assert await recover(audit) == []
            [live] = await audit.list_runs()
            assert (live.status, live.current_step) == ("running", "reinstall")
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    assert _db_row(db, "PRAGMA integrity_check") == ("ok",)
    async with AuditLog.open(db) as audit:
        [run] = await audit.list_runs()
        steps = await audit.steps(run.id)
        assert [(s.step, s.status) for s in steps] == [
            ("preflight", "ok"),
            ("gpu_check", "ok"),
            ("prefetch", "ok"),
            ("requests", "ok"),
            ("stop", "ok"),
            ("drain", "ok"),
            ("reinstall", "running"),
        ]
        assert all(s.finished_at and s.duration_s is not None for s in steps[:-1])
        stop = next(s for s in steps if s.step == "stop")
        assert stop.exit_status == 0  # systemctl stop's, as the host returned it
        assert [s.label for s in await audit.snapshots(run.id)] == ["after drain"]
        assert run.version_before == DEFAULT_VERSION

        [interrupted] = await recover(audit)  # the CLI's process is gone now
        assert interrupted.run.id == run.id
        assert (interrupted.run.status, interrupted.run.current_step) == (
            "interrupted",
            "reinstall",
        )
        assert interrupted.run.summary == interrupted.message  # the card shows it too
        assert "during step `reinstall`" in interrupted.message
        assert "STOPPED" in interrupted.message and "does not stop `uv`" in interrupted.message
        assert f"`/vllm status {SERVICE}`" in interrupted.message
        assert (await audit.steps(run.id))[-1].status == "interrupted"
        assert await audit.lock_holder(f"service:{SERVICE}") is None
        assert await recover(audit) == []  # once only


# ---- logs -------------------------------------------------------------------------------


class _Broken:
    def __init__(self, message: str) -> None:
        self.message = message

    async def handle(self, event: ev.Event) -> None:
        raise RuntimeError(self.message)


async def test_logged_exceptions_and_args_are_redacted() -> None:
    literal = "s3cr3t-literal-value"
    token = "xoxb-1234567890-abcdefghij"
    stream = io.StringIO()
    root, quiet = logging.getLogger(), logging.getLogger("asyncssh")
    levels = (root.level, quiet.level)
    handler = setup_logging(Redactor([literal]), stream=stream)
    try:
        sink = ev.BestEffort(_Broken(f"Slack said invalid_auth for {token} ({literal})"))
        await sink.handle(
            ev.RunFinished(1, RunStatus.SUCCEEDED, "done", None, None, ServiceState.UP)
        )
        logging.getLogger("bot.test").warning("retrying with %s", literal)
        quiet.info("Opening SSH connection")  # chatty at INFO: kept out
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        quiet.setLevel(levels[1])
    text = stream.getvalue()
    assert "event sink _Broken failed on RunFinished" in text
    assert "Traceback" in text and "RuntimeError: Slack said invalid_auth for xoxb-***" in text
    assert "retrying with ***" in text
    assert token not in text and literal not in text
    assert "Opening SSH connection" not in text
