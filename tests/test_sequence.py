"""The redeploy/restart/status flows driven by hand-made outcomes: every branch, no I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from bot.core import remote
from bot.core.cuda import GATE_CODE
from bot.core.flows import (
    BeginStep,
    Checkpoint,
    Emit,
    EndStep,
    Flow,
    HostOutcome,
    HttpCheck,
    Progress,
    ReadGpuState,
    RunCommand,
    Sleep,
    Snapshot,
    Tick,
    Versions,
    redeploy_flow,
    release_rollback_flow,
    restart_flow,
    status_flow,
)
from bot.core.health import GpuReading, GpuStateRead
from bot.core.leftovers import Approval, AskApproval
from bot.core.phases.actions import ReadRotationRecords, RotationRecords
from bot.core.plan import Step, make_plan
from bot.core.service_state import ServiceState
from bot.core.status import HealthSource
from bot.hosts.base import CommandResult, HttpResult
from bot.settings import Settings
from tests.test_metrics_readiness import vllm_metrics

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(8)]
IDLE_METRICS = vllm_metrics({"0": 0}, {"0": 0}, {"0": 0.0})
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def settings(**svc: Any) -> Settings:
    base: dict[str, Any] = {
        "hosts": ["h1"],
        "unit": "vllm-kimi-k25",
        "python": "/opt/venvs/vllm/bin/python",
        "indexes": {"nightly": "https://wheels.vllm.ai/nightly"},
        "drain_timeout_s": 10,
        "drain_poll_s": 1,
        "start_timeout_s": 30,
        "health_poll_s": 2,
        "min_free_disk_mib": 1000,
    }
    base.update(svc)
    return Settings(
        hosts={"h1": {"address": "10.0.0.1", "known_hosts": "/tmp/kh"}}, services={"kimi": base}
    )


def ok(argv: tuple[str, ...], stdout: str = "", stderr: str = "", status: int = 0) -> CommandResult:
    return CommandResult(
        argv=argv, exit_status=status, stdout=stdout, stderr=stderr, duration_s=0.01
    )


@dataclass
class Host:
    """A pure model of the host, just enough to answer the flow's actions."""

    version: str = "0.16.0rc2.dev313+g662205d34"
    installed_after: str = "0.16.0"
    torch: str = "2.9.1"  # moves to 2.10.0 with any install, as a real vLLM upgrade does
    freeze_ok: bool = True
    save_ok: bool = True
    prefetch_ok: bool = True
    prefetched: str | None = None  # the vllm the prefetch's venv holds (None: installed_after)
    gate_stdout: str | None = None  # None: the gate's line for what is installed
    gate_exit: int = 0
    driver_cuda: str = "13.1"
    sync_fails: int = 0  # how many rollback syncs fail before one succeeds
    load_state: str = "loaded"
    free_mib: int = 80_000
    dry_run_ok: bool = True
    stop_ok: bool = True
    drain_after_polls: int = 2
    stuck: bool = False
    smi_exit: int = 0
    install_fails: int = 0  # how many installs fail before one succeeds
    start_ok: bool = True
    unit_dies: bool = False
    healthy_after_checks: int = 2
    health_status: int = 200
    # The API beside /health: /metrics bodies in turn (the last one repeats), /v1/models,
    # /version and the smoke completion, as (status, body). An idle vLLM by default: a
    # load that cannot be read refuses the stop (issue 17, D5).
    metrics: list[str] = field(default_factory=lambda: [IDLE_METRICS])
    models: tuple[int, str] = (200, '{"object":"list","data":[{"id":"kimi-k2.5"}]}')
    version_answer: tuple[int, str] = (404, '{"detail":"Not Found"}')
    completion: tuple[int, str] = (200, '{"choices":[{"index":0,"text":" Paris."}]}')
    # What each journal follow prints (in turn, then nothing new).
    journal: list[str] = field(default_factory=list)
    requests: list[HttpCheck] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    cancel_at: Callable[[Any], bool] | None = None
    # Commands whose result never comes back; the host still runs them (see respond).
    lose: Callable[[tuple[str, ...]], bool] | None = None
    uv_running_polls: int = 0  # how many install checks still see uv running
    now: float = 0.0
    polls: int = 0
    health_checks: int = 0
    calls: list[tuple[str, ...]] = field(default_factory=list)
    # (uv's argv, the index URL it got in its environment) for each install given one
    index_env: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    notices: list[Any] = field(default_factory=list)
    cancelled: bool = False
    # Issue 12: the unit was stopped (polls count from then); the GPU driver fails only
    # from the stop on; what an approver answers to terminating leftover processes.
    stopped: bool = False
    smi_fails_from_stop: bool = False
    approval: Approval = field(default_factory=lambda: Approval(None, "nobody asked"))
    asked: list[AskApproval] = field(default_factory=list)
    # What nvidia-smi -q prints; NVML's readings where the bot runs on the host (None:
    # a remote host, or NVML failing: the executor runs nvidia-smi -q instead).
    health_q: str = ""
    nvml: tuple[GpuReading, ...] | None = None
    # Issue 19: servers the audit log says a run left out of rotation, with why.
    held_out: dict[str, str] = field(default_factory=dict)
    # What the audit log answers instead, where it cannot say (an error).
    records: RotationRecords | None = None

    def respond(self, action: Any) -> Any:
        if self.cancel_at is not None and self.cancel_at(action):
            self.cancelled = True
        if isinstance(action, Emit):
            self.notices.append(action.notice)
            return None
        if isinstance(action, Sleep):
            self.now += action.seconds
            return Tick(self.now, self.cancelled)
        if isinstance(action, Checkpoint):
            return Tick(self.now, self.cancelled)
        if isinstance(action, Progress):
            self.progress.append(action)
            return None
        if isinstance(action, HttpCheck):
            return self.http(action)
        if isinstance(action, AskApproval):
            self.asked.append(action)
            return self.approval
        if isinstance(action, ReadRotationRecords):
            # The audit log's word on which replicas a run left out (issue 19).
            return self.records or RotationRecords(dict(self.held_out))
        if isinstance(action, ReadGpuState):
            if self.nvml is not None:
                return GpuStateRead(HealthSource.NVML, self.nvml)
            # A remote host: the GPUs' state is nvidia-smi -q's, run as any command.
            return GpuStateRead(HealthSource.NVIDIA_SMI, result=self.respond(action.fallback))
        assert isinstance(action, RunCommand)
        a = action.argv
        wrapper = remote.INDEX_FROM_STDIN
        if a[: len(wrapper)] == wrapper:
            # What the host's sh does with it: the URL on stdin goes to uv's environment.
            assert action.stdin is not None and action.stdin.endswith(b"\n")
            a = a[len(wrapper) :]
            self.index_env.append((a, action.stdin.decode().rstrip("\n")))
        self.calls.append(a)
        self.now += 0.1
        if self.lose is not None and self.lose(a):
            self.command(a)  # it ran on the host (or not); only its result is lost
            return CommandResult(
                argv=a,
                exit_status=None,
                stdout="",
                stderr=f"connection lost while running `{a[0]}`: "
                "Server not responding to keepalive",
                duration_s=0.0,
            )
        return self.command(a)

    def http(self, action: HttpCheck) -> HttpResult:
        path = urlsplit(action.url).path
        if path != "/health":
            self.requests.append(action)
            if path == "/metrics":
                body = self.metrics.pop(0) if len(self.metrics) > 1 else self.metrics[0]
                return HttpResult(action.url, 200, body)
            status, body = {
                "/v1/models": self.models,
                "/version": self.version_answer,
                "/v1/completions": self.completion,
            }[path]
            return HttpResult(action.url, status, body)
        self.health_checks += 1
        if self.health_checks < self.healthy_after_checks:
            return HttpResult(action.url, None, error="connection refused")
        return HttpResult(action.url, self.health_status)

    def command(self, a: tuple[str, ...]) -> CommandResult:
        gpu = self._gpu_health(a)
        if gpu is not None:
            return gpu
        if a[:2] == ("systemctl", "show"):
            return ok(
                a,
                f"LoadState={self.load_state}\nActiveState=active\nSubState=running\n"
                "MainPID=4242\n",
            )
        if a[1:3] == ("pip", "show"):
            return ok(a, f"Name: vllm\nVersion: {self.version}\n")
        environment = self._environment(a)
        if environment is not None:
            return environment
        if a[0] == "df":
            return ok(
                a,
                "Filesystem 1048576-blocks Used Available Capacity Mounted on\n"
                f"/dev/vda 258020 22298 {self.free_mib} 22% /\n",
            )
        if "--dry-run" in a:
            spec = a[a.index("--force-reinstall") + 1]
            resolved = spec.split("==")[1] if "==" in spec else self.installed_after
            return (
                ok(
                    a,
                    stderr=f"Would install 2 packages\n - torch=={self.torch}\n"
                    " + torch==2.10.0\n ~ numpy==2.2.6\n"
                    f" - vllm=={self.version}\n + vllm=={resolved}",
                )
                if self.dry_run_ok
                else ok(a, stderr="  × No solution found when resolving dependencies", status=1)
            )
        if a[1:3] == ("pip", "install"):
            if self.install_fails > 0:
                self.install_fails -= 1
                return ok(a, stderr="error: Failed to download `vllm`", status=2)
            self.version = a[-1].split("==")[-1] if "==" in a[-1] else self.installed_after
            self.torch = "2.10.0"
            return ok(a, stderr=f" + vllm=={self.version}")
        if a[:2] == ("systemctl", "stop"):
            self.stopped = self.stopped or self.stop_ok
            return ok(a) if self.stop_ok else ok(a, stderr="Failed to stop", status=5)
        if a[:2] == ("systemctl", "start"):
            return ok(a) if self.start_ok else ok(a, stderr="Job failed", status=1)
        if a[:2] == ("systemctl", "is-active"):
            return ok(a, "failed\n", status=3) if self.unit_dies else ok(a, "active\n")
        if a[0] == "journalctl" and "--show-cursor" in a:
            return ok(a, self.journal.pop(0) if self.journal else "")
        if a[0] == "journalctl":
            return ok(a, "Nov 30 13:12:01 h1 python3[4242]: RuntimeError: CUDA out of memory\n")
        if a == ("nvidia-smi",):
            return ok(
                a,
                "| NVIDIA-SMI 590.44.01   Driver Version: 590.44.01   "
                f"CUDA Version: {self.driver_cuda}     |\n",
            )
        if a[0] == "nvidia-smi" and a[1].startswith("--query-gpu"):
            if self.smi_exit and (self.stopped or not self.smi_fails_from_stop):
                return ok(
                    a,
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                    status=self.smi_exit,
                )
            self.polls += self.stopped  # the GPU check before the stop is no drain poll
            used = 0 if self.stopped and self.polls > self.drain_after_polls else 97000
            lines = [
                f"{i}, {UUIDS[i]}, {NAME}, {96000 if (self.stuck and i == 3) else used}, 97871, 0"
                for i in range(8)
            ]
            return ok(a, "\n".join(lines) + "\n")
        if a[0] == "nvidia-smi":
            if self.stuck:
                return ok(a, f"48304, VLLM::Worker_TP3, 96000 MiB, {UUIDS[3]}\n")
            return ok(a, "")
        if a[0] == "pgrep" and a[-1].startswith(UV_PATTERN):
            if self.uv_running_polls > 0:
                self.uv_running_polls -= 1
                return ok(
                    a,
                    "5151 uv pip install --python /opt/venvs/vllm/bin/python "
                    "--force-reinstall vllm\n",
                )
            return ok(a, status=1)
        if a[0] == "pgrep":
            return ok(a, "48304 VLLM::Worker_TP3\n") if self.stuck else ok(a, status=1)
        raise AssertionError(f"unexpected command {a}")

    def _gpu_health(self, a: tuple[str, ...]) -> CommandResult | None:
        """Issue 12's commands: nvidia-smi -q (nothing to judge), the kernel log (no Xid),
        the unit's user, and ps of the stuck worker (the unit's own)."""
        if a == ("nvidia-smi", "-q"):
            return ok(a, self.health_q) if not self.smi_exit else None
        if a[:2] == ("journalctl", "-k"):
            return ok(a, "-- No entries --\n")
        if a[:4] == ("systemctl", "show", "-p", "User"):
            return ok(a, "vllm\n")
        if a[:3] == ("env", "LC_ALL=C", "ps"):
            return (
                ok(
                    a,
                    "48304 Sl vllm Mon Nov 30 13:00:00 2026 "
                    "0::/system.slice/vllm-kimi-k25.service\n",
                )
                if self.stuck
                else ok(a, status=1)
            )
        return None

    def _environment(self, a: tuple[str, ...]) -> CommandResult | None:
        """The commands of issue 10: freeze, keep the snapshot, prefetch, gate, sync."""
        if a[1:3] == ("pip", "freeze"):
            return (
                ok(a, f"numpy==2.2.6\ntorch=={self.torch}\nvllm=={self.version}\n")
                if self.freeze_ok
                else ok(a, stderr="error: broken venv", status=2)
            )
        if a[:3] == ("/bin/sh", "-c", remote.SAVE_FROM_STDIN):
            return (
                ok(a)
                if self.save_ok
                else ok(
                    a,
                    stderr="sh: 1: cannot create /opt/venvs/.chatops/x: Read-only file system",
                    status=2,
                )
            )
        if a[:3] == ("/bin/sh", "-c", remote.PREFETCH_SCRIPT):
            # The script ends with the import gate in the throwaway venv (issue 20): the
            # new build it holds, the resolved vllm and torch 2.10.0 (CUDA 13.0).
            new = self.prefetched or self.installed_after
            return (
                ok(
                    a,
                    f"{remote.PREFETCHED_MARK}\nchatops-gate "
                    f'{{"vllm": "{new}", "torch": "2.10.0", "cuda": "{TORCH_CUDA["2.10.0"]}"}}\n',
                    "Downloading torch (880.0MiB)\n Downloaded torch\n",
                )
                if self.prefetch_ok
                else ok(a, stderr="error: Failed to download `torch==2.10.0`", status=2)
            )
        if a[1:] == ("-c", GATE_CODE):
            line = (
                self.gate_stdout
                if self.gate_stdout is not None
                else (
                    f'chatops-gate {{"vllm": "{self.version}", "torch": "{self.torch}", '
                    f'"cuda": "{TORCH_CUDA[self.torch]}"}}\n'
                )
            )
            return ok(
                a,
                line,
                "Traceback (most recent call last):\nImportError: boom" if self.gate_exit else "",
                status=self.gate_exit,
            )
        if a[1:3] == ("pip", "sync"):
            if self.sync_fails > 0:
                self.sync_fails -= 1
                return ok(a, stderr="error: Failed to download `torch==2.9.1`", status=2)
            self.version, self.torch = "0.16.0rc2.dev313+g662205d34", "2.9.1"
            return ok(a, stderr=" - torch==2.10.0\n + torch==2.9.1")
        return None


