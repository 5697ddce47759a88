"""The pieces the reliability tests stand on: the faulty link, the simulator's view of
real processes, a stalled or orphaned uv, the pgrep pattern against the real pgrep,
and the recovery messages."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bot.audit.store import AuditLog
from bot.core import flows as sequence
from bot.core import remote
from bot.core.flows import Flow, HostOutcome, Sleep, Tick
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus, RunStatus, Source
from bot.engine.executor import CancelToken, Executor
from bot.engine.recovery import recover
from bot.errors import HostUnreachableError
from bot.hosts import streams as ssh
from bot.hosts.ssh import SshTransport
from bot.settings import HostSettings, ServiceSettings
from bot.sim import procfs
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, STATE_DIR_ENV
from tests.polling import eventually
from tests.support.sim import MakeSimHost


def transport(kit: SimKit, **overrides: object) -> SshTransport:
    return SshTransport(kit.hostname, HostSettings(**{**kit.host_settings(), **overrides}))


def install_argv(kit: SimKit, spec: str = "vllm==0.31.0") -> tuple[str, ...]:
    return ("uv", "pip", "install", "--python", str(kit.python), "--force-reinstall", spec)


def svc(kit: SimKit) -> ServiceSettings:
    return ServiceSettings(**kit.service_settings())


# ---- the link ---------------------------------------------------------------------------


async def test_link_faults_reach_the_transport_as_lost_connections(
    make_sim_host: MakeSimHost,
) -> None:
    kit = await make_sim_host(link=True)
    t = transport(kit, keepalive_interval_s=0.2, keepalive_count_max=2)
    try:
        assert (await t.run(["echo", "up"], timeout_s=10)).stdout == "up\n"

        def on_host(marker: str) -> bool:
            return any(
                marker in " ".join(procfs.cmdline(p))
                for p in procfs.with_env(STATE_DIR_ENV, str(kit.state_dir))
            )

        running = asyncio.create_task(t.run(["sleep", "61.25"], timeout_s=120))
        await eventually(lambda: on_host("sleep 61.25"), "sleep runs on the host")
        kit.link.drop()
        with pytest.raises(HostUnreachableError, match="connection lost while running `sleep`"):
            await running
        assert (await t.run(["echo", "again"], timeout_s=10)).stdout == "again\n"  # reconnects

        running = asyncio.create_task(t.run(["sleep", "62.25"], timeout_s=120))
        await eventually(lambda: on_host("sleep 62.25"), "sleep runs on the host")
        kit.link.blackhole()
        # Nothing comes back and the socket stays open: only the keepalive ends it.
        with pytest.raises(HostUnreachableError, match="not responding to keepalive"):
            await running

        kit.link.refuse()
        with pytest.raises(HostUnreachableError, match="cannot connect"):
            await t.run(["true"], timeout_s=10)
        kit.link.heal()
        assert (await t.run(["echo", "healed"], timeout_s=10)).stdout == "healed\n"
    finally:
        await t.close()


# ---- the simulator ------------------------------------------------------------------------


async def test_pgrep_sees_a_real_install_as_the_host_shows_it(sim_host: SimKit) -> None:
    sim_host.set_faults(uv_stalls=True)
    installing = await asyncio.create_subprocess_exec(
        *install_argv(sim_host),
        env=sim_host.env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert installing.stderr is not None
        assert (await installing.stderr.readline()).startswith(b"Resolved 44 packages")
        query = remote.installs_query(svc(sim_host))
        found = subprocess.run(query, env=sim_host.env(), capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
        assert found.stdout == f"{installing.pid} {' '.join(install_argv(sim_host))}\n"
        # The fake vLLM server is real but stands for the simulated processes: not listed.
        server = subprocess.run(
            ["pgrep", "-f", "vllm_server"], env=sim_host.env(), capture_output=True
        )
        assert server.returncode == 1
        workers = subprocess.run(
            remote.workers_query(), env=sim_host.env(), capture_output=True, text=True
        )
        assert "48301 VLLM::Worker_TP0" in workers.stdout.splitlines()
        assert all(
            line.split(" ", 1)[1].startswith("VLLM::") for line in workers.stdout.splitlines()
        )
        assert sim_host.installed_version == DEFAULT_VERSION  # a stalled install changes nothing
    finally:
        sim_host.set_faults(uv_stalls=False)
        status = await installing.wait()
    assert status == 0 and sim_host.installed_version == "0.31.0"
    none = subprocess.run(query, env=sim_host.env(), capture_output=True)
    assert none.returncode == 1


async def test_uv_goes_on_installing_when_its_output_is_gone(sim_host: SimKit) -> None:
    # What OpenSSH leaves behind after a cut: a command whose stdout/stderr pipes are closed.
    sim_host.update_config(install_duration_s=0.5)
    proc = subprocess.Popen(
        install_argv(sim_host), env=sim_host.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    await asyncio.to_thread(proc.wait, 20)
    assert sim_host.installed_version == "0.31.0"


# ---- the executor after a cancel ----------------------------------------------------------


class _NoHost:
    host = "h1"  # the flow below never reaches the host


class _Discard:
    async def handle(self, event: object) -> None:
        return None


async def test_polls_after_a_cancel_keep_their_pace() -> None:
    # A cancel wakes the poll that is waiting, once; the polls that bring the service
    # back afterwards (health gate) must not spin against the host.
    token = CancelToken()
    token.request("U0ALICE")
    ticks: list[Tick] = []

    def flow() -> Flow:
        for _ in range(3):
            tick = yield Sleep(0.05)
            assert isinstance(tick, Tick)
            ticks.append(tick)
        return HostOutcome(HostStatus.CANCELLED, "done", ServiceState.UP)

    loop = asyncio.get_running_loop()
    executor = Executor(
        1,
        _NoHost(),  # type: ignore[arg-type]
        _Discard(),
        cancel=token,
        clock=loop.time,
    )
    assert (await executor.drive(flow())).status == "cancelled"
    assert all(t.cancel_requested for t in ticks)
    # asyncio may fire a timer up to its clock resolution early: allow a little.
    assert all(b.now - a.now >= 0.04 for a, b in itertools.pairwise(ticks))


# ---- the wait after a cut install --------------------------------------------------------


def test_the_wait_for_a_cut_install_outlasts_the_remote_kill() -> None:
    # The host's `timeout` KILLs an install KILL_AFTER_S after its TERM; waiting less
    # could start a rollback next to an install that is still writing the venv.
    assert sequence.INSTALL_KILL_GRACE_S > ssh.KILL_AFTER_S
    assert f"--kill-after={ssh.KILL_AFTER_S}s" in ssh.wrap_with_timeout(["uv"], 60)


# ---- the pgrep pattern against procps' pgrep -----------------------------------------------


@pytest.fixture
def disguised() -> Iterator[Callable[[str], int]]:
    """Start processes whose command line reads as given (perl rewrites its $0)."""
    perl = shutil.which("perl")
    if perl is None or shutil.which("pgrep") is None:
        pytest.skip("needs perl and procps' pgrep")
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmdline: str) -> int:
        p = subprocess.Popen([perl, "-e", "$0 = shift; sleep 60", cmdline])
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_installs_query_matches_only_installs_into_the_venv(
    disguised: Callable[[str], int],
) -> None:
    s = ServiceSettings(hosts=["h"], unit="u", python="/opt/venvs/v1.2/bin/python")
    py = s.python
    mine = disguised(f"uv pip install --python {py} --force-reinstall vllm==0.31.0")
    rollback = disguised(f"uv pip install --python {py} --reinstall-package vllm vllm==0.1")
    for other in (
        f"uv pip install --python {py}3 vllm",  # another interpreter
        "uv pip install --python /opt/venvs/v1x2/bin/python vllm",  # '.' is literal
        f"sh -c uv pip install --python {py} vllm",  # the shell around a command
        f"timeout --kill-after=10s 60s uv pip install --python {py} vllm",
    ):
        disguised(other)
    pids: list[int] = []
    deadline = time.monotonic() + 10
    while len(pids) < 2 and time.monotonic() < deadline:
        r = subprocess.run(remote.installs_query(s), capture_output=True, text=True)
        pids = [int(line.split()[0]) for line in r.stdout.splitlines()]
    assert sorted(pids) == sorted([mine, rollback])  # and never this pgrep itself


# ---- recovery messages --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "needles"),
    [
        (None, ("before its first step", "Nothing was changed")),
        ("preflight", ("Nothing was changed",)),
        ("stop", ("running, stopping or stopped",)),
        ("drain", ("STOPPED",)),
        ("reinstall", ("STOPPED", "does not stop `uv`")),
        ("rollback", ("STOPPED", "rollback may have completed")),
        ("health", ("had not yet passed the health gate",)),
    ],
)
async def test_recovery_says_what_state_the_service_may_be_in(
    tmp_path: Path, step: str | None, needles: tuple[str, ...]
) -> None:
    async with AuditLog.open(tmp_path / "audit.db") as audit:
        run_id = await audit.create_run(
            service=SERVICE,
            action=Action.REDEPLOY,
            hosts=["h"],
            requested_by="U0ALICE",
            source=Source.SLACK,
            plan={},
            package_spec="vllm",
        )
        await audit.transition(run_id, RunStatus.APPROVED)
        await audit.transition(run_id, RunStatus.RUNNING, owner="elsewhere:1:1")
        if step is not None:
            await audit.set_step(run_id, step)
        approved = await audit.create_run(
            service="other",
            action=Action.RESTART,
            hosts=["h"],
            requested_by="U0BOB",
            source=Source.SLACK,
            plan={},
            package_spec=None,
            status=RunStatus.APPROVED,
        )
        [first, second] = await recover(audit, alive=lambda owner: False)
    assert first.run.id == run_id and first.run.status == "interrupted"
    for needle in needles:
        assert needle in first.message
    assert f"`/vllm status {SERVICE}`" in first.message
    assert second.run.id == approved
    assert "before it began; nothing was changed" in second.message
