"""A host's maintenance as one pure flow (issue 23): ``host reboot`` and ``host gpu-reset``.

preflight (boot id, GPUs, each service's unit) -> for each service that runs: out of
rotation, in-flight requests drained, stop, GPU memory drained -> the reboot (and the
wait for the same host with a new boot id) or the GPU reset -> the deep GPU check ->
each service that ran before started, health-gated and ready, back in rotation.

Every service is handled by the phases a restart of it uses (its part of the plan,
``bot.core.host_plan``), so its drain, stop, start and rotation mean what they mean in
any other run. What the run may end with:

* refused before anything changed (a unit not loaded, the host not answering, GPUs
  unreadable for a reset): every service untouched;
* a service that will not stop, a cancel before the maintenance, or a reset whose GPUs
  did not drain: the services already stopped are started again and nothing else
  happens;
* the reboot refused (sudo, systemd), or every reset refused by sudo (a rule missing,
  no GPU touched): the services are started again;
* the host not back within ``reboot_timeout_s``, or back with another host key: nothing
  is started, the thread says the services' state is unknown and why;
* the deep check failing (or a reset refused, which needs a reboot): the host stays out,
  its services STOPPED (``[maintenance] on_failed_check = "stop"``) or started again out
  of rotation (``"restore"``), with the findings and NVIDIA's actions on the card.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bot.core import host_ops
from bot.core.deep_check import DeepReport
from bot.core.flows import back_in, out_and_stop
from bot.core.health_types import Level
from bot.core.phases.actions import BeginStep, Emit, EndStep, Flow, HostOutcome, Phase, pause, run
from bot.core.phases.common import lost, read_snapshot, reason_of
from bot.core.phases.host_steps import (
    QUICK_TIMEOUT_S,
    deep_check,
    reboot_and_wait,
    reset_gpus,
    sudo_allows,
)
from bot.core.phases.preflight import Refused, preflight_unit
from bot.core.phases.rotation import NOTHING_TAKEN, Taken, stays_out
from bot.core.phases.start import left_as, start_and_gate
from bot.core.phases.stop import quiesce_and_stop
from bot.core.phases.terminate import drain_clean
from bot.core.plan import Plan, Step
from bot.core.service_state import ServiceState, worst
from bot.core.status import Action, HostStatus
from bot.errors import GpuQueryError
from bot.settings import MaintenanceSettings, ServiceSettings

# Services in these states at preflight are started again after the maintenance: UP, and
# DOWN (failed or restarting: often the very reason for a reboot, an Xid that killed the
# engine). STOPPED (inactive) was stopped on purpose and stays so.
_RESTARTED = (ServiceState.UP, ServiceState.DOWN)


@dataclass(frozen=True, slots=True)
class _Part:
    plan: Plan  # the service's own restart plan of this host
    svc: ServiceSettings
    before: ServiceState
    # How it left its router's rotation before its stop (nothing, without a router).
    taken: Taken = NOTHING_TAKEN


@dataclass(frozen=True, slots=True)
class _Ended:
    """One service's end, and the words for it."""

    service: str
    state: ServiceState
    ok: bool
    said: str


def host_flow(
    plan: Plan, services: Mapping[str, ServiceSettings], m: MaintenanceSettings, host: str
) -> Flow:
    first = services[plan.parts[0].service]
    yield Emit(BeginStep(Step.PREFLIGHT, plan.steps[0].command))
    try:
        boot_id, count, parts, sudo = yield from _preflight(plan, services, m, host)
    except Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason))
        return HostOutcome(
            HostStatus.ABORTED,
            f"preflight refused; host untouched: {e.reason}",
            ServiceState.UNKNOWN,
        )
    running = [p for p in parts if p.before in _RESTARTED]
    yield Emit(
        EndStep(
            Step.PREFLIGHT,
            True,
            f"boot {boot_id[:8]}, {count if count is not None else '?'} GPUs; "
            + "; ".join(f"{p.plan.service} {p.before}" for p in parts)
            + (f"; {sudo}" if sudo else ""),
        )
    )
    stopped = yield from _stop_all(plan, running, host)
    if isinstance(stopped, HostOutcome):
        return stopped
    needs_reboot: str | None = None
    if plan.action == Action.REBOOT:
        rebooted = yield from reboot_and_wait(m, boot_id)
        match rebooted.end:
            case "not_rebooted":
                return (yield from _abandon(host, stopped, rebooted.why, HostStatus.FAILED))
            case "timeout" | "other_host":
                return _lost_host(host, running, rebooted.why)
            case "back":
                pass
    else:
        reset = yield from reset_gpus(m, first, plan.gpus)
        if reset.not_run:
            # As a refused `systemctl reboot`: the GPUs are as they were; say the rule.
            why = f"no GPU was reset, sudo refused to run it: {reset.text().rstrip('.')}"
            return (yield from _abandon(host, stopped, why, HostStatus.FAILED))
        if not reset.ok:
            needs_reboot = f"{reset.text()}: the host needs a reboot (/vllm host reboot {host})"
    report = yield from deep_check(m, first, host, count, plan.is_local(host))
    failed = needs_reboot or _fail_text(report)
    if failed is not None and m.on_failed_check == "stop":
        return (yield from _too_late((yield from _keep_out(host, parts, running, failed))))
    ends = []
    for p in running:
        ends.append((yield from _start(p, host, hold_out=failed is not None)))
    return (yield from _too_late(_host_end(host, ends, failed)))