UV_PATTERN = "^uv pip (install|sync)"
TORCH_CUDA = {"2.9.1": "12.8", "2.10.0": "13.0"}


def drive(flow: Flow, host: Host) -> HostOutcome:
    reply: Any = None
    try:
        while True:
            reply = host.respond(flow.send(reply))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def run(
    host: Host, action: str = "redeploy", svc: dict[str, Any] | None = None, **plan_kw: Any
) -> HostOutcome:
    s = settings(**(svc or {}))
    plan = make_plan(s, action, "kimi", **plan_kw)  # type: ignore[arg-type]
    flow = {
        "redeploy": redeploy_flow,
        "restart": restart_flow,
        "status": status_flow,
        "rollback": release_rollback_flow,
    }[action]
    return drive(flow(plan, s.services["kimi"], "h1"), host)


def steps(host: Host) -> list[tuple[str, bool]]:
    return [(str(n.step), n.ok) for n in host.notices if isinstance(n, EndStep)]


def verbs(host: Host) -> list[str]:
    """The state-changing commands, in order."""
    out = []
    for a in host.calls:
        if a[:2] in (("systemctl", "stop"), ("systemctl", "start")):
            out.append(a[1])
        elif a[1:3] == ("pip", "install") and "--dry-run" not in a:
            out.append("rollback" if is_rollback(a) else "install")
        elif is_rollback(a):
            out.append("rollback")
    return out


