"""Small reads and words every phase shares: whether a result came back (``lost``),
why a command failed, the GPU snapshot, the installed version, the unit's state and the
journal's tail."""

from __future__ import annotations

from typing import Literal

from bot.core import remote
from bot.core.cuda import (
    GateReport,
    GateVerdict,
    gate_verdict,
    parse_driver_cuda,
    parse_gate_output,
)
from bot.core.gpu import GpuSnapshot, build_snapshot, check_nvidia_smi, scoped, select_gpus
from bot.core.leftovers import facts_query, parse_facts, service_name
from bot.core.phases.actions import Phase, run
from bot.core.plan import Step, cmd
from bot.core.readiness import error_message
from bot.core.results import CommandResult, HttpResult
from bot.core.service_state import ServiceState
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings

HEALTH_REQUEST_TIMEOUT_S = 5.0


def lost(r: CommandResult) -> bool:
    """No exit status and no signal: the result never came back (see the module doc)."""
    return r.exit_status is None and r.signal is None


class HostLost(GpuQueryError):
    """A poll's result never came back; a GpuQueryError so read-only callers treat it
    like any other failed query, while the drain can tell it apart and retry."""


def reason_of(r: CommandResult) -> str:
    if r.refused is not None:
        return r.refused  # sudo did not run it: the rule the host lacks
    if r.timed_out and r.exit_status is None and r.signal is None:
        return "no answer within the step's timeout: the host or the link is stuck"
    if r.timed_out:
        return "timed out"
    if r.exit_status is None:
        return f"ended by signal {r.signal}" if r.signal else (r.stderr.strip() or "no exit status")
    return f"exit {r.exit_status}"


def failed_msg(what: str, r: CommandResult, timeout_s: float) -> str:
    """Why a command failed; a timeout (the host's `timeout` ended it with TERM, then
    KILL) names the limit and the command's last line of output."""
    if not r.timed_out:
        return f"{what} failed ({reason_of(r)})"
    last = tail_of(r.output, 1)
    return f"{what} timed out after {timeout_s:g}s" + (f" (last output: {last})" if last else "")