def _too_late(outcome: HostOutcome) -> Flow:
    """A cancel that came once the reboot or reset had begun cannot undo it: the run went
    on to its end (the services back, or the host kept out), and says so."""
    if not (yield from pause()).cancel_requested:
        return outcome
    return replace(
        outcome,
        summary=f"{outcome.summary}. A cancel came after the maintenance had begun: a "
        "reboot or reset cannot be taken back, so the run went on to its end",
    )


def _stop_all(plan: Plan, running: Sequence[_Part], host: str) -> Phase[list[_Part] | HostOutcome]:
    """Each running service out of rotation, drained of requests, stopped, its GPU memory
    drained; the stopped services, or the run's end (those stopped started again)."""
    stopped: list[_Part] = []
    for p in running:
        # A service DOWN (failed, or in a Restart= loop after an Xid) serves nothing and
        # its /metrics cannot answer: its stop does not wait for requests, or the reboot
        # that would fix it could never run.
        part = replace(p.plan, force=True) if p.before == ServiceState.DOWN else p.plan
        ended = yield from out_and_stop(part, p.svc, host, None, p.before)
        if not isinstance(ended, Taken):
            # Cancelled before its stop, or refused (its router, its load): the run ends
            # as that service's did; a stop that failed is a failed run.
            cancelled = ended.status in (HostStatus.CANCELLED, HostStatus.ABORTED)
            status = ended.status if cancelled else HostStatus.FAILED
            # Its own words follow in the list of services (``already``), once.
            why = (
                f"{p.plan.service} ended the run before its stop"
                if cancelled
                else f"{p.plan.service} did not stop"
            )
            return (yield from _abandon(host, stopped, why, status, [_of(p, ended)]))
        stopped.append(replace(p, taken=ended))
    for p in stopped:
        drain, reason = yield from drain_clean(p.svc, host)
        if drain == "cancelled":
            why = "cancelled during the drain"
            return (yield from _abandon(host, stopped, why, HostStatus.CANCELLED))
        if drain == "failed" and plan.action == Action.GPU_RESET:
            why = f"{p.plan.service}'s GPUs did not drain ({reason}); no GPU was reset"
            return (yield from _abandon(host, stopped, why, HostStatus.FAILED))
        # A reboot ends every process: a GPU still held is no reason not to.
    if (yield from pause()).cancel_requested:
        why = "cancelled before the maintenance"
        return (yield from _abandon(host, stopped, why, HostStatus.CANCELLED))
    return stopped


def _preflight(
    plan: Plan, services: Mapping[str, ServiceSettings], m: MaintenanceSettings, host: str
) -> Phase[tuple[str, int | None, list[_Part], str]]:
    """The boot id, the GPUs, each service's unit and state, then whether sudo would run
    the maintenance itself: (boot id, GPU count, parts, what sudo said)."""
    first = services[plan.parts[0].service]
    r = yield from run(Step.PREFLIGHT, host_ops.BOOT_ID_ARGV, QUICK_TIMEOUT_S, quiet=True)
    if lost(r):
        raise Refused(f"cannot reach {host} over SSH: {reason_of(r)}")
    boot_id = host_ops.parse_boot_id(r.stdout)
    if boot_id is None:
        raise Refused(
            f"cannot read {host_ops.BOOT_ID_PATH} ({reason_of(r)}): without it a reboot "
            "could not be told from a host that never went down"
        )
    listed: tuple[int, ...] | None = None
    try:
        listed = tuple(
            g.index for g in (yield from read_snapshot(Step.PREFLIGHT, first, host)).gpus
        )
    except GpuQueryError as e:
        if plan.action == Action.GPU_RESET:
            raise Refused(f"cannot list the GPUs to reset: {e.reason}") from None
        # A reboot is often what a GPU that stopped answering needs.
    parts = []
    for part in plan.parts:
        svc = services[part.service]
        _, state = yield from preflight_unit(svc, host)
        parts.append(_Part(part, svc, state))
    reboot = plan.action == Action.REBOOT
    sudo = yield from sudo_allows(m, reboot, plan.gpus or listed or (), host)
    return boot_id, None if listed is None else len(listed), parts, sudo