def is_rollback(a: tuple[str, ...]) -> bool:
    """A rollback: ``uv pip sync`` of the environment snapshot."""
    return a[1:3] == ("pip", "sync")


def test_happy_redeploy_runs_steps_in_order_and_reports_versions() -> None:
    h = Host()
    out = run(h, version="0.16.0", index="nightly")
    assert out.status == "succeeded"
    assert (out.version_before, out.version_after) == ("0.16.0rc2.dev313+g662205d34", "0.16.0")
    assert steps(h) == [
        (s, True)
        for s in (
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
    assert verbs(h) == ["stop", "install", "start"]
    install = next(a for a in h.calls if a[1:3] == ("pip", "install") and "--dry-run" not in a)
    # The index reaches uv through its environment, never its argv (which `ps` shows).
    assert install[-1] == "vllm==0.16.0" and not any("wheels" in x for x in install)
    assert (install, "https://wheels.vllm.ai/nightly") in h.index_env
    assert len(h.index_env) == 3  # the dry run, the prefetch and the install
    assert "--force-reinstall" in install
    labels = [n.label for n in h.notices if isinstance(n, Snapshot)]
    assert labels == ["after drain", "after restart"]
    assert Versions("0.16.0rc2.dev313+g662205d34", None) in h.notices


def test_drain_polls_at_the_configured_interval_not_a_fixed_sleep() -> None:
    h = Host(drain_after_polls=4)
    assert run(h).status == "succeeded"
    drain = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.DRAIN)
    assert "5 polls" in drain.summary


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("load_state", "not-found", "not loaded"),
        ("free_mib", 10, "MiB free"),
        ("dry_run_ok", False, "dry run failed"),
        ("version", "", "rollback would be impossible"),
    ],
)
def test_preflight_refusals_leave_the_service_untouched(
    field: str, value: Any, needle: str
) -> None:
    h = Host(**{field: value})
    if field == "version":
        h.command = _no_version(h.command)  # type: ignore[method-assign, assignment]
    out = run(h)
    assert out.status == "aborted"
    assert needle in out.summary
    # Untouched: as preflight read it (active; a unit it could not use: unknown).
    assert out.state == (ServiceState.UNKNOWN if field == "load_state" else ServiceState.UP)
    assert verbs(h) == []
    assert steps(h) == [("preflight", False)]