def tail_of(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def read_snapshot(step: Step, svc: ServiceSettings, host: str) -> Phase[GpuSnapshot]:
    """Query GPUs and compute apps; raises GpuQueryError when nvidia-smi fails
    (``HostLost`` when its result never came back)."""
    gpus = yield from run(step, remote.gpu_query(), svc.command_timeout_s, quiet=True)
    check_reached(host, gpus)
    check_nvidia_smi(host, gpus)
    apps = yield from run(step, remote.apps_query(), svc.command_timeout_s, quiet=True)
    check_reached(host, apps)
    check_nvidia_smi(host, apps)
    return _in_scope(
        svc, build_snapshot(host, gpus.stdout, apps.stdout, (gpus.stderr, apps.stderr))
    )


def check_reached(host: str, r: CommandResult) -> None:
    if lost(r):
        raise HostLost(host, reason_of(r))


def read_installed(step: Step, svc: ServiceSettings) -> Phase[str | None]:
    version, _, _ = yield from read_version(step, svc)
    return version


def read_version(step: Step, svc: ServiceSettings) -> Phase[tuple[str | None, str, str]]:
    """(version, why it is unknown, the output that says so).  The query is quiet, so
    its output reaches no one unless the caller keeps it: uv's own words ("No virtual
    environment or system Python installation found for path ...") are the reason."""
    argv = remote.package_show(svc)
    r = yield from run(step, argv, svc.command_timeout_s, quiet=True)
    version = remote.parse_package_version(r.stdout) if r.ok else None
    if version is not None:
        return version, "", ""
    return None, f"`{cmd(argv)}`: {explain(r)}", evidence_of(argv, r)


def explain(r: CommandResult) -> str:
    """Why a command's result is unusable, in its own last words."""
    said = tail_of(r.output, 3)
    if r.ok:
        return f"unexpected output: {said}" if said else "no output"
    return f"{reason_of(r)}: {said}" if said and not lost(r) else reason_of(r)


def evidence_of(argv: tuple[str, ...], r: CommandResult) -> str:
    """The tail of a quiet command's output, for a failed step's output (which
    otherwise holds only what was streamed)."""
    return f"$ {cmd(argv)}\n{tail_of(r.output) or '(' + reason_of(r) + ')'}"


def unit_state(step: Step, svc: ServiceSettings) -> Phase[tuple[CommandResult, dict[str, str]]]:
    r = yield from run(step, remote.unit_show(svc), svc.command_timeout_s)
    return r, remote.parse_unit_show(r.stdout)


def read_state(r: CommandResult, props: dict[str, str]) -> ServiceState:
    """The service's state as ``systemctl show`` read it, for a run that has not touched
    it (or only read it): active is UP (its health is this run's to judge, not known
    here); failed or still activating (a Restart= wait) is DOWN; inactive is STOPPED
    (nobody runs it); a read that failed is UNKNOWN."""
    if not r.ok:
        return ServiceState.UNKNOWN
    match props.get("ActiveState"):
        case "active" | "reloading":
            return ServiceState.UP
        case "failed" | "activating":
            return ServiceState.DOWN
        case "inactive" | "deactivating":
            return ServiceState.STOPPED
        case _:
            return ServiceState.UNKNOWN


def check_unit(svc: ServiceSettings, r: CommandResult, props: dict[str, str]) -> str | None:
    """A reason to refuse, or None when the unit exists."""
    if not r.ok:
        return f"cannot read the state of {svc.unit} ({reason_of(r)}): {tail_of(r.output, 3)}"
    if props.get("LoadState") != "loaded":
        return (
            f"unit {svc.unit} is not loaded on this host (LoadState={props.get('LoadState', '?')})"
        )
    return None


def status_hint(service: str) -> str:
    return f"Check with `/vllm status {service}` (or `python -m bot status {service}`)"


# How a drain or an install ended, for the flow to decide what comes next.
DrainEnd = Literal["ok", "failed", "cancelled"]


InstallEnd = Literal["ok", "failed", "unknown"]


def http_why(h: HttpResult) -> str:
    if h.status is None:
        return h.error or "no response"
    return f"HTTP {h.status}: {error_message(h.body)}"


def journal_tail(step: Step, svc: ServiceSettings) -> Phase[str]:
    r = yield from run(step, remote.journal_tail(svc), svc.command_timeout_s, quiet=True)
    header = f"$ {cmd(remote.journal_tail(svc))}"
    return f"{header}\n{r.output.rstrip()}" if r.output.strip() else f"{header}\n({reason_of(r)})"


def _in_scope(svc: ServiceSettings, snap: GpuSnapshot) -> GpuSnapshot:
    """The snapshot scoped to the service's GPUs (its ``gpus`` setting; all when unset)."""
    if svc.gpus is None:
        return snap
    return scoped(snap, select_gpus(snap.gpus, svc.gpus))


def service_workers(
    svc: ServiceSettings, host: str, snap: GpuSnapshot, workers: tuple[tuple[int, str], ...]
) -> Phase[tuple[tuple[int, str], ...]]:
    """The ``VLLM::`` processes that may be this service's. On a host the service has to
    itself (``gpus`` unset) every one counts, as it always did. With ``gpus`` set another
    service runs beside it: a worker nvidia-smi lists on another GPU, or one in another
    unit's cgroup, is that service's and never blocks this drain."""
    listed = {p.pid for p in snap.processes}
    unlisted = [w for w in workers if w[0] not in listed]
    if svc.gpus is None or not unlisted:
        return workers
    r = yield from run(
        Step.DRAIN, facts_query(p for p, _ in unlisted), svc.command_timeout_s, quiet=True
    )
    check_reached(host, r)
    if r.exit_status not in (0, 1):
        return workers  # cannot tell whose they are: each still counts
    facts = parse_facts(r.stdout)
    ours = service_name(svc.unit)
    keep = {
        p
        for p, _ in unlisted
        if p in facts and not facts[p].zombie and (ours in facts[p].units() or not facts[p].units())
    }
    return tuple(w for w in workers if w[0] in listed or w[0] in keep)


def read_driver_cuda(step: Step, svc: ServiceSettings) -> Phase[str | None]:
    """The CUDA version the driver supports (plain ``nvidia-smi``'s header), for a gate;
    None when it cannot be read (the gate then judges without it)."""
    smi = yield from run(step, remote.driver_info(), svc.command_timeout_s, quiet=True)
    return parse_driver_cuda(smi.stdout) if smi.ok else None


def judge_gate(
    r: CommandResult, svc: ServiceSettings, *, target: str | None, driver_cuda: str | None
) -> tuple[GateReport | None, GateVerdict]:
    """The import and CUDA gate's report (None: its interpreter printed none) and verdict,
    from the run of its code: the same judgement in the prefetch's throwaway venv, in a
    side-by-side release and in the venv after the install."""
    report = parse_gate_output(r.stdout) if r.ok else None
    verdict = gate_verdict(
        report, target=target, driver_cuda=driver_cuda, package=svc.package, indexes=svc.indexes
    )
    return report, verdict


def gate_refusal(verdict: GateVerdict, report: GateReport | None, r: CommandResult) -> str:
    """Why a gate refused, with the interpreter's last line when it printed no report, or
    how the command ended when it failed: the same words before the stop and after the
    install."""
    said = tail_of(r.output, 1) if report is None else ""
    return verdict.reason + (f": {said}" if said else f" ({reason_of(r)})" if not r.ok else "")