def _of(p: _Part, outcome: HostOutcome) -> _Ended:
    ok = outcome.status == HostStatus.SUCCEEDED
    return _Ended(p.plan.service, outcome.state, ok, outcome.summary)


def _start(p: _Part, host: str, *, hold_out: bool = False) -> Phase[_Ended]:
    """Start one service (a no-op start when the boot started it) and gate it; back in
    rotation unless ``hold_out`` (the host failed its check: it stays out)."""
    err = yield from start_and_gate(p.svc, Step.START, Step.HEALTH)
    if err is not None:
        state, left = yield from left_as(p.svc, Step.HEALTH, err)
        failed = HostOutcome(HostStatus.FAILED, f"{err.reason}. {left}", state)
        outcome = failed if hold_out else (yield from back_in(p.plan, p.svc, host, failed, p.taken))
        return _of(p, outcome)
    healthy = HostOutcome(HostStatus.SUCCEEDED, "started, healthy", ServiceState.UP)
    if hold_out:
        kept = "started, healthy" + (
            f"; {stays_out(p.plan, host)}" if p.plan.router is not None else ""
        )
        return _Ended(p.plan.service, ServiceState.UP, True, kept)
    return _of(p, (yield from back_in(p.plan, p.svc, host, healthy, p.taken)))


def _abandon(
    host: str,
    stopped: Sequence[_Part],
    why: str,
    status: HostStatus,
    already: Sequence[_Ended] = (),
) -> Flow:
    """The maintenance will not happen: every service this run stopped starts again."""
    ends = list(already)
    for p in stopped:
        ends.append((yield from _start(p, host)))
    said = "; ".join(f"{e.service}: {e.said}" for e in ends) or "no service was stopped"
    state = worst(e.state for e in ends) if ends else ServiceState.UNKNOWN
    return HostOutcome(status, f"{why}; nothing was done to {host}. {said}", state)


def _lost_host(host: str, running: Sequence[_Part], why: str) -> HostOutcome:
    names = ", ".join(p.plan.service for p in running)
    checks = ", ".join(f"`/vllm status {p.plan.service}`" for p in running)
    said = (
        f"The services that ran before ({names}) were stopped for the reboot and their "
        f"state now is UNKNOWN; check the host's console, then {checks}"
        if running
        else "No service ran on it before"
    )
    out = "".join(
        f". {p.plan.service}: {stays_out(p.plan, host)}" for p in running if p.plan.router
    )
    return HostOutcome(HostStatus.FAILED, f"{host}: {why}. {said}{out}", ServiceState.UNKNOWN)


def _fail_text(report: DeepReport) -> str | None:
    failed = [f.line() for f in report.findings if f.level == Level.CRITICAL]
    return f"deep GPU check FAIL: {'; '.join(failed)}" if failed else None


def _keep_out(host: str, parts: Sequence[_Part], running: Sequence[_Part], why: str) -> Flow:
    """The host failed its check: it stays out. Every service found running now is
    stopped, without waiting for requests: those the boot started by itself (enabled
    units, one stopped by hand before included), so nothing serves on a GPU that needs
    attention."""
    said = []
    # Each named service's state now: a stop that failed or a unit that cannot be read
    # is no STOPPED on the card.
    states: list[ServiceState] = []
    for p in parts:
        try:
            _, now = yield from preflight_unit(p.svc, host)
        except Refused as e:
            said.append(f"{p.plan.service}: state unknown ({e.reason})")
            states.append(ServiceState.UNKNOWN)
            continue
        if now in (ServiceState.UP, ServiceState.DOWN):
            ended = yield from quiesce_and_stop(replace(p.plan, force=True), p.svc, None, now)
            if ended is not None:
                said.append(f"{p.plan.service}: could not be stopped again ({ended.summary})")
                states.append(ended.state)
                continue
        elif p not in running:
            continue  # stopped before the run, and still
        said.append(
            f"{p.plan.service}: STOPPED"
            + (f", {stays_out(p.plan, host)}" if p.plan.router is not None else "")
        )
        states.append(ServiceState.STOPPED)
    tail = "; ".join(said) or "no service ran before"
    return HostOutcome(
        HostStatus.FAILED,
        f"{host} stays out: {why}. {tail}",
        worst(states) if states else ServiceState.UNKNOWN,
    )


def _host_end(host: str, ends: Sequence[_Ended], failed: str | None) -> HostOutcome:
    said = "; ".join(f"{e.service}: {e.said}" for e in ends) or "no service ran before"
    state = worst(e.state for e in ends) if ends else ServiceState.STOPPED
    if failed is not None:
        return HostOutcome(HostStatus.FAILED, f"{host} stays out: {failed}. {said}", state)
    status = HostStatus.SUCCEEDED if all(e.ok for e in ends) else HostStatus.FAILED
    return HostOutcome(status, f"{host} maintained, deep GPU check ok. {said}", state)