def _no_version(
    inner: Callable[[tuple[str, ...]], CommandResult],
) -> Callable[[tuple[str, ...]], CommandResult]:
    def command(a: tuple[str, ...]) -> CommandResult:
        if a[1:3] == ("pip", "show"):
            return ok(a, stderr="warning: Package(s) not found for: vllm", status=1)
        return inner(a)

    return command


def test_dry_run_stops_after_preflight() -> None:
    h = Host()
    out = run(h, dry_run=True, version="0.16.0")
    assert out.status == "succeeded"
    assert "dry run" in out.summary and out.state == ServiceState.UP
    assert verbs(h) == []


def test_drain_timeout_aborts_before_reinstall_and_names_the_pid() -> None:
    h = Host(stuck=True)
    out = run(h)
    assert out.status == "failed"
    assert "48304" in out.summary and "GPU 3" in out.summary
    assert out.state == ServiceState.STOPPED
    assert verbs(h) == ["stop"]
    assert [n.label for n in h.notices if isinstance(n, Snapshot)] == ["drain timeout"]
    assert h.now >= 10  # the deadline was measured with the flow's clock


def test_nvidia_smi_failure_during_drain_fails_clearly() -> None:
    h = Host(smi_exit=9, smi_fails_from_stop=True)
    out = run(h)
    assert out.status == "failed"
    assert "driver" in out.summary.lower()
    assert verbs(h) == ["stop"]


def test_stop_failure_ends_the_run_without_reinstall() -> None:
    h = Host(stop_ok=False)
    out = run(h)
    assert out.status == "failed"
    assert "systemctl stop failed (exit 5)" in out.summary
    assert verbs(h) == ["stop"]


def test_reinstall_failure_rolls_back_to_the_recorded_version() -> None:
    h = Host(install_fails=1)
    out = run(h, version="0.16.0", index="nightly")
    assert out.status == "rolled_back"
    assert out.version_after == "0.16.0rc2.dev313+g662205d34"
    assert verbs(h) == ["stop", "install", "rollback", "start"]
    rb = next(a for a in h.calls if is_rollback(a))
    # The whole environment goes back: a sync of the snapshot kept on the host, from
    # uv's cache first (no index needed).
    assert "--offline" in rb and rb[-1].startswith("/opt/venvs/.chatops/vllm-")
    assert rb[-1].endswith(".freeze.txt")
    assert ("reinstall", False) in steps(h) and ("rollback_health", True) in steps(h)


def test_reinstall_and_rollback_failure_says_the_service_is_stopped() -> None:
    h = Host(install_fails=1, sync_fails=2)
    out = run(h)
    assert out.status == "failed"
    assert "rollback from the index failed" in out.summary
    assert out.state == ServiceState.STOPPED
    assert "The service is STOPPED; restore the snapshot" in out.summary  # said from it
    # The exact command to restore the snapshot by hand.
    assert (
        "restore the snapshot with `uv pip sync --python /opt/venvs/vllm/bin/python "
        "--offline /opt/venvs/.chatops/vllm-" in out.summary
    )
    # From uv's cache first, then from the index: two tries, no start.
    assert verbs(h) == ["stop", "install", "rollback", "rollback"]


def test_rollback_then_unhealthy_is_failed() -> None:
    h = Host(install_fails=1, health_status=503)
    out = run(h)
    assert out.status == "failed"
    # The unit runs (answering 503): not DOWN, as systemctl is-active said after the gate.
    assert out.state == ServiceState.UP_NOT_READY
    assert out.summary.endswith("The service is UP but NOT READY (unit active)."), out.summary


def test_rollback_then_dead_unit_says_down() -> None:
    h = Host(install_fails=1, unit_dies=True)
    out = run(h)
    assert out.status == "failed"
    assert out.state == ServiceState.DOWN
    assert out.summary.endswith("The service is DOWN."), out.summary


def test_health_503_forever_fails_with_journal_tail() -> None:
    h = Host(health_status=503)
    out = run(h)
    assert out.status == "failed"
    assert "HTTP 503" in out.summary and "not healthy after 30s" in out.summary
    health = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.HEALTH)
    assert "journalctl -u vllm-kimi-k25 -n 50 --no-pager" in health.detail
    assert "CUDA out of memory" in health.detail


def test_connection_refused_while_loading_is_normal() -> None:
    h = Host(healthy_after_checks=5)
    assert run(h).status == "succeeded"
    assert h.health_checks == 5


def test_unit_that_dies_after_start_fails_fast_with_journal() -> None:
    h = Host(unit_dies=True)
    out = run(h)
    assert out.status == "failed"
    assert "is failed after start" in out.summary
    assert h.health_checks == 0


def test_systemctl_start_failure() -> None:
    h = Host(start_ok=False)
    out = run(h)
    assert out.status == "failed"
    assert "systemctl start failed" in out.summary


def test_cancel_before_stop_changes_nothing() -> None:
    h = Host(cancel_at=lambda a: isinstance(a, Checkpoint))
    out = run(h)
    assert out.status == "cancelled"
    assert verbs(h) == []


def test_cancel_during_drain_restarts_on_installed_version() -> None:
    h = Host(drain_after_polls=100, cancel_at=lambda a: isinstance(a, Sleep) and a.seconds > 0)
    out = run(h)
    assert out.status == "cancelled"
    assert verbs(h) == ["stop", "start"]
    assert out.version_after == "0.16.0rc2.dev313+g662205d34"


def test_cancel_that_meets_a_finished_drain_restarts_without_reinstalling() -> None:
    # The cancel arrives with the stop's end (the audit log went away right after
    # `systemctl stop`); the first drain poll already finds the GPUs free. The cancel
    # must still win: the service comes back on what was installed, nothing reinstalled.
    def stop_ended(a: Any) -> bool:
        return isinstance(a, Emit) and isinstance(a.notice, EndStep) and a.notice.step == "stop"

    h = Host(drain_after_polls=0, cancel_at=stop_ended)
    out = run(h)
    assert out.status == "cancelled"
    assert verbs(h) == ["stop", "start"]
    assert out.summary == "cancelled during drain; service restarted on 0.16.0rc2.dev313+g662205d34"
    assert ("drain", False) in steps(h)


def test_cancel_during_reinstall_takes_effect_after_it() -> None:
    def during_install(a: Any) -> bool:
        return isinstance(a, RunCommand) and a.step == Step.REINSTALL

    h = Host(cancel_at=during_install)
    out = run(h, version="0.16.0")
    assert out.status == "cancelled"
    assert verbs(h) == ["stop", "install", "start"]
    assert out.version_after == "0.16.0"
    assert "after the reinstall" in out.summary


def test_restart_flow_skips_reinstall() -> None:
    h = Host()
    out = run(h, "restart")
    assert out.status == "succeeded"
    assert verbs(h) == ["stop", "start"]
    assert [s for s, _ in steps(h)] == [
        "preflight",
        "gpu_check",
        "requests",
        "stop",
        "drain",
        "start",
        "health",
        "readiness",
        "postcheck",
        "gpu_recheck",
    ]


def test_restart_refuses_unknown_unit() -> None:
    h = Host(load_state="not-found")
    assert run(h, "restart").status == "aborted"
    assert verbs(h) == []


def test_status_changes_nothing_and_reports() -> None:
    h = Host()
    out = run(h, "status")
    assert out.status == "succeeded"
    assert "active (running)" in out.summary and "MiB GPU memory in use" in out.summary
    assert verbs(h) == []


def test_status_with_broken_driver_reports_failure() -> None:
    h = Host(smi_exit=9)
    out = run(h, "status")
    assert out.status == "failed"


def test_every_begun_step_is_ended() -> None:
    for h in (
        Host(),
        Host(stuck=True),
        Host(install_fails=1, sync_fails=2),
        Host(health_status=503),
        Host(gate_exit=3),
        Host(driver_cuda="12.8"),
        Host(prefetch_ok=False),
        Host(save_ok=False),
    ):
        run(h)
        begun = [n.step for n in h.notices if isinstance(n, BeginStep)]
        ended = [n.step for n in h.notices if isinstance(n, EndStep)]
        assert begun == ended


# ---- results that never came back (connection lost, host unreachable) -------------------


def is_install(a: tuple[str, ...]) -> bool:
    """The reinstall itself (not its dry run, not the rollback)."""
    return a[1:3] == ("pip", "install") and "--force-reinstall" in a and "--dry-run" not in a


def installs_checks(host: Host) -> list[int]:
    """Indexes of the pgrep calls looking for a running uv install."""
    return [i for i, a in enumerate(host.calls) if a[0] == "pgrep" and a[-1].startswith(UV_PATTERN)]


def test_host_unreachable_at_preflight_aborts_untouched() -> None:
    h = Host(lose=lambda a: True)
    out = run(h)
    assert out.status == "aborted"
    assert "cannot reach h1 over SSH" in out.summary and "keepalive" in out.summary
    assert out.state == ServiceState.UNKNOWN  # nothing could read it
    assert verbs(h) == [] and len(h.calls) == 1  # nothing more is tried


def test_restart_with_host_unreachable_aborts() -> None:
    h = Host(lose=lambda a: True)
    out = run(h, "restart")
    assert out.status == "aborted" and "cannot reach h1" in out.summary


def test_connection_lost_during_stop_says_the_state_is_unknown() -> None:
    h = Host(lose=lambda a: a[:2] == ("systemctl", "stop"))
    out = run(h)
    assert out.status == "failed"
    assert "connection lost during systemctl stop" in out.summary
    assert "may be running, stopping or stopped" in out.summary
    # The terminal's way to look too: a CLI operator may have no Slack.
    assert "`/vllm status kimi` (or `python -m bot status kimi`)" in out.summary
    assert verbs(h) == ["stop"]


def test_drain_keeps_polling_through_a_dropped_connection() -> None:
    dropped = iter([True, True])  # two polls get no answer, then the link is back
    h = Host(drain_after_polls=1)
    h.lose = lambda a: h.stopped and a[0] == "nvidia-smi" and next(dropped, False)
    out = run(h)
    assert out.status == "succeeded"
    assert verbs(h) == ["stop", "install", "start"]
    # after preflight, the GPU check, prefetch, requests and stop
    assert steps(h)[5] == ("drain", True)


def test_drain_with_the_host_gone_fails_at_the_drain_timeout() -> None:
    stopped = [False]

    def lose(a: tuple[str, ...]) -> bool:
        if a[:2] == ("systemctl", "stop"):
            stopped[0] = True
            return False
        return stopped[0]

    h = Host(lose=lose)
    out = run(h)
    assert out.status == "failed"
    assert "no answer from the host while waiting for GPU memory" in out.summary
    assert out.state == ServiceState.STOPPED and "keepalive" in out.summary
    assert verbs(h) == ["stop"]
    assert h.now >= 10  # it waited the whole drain timeout, not one failed poll


def test_cut_reinstall_waits_for_uv_then_continues_when_the_target_is_installed() -> None:
    h = Host(lose=is_install, uv_running_polls=3)
    out = run(h, version="0.16.0")
    assert out.status == "succeeded", out.summary
    assert out.version_after == "0.16.0"
    assert verbs(h) == ["stop", "install", "start"]  # no rollback, no second install
    checks = installs_checks(h)
    assert len(checks) == 4  # three saw uv still running, the fourth saw none
    pip_show_after = [
        i for i, a in enumerate(h.calls) if a[1:3] == ("pip", "show") and i > checks[-1]
    ]
    start_i = next(i for i, a in enumerate(h.calls) if a[:2] == ("systemctl", "start"))
    assert checks[-1] < pip_show_after[0] < start_i  # version read once uv was gone
    reinstall = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.REINSTALL)
    assert reinstall.ok and "uv finished on the host" in reinstall.summary


def test_cut_reinstall_of_latest_uses_the_version_the_dry_run_resolved() -> None:
    h = Host(lose=is_install, installed_after="0.16.1")
    out = run(h)
    assert out.status == "succeeded", out.summary
    assert verbs(h) == ["stop", "install", "start"]


def test_cut_reinstall_that_failed_on_the_host_rolls_back_after_uv_ended() -> None:
    h = Host(lose=is_install, install_fails=1, uv_running_polls=2)
    out = run(h, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert "once uv had ended, vllm was 0.16.0rc2.dev313+g662205d34, not 0.16.0" in out.summary
    assert verbs(h) == ["stop", "install", "rollback", "start"]
    rollback_i = next(i for i, a in enumerate(h.calls) if is_rollback(a))
    assert installs_checks(h)[-1] < rollback_i  # never two installs into the venv at once


def test_cut_reinstall_with_the_host_gone_ends_failed_outcome_unknown_service_stopped() -> None:
    cut = [False]

    def lose(a: tuple[str, ...]) -> bool:
        cut[0] = cut[0] or is_install(a)
        return cut[0]

    h = Host(lose=lose)
    out = run(h, svc={"install_timeout_s": 60}, version="0.16.0")
    assert out.status == "failed"
    assert "connection lost during the reinstall" in out.summary
    assert "Whether vllm==0.16.0 was installed is unknown" in out.summary
    assert out.state == ServiceState.STOPPED and "`/vllm status kimi`" in out.summary
    assert verbs(h) == ["stop", "install"]  # neither a rollback nor a start
    assert h.now >= 60 + 15  # it waited until `timeout` had surely ended uv


def test_cut_reinstall_still_running_at_the_deadline_is_unknown() -> None:
    h = Host(lose=is_install, uv_running_polls=10_000)
    out = run(h, svc={"install_timeout_s": 30}, version="0.16.0")
    assert out.status == "failed"
    assert "uv is still running" in out.summary and "unknown" in out.summary
    assert verbs(h) == ["stop", "install"]


def test_cut_reinstall_when_pgrep_cannot_tell_is_unknown() -> None:
    def command(
        inner: Callable[[tuple[str, ...]], CommandResult],
    ) -> Callable[[tuple[str, ...]], CommandResult]:
        def run_it(a: tuple[str, ...]) -> CommandResult:
            if a[0] == "pgrep" and a[-1].startswith("^uv"):
                return ok(a, stderr="bash: line 1: pgrep: command not found", status=127)
            return inner(a)

        return run_it

    h = Host(lose=is_install)
    h.command = command(h.command)  # type: ignore[method-assign, assignment]
    out = run(h, version="0.16.0")
    assert out.status == "failed"
    # pgrep's reason is kept, not only its exit status.
    assert (
        "cannot tell whether uv still runs (exit 127: bash: line 1: pgrep: command not found)"
    ) in out.summary
    assert verbs(h) == ["stop", "install"]


def test_cut_rollback_waits_too_then_restarts_on_the_old_version() -> None:
    h = Host(install_fails=1, uv_running_polls=1, lose=lambda a: is_rollback(a))
    out = run(h)
    assert out.status == "rolled_back", out.summary
    assert out.version_after == "0.16.0rc2.dev313+g662205d34"
    rollback_i = next(i for i, a in enumerate(h.calls) if is_rollback(a))
    start_i = next(i for i, a in enumerate(h.calls) if a[:2] == ("systemctl", "start"))
    assert rollback_i < installs_checks(h)[0] < installs_checks(h)[-1] < start_i


def test_cut_rollback_with_the_host_gone_is_unknown_and_stopped() -> None:
    cut = [False]

    def lose(a: tuple[str, ...]) -> bool:
        cut[0] = cut[0] or is_rollback(a)
        return cut[0]

    h = Host(install_fails=1, lose=lose)
    out = run(h, svc={"install_timeout_s": 20})
    assert out.status == "failed"
    assert "connection lost during the rollback" in out.summary
    assert "unknown" in out.summary and out.state == ServiceState.STOPPED


def test_cut_rollback_that_left_the_package_missing_says_stopped() -> None:
    h = Host(install_fails=1, lose=lambda a: is_rollback(a))
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if is_rollback(a):  # killed between uninstall and install
            h.version = ""
            return ok(a, stderr="Uninstalled 1 package", status=143)
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h)
    assert out.status == "failed"
    assert "vllm was missing, not 0.16.0rc2.dev313+g662205d34" in out.summary
    assert out.state == ServiceState.STOPPED
    # Once uv had ended, the sync from the cache had failed: the index is tried too.
    assert verbs(h) == ["stop", "install", "rollback", "rollback"]


def test_lost_start_leaves_the_verdict_to_the_health_gate() -> None:
    h = Host(lose=lambda a: a[:2] == ("systemctl", "start"))
    out = run(h)
    assert out.status == "succeeded"
    start = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.START)
    assert "the health gate decides" in start.summary


def test_cancel_during_a_cut_reinstall_takes_effect_after_uv_ended() -> None:
    h = Host(
        lose=is_install,
        uv_running_polls=2,
        cancel_at=lambda a: is_install(a.argv) if isinstance(a, RunCommand) else False,
    )
    out = run(h, version="0.16.0")
    assert out.status == "cancelled"
    assert "after the reinstall" in out.summary and out.version_after == "0.16.0"
    assert verbs(h) == ["stop", "install", "start"]
    assert len(installs_checks(h)) == 3


def test_every_begun_step_is_ended_when_results_are_lost() -> None:
    for h in (
        Host(lose=lambda a: True),
        Host(lose=is_install),
        Host(lose=lambda a: a[:2] == ("systemctl", "stop")),
        Host(install_fails=1, lose=lambda a: is_rollback(a)),
    ):
        run(h, svc={"install_timeout_s": 20})
        begun = [n.step for n in h.notices if isinstance(n, BeginStep)]
        ended = [n.step for n in h.notices if isinstance(n, EndStep)]
        assert begun == ended


def test_install_timeout_rolls_back_and_names_the_limit_and_last_output() -> None:
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if is_install(a):  # `timeout` sent TERM: uv is gone, the venv may be half-done
            return CommandResult(
                argv=a,
                exit_status=124,
                stdout="",
                stderr="Resolved 152 packages in 30ms\n",
                duration_s=60.0,
                timed_out=True,
            )
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h, svc={"install_timeout_s": 60}, version="0.16.0")
    assert out.status == "rolled_back"
    assert out.summary.startswith(
        "reinstall timed out after 60s (last output: Resolved 152 packages in 30ms); "
        "rolled back to 0.16.0rc2.dev313+g662205d34"
    )
    assert verbs(h) == ["stop", "install", "rollback", "start"]
    assert installs_checks(h) == []  # uv's end is known: nothing to wait for


def test_a_prefetch_cut_off_by_its_timeout_after_the_install_is_a_timeout_not_a_gate() -> None:
    # The install into the throwaway venv finished (its mark printed), then `timeout`
    # ended the script in the import gate: nothing says the new build is bad.
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[:3] == ("/bin/sh", "-c", remote.PREFETCH_SCRIPT):
            return CommandResult(
                a, 124, f"{remote.PREFETCHED_MARK}\n", " + xgrammar==0.2.7\n", 60.0, timed_out=True
            )
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h, svc={"install_timeout_s": 60}, version="0.16.0")
    assert out.status == "aborted"
    assert "prefetch timed out after 60s" in out.summary, out.summary
    assert "gate" not in out.summary, out.summary
    assert verbs(h) == []  # never stopped


def test_preflight_reads_free_disk_on_a_mount_point_with_a_space() -> None:
    # Real `df -P -B1M` output (GNU coreutils 9.1) for a tmpfs mounted, as root, with
    # `mount -t tmpfs -o size=64m tmpfs '/tmp/df sample/mnt 1'`.  The old parser took
    # the third field from the end and refused with "cannot read free disk space".
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[0] == "df":
            return ok(
                a,
                "Filesystem     1048576-blocks  Used Available Capacity Mounted on\n"
                "tmpfs                      64     0        64       0% "
                "/tmp/df sample/mnt 1\n",
            )
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h, svc={"min_free_disk_mib": 10}, dry_run=True)
    assert out.status == "succeeded", out.summary
    preflight = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.PREFLIGHT)
    assert "64 MiB free" in preflight.summary


# Real uv 0.13.9 output (the dev machine of issue 9), captured with
#   uv pip show --python /opt/venvs/vllm/bin/python vllm      (no such file: exit 2)
#   uv pip show --python /tmp/fakepy/python vllm              (an empty file: exit 2)
# stdout was empty both times; this is stderr, as uv wrote it without a terminal.
UV_NO_PYTHON = (
    "error: No virtual environment or system Python installation found for path "
    "`/opt/venvs/vllm/bin/python`; run `uv venv` to create an environment\n"
)
UV_NOT_EXECUTABLE = (
    "error: Failed to inspect Python interpreter from provided path at "
    "`/tmp/fakepy/python`\n"
    "  cause: Failed to query Python interpreter at `/tmp/fakepy/python`\n"
    "  cause: Permission denied (os error 13)\n"
)


@pytest.mark.parametrize("said", [UV_NO_PYTHON, UV_NOT_EXECUTABLE])
def test_preflight_refusal_for_an_unknown_version_keeps_uvs_reason(said: str) -> None:
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[1:3] == ("pip", "show"):
            return ok(a, stderr=said, status=2)
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h)
    assert out.status == "aborted"
    assert verbs(h) == []
    last_line = said.strip().splitlines()[-1].strip()
    # In the summary (card, thread, terminal, runs.summary) ...
    assert "rollback would be impossible" in out.summary
    assert "exit 2" in out.summary and last_line in out.summary
    preflight = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.PREFLIGHT)
    assert last_line in preflight.summary
    # ... and whole in the step's output (the query is quiet: nothing else carries it).
    assert preflight.detail.startswith("$ uv pip show --python /opt/venvs/vllm/bin/python vllm\n")
    assert said.strip() in preflight.detail


def test_preflight_refusal_for_unreadable_free_disk_quotes_df() -> None:
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[0] == "df":  # real GNU df 9.1 on a missing path: stdout empty, exit 1
            return ok(a, stderr="df: /opt/venvs/vllm: No such file or directory\n", status=1)
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h)
    assert out.status == "aborted"
    assert out.summary.endswith(
        "cannot read free disk space of /opt/venvs/vllm "
        "(exit 1: df: /opt/venvs/vllm: No such file or directory)"
    )
